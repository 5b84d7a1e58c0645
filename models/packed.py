"""Patches of one latent for a packed forward (the blocks take ``segments=``: :class:`axial_rope.DiTBlock`)."""

from __future__ import annotations

import torch

__all__ = ["patch_tokens"]


def patch_tokens(x: torch.Tensor, patch: int, index: int = 0) -> torch.Tensor:
    """One latent ``[C, H, W]`` -> its patches ``[H / p, W / p, C p p]``, channels ordered as the patch conv's weight."""
    if x.ndim != 3:
        raise ValueError(f"item {index}: a latent must be [C, H, W], got shape {tuple(x.shape)}")
    C, H, W = x.shape
    if H % patch or W % patch:
        raise ValueError(f"item {index}: sides {H} x {W} must be divisible by the patch size {patch}")
    h, w = H // patch, W // patch
    return x.reshape(C, h, patch, w, patch).permute(1, 3, 0, 2, 4).reshape(h, w, C * patch * patch)
