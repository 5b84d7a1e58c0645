"""Z-Image (diffusers ``RopeEmbedder``): Flux's per-axis spectra over 3-axis ids, as complex tables.

The ids are ``(index, y, x)``: caption tokens ``(1 + l, 0, 0)``, image tokens ``(L + 1, y, x)`` after the
caption's padded length ``L``, padding rows ``(0, 0, 0)``. ``RopeEmbedder(ids [N, 3])`` (a plain object, not a
module) looks the rows up in float32 tables of ``theta ** (-2i / d_a)`` (``rope_theta`` 256, ``axes_dims``
summing to the head) and returns the complex planes ``[N, D/2]``; the model calls it once for the image ids
and once for the caption ids of the whole batch, so a sized forward reads its image grid from the latents
``x`` (the record's ``grid``) and sizes both calls by it.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum, field
from .flux import flux
from .tables import complex_tables, ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_z_image.py` `RopeEmbedder`"


def _latents(x) -> list[torch.Tensor]:  # a list of [C, F, H, W] per item, or (omni mode) a list of lists
    return [t for item in x for t in (item if isinstance(item, (list, tuple)) else [item])]


def _grid(config):
    def grid(x, patch_size):  # the image grid (y, x) in tokens: the largest latent's
        patch = 2 if patch_size is None else patch_size  # the forward's default
        latents = _latents(x)
        return torch.tensor([max(t.shape[-2] for t in latents) // patch, max(t.shape[-1] for t in latents) // patch])

    return grid


def z_image_rope(config):
    """Z-Image's rope from its config (``dim``, ``n_heads``, ``axes_dims``, ``rope_theta``); Bria-Fibo 2 reads the same."""
    dim, heads = field(config, "dim"), field(config, "n_heads")
    axes = axes_sum({"axes_dims": field(config, "axes_dims"), "head": dim // heads}, "axes_dims", "head")
    return flux(axes, field(config, "rope_theta", 256.0))


Z_IMAGE_TRAINED_SOURCE = "github.com/Tongyi-MAI/Z-Image `inference.py` height = width = 1024; arXiv:2511.22699"
register_diffusers(
    DiffusersFamily(
        name="z_image",
        classes=("ZImageTransformer2DModel",),
        rope=z_image_rope,
        tables=("module", "rope_embedder"),  # rope_embedder(cat(pos_ids)): ids [N, 3], once for image, once caption
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        layout=complex_tables,  # complex64 [N, D/2]
        grid_axes=(1, 2),
        time_axis=None,
        stock=("ZSingleStreamAttnProcessor",),
        processor="ZImageRopeProcessor",
        blocks=("noise_refiner.", "context_refiner.", "layers."),
        qk_norm="rms",  # ZSingleStreamAttnProcessor: norm_q, norm_k (RMSNorm over D), then its apply_rotary_emb
        # the pipeline passes t = (1000 - timestep) / 1000: 0 at pure noise, 1 when clean
        timing=Timing(argument="t", noise=0.0, clean=1.0),
        grid=(("x", "patch_size"), _grid),
        max_diff=2e-8,  # float64 models, tables replaced: 1.3e-8 measured (upstream float32 lookup tables)
        source=SOURCE,
        axes="(index, y, x): `axes_dims` (summing to `dim / n_heads`), `rope_theta` (256)",
        trained=(TrainedGrid("Z-Image-Turbo", (1024, 1024), Z_IMAGE_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
