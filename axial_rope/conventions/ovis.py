"""Ovis-Image (diffusers ``OvisImagePosEmbed``): Flux's per-axis spectra over ids with text on the diagonal.

The pipeline's ids: text token ``i`` at ``(0, i, i)``, then the image at ``(0, y, x)``: both start at the
origin, so the image rows are told apart by their place, after the text (from the last all-zero row on).
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum
from .flux import flux
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_ovis_image.py` `OvisImagePosEmbed`"


def image_rows(ids: torch.Tensor) -> torch.Tensor:
    """The image rows of Ovis' ``cat([txt_ids, img_ids])`` ``[S, 3]``: from the last all-zero row, the image's
    ``(0, 0, 0)``, on (text ``(0, i, i)`` has one zero row, its first). One host read; only when sizing."""
    zero = (ids == 0).all(-1)  # [S]
    start = int(torch.nonzero(zero).max()) if bool(zero.any()) else 0
    return torch.arange(ids.shape[0], device=ids.device) >= start


def _positions(config):
    def positions(rope, sizing, ids):
        return ids_positions(ids, rope, sizing, image=None if sizing is None else image_rows(ids))

    return positions


OVIS_IMAGE_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/ovis_image/pipeline_ovis_image.py` default: "
    "`default_sample_size` 128 x `vae_scale_factor` 8"
)
register_diffusers(
    DiffusersFamily(
        name="ovis_image",
        classes=("OvisImageTransformer2DModel",),
        rope=lambda c: flux(axes_sum(c, "axes_dims_rope", "attention_head_dim")),  # PosEmbed(theta=10000)
        tables=("module", "pos_embed"),  # pos_embed(cat([txt_ids, img_ids]))
        positions=_positions,
        grid_axes=(1, 2),
        time_axis=None,
        stock=("OvisImageAttnProcessor",),
        processor="FluxRopeProcessor",  # OvisImageAttnProcessor: FluxAttnProcessor's steps, copied
        qk_norm="rms",  # OvisImageAttnProcessor: norm_q/k, norm_added_q/k (RMSNorm over D), then apply_rotary_emb
        timing=Timing(noise=1.0),  # the pipeline passes timestep / 1000
        max_diff=0.0,
        source=SOURCE,
        axes="(index, y, x): `axes_dims_rope`, theta 10000; text on the y = x diagonal, image from the origin",
        trained=(TrainedGrid("Ovis-Image-7B", (1024, 1024), OVIS_IMAGE_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
