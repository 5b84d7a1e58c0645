"""One-axis language-model conventions of transformers: Llama, GPT-NeoX partial rotary, p-RoPE (proportional)."""

from __future__ import annotations

import torch

from ..frequencies import Frequencies
from ..hf_config import layer_entry
from ..rope import AxialRoPE
from ..scaling import base_inv_freq, from_rope_parameters
from ._registry import Convention, builds_rope, register
from .qwen_vl import check_mrope_section

__all__ = ["llama", "gpt_neox", "p_rope", "rope_for_parameters"]

# rope_parameters keys of the proportional type: what `_validate_proportional_rope_parameters` accepts (with the
# legacy `type`), the `factor` `_compute_proportional_rope_parameters` reads, and the model's lengths (hf_config)
_PROPORTIONAL_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                "max_position_embeddings", "original_max_position_embeddings"})  # fmt: skip

LLAMA_SOURCE = (
    "transformers 5.24.0 `models/llama/modeling_llama.py` `LlamaRotaryEmbedding` (+ `modeling_rope_utils.py`)"
)
NEOX_SOURCE = "transformers 5.24.0 `models/gpt_neox/modeling_gpt_neox.py` `GPTNeoXRotaryEmbedding`"
PROP_SOURCE = "transformers 5.24.0 `modeling_rope_utils.py` `_compute_proportional_rope_parameters` (Gemma 4)"


@builds_rope
def llama(
    head_dim: int = 128,
    rope_theta: float = 10000.0,
    rope_parameters: dict | None = None,
    *,
    max_position_embeddings: int | None = None,
    interleaved: bool = False,
) -> AxialRoPE:
    """A transformers decoder's RoPE: ``theta ** (-2j / D)`` over the head, half pairing, scaled by ``rope_parameters``.

    ``rope_parameters`` (or ``rope_scaling``) picks the scaling method (:func:`axial_rope.scaling.from_rope_parameters`);
    ``interleaved=True`` for the models that pair ``(2j, 2j+1)`` (Llama 4, Cohere, GLM, ...:
    :data:`~axial_rope.conventions.model_types.INTERLEAVED_MODEL_TYPES`).
    """
    scaling = from_rope_parameters(rope_parameters, max_position_embeddings=max_position_embeddings)
    return AxialRoPE(head_dim, theta=rope_theta, scaling=scaling, pairing="interleaved" if interleaved else "half")


