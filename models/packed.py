"""The DiT pieces of a packed forward: patches of one latent, and blocks whose conditioning is per item.

A packed sequence ``x [1, T, C]`` holds the tokens of ``N`` items; the adaLN conditioning
``c [N, C]`` is one vector per item. The modulation ``Linear(SiLU(c))`` is computed per item
(``N`` rows) and then gathered per token by the items' segment ids: the same numbers as a
per-token conditioning ``c[ids]``, at ``N / T`` of its cost (with 6C outputs per row, a
per-token modulation would add half the FLOPs of a tiny DiT's block). Attention gets the
segments, so it stays within each item (:func:`axial_rope.varlen.varlen_attention`). The gather is
``index_select``, whose backward (``index_add_``) is several times faster on CPU than plain indexing's.
"""

from __future__ import annotations

import torch

from axial_rope.layers import DiTBlock, FinalLayer, modulate
from axial_rope.varlen import Segments

__all__ = ["packed_block", "packed_final", "patch_tokens"]


def patch_tokens(x: torch.Tensor, patch: int, index: int = 0) -> torch.Tensor:
    """One latent ``[C, H, W]`` -> its patches ``[H / p, W / p, C p p]``, channels ordered as the patch conv's weight."""
    if x.ndim != 3:
        raise ValueError(f"item {index}: a latent must be [C, H, W], got shape {tuple(x.shape)}")
    C, H, W = x.shape
    if H % patch or W % patch:
        raise ValueError(f"item {index}: sides {H} x {W} must be divisible by the patch size {patch}")
    h, w = H // patch, W // patch
    return x.reshape(C, h, patch, w, patch).permute(1, 3, 0, 2, 4).reshape(h, w, C * patch * patch)


def packed_block(
    block: DiTBlock,
    x: torch.Tensor,
    c: torch.Tensor,
    ids: torch.Tensor,
    pos: torch.Tensor,
    rope,
    segments: Segments,
) -> torch.Tensor:
    """:meth:`DiTBlock.forward` on a packed sequence: x ``[1, T, C]``, c ``[N, C]`` per item, ids ``[T]`` item of each token."""
    mods = block.adaLN_modulation(c).index_select(0, ids)[None].chunk(6, dim=-1)  # each [1, T, C]
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
    h = modulate(block.norm1(x), shift_msa, scale_msa)
    x = x + gate_msa * block.attn(h, pos, rope=rope, segments=segments)
    return x + gate_mlp * block.mlp(modulate(block.norm2(x), shift_mlp, scale_mlp))


def packed_final(final: FinalLayer, x: torch.Tensor, c: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """:meth:`FinalLayer.forward` with per-item conditioning: x ``[1, T, C]`` -> ``[1, T, prod(patch) * out]``."""
    shift, scale = final.adaLN_modulation(c).index_select(0, ids)[None].chunk(2, dim=-1)
    return final.linear(modulate(final.norm_final(x), shift, scale))
