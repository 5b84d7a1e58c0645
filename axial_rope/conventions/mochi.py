"""Mochi (diffusers ``MochiRoPE``): learned frequencies that mix the three axes, one set per head."""

from __future__ import annotations

import math

import torch

from ..frequencies import Frequencies
from ..rope import AxialRoPE
from ._registry import Convention, builds_rope, register

__all__ = ["mochi", "mochi_positions"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_mochi.py` `MochiRoPE`"


@builds_rope
def mochi(
    num_attention_heads: int = 24,
    attention_head_dim: int = 128,
    pos_frequencies: torch.Tensor | None = None,
    *,
    learnable: bool = False,
) -> AxialRoPE:
    """Mochi from its config and its ``pos_frequencies`` parameter ``[3, H, D/2]`` (axes ``t, y, x``).

    Plane ``j`` of head ``h`` turns by ``sum_a pos[a] * pos_frequencies[a, h, j]``: a dense per-head
    ``F`` (``[H, 3, D/2]``), interleaved planes, ``bshd``. Without ``pos_frequencies`` it starts from
    zeros, as the untrained model does; ``learnable=True`` makes it a trainable parameter.
    """
    shape = (3, num_attention_heads, attention_head_dim // 2)
    if pos_frequencies is None:
        pos_frequencies = torch.zeros(shape)
    if tuple(pos_frequencies.shape) != shape:
        raise ValueError(f"mochi: pos_frequencies must have shape {shape}, got {tuple(pos_frequencies.shape)}")
    F = pos_frequencies.detach().to(torch.float64).permute(1, 0, 2)  # [H, 3, D/2]
    return AxialRoPE.from_frequencies(Frequencies(F), pairing="interleaved", learnable=learnable)


def mochi_positions(
    frames: int, height: int, width: int, *, base_height: int = 192, base_width: int = 192, dtype=torch.float32
) -> torch.Tensor:
    """Mochi's token coordinates ``(t, y, x)`` for a ``frames x height x width`` token grid.

    Time is the frame index; y and x are the centres of ``height`` (``width``) equal cells spanning
    ``[-n s / 2, n s / 2]`` with ``s = sqrt(base_height * base_width / (height * width))``, so every
    resolution covers the same area: ``s (i + 1/2 - n / 2)``.
    """
    s = math.sqrt(base_height * base_width / (height * width))
    t = torch.arange(frames, dtype=torch.float64)
    y = s * (torch.arange(height, dtype=torch.float64) + 0.5 - height / 2)
    x = s * (torch.arange(width, dtype=torch.float64) + 0.5 - width / 2)
    return torch.stack(torch.meshgrid(t, y, x, indexing="ij"), dim=-1).reshape(-1, 3).to(dtype)


def _example() -> AxialRoPE:
    gen = torch.Generator().manual_seed(0)
    return mochi(2, 16, torch.randn(3, 2, 8, generator=gen) * 0.3)


register(
    Convention(
        name="mochi",
        family="mochi",
        source=SOURCE,
        axes="(t, y, x) mixed in every plane: learned `pos_frequencies` [3, H, D/2]; per head",
        pairing="interleaved",
        positions="frame index; y, x cell centres scaled to the 192 x 192 base area",
        max_diff=5e-06,
        example=_example,
    )
)
