"""Wan (diffusers ``WanRotaryPosEmbed``): a head split as t = D - 2 (2 floor(D / 6)), h = w = 2 floor(D / 6)."""

from __future__ import annotations

import torch

from ..positions import grid
from ..rope import AxialRoPE
from ._registry import (
    Convention,
    DiffusersFamily,
    PipelineUnits,
    TrainedGrid,
    builds_rope,
    register,
    register_diffusers,
)
from .fields import field, size
from .tables import latent_positions

__all__ = ["wan", "wan_axes_dim", "video_grid_positions"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_wan.py` `WanRotaryPosEmbed`"


def wan_axes_dim(attention_head_dim: int) -> tuple[int, int, int]:
    """Wan's split of a head: ``h = w = 2 * (D // 6)``, ``t = D - h - w`` (44, 42, 42 for D = 128)."""
    if attention_head_dim % 2 or attention_head_dim < 6:
        raise ValueError(f"wan: attention_head_dim must be even and >= 6, got {attention_head_dim!r}")
    hw = 2 * (attention_head_dim // 6)
    return attention_head_dim - 2 * hw, hw, hw


@builds_rope
def wan(attention_head_dim: int = 128, theta: float = 10000.0) -> AxialRoPE:
    """Wan's RoPE from ``attention_head_dim``: per-axis spectra over ``(t, y, x)``, interleaved, ``bshd``."""
    return AxialRoPE(wan_axes_dim(attention_head_dim), theta=theta, pairing="interleaved")


def video_grid_positions(
    frames: int, height: int, width: int, patch_size: tuple[int, int, int] = (1, 2, 2), *, dtype=torch.float32
) -> torch.Tensor:
    """The integer token grid ``(t, y, x)`` of a latent video ``[.., frames, height, width]`` cut into patches.

    Returns:
        ``[T * H * W, 3]`` with ``T, H, W = frames // p_t, height // p_h, width // p_w``, t slowest.
    """
    p_t, p_h, p_w = patch_size
    return grid(frames // p_t, height // p_h, width // p_w, dtype=dtype)


register(
    Convention(
        name="wan",
        family="wan",
        source=SOURCE,
        axes="(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6) (44, 42, 42 at D = 128)",
        pairing="interleaved",
        positions="integer latent grid after the (1, 2, 2) patches",
        max_diff=0.0,
        example=lambda: wan(24),
    )
)

WAN_TRAINED_SOURCE = (
    "github.com/Wan-Video/Wan2.1 `wan/configs/__init__.py` SUPPORTED_SIZES (t2v-1.3B: 480 x 832; t2v-14B, i2v-14B: "
    "720 x 1280, 1280 x 720, 480 x 832, 832 x 480), `generate.py` frame_num 81; Wan2.2's configs repeat them for "
    "A14B; arXiv:2503.20314"
)
register_diffusers(
    DiffusersFamily(
        name="wan",
        classes=("WanTransformer3DModel",),
        rope=lambda c: wan(size(c, "attention_head_dim")),  # WanRotaryPosEmbed's theta is fixed at 10000
        tables=("module", "rope"),  # WanRotaryPosEmbed(hidden_states): the latent video
        positions=latent_positions(lambda c: tuple(field(c, "patch_size"))),
        layout=lambda cos, sin: (cos[None, :, None], sin[None, :, None]),  # [1, S, 1, D]
        stock=("WanAttnProcessor",),
        processor="WanRopeProcessor",
        blocks=("blocks.",),
        qk_norm="rms across heads",  # WanAttnProcessor: norm_q, norm_k (RMSNorm over H * D), then apply_rotary_emb
        max_diff=0.0,
        source=SOURCE,
        axes="(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000",
        trained=(
            TrainedGrid("Wan2.1-T2V-1.3B", (81, 480, 832), WAN_TRAINED_SOURCE),
            TrainedGrid("Wan2.1/2.2 T2V, I2V 14B", (81, 720, 1280), WAN_TRAINED_SOURCE),
            TrainedGrid("Wan2.1/2.2 T2V, I2V 14B", (81, 1280, 720), WAN_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
