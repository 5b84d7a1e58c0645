"""Bria (diffusers ``BriaEmbedND``, ``BriaFiboEmbedND``, Bria-Fibo 2's ``RopeEmbedder``): Flux's per-axis spectra over
Flux-style ids."""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import field
from .flux import axes_widths, turned_axes_rope
from .tables import complex_tables, ids_positions
from .z_image import z_image_rope

__all__: list[str] = []

BRIA_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_bria.py` `BriaEmbedND`"
FIBO_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_bria_fibo.py` `BriaFiboEmbedND`"


def _rope(config):  # over the id columns with channels: diffusers' own tiny config is axes_dims_rope=(0, 4, 4)
    return turned_axes_rope(config, field(config, "rope_theta", 10000))


def _record(name: str, cls: str, processor: str, source: str, trained: tuple[TrainedGrid, ...]) -> DiffusersFamily:
    return DiffusersFamily(
        name=name,
        classes=(cls,),
        rope=_rope,
        tables=("module", "pos_embed"),  # pos_embed(cat([txt_ids, img_ids])): text (0, 0, 0), image (0, y, x)
        timing=Timing(noise=1000.0),  # the pipelines pass the scheduler's timestep (1000 sigma)
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        grid_axes=(1, 2),
        time_axis=None,
        widths=axes_widths,
        stock=(processor,),
        processor="FluxRopeProcessor",  # BriaAttnProcessor, BriaFiboAttnProcessor: FluxAttnProcessor's steps, copied
        qk_norm="rms",  # BriaAttnProcessor, BriaFiboAttnProcessor: RMSNorms over D, then apply_rotary_emb
        max_diff=0.0,
        source=source,
        axes="(index, y, x): `axes_dims_rope`, `rope_theta`",
        trained=trained,
        units=PipelineUnits(16),  # Bria 3.2: VAE 16, latents packed 2 x 2; FIBO: VAE 16, patch 1
    )


BRIA_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/bria/pipeline_bria.py` default: "
    "`default_sample_size` 64 x `vae_scale_factor` 16 ('res of 1k,1k')"
)
BRIA_FIBO_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/bria_fibo/pipeline_bria_fibo.py` default: "
    "`default_sample_size` 64 x `vae_scale_factor` 16"
)

register_diffusers(
    _record(
        "bria",
        "BriaTransformer2DModel",
        "BriaAttnProcessor",
        BRIA_SOURCE,
        (TrainedGrid("BRIA-3.2", (1024, 1024), BRIA_TRAINED_SOURCE),),
    )
)
register_diffusers(
    _record(
        "bria_fibo",
        "BriaFiboTransformer2DModel",
        "BriaFiboAttnProcessor",
        FIBO_SOURCE,
        (TrainedGrid("FIBO", (1024, 1024), BRIA_FIBO_TRAINED_SOURCE),),
    )
)

FIBO2_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_bria_fibo2.py` `RopeEmbedder`"


def _fibo2_grid(config):
    def grid(hidden_states):  # the image grid (y, x) in tokens, from the latents [B, C, H, W]
        patch = field(config, "patch_size", 2)
        return torch.tensor([hidden_states.shape[-2] // patch, hidden_states.shape[-1] // patch])

    return grid


# Bria-Fibo 2 looks its tables up as Z-Image does (a plain `RopeEmbedder` object, float32 complex lookup tables),
# over ids (index, y, x): the image at index `max_num_gist_tokens + 1`, each context image on the next index with
# its own rows and columns, the gist tokens at (1 + i, 0, 0); called once for the image and context ids, once for
# the gist ids, so a sized forward reads the image grid from `hidden_states` and sizes both calls by it.
BRIA_FIBO2_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/bria_fibo2/pipeline_bria_fibo2.py` default: "
    "`default_sample_size` 128 x `vae_scale_factor` 8"
)
register_diffusers(
    DiffusersFamily(
        name="bria_fibo2",
        classes=("BriaFibo2Transformer2DModel",),
        rope=z_image_rope,  # the same config fields: dim, n_heads, axes_dims, rope_theta
        tables=("module", "rope_embedder"),  # rope_embedder(ids [N, 3]) -> complex64 [N, D/2]
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        layout=complex_tables,
        grid_axes=(1, 2),
        time_axis=None,
        blocks=("noise_refiner.", "layers."),
        stock=("BriaFibo2AttnProcessor",),
        processor="BriaFibo2RopeProcessor",
        qk_norm="rms",  # BriaFibo2AttnProcessor: norm_q, norm_k (RMSNorm over D), then its apply_rotary_emb
        timing=Timing(noise=1.0),  # its timestep is the noise level in [0, 1]: 1 pure noise, 0 clean
        grid=(("hidden_states",), _fibo2_grid),
        max_diff=4e-8,  # float64 models, tables replaced: 3.0e-8 measured (upstream float32 lookup tables)
        source=FIBO2_SOURCE,
        axes="(index, y, x): `axes_dims` (summing to `dim / n_heads`), `rope_theta` (256)",
        trained=(TrainedGrid("FIBO 2", (1024, 1024), BRIA_FIBO2_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
