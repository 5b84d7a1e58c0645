"""The length study's position scheme: one frozen record of the options, answering :class:`models.gpt.RoPEPositions`' calls.

``GPT(config, positions=StudyPositions(position="alibi", window=64))`` builds the reference GPT with
that scheme; the fields are the study's (they were once fields of ``GPTConfig``, which now holds sizes
and RoPE settings only). A saved run names its preset (``lm-*``, :mod:`.presets`), which gives both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import axial_rope as ar
from axial_rope.attention import Attention

from ....gpt import GPTConfig, RoPEPositions
from .absolute import LearnedPositions, SinusoidalPositions
from .bias import ALiBi, T5Bias
from .dual_chunk import DualChunk, DualChunkAttention
from .linear import LinearAttention, LinearState

__all__ = ["ATTENTIONS", "POSITIONS", "StudyPositions", "attention_mask", "fused_path", "window_mask"]

POSITIONS = ("rope", "nope", "sinusoidal", "learned", "t5", "alibi")
ATTENTIONS = ("softmax", "linear")
BIASED = ("t5", "alibi")  # schemes that add a bias to the logits (an explicit SDPA mask)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"StudyPositions: {name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class StudyPositions(RoPEPositions):
    """How positions enter the model; every combination is checked against the model's config.

    Args:
        position: one of :data:`POSITIONS`.
        attention: ``"softmax"`` or ``"linear"`` (Su et al.'s linear attention; rope or nope).
        window: sliding window: each token attends to the last ``window`` tokens (itself included).
        dual_chunk: Dual Chunk Attention (rope, training-free).
        t5_buckets, t5_max_distance: T5's relative bias: buckets per direction and the distance from which
            all share the last bucket.
    """

    position: str = "rope"
    attention: str = "softmax"
    window: int | None = None
    dual_chunk: DualChunk | None = None
    t5_buckets: int = 32
    t5_max_distance: int = 128

    fixed_modules = (ALiBi,)

    def __post_init__(self):
        if self.position not in POSITIONS:
            raise ValueError(f"StudyPositions: position must be one of {POSITIONS}, got {self.position!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"StudyPositions: attention must be one of {ATTENTIONS}, got {self.attention!r}")
        for name in ("t5_buckets", "t5_max_distance"):
            _positive_int(name, getattr(self, name))
        if self.window is not None:
            _positive_int("window", self.window)
        if self.dual_chunk is not None:
            if not isinstance(self.dual_chunk, DualChunk):
                raise ValueError(f"StudyPositions: dual_chunk must be a DualChunk or None, got {self.dual_chunk!r}")
            if self.position != "rope" or self.attention != "softmax":
                raise ValueError(
                    "StudyPositions: dual_chunk remaps RoPE positions in softmax attention (position='rope')"
                )
        if self.attention == "linear":
            if self.position not in ("rope", "nope"):
                raise ValueError(
                    f"StudyPositions: linear attention takes position 'rope' or 'nope', got {self.position!r}"
                )
            if self.window is not None:
                raise ValueError("StudyPositions: linear attention has no sliding window (its state sums every token)")

    def check(self, config: GPTConfig) -> None:
        """Raise ``ValueError`` where the scheme and the model's config do not go together."""
        if config.scaling is not None and self.position != "rope":
            raise ValueError(f"a RoPE scaling needs position='rope', got position={self.position!r}")
        if self.position == "sinusoidal" and config.hidden_size % 2:
            raise ValueError(f"sinusoidal positions need an even hidden_size, got {config.hidden_size}")

    def uses_rope(self, config: GPTConfig) -> bool:
        return self.position == "rope"

    def make_attention(self, config: GPTConfig, rope: ar.AxialRoPE | None, **kwargs) -> nn.Module:
        if self.attention == "linear":
            return LinearAttention(config.hidden_size, config.num_heads, rope, **kwargs)
        if self.dual_chunk is not None:
            return DualChunkAttention(config.hidden_size, config.num_heads, rope, dual_chunk=self.dual_chunk, **kwargs)
        return Attention(config.hidden_size, config.num_heads, rope, **kwargs)

    def make_embedding(self, config: GPTConfig) -> nn.Module | None:
        if self.position == "sinusoidal":
            return SinusoidalPositions(config.hidden_size)
        if self.position == "learned":
            return LearnedPositions(config.max_seq_len, config.hidden_size)
        return None

    def make_bias(self, config: GPTConfig) -> nn.Module | None:
        if self.position == "t5":
            return T5Bias(config.num_heads, self.t5_buckets, self.t5_max_distance)
        if self.position == "alibi":
            return ALiBi(config.num_heads)
        return None

    def mask(self, bias, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return attention_mask(bias, self.window, q_pos, k_pos)

    def new_caches(self, config: GPTConfig, batch_size: int, max_seq_len: int, dtype, device) -> list | None:
        if self.attention != "linear":
            return None
        kw = {"dtype": dtype, "device": device}
        return [
            LinearState(batch_size, config.num_heads, config.head_dim, max_seq_len, **kw) for _ in range(config.depth)
        ]

    def check_decode(self, model, last: int) -> None:
        if self.position == "learned":  # the table ends at max_seq_len
            model.absolute.check(last)

    def streaming_refusal(self, config: GPTConfig) -> str | None:
        if self.position == "rope" and self.attention == "softmax" and self.window is None and self.dual_chunk is None:
            return None
        return (
            f"position={self.position!r}, attention={self.attention!r}, window={self.window}, "
            f"dual_chunk={self.dual_chunk}"
        )


def fused_path(p: StudyPositions) -> tuple[bool, str]:
    """Whether a scheme's full-sequence attention runs SDPA without an explicit mask (``is_causal=True``: the
    flash or memory-efficient kernel), and why not where it does not."""
    if p.attention == "linear":
        return False, "linear attention: no softmax kernel; two masked S x S products (recurrent form when decoding)"
    if p.dual_chunk is not None:
        return (
            False,
            "three query rotations merged into one explicit S x S_k score matrix (vLLM: 3 flash calls + merge)",
        )
    if p.position in BIASED:
        return False, "the bias is an additive float mask [1, H, S, S_k]: SDPA must read it, no flash kernel"
    if p.window is not None:
        return False, "the window is a boolean mask [S, S_k] (SDPA has no window argument; flash-attn has one)"
    return True, "no mask: SDPA's fused causal kernel (is_causal=True)"


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """``[S, S_k]`` bool: key within the last ``window`` positions of the query (itself included; causality apart)."""
    return k_pos[None, :] > q_pos[:, None] - window


def attention_mask(bias, window: int | None, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
    """The SDPA mask of a forward: ``None`` (fused path), a window ``[S, S_k]`` bool, or an additive bias
    ``[1, H, S, S_k]`` (``-inf`` outside the window). Causality and unwritten cache slots are added by attention."""
    if bias is None:
        return None if window is None else window_mask(q_pos, k_pos, window)
    mask = bias(q_pos, k_pos)  # [1, H, S, S_k]
    if window is not None:
        mask = mask.masked_fill(~window_mask(q_pos, k_pos, window), float("-inf"))
    return mask
