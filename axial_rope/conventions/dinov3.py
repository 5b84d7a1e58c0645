"""DINOv3: patch centres normalised to [-1, 1], periods ``base ** (4j / D)``, turned by ``2 pi c / period``."""

from __future__ import annotations

import math

import torch

from ..frequencies import Frequencies, PositionTransform
from ..rope import AxialRoPE
from ._registry import Convention, builds_rope, register

__all__ = ["dinov3"]

SOURCE = "transformers 5.24.0 `models/dinov3_vit/modeling_dinov3_vit.py` `DINOv3ViTRopePositionEmbedding`"


@builds_rope
def dinov3(
    head_dim: int = 64,
    rope_theta: float | None = 100.0,
    *,
    normalize_coords: str = "separate",
    min_period: float | None = None,
    max_period: float | None = None,
) -> AxialRoPE:
    """DINOv3's RoPE from its config: two axes ``(y, x)`` of ``D / 4`` planes each, half pairing.

    Periods ``rope_theta ** (2j / (D / 2))``, or ``min_period * (max_period / min_period) ** linspace(0, 1)``
    (timm's ``RotaryEmbeddingDinoV3``); plane ``j`` of axis ``a`` turns by ``2 pi c_a / period_j``. The
    coordinates ``c`` are the patch centres in ``[-1, 1]``: the position map normalises integer grid
    positions (``ar.grid(H, W)``) by the axis' extent (``"separate"``, DINOv3's default) or the largest /
    smallest one. The class and register tokens are not rotated.
    """
    if head_dim % 4:
        raise ValueError(f"dinov3: head_dim must be divisible by 4, got {head_dim!r}")
    n = head_dim // 4
    if min_period is not None and max_period is not None:
        periods = min_period * (max_period / min_period) ** torch.linspace(0, 1, n, dtype=torch.float64)
    elif rope_theta is not None:
        periods = rope_theta ** (4 * torch.arange(n, dtype=torch.float64) / head_dim)
    else:
        raise ValueError("dinov3: give rope_theta, or both min_period and max_period")
    values = 2 * math.pi / periods
    model = Frequencies.axial([0] * n + [1] * n, torch.cat([values, values]), n_axes=2,
                              transform=PositionTransform(normalize=normalize_coords))  # fmt: skip
    return AxialRoPE.from_frequencies(model, pairing="half")


register(
    Convention(
        name="dinov3",
        family="dinov3",
        source=SOURCE,
        axes="(y, x): D/4 planes each, periods base^(4j/D)",
        pairing="half",
        positions="integer grid normalised to patch centres in [-1, 1] (position map); prefix tokens unrotated",
        max_diff=4e-07,
        example=lambda: dinov3(16),
    )
)
