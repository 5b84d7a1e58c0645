"""Lumina-Image 2.0 (diffusers ``Lumina2RotaryPosEmbed``): three-axis ids for caption and image tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..positions import grid, text_positions
from ..rope import AxialRoPE
from ._registry import Convention, builds_rope, register

__all__ = ["lumina2", "lumina2_positions"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_lumina2.py` `Lumina2RotaryPosEmbed`"


@builds_rope
def lumina2(
    axes_dim_rope: Sequence[int] = (32, 32, 32), axes_lens: Sequence[int] = (300, 512, 512), theta: float = 10000.0
) -> AxialRoPE:
    """Lumina-Image 2.0 from its config: per-axis spectra over ``(index, y, x)``, interleaved (complex), ``bshd``.

    ``axes_lens`` only bounds the positions upstream's precomputed tables hold (each coordinate of
    axis ``a`` must stay below ``axes_lens[a]`` there); the frequencies do not depend on it.
    """
    if len(tuple(axes_lens)) != len(tuple(axes_dim_rope)):
        raise ValueError(f"lumina2: axes_lens {tuple(axes_lens)} needs one length per axis of {tuple(axes_dim_rope)}")
    return AxialRoPE(tuple(axes_dim_rope), theta=theta, pairing="interleaved")


def lumina2_positions(caption_length: int, height: int, width: int, *, dtype=torch.float32) -> torch.Tensor:
    """Lumina 2's ids: caption token ``i`` at ``(i, 0, 0)``, then the image grid at ``(L, y, x)``.

    ``height`` and ``width`` count tokens (after the patches). Returns ``[L + height * width, 3]``.
    """
    caption = text_positions(caption_length, 3, dtype=dtype)
    caption[:, 1:] = 0
    return torch.cat([caption, grid(1, height, width, offset=(caption_length, 0, 0), dtype=dtype)])


register(
    Convention(
        name="lumina2",
        family="lumina",
        source=SOURCE,
        axes="(index, y, x): 32, 32, 32",
        pairing="interleaved",
        positions="caption (i, 0, 0), image (L, y, x)",
        max_diff=3e-08,
        example=lambda: lumina2((4, 6, 6), (8, 8, 8)),
    )
)
