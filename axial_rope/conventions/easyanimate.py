"""EasyAnimate (diffusers ``EasyAnimateRotaryPosEmbed``): CogVideoX's tables over a grid stretched to a base region.

Every forward spreads its ``h x w`` token grid over the crop of a ``60/p x 90/p`` base region that keeps the
aspect ratio (``get_resize_crop_region_for_grid``), with CogVideoX 1.0's torch linspace; time is the frame
index (the patches are spatial only). So at the base size the positions are the integer grid, and at other
sizes the model already interpolates space itself. Scaled with a fixed ``scaling``, the tables keep these
positions; sized with ``mode``, the integer latent grid is sized against ``train_size`` instead.
"""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, register_diffusers
from .cogvideox import cogvideox, cogvideox_positions
from .fields import size
from .tables import grid_positions

__all__ = ["easyanimate_crop"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_easyanimate.py` `EasyAnimateRotaryPosEmbed`"


def easyanimate_crop(height: int, width: int, base_height: int, base_width: int) -> tuple[tuple, tuple]:
    """The crop ``((top, left), (bottom, right))`` of an ``height x width`` grid in the base region (aspect kept)."""
    if height / width > base_height / base_width:
        resize_h, resize_w = base_height, int(round(base_height / height * width))
    else:
        resize_w, resize_h = base_width, int(round(base_width / width * height))
    top, left = int(round((base_height - resize_h) / 2.0)), int(round((base_width - resize_w) / 2.0))
    return (top, left), (top + resize_h, left + resize_w)


def _positions(config):
    p = size(config, "patch_size")
    base = (60 // p, 90 // p)  # EasyAnimateRotaryPosEmbed's base region, fixed

    def positions(rope, sizing, latent):
        frames, height, width = latent.shape[2], latent.shape[3] // p, latent.shape[4] // p
        if sizing is not None:
            return grid_positions((frames, height, width), rope, sizing, latent.device)
        crops = easyanimate_crop(height, width, *base)
        return cogvideox_positions(frames, height, width, crops).to(latent.device), rope.scaling

    return positions


EASYANIMATE_TRAINED_SOURCE = (
    "github.com/aigc-apps/EasyAnimate README: v5 'up to 1024x1024, 49 frames, 6s, 8fps'; arXiv:2405.18991"
)
register_diffusers(
    DiffusersFamily(
        name="easyanimate",
        classes=("EasyAnimateTransformer3DModel",),
        rope=lambda c: cogvideox(size(c, "attention_head_dim")),
        tables=("module", "rope_embedding"),  # EasyAnimateRotaryPosEmbed(hidden_states): the latent video
        positions=_positions,
        stock=("EasyAnimateAttnProcessor2_0",),
        processor="EasyAnimateRopeProcessor",
        qk_norm="layer",  # EasyAnimateAttnProcessor2_0: norm_q/k, norm_added_q/k (LayerNorm over D), then rotation
        max_diff=2e-8,  # float64 models, tables replaced: 1.4e-8 measured (the float32 tables)
        source=SOURCE,
        axes="(t, y, x): D/4, 3D/8, 3D/8, theta 10000",
        trained=(TrainedGrid("EasyAnimateV5.1", (49, 1024, 1024), EASYANIMATE_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