def _rotary_planes(head_dim: int, partial_rotary_factor: float, rule: str) -> int:
    if not isinstance(partial_rotary_factor, (int, float)) or not 0 < partial_rotary_factor <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
    return int(head_dim * partial_rotary_factor) if rule == "neox" else int(partial_rotary_factor * head_dim // 2)


@builds_rope
def gpt_neox(head_dim: int = 64, rope_theta: float = 10000.0, partial_rotary_factor: float = 0.25) -> AxialRoPE:
    """GPT-NeoX (Pythia) partial rotary: the first ``int(D * partial_rotary_factor)`` channels rotate, half-paired
    among themselves; the rest pass through. (Channels, not a mask: the half pairing spans the rotary width.)
    """
    rot_dim = _rotary_planes(head_dim, partial_rotary_factor, "neox")
    if rot_dim % 2 or rot_dim == 0:
        raise ValueError(
            f"partial_rotary_factor {partial_rotary_factor} gives {rot_dim} rotary channels of head_dim {head_dim}: "
            "need an even number > 0"
        )
    return AxialRoPE(rot_dim, theta=rope_theta, pairing="half")


@builds_rope
def p_rope(
    head_dim: int = 256, rope_theta: float = 1000000.0, partial_rotary_factor: float = 0.25, factor: float = 1.0
) -> AxialRoPE:
    """p-RoPE (transformers' ``proportional``, Gemma 4's global layers): a mask on the full spectrum.

    The head keeps its spectrum ``theta ** (-2j / D) / factor`` on the first ``int(p * D // 2)`` planes
    and leaves the other (lowest-frequency) planes unrotated, half pairing over the whole head: a
    frequency model with zero columns, unlike GPT-NeoX's narrower rotary width.
    """
    kept = _rotary_planes(head_dim, partial_rotary_factor, "proportional")
    values = base_inv_freq(head_dim, rope_theta) / factor
    keep = torch.arange(head_dim // 2) < kept
    model = Frequencies.axial([0] * (head_dim // 2), values, n_axes=1).masked(keep)
    return AxialRoPE.from_frequencies(model, pairing="half")


@builds_rope
def rope_for_parameters(
    params: dict | None,
    head_dim: int,
    *,
    max_position_embeddings: int | None = None,
    interleaved: bool = False,
    mrope_interleaved: bool = False,
) -> AxialRoPE:
    """The rope of one transformers ``rope_parameters`` dict (``rope_theta``, ``rope_type``, scaling fields,
    ``partial_rotary_factor``, ``mrope_section``/``mrope_interleaved``) for a head of ``head_dim`` channels.

    ``rope_type="proportional"`` is :func:`p_rope`; ``mrope_section`` the Qwen-VL M-RoPE (contiguous, or
    cycled with ``mrope_interleaved``; GLM-OCR's with ``interleaved`` pairing); ``partial_rotary_factor``
    narrows the rotary width (GPT-NeoX rule). ``interleaved`` pairs ``(2j, 2j+1)``, else half pairing.
    Unknown keys and inconsistent values raise ``ValueError`` naming the key.
    """
    params = layer_entry(dict(params or {}))  # without per-layer entries nested in it (transformers reads flat keys)
    theta = params.get("rope_theta", 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    factor = params.get("partial_rotary_factor")
    factor = 1.0 if factor is None else factor
    if kind == "proportional":
        unknown = sorted(set(params) - _PROPORTIONAL_KEYS)
        if unknown:
            raise ValueError(
                f"rope_type 'proportional': unknown key(s) {unknown}; valid keys are {sorted(_PROPORTIONAL_KEYS)}"
            )
        return p_rope(head_dim, theta, factor, params.get("factor") or 1.0)
    scaling = from_rope_parameters(params, max_position_embeddings=max_position_embeddings)
    section = params.get("mrope_section")
    if section is not None:
        if factor != 1.0:
            raise ValueError(f"mrope_section with partial_rotary_factor {factor}: M-RoPE sections cover the whole head")
        section = check_mrope_section(section, head_dim)
        spectrum = "cycled" if params.get("mrope_interleaved") or mrope_interleaved else "split"
        pairing = "interleaved" if interleaved else "half"
        return AxialRoPE(tuple(2 * s for s in section), theta, scaling, pairing=pairing, spectrum=spectrum)
    rot_dim = _rotary_planes(head_dim, factor, "neox")
    if rot_dim % 2 or rot_dim == 0:
        raise ValueError(f"partial_rotary_factor {factor} gives {rot_dim} rotary channels of head_dim {head_dim}: "
                         "need an even number > 0")  # fmt: skip
    return AxialRoPE(rot_dim, theta, scaling, pairing="interleaved" if interleaved else "half")


register(
    Convention(
        name="llama",
        family="llm",
        source=LLAMA_SOURCE,
        axes="one axis: D/2 planes (scaled by `rope_parameters`)",
        pairing="half",
        positions="`position_ids`",
        max_diff=6e-07,
        example=lambda: llama(16),
    )
)
register(
    Convention(
        name="gpt_neox",
        family="llm",
        source=NEOX_SOURCE,
        axes="one axis: int(D x partial_rotary_factor) channels, the rest pass",
        pairing="half (within the rotary width)",
        positions="`position_ids`",
        max_diff=2e-07,
        example=lambda: gpt_neox(32, partial_rotary_factor=0.5),
    )
)
register(
    Convention(
        name="p_rope",
        family="llm",
        source=PROP_SOURCE,
        axes="one axis: first int(p D / 2) planes of theta^(-2j/D), the rest unrotated (zero columns)",
        pairing="half (whole head)",
        positions="`position_ids`",
        max_diff=4e-07,
        example=lambda: p_rope(16, partial_rotary_factor=0.5),
    )
)
