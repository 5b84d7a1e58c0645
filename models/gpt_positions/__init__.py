"""The position schemes of the reference language model (:mod:`models.gpt`), one option each.

``GPTConfig.position`` picks how positions enter the model:

- ``"rope"``: rotary embedding of q and k (Su et al. 2021), with any scaling of :mod:`axial_rope.scaling`;
- ``"nope"``: no positions at all; causal masking alone tells the tokens apart (Kazemnejad et al. 2023);
- ``"sinusoidal"``: fixed sinusoids added to the embeddings (Vaswani et al. 2017);
- ``"learned"``: a learned table added to the embeddings (GPT-2); positions past it raise;
- ``"t5"``: a learned bias per head and log-spaced distance bucket (Raffel et al. 2020);
- ``"alibi"``: a fixed linear distance penalty per head (Press et al. 2022).

Orthogonal to it: ``attention="linear"`` (Su et al.'s linear attention, rope or nope),
``window`` (sliding-window attention: each token sees the last ``window`` tokens) and
``dual_chunk`` (:class:`DualChunk`, training-free Dual Chunk Attention on a RoPE model).
:func:`fused_path` says which combinations keep PyTorch's fused causal kernel.
"""

from __future__ import annotations

import torch

from .absolute import LearnedPositions, PositionTableError, SinusoidalPositions, sinusoids
from .bias import ALiBi, T5Bias, alibi_slopes, t5_bucket
from .dual_chunk import DualChunk, DualChunkAttention
from .linear import LinearAttention, LinearState, feature_map

__all__ = [
    "ALiBi",
    "ATTENTIONS",
    "DualChunk",
    "DualChunkAttention",
    "LearnedPositions",
    "LinearAttention",
    "LinearState",
    "POSITIONS",
    "PositionTableError",
    "SinusoidalPositions",
    "T5Bias",
    "alibi_slopes",
    "attention_mask",
    "check_config",
    "feature_map",
    "fused_path",
    "sinusoids",
    "t5_bucket",
]

POSITIONS = ("rope", "nope", "sinusoidal", "learned", "t5", "alibi")
ATTENTIONS = ("softmax", "linear")
BIASED = ("t5", "alibi")  # schemes that add a bias to the logits (an explicit SDPA mask)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"GPTConfig: {name} must be an int >= 1, got {value!r}")


def check_config(c) -> None:
    """Raise ``ValueError`` for a :class:`~models.gpt.GPTConfig` whose position options do not go together."""
    if c.position not in POSITIONS:
        raise ValueError(f"GPTConfig: position must be one of {POSITIONS}, got {c.position!r}")
    if c.attention not in ATTENTIONS:
        raise ValueError(f"GPTConfig: attention must be one of {ATTENTIONS}, got {c.attention!r}")
    if c.scaling is not None and c.position != "rope":
        raise ValueError(f"GPTConfig: a RoPE scaling needs position='rope', got position={c.position!r}")
    for name in ("t5_buckets", "t5_max_distance", "max_seq_len"):
        _positive_int(name, getattr(c, name))
    if c.window is not None:
        _positive_int("window", c.window)
    if c.dual_chunk is not None:
        if not isinstance(c.dual_chunk, DualChunk):
            raise ValueError(f"GPTConfig: dual_chunk must be a DualChunk or None, got {c.dual_chunk!r}")
        if c.position != "rope" or c.attention != "softmax":
            raise ValueError("GPTConfig: dual_chunk remaps RoPE positions in softmax attention (position='rope')")
    if c.attention == "linear":
        if c.position not in ("rope", "nope"):
            raise ValueError(f"GPTConfig: linear attention takes position 'rope' or 'nope', got {c.position!r}")
        if c.window is not None:
            raise ValueError("GPTConfig: linear attention has no sliding window (its state sums every token)")
    if c.position == "sinusoidal" and c.hidden_size % 2:
        raise ValueError(f"GPTConfig: sinusoidal positions need an even hidden_size, got {c.hidden_size}")


def fused_path(c) -> tuple[bool, str]:
    """Whether a config's full-sequence attention runs SDPA without an explicit mask (``is_causal=True``: the
    flash or memory-efficient kernel), and why not where it does not."""
    if c.attention == "linear":
        return False, "linear attention: no softmax kernel; two masked S x S products (recurrent form when decoding)"
    if c.dual_chunk is not None:
        return (
            False,
            "three query rotations merged into one explicit S x S_k score matrix (vLLM: 3 flash calls + merge)",
        )
    if c.position in BIASED:
        return False, "the bias is an additive float mask [1, H, S, S_k]: SDPA must read it, no flash kernel"
    if c.window is not None:
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
