"""Patches of one latent for a packed forward (the blocks take ``segments=``: :class:`axial_rope.DiTBlock`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["patch_tokens"]


def patch_tokens(x: torch.Tensor, patch: int | Sequence[int], index: int = 0) -> torch.Tensor:
    """One latent ``[C, H, W]`` (or ``[C, T, H, W]``) -> its patches ``[h, w, C p_y p_x]`` (``[t, h, w, ...]``),
    channels ordered as the patch conv's flattened weight ``[dim, C, *patch]``; ``patch``: ``p`` or one per axis."""
    given = patch
    n = len(patch) if isinstance(patch, Sequence) else 2
    patch = tuple(patch) if isinstance(patch, Sequence) else (patch,) * n
    if x.ndim != n + 1:
        dims = "[C, T, H, W]" if n == 3 else "[C, H, W]"
        raise ValueError(f"item {index}: a latent must be {dims}, got shape {tuple(x.shape)}")
    C, *sizes = x.shape
    if any(s % p for s, p in zip(sizes, patch)):
        raise ValueError(
            f"item {index}: sides {' x '.join(map(str, sizes))} must be divisible by the patch size {given}"
        )
    grid = [s // p for s, p in zip(sizes, patch)]
    x = x.reshape(C, *(v for g, p in zip(grid, patch) for v in (g, p)))  # [C, g0, p0, g1, p1, ...]
    order = [1 + 2 * a for a in range(n)] + [0] + [2 + 2 * a for a in range(n)]  # grid axes, C, patch axes
    return x.permute(order).reshape(*grid, C * math.prod(patch))
