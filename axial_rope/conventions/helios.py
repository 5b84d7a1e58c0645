"""Helios (diffusers ``HeliosRotaryPosEmbed``): Wan-like per-axis tables over frames at the pipeline's indices.

``rope(frame_indices [B, F], height, width, device)`` returns cos and sin stacked on the channel axis of a
grid, ``[B, 2D, F, H, W]`` (cos of t, y, x, then sin; each plane's value twice, interleaved), for the new
frames and each history; the model flattens it to ``[B, S, 2D]`` and pools the mid and long histories' tables
over 2x2x2 and 4x4x4 cells, as it pools their latents.
"""

from __future__ import annotations

import torch

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, builds_rope, register_diffusers
from .fields import axes_sum, field
from .tables import frames_grid_positions

__all__ = ["helios"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_helios.py` `HeliosRotaryPosEmbed`"


@builds_rope
def helios(rope_dim: tuple[int, int, int] = (44, 42, 42), rope_theta: float = 10000.0) -> AxialRoPE:
    """Helios from its config: per-axis spectra over ``(t, y, x)``, interleaved, ``bshd``."""
    return AxialRoPE(tuple(rope_dim), theta=rope_theta, pairing="interleaved")


def _positions(config):
    def positions(rope, sizing, frame_indices, height, width, device):  # height, width: tokens
        pos, scaling = frames_grid_positions(frame_indices, height, width, rope, sizing, device)  # [B, F H W, 3]
        return pos, scaling, (frame_indices.shape[1], height, width)  # the grid the layout lays the tables in

    return positions


def _layout(cos, sin, grid):
    """``[B, S, D]`` each and the grid ``(F, H, W)`` -> ``[B, 2D, F, H, W]``."""
    return torch.cat([cos, sin], dim=-1).transpose(1, 2).unflatten(2, grid)


HELIOS_TRAINED_SOURCE = (
    "github.com/PKU-YuanGroup/Helios README (33 frames per chunk), `app.py` height 384, width 640; arXiv:2603.04379"
)
register_diffusers(
    DiffusersFamily(
        name="helios",
        classes=("HeliosTransformer3DModel",),
        rope=lambda c: helios(axes_sum(c, "rope_dim", "attention_head_dim"), field(c, "rope_theta")),
        tables=("module", "rope"),
        positions=_positions,
        layout=_layout,
        grid_axes=(1, 2),  # the frame indices are the pipeline's window of history and new frames: (y, x) sized
        stock=("HeliosAttnProcessor",),
        processor="HeliosRopeProcessor",
        blocks=("blocks.",),
        qk_norm="rms across heads",  # HeliosAttnProcessor: norm_q, norm_k (RMSNorm over H * D), then the rotation
        max_diff=1.5e-7,  # float64 models, tables replaced: 1.3e-7 measured (the float32 tables against the stock ones)
        source=SOURCE,
        axes="(t, y, x): `rope_dim`, `rope_theta`; t = the pipeline's frame indices",
        trained=(TrainedGrid("Helios", (33, 384, 640), HELIOS_TRAINED_SOURCE),),
        units=PipelineUnits(16),  # time is the pipeline's frame indices, not sized
    )
)
