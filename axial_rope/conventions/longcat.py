"""LongCat-Image (diffusers ``LongCatImagePosEmbed``): Flux's per-axis spectra over multimodal ids.

The pipeline's ids are ``(modality, y, x)``: text token ``i`` at ``(0, i, i)``, the image (modality 1; an
edited image 2) at ``(m, s + y, s + x)`` with ``s`` the text's padded length (512), so the image's grid
starts after the text on both axes.
"""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum
from .flux import flux
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_longcat_image.py` `LongCatImagePosEmbed`"


def _positions(config):
    def positions(rope, sizing, ids):
        # sized: the image rows (modality > 0) about their origin (s, s); the text's diagonal stays
        return ids_positions(ids, rope, sizing, image=None if sizing is None else ids[..., 0] > 0)

    return positions


LONGCAT_IMAGE_TRAINED_SOURCE = (
    "github.com/meituan-longcat/LongCat-Image `longcat_image/dataset/data_utils.py` MULTI_ASPECT_RATIO_1024: the "
    "training buckets, 704 x 1408 to 1408 x 704 around 1024 x 1024; arXiv:2512.07584"
)
register_diffusers(
    DiffusersFamily(
        name="longcat_image",
        classes=("LongCatImageTransformer2DModel",),
        rope=lambda c: flux(axes_sum(c, "axes_dims_rope", "attention_head_dim")),  # PosEmbed(theta=10000)
        tables=("module", "pos_embed"),  # pos_embed(cat([txt_ids, img_ids]))
        positions=_positions,
        grid_axes=(1, 2),
        time_axis=None,
        stock=("LongCatImageAttnProcessor",),
        processor="FluxRopeProcessor",  # LongCatImageAttnProcessor: FluxAttnProcessor's steps, copied
        qk_norm="rms",  # LongCatImageAttnProcessor: norm_q/k, norm_added_q/k (RMSNorm over D), then rotation
        timing=Timing(noise=1.0),  # the pipeline passes timestep / 1000; the transformer multiplies by 1000
        max_diff=0.0,
        source=SOURCE,
        axes="(modality, y, x): `axes_dims_rope`, theta 10000; text on the y = x diagonal, image after it",
        trained=(
            TrainedGrid("LongCat-Image", (1024, 1024), LONGCAT_IMAGE_TRAINED_SOURCE),
            TrainedGrid("LongCat-Image", (704, 1408), LONGCAT_IMAGE_TRAINED_SOURCE),
            TrainedGrid("LongCat-Image", (1408, 704), LONGCAT_IMAGE_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16),
    )
)
