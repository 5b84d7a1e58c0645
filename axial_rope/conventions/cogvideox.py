"""CogVideoX (diffusers ``get_3d_rotary_pos_embed``): t = D/4, y = x = 3D/8, crop grids or integer slices."""

from __future__ import annotations

import torch

from ..positions import crop_grid, grid
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

__all__ = ["cogvideox", "cogvideox_positions"]

SOURCE = "diffusers 0.42.1 `models/embeddings.py` `get_3d_rotary_pos_embed`"


@builds_rope
def cogvideox(attention_head_dim: int = 64, theta: float = 10000.0) -> AxialRoPE:
    """CogVideoX from ``attention_head_dim``: per-axis spectra over ``(t, y, x)`` with ``D/4, 3D/8, 3D/8`` channels.

    Interleaved planes, attention ``bhsd``; the text tokens (first) are not rotated.
    """
    d = attention_head_dim
    if d % 16:
        raise ValueError(f"cogvideox: attention_head_dim must be divisible by 16 (even axis widths), got {d!r}")
    return AxialRoPE((d // 4, d // 8 * 3, d // 8 * 3), theta=theta, pairing="interleaved")


def cogvideox_positions(
    frames: int,
    height: int,
    width: int,
    crops: tuple[tuple[float, float], tuple[float, float]] | None = None,
    *,
    grid_type: str = "linspace",
    dtype=torch.float32,
) -> torch.Tensor:
    """CogVideoX's token coordinates ``(t, y, x)`` as ``get_3d_rotary_pos_embed`` builds them.

    ``grid_type="linspace"`` (CogVideoX 1.0): time ``0 .. T-1``, space spread over ``crops``
    (``((top, left), (bottom, right))``, default the grid itself) with diffusers' torch linspace;
    ``"slice"`` (CogVideoX 1.5): integer positions from 0.
    """
    if grid_type == "slice":
        return grid(frames, height, width, dtype=dtype)
    if grid_type != "linspace":
        raise ValueError(f"cogvideox_positions: grid_type must be 'linspace' or 'slice', got {grid_type!r}")
    (top, left), (bottom, right) = crops if crops is not None else ((0, 0), (height, width))
    return crop_grid(
        (0, top, left), (frames, bottom, right), (frames, height, width), diffusers_compat=True, dtype=dtype
    )


register(
    Convention(
        name="cogvideox",
        family="cogvideox",
        source=SOURCE,
        axes="(t, y, x): D/4, 3D/8, 3D/8",
        pairing="interleaved",
        positions="crop grid (torch linspace) or integer slice; text unrotated",
        max_diff=2e-07,
        example=lambda: cogvideox(32),
    )
)


def _diffusers_rope(config) -> AxialRoPE:
    if not field(config, "use_rotary_positional_embeddings", False):
        raise ValueError("CogVideoXTransformer3DModel config: use_rotary_positional_embeddings is False (no RoPE)")
    return cogvideox(size(config, "attention_head_dim"))


COGVIDEOX_TRAINED_SOURCE = (
    "github.com/zai-org/CogVideo README model table: 720 * 480, 6 seconds at 8 frames / second; the transformer's "
    "sample_frames 49 and 60 x 90 latents"
)
register_diffusers(
    DiffusersFamily(
        name="cogvideox",
        classes=("CogVideoXTransformer3DModel",),
        rope=_diffusers_rope,
        # the pipeline computes the tables; scaled, the integer latent grid's (CogVideoX 1.5's positions)
        tables=("argument", "image_rotary_emb"),
        positions=latent_positions(
            lambda c: (field(c, "patch_size_t", None) or 1, size(c, "patch_size"), size(c, "patch_size")),
            channels_first=False,  # [B, F, C, H, W]
        ),
        stock=("CogVideoXAttnProcessor2_0", "FusedCogVideoXAttnProcessor2_0"),
        processor="CogVideoXRopeProcessor",
        qk_norm="layer",  # CogVideoXAttnProcessor2_0: norm_q, norm_k (LayerNorm over D), then apply_rotary_emb
        max_diff=6e-9,  # float64 models, unscaled; the tables' float32 rounding
        source=SOURCE,
        axes="(t, y, x): D/4, 3D/8, 3D/8, theta 10000",
        trained=(TrainedGrid("CogVideoX-2B, CogVideoX-5B", (49, 480, 720), COGVIDEOX_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),  # CogVideoX 1.0 (patch_size_t None)
    )
)
