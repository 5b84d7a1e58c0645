"""Ideogram 4 (diffusers ``Ideogram4MRoPE``): Qwen3-VL's interleaved M-RoPE over the pipeline's ``(t, h, w)`` ids.

The pipeline packs ``[left padding][text][image]`` per item: text tokens at ``(p, p, p)``, image tokens at
``(0, y, x) + 65536`` (``IMAGE_POSITION_OFFSET``, so that they never meet a text position), and passes
``position_ids [B, L, 3]``. ``rotary_emb(position_ids)`` returns half-paired ``(cos, sin) [B, L, D]``. Sizing moves
the image rows' ``(y, x)`` (counted from their origin, 65536) and keeps the text rows.
"""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import field, size
from .qwen_vl import qwen3_vl
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_ideogram4.py` `Ideogram4MRoPE`"
IMAGE_POSITION_OFFSET = 65536  # transformer_ideogram4.IMAGE_POSITION_OFFSET: image ids start here on every axis


def _rope(config):
    return qwen3_vl(size(config, "attention_head_dim"), float(field(config, "rope_theta")),
                    tuple(field(config, "mrope_section")))  # fmt: skip


def _positions(config):
    def positions(rope, sizing, position_ids):  # [B, L, 3], int
        image = position_ids[..., 0] >= IMAGE_POSITION_OFFSET  # [B, L]; text ids stay below it
        pos, scaling = ids_positions(position_ids, rope, sizing, image=image)
        if len(set(scaling)) > 1:  # one spectrum cycles through the axes: it scales them all alike or not at all
            raise ValueError(
                f"Ideogram4Transformer2DModel (ideogram4) shares one spectrum among its axes (t, h, w): mode "
                f"{sizing.mode} scales (h, w) alone ({scaling}); use mode 'interpolate' or one scaling for all axes"
            )
        return pos, scaling[0]

    return positions


IDEOGRAM4_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/ideogram4/pipeline_ideogram4.py` default height = "
    "width = 2048 ('the defaults are the recommended settings for best quality')"
)
register_diffusers(
    DiffusersFamily(
        name="ideogram4",
        classes=("Ideogram4Transformer2DModel",),
        rope=_rope,
        tables=("module", "rotary_emb"),  # rotary_emb(position_ids [B, L, 3]) -> (cos, sin) [B, L, D], half pairing
        positions=_positions,
        grid_axes=(1, 2),
        time_axis=None,
        blocks=("layers.",),
        stock=("Ideogram4AttnProcessor",),
        processor="Ideogram4RopeProcessor",
        qk_norm="rms",  # Ideogram4AttnProcessor: norm_q, norm_k (RMSNorm over D), then the rotation
        timing=Timing(noise=0.0, clean=1.0),  # flow-matching time in [0, 1]: 0 pure noise, 1 clean
        # float64 models, tables replaced: 7.2e-6 measured; the stock angles are float32 products at positions past
        # 65536 (|error| up to 2**-23 x 65552 = 8e-3 rad on the fastest plane), ours float64
        max_diff=1e-5,
        source=SOURCE,
        axes="(t, h, w): `mrope_section` planes interleaved t, h, w, `rope_theta`; image ids from 65536; one "
        "spectrum: one scaling for all axes, mode interpolate",
        trained=(TrainedGrid("Ideogram 4", (2048, 2048), IDEOGRAM4_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
