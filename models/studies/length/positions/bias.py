"""Relative position biases added to the attention logits: T5's learned buckets and ALiBi's fixed slopes.

Both turn a (query position, key position) pair into one number per head, added to
``q . k / sqrt(D)`` before the softmax. They reach :func:`torch.nn.functional.scaled_dot_product_attention`
as an additive float mask ``[1, H, S, S_k]``, which is why they cannot take the fused
causal (flash) path: the kernel must read an ``H x S x S_k`` tensor it would otherwise
never materialise (see :func:`models.gpt_positions.fused_path`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["ALiBi", "T5Bias", "alibi_slopes", "t5_bucket"]


def t5_bucket(relative: torch.Tensor, bidirectional: bool = False, num_buckets: int = 32, max_distance: int = 128):
    """T5's bucket of each relative position ``key - query`` (Raffel et al. 2020, section 2.1).

    Half the buckets (of one direction) hold the exact distances ``0 .. n/2 - 1``; the other
    half cover ``n/2 .. max_distance`` on a log scale; every farther distance shares the last
    bucket, so the bias of a distance never seen in training is that of ``max_distance``.
    Causal models use one direction (``bidirectional=False``): a key after the query counts
    as distance 0. Bidirectional: the first half of the buckets for keys before the query,
    the second for keys after it.

    Args:
        relative: int tensor of ``key_position - query_position``, any shape.

    Returns:
        int64 buckets in ``[0, num_buckets)``, the shape of ``relative``.
    """
    relative = relative.long()
    offset = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        offset = (relative > 0).long() * num_buckets  # keys after the query: the upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # how far back the key is; keys ahead: 0
    exact = num_buckets // 2
    # log-spaced buckets from `exact` to `max_distance`; the clamp(min=1) only guards log(0) (those are exact)
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + (scaled * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(distance < exact, distance, far)


class T5Bias(nn.Module):
    """A learned bias per (bucket, head), shared by every layer as in T5: ``[1, H, S, S_k]`` from positions."""

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, num_heads)  # [buckets, H]: the scheme's only parameters

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """``q_pos [S]``, ``k_pos [S_k]`` (int) -> additive bias ``[1, H, S, S_k]``."""
        buckets = t5_bucket(k_pos[None, :] - q_pos[:, None], False, self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)[None]  # [S, S_k, H] -> [1, H, S, S_k]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's head slopes (Press et al. 2022, section 3): ``[H]`` float32.

    For ``n`` a power of two, the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``.
    Otherwise the slopes of the largest power of two ``p < n``, then every other slope of
    ``2p`` (the odd-numbered ones) until there are ``n`` (the paper's rule, its footnote and code).
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    p = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(p) + geometric(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(nn.Module):
    """``-m_h * (query - key)``: a linear penalty on distance, one fixed slope per head; no parameters."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)  # [H]

    def reset_parameters(self) -> None:
        """The slopes recomputed (a module built on the meta device gets them here, after ``to_empty``)."""
        with torch.device("cpu"):
            self.slopes.copy_(alibi_slopes(self.slopes.shape[0]))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """``q_pos [S]``, ``k_pos [S_k]`` (int) -> additive bias ``[1, H, S, S_k]``; keys ahead get 0 (masked anyway)."""
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()  # [S, S_k]
        return (-self.slopes[:, None, None] * distance)[None]
