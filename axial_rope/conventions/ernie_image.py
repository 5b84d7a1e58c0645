"""ERNIE-Image (diffusers ``ErnieImageEmbedND3``): Flux-style per-axis spectra over 3-axis ids, as angles.

The ids are ``[B, S, 3]``: the image's ``(L_b, y, x)`` (``L_b`` the item's text length) first, then the text's
``(t, 0, 0)``. The tables module returns the angles ``[B, S, 1, r]`` with each plane's angle twice in a row
(``theta ** (-2i / d_a)`` per axis, ``rope_theta`` 256, ``r = sum(rope_axes_dim)``): an interleaved angle table,
which the stock processor takes the cosine and sine of (it pairs the halves of the rotated channels, as it
does stock). Angles carry no amplitude: YaRN's attention factor is refused.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, register_diffusers
from .fields import field, size
from .flux import flux
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_ernie_image.py` `ErnieImageEmbedND3`"


def _rope(config):
    axes = tuple(field(config, "rope_axes_dim"))
    head = size(config, "hidden_size") // size(config, "num_attention_heads")
    if len(axes) != 3 or sum(axes) > head:
        raise ValueError(f"ErnieImageTransformer2DModel config: rope_axes_dim {list(axes)} must have 3 entries "
                         f"summing to at most the head dim {head}")  # fmt: skip
    return flux(axes, float(field(config, "rope_theta", 256)))


ERNIE_IMAGE_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/ernie_image/pipeline_ernie_image.py` default "
    "height = width = 1024, as the docs' (`ernie_image.md`) examples"
)
register_diffusers(
    DiffusersFamily(
        name="ernie_image",
        classes=("ErnieImageTransformer2DModel",),
        rope=_rope,
        tables=("module", "pos_embed"),  # pos_embed(cat([image_ids, text_ids], dim=1)): ids [B, S, 3]
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        layout=lambda cos, sin: torch.atan2(sin, cos).unsqueeze(-2),  # [B, S, 1, r] (cos, sin of them: stock's)
        grid_axes=(1, 2),
        time_axis=None,
        amplitude=False,
        stock=("ErnieImageSingleStreamAttnProcessor",),
        blocks=("layers.",),
        qk_norm="rms",  # ErnieImageSingleStreamAttnProcessor: norm_q, norm_k (RMSNorm over D), then rotation
        max_diff=2e-7,  # float64 models, tables replaced: 1.1e-7 measured (float32 angles through atan2)
        source=SOURCE,
        axes="(text length or index, y, x): `rope_axes_dim`, `rope_theta` (256), angles",
        trained=(TrainedGrid("ERNIE-Image, ERNIE-Image-Turbo", (1024, 1024), ERNIE_IMAGE_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
