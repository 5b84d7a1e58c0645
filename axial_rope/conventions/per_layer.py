"""Conventions that change per layer: Gemma's local and global bases, Llama 4's NoPE layers and chunks.

A per-layer convention is a list of :class:`LayerRoPE`, one per layer: the rope of the layer
(``None``: no positional rotation, NoPE) and what its attention must do (the layer type as
transformers names it, the sliding window or chunk size, Llama 4's query temperature). Layers of a
type share one :class:`~axial_rope.AxialRoPE`. The attention itself is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..rope import AxialRoPE
from ._registry import Convention, builds_rope, register
from .llm import rope_for_parameters

__all__ = ["LayerRoPE", "gemma", "llama4"]

GEMMA_SOURCE = "transformers 5.24.0 `models/gemma3/modeling_gemma3.py` `Gemma3RotaryEmbedding` (`layer_types`)"
LLAMA4_SOURCE = (
    "transformers 5.24.0 `models/llama4/modeling_llama4.py` `Llama4TextRotaryEmbedding`, `Llama4TextAttention`; "
    "`configuration_llama4.py` (`no_rope_layers`, `layer_types`)"
)
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True, eq=False)
class LayerRoPE:
    """The positional part of one layer.

    Attributes:
        rope: the layer's rope, or ``None`` for a NoPE layer (q and k not rotated).
        attention: ``"full_attention"``, ``"sliding_attention"`` or ``"chunked_attention"``.
        window: the sliding window or the attention chunk size (``None`` for full attention).
        temperature: Llama 4's query temperature on NoPE layers, ``(floor_scale, attn_scale)``, or ``None``.
    """

    rope: AxialRoPE | None
    attention: str = "full_attention"
    window: int | None = None
    temperature: tuple[float, float] | None = None

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Llama 4's factor on the queries of a NoPE layer: ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))``.

        ``positions`` are the absolute token positions (cache offset included); ``None`` without temperature.
        """
        if self.temperature is None:
            return None
        floor_scale, attn_scale = self.temperature
        p = positions.to(torch.float64)
        return torch.log1p(torch.floor((p + 1.0) / floor_scale)) * attn_scale + 1.0


@builds_rope
def gemma(
    layer_types: Sequence[str],
    rope_parameters: dict,
    head_dim: int = 256,
    *,
    sliding_window: int | None = None,
    max_position_embeddings: int | None = None,
    head_dims: dict[str, int] | None = None,
) -> list[LayerRoPE]:
    """Gemma 2 / 3 / 4 layers: one rope per layer type from ``rope_parameters[layer_type]``.

    Gemma 3: ``sliding_attention`` layers with the local base (``rope_local_base_freq``, 10000),
    ``full_attention`` layers with the global base (1e6, often ``linear`` x8); Gemma 4's global
    layers use ``proportional`` RoPE (:func:`~axial_rope.conventions.p_rope`) on their own
    ``head_dims["full_attention"]``. Half pairing.
    """
    ropes: dict[str, AxialRoPE] = {}
    layers = []
    for i, kind in enumerate(layer_types):
        if kind not in LAYER_TYPES:
            raise ValueError(f"gemma: layer_types[{i}] is {kind!r}, expected one of {LAYER_TYPES}")
        if kind not in rope_parameters:
            raise ValueError(
                f"gemma: rope_parameters has no entry for layer type {kind!r} (has {sorted(rope_parameters)})"
            )
        if kind not in ropes:
            dim = (head_dims or {}).get(kind, head_dim)
            ropes[kind] = rope_for_parameters(
                rope_parameters[kind], dim, max_position_embeddings=max_position_embeddings
            )
        window = sliding_window if kind == "sliding_attention" else None
        layers.append(LayerRoPE(ropes[kind], kind, window))
    return layers


@builds_rope
def llama4(
    num_hidden_layers: int,
    head_dim: int = 128,
    rope_parameters: dict | None = None,
    *,
    no_rope_layers: Sequence[int] | None = None,
    no_rope_layer_interval: int = 4,
    attention_chunk_size: int | None = 8192,
    attn_temperature_tuning: bool = True,
    floor_scale: float = 8192,
    attn_scale: float = 0.1,
    max_position_embeddings: int | None = None,
) -> list[LayerRoPE]:
    """Llama 4 text layers: RoPE layers with chunked attention, every ``no_rope_layer_interval``-th layer NoPE.

    ``no_rope_layers[i] == 1`` means layer ``i`` *uses* RoPE (transformers' naming); by default every
    4th layer is NoPE. RoPE layers: interleaved pairing, ``rope_parameters`` (``llama3`` scaling in the
    released models), ``chunked_attention`` of ``attention_chunk_size``. NoPE layers: full attention
    and, with ``attn_temperature_tuning``, the query temperature of :meth:`LayerRoPE.query_scale`.
    """
    if no_rope_layers is None or len(no_rope_layers) == 0:
        no_rope_layers = [int((i + 1) % no_rope_layer_interval != 0) for i in range(num_hidden_layers)]
    if len(no_rope_layers) != num_hidden_layers:
        raise ValueError(f"llama4: no_rope_layers has {len(no_rope_layers)} entries for {num_hidden_layers} layers")
    rope = rope_for_parameters(rope_parameters, head_dim, max_position_embeddings=max_position_embeddings,
                               interleaved=True)  # fmt: skip
    layers = []
    for use_rope in no_rope_layers:
        if use_rope:
            chunked = attention_chunk_size is not None
            layers.append(LayerRoPE(rope, "chunked_attention" if chunked else "full_attention", attention_chunk_size))
        else:
            temperature = (float(floor_scale), float(attn_scale)) if attn_temperature_tuning else None
            layers.append(LayerRoPE(None, "full_attention", None, temperature))
    return layers


register(
    Convention(
        name="gemma",
        family="layers",
        source=GEMMA_SOURCE,
        axes="one axis per layer type: local base 1e4 (sliding), global 1e6 (full; Gemma 4: p-RoPE)",
        pairing="half",
        positions="`position_ids`; sliding window per layer type",
        max_diff=3e-07,
        example=lambda: (
            gemma(
                ["sliding_attention", "full_attention"],
                {"sliding_attention": {"rope_theta": 10000.0}, "full_attention": {"rope_theta": 1e6}},
                16,
            )[1].rope
        ),  # fmt: skip
    )
)
register(
    Convention(
        name="llama4",
        family="layers",
        source=LLAMA4_SOURCE,
        axes="one axis on RoPE layers (llama3 scaling); every 4th layer NoPE",
        pairing="interleaved",
        positions="`position_ids`; chunked attention (8192) on RoPE layers, query temperature on NoPE layers",
        max_diff=5e-07,
        example=lambda: llama4(4, 16, {"rope_theta": 500000.0})[0].rope,
    )
)
