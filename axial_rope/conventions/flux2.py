"""FLUX.2 and FLUX.3 (diffusers ``Flux2PosEmbed``, ``Flux3PosEmbed``): per-axis spectra over 4-axis ids.

The ids are ``(t, y, x, l)``: image tokens ``(t, y, x, 0)`` (``t`` 0 for the image generated, 10, 20, ...
for reference images in FLUX.2; reference images in their own call in FLUX.3), text tokens ``(0, 0, 0, l)``.
The tables module is called once for the text ids and once for the image ids (FLUX.3: once more for the
reference ids), and the tables concatenated; so a sized forward reads its image grid from ``img_ids``
(and ``image_cond_ids``) through the record's ``grid``, and sizes every call by it.
"""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum, field
from .flux import flux
from .tables import id_extent, ids_positions

__all__: list[str] = []

FLUX2_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_flux2.py` `Flux2PosEmbed`"
FLUX3_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_flux3.py` `Flux3PosEmbed`"


def _rope(default_theta: float):
    return lambda c: flux(axes_sum(c, "axes_dims_rope", "attention_head_dim"), field(c, "rope_theta", default_theta))


def _positions(config):
    return lambda rope, sizing, ids: ids_positions(ids, rope, sizing)  # ids [S, 4]; grid columns y, x


FLUX2_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/flux2/pipeline_flux2.py`, "
    "`pipeline_flux2_klein.py` default (`default_sample_size` 128 x `vae_scale_factor` 8)"
)
register_diffusers(
    DiffusersFamily(
        name="flux2",
        classes=("Flux2Transformer2DModel",),
        rope=_rope(2000.0),
        tables=("module", "pos_embed"),  # pos_embed(img_ids), pos_embed(txt_ids): two calls per forward
        positions=_positions,
        grid_axes=(1, 2),
        time_axis=None,
        stock=("Flux2AttnProcessor", "Flux2ParallelSelfAttnProcessor"),
        processor="Flux2RopeProcessor",
        qk_norm="rms",  # Flux2AttnProcessor, Flux2ParallelSelfAttnProcessor: RMSNorms over D, then apply_rotary_emb
        timing=Timing(noise=1.0),  # the pipeline passes timestep / 1000; the transformer multiplies by 1000
        grid=(("img_ids",), lambda c: lambda img_ids: id_extent(img_ids)),  # the image and its references
        max_diff=0.0,
        source=FLUX2_SOURCE,
        axes="(t, y, x, l): `axes_dims_rope`, `rope_theta`",
        trained=(TrainedGrid("FLUX.2 [dev], [klein]", (1024, 1024), FLUX2_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
FLUX3_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `modular_pipelines/flux3/before_denoise.py` default_height = "
    "default_width = 1024"
)
register_diffusers(
    DiffusersFamily(
        name="flux3",
        classes=("Flux3Transformer2DModel",),
        rope=_rope(10000.0),
        tables=("module", "pos_embed"),  # pos_embed(txt_ids), (img_ids), (image_cond_ids): a call each
        positions=_positions,
        grid_axes=(1, 2),
        time_axis=None,
        stock=("Flux3AttnProcessor",),
        processor="Flux3RopeProcessor",
        blocks=("txt_mode_blocks.", "mode_blocks.", "single_transformer_blocks."),
        qk_norm="rms",  # Flux3AttnProcessor: norm_q, norm_k (RMSNorm over D, of float32 q, k), then apply_rotary_emb
        timing=Timing(noise=1.0),  # the flow timestep in [0, 1]; the transformer multiplies by 1000
        grid=(("img_ids", "image_cond_ids"), lambda c: lambda img_ids, cond_ids: id_extent(img_ids, cond_ids)),
        max_diff=0.0,
        source=FLUX3_SOURCE,
        axes="(t, y, x, l): `axes_dims_rope`, `rope_theta`",
        trained=(TrainedGrid("FLUX.3", (1024, 1024), FLUX3_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
