"""Flux (diffusers ``FluxPosEmbed``): three per-axis spectra over text and image ids."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..positions import grid, text_positions
from ..rope import AxialRoPE
from ._registry import (
    Convention,
    DiffusersFamily,
    PipelineUnits,
    Timing,
    TrainedGrid,
    builds_rope,
    register,
    register_diffusers,
)
from .fields import axes_sum
from .tables import ids_positions

__all__ = ["flux", "flux_positions"]  # axes_widths, turned_axes_rope: for the records

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_flux.py` `FluxPosEmbed`"


@builds_rope
def flux(axes_dims_rope: Sequence[int] = (16, 56, 56), theta: float = 10000.0) -> AxialRoPE:
    """Flux's RoPE from its transformer config (``axes_dims_rope``; ``FluxPosEmbed``'s theta is 10000).

    Each axis of the ids ``(index, y, x)`` gets ``axes_dims_rope[a]`` channels of its own spectrum
    ``theta ** (-2i / d_a)``; interleaved planes; attention ``bshd``.
    """
    return AxialRoPE(tuple(axes_dims_rope), theta=theta, pairing="interleaved")


def axes_widths(config, name: str = "axes_dims_rope", head_field: str = "attention_head_dim") -> tuple[int, ...]:
    """The channels of each id column (``config[name]``, summing to the head dim); 0 for a column no plane reads."""
    return axes_sum(config, name, head_field)


def turned_axes_rope(config, theta: float = 10000.0) -> AxialRoPE:
    """Flux's rope over the id columns that have channels: ``axes_dims_rope=(0, 4, 4)`` (diffusers' own tiny Bria
    config; ``FluxPosEmbed`` gives the first column an empty table) turns by ``(y, x)`` only."""
    return flux(tuple(d for d in axes_widths(config) if d), theta)


def flux_positions(text_length: int, height: int, width: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Flux's ``cat([txt_ids, img_ids])``: text ids all zero, image ids ``(0, y, x)`` over the packed latent grid.

    Returns:
        ``[text_length + height * width, 3]``.
    """
    return torch.cat([text_positions(text_length, 3, step=0, dtype=dtype), grid(1, height, width, dtype=dtype)])


register(
    Convention(
        name="flux",
        family="flux",
        source=SOURCE,
        axes="(index, y, x): 16, 56, 56 channels, one spectrum each",
        pairing="interleaved",
        positions="integer ids; text (0, 0, 0), image (0, y, x)",
        max_diff=0.0,
        example=lambda: flux((4, 6, 6)),
    )
)

FLUX_TRAINED_SOURCE = (
    "huggingface.co/black-forest-labs/FLUX.1-dev model card example (height = width = 1024, also FluxPipeline's "
    "default: `default_sample_size` 128 x `vae_scale_factor` 8); github.com/black-forest-labs/flux `src/flux/cli.py` "
    "default width 1360, height 768"
)
register_diffusers(
    DiffusersFamily(
        name="flux",
        classes=("FluxTransformer2DModel",),
        rope=turned_axes_rope,  # theta 10000
        tables=("module", "pos_embed"),  # FluxPosEmbed(ids): ids [S, 3], text rows first
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        grid_axes=(1, 2),
        time_axis=None,
        widths=axes_widths,
        stock=("FluxAttnProcessor",),
        processor="FluxRopeProcessor",
        qk_norm="rms",  # FluxAttnProcessor: norm_q/k, norm_added_q/k (RMSNorm over D), then apply_rotary_emb
        timing=Timing(noise=1.0),  # FluxPipeline passes timestep = sigma
        # FluxKontextPipeline: the reference image's ids have index 1 in their first column (text and latents 0)
        references=lambda pos: pos[..., 0] != 0,
        max_diff=3e-9,  # float64 models, unscaled; the tables' float32 rounding
        source=SOURCE,
        axes="(index, y, x): `axes_dims_rope`, theta 10000",
        trained=(
            TrainedGrid("FLUX.1 [dev], [schnell]", (1024, 1024), FLUX_TRAINED_SOURCE),
            TrainedGrid("FLUX.1 [dev], [schnell]", (768, 1360), FLUX_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16),
    )
)

CHROMA_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_chroma.py` `ChromaTransformer2DModel`"

CHROMA_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/chroma/pipeline_chroma.py` default "
    "(`default_sample_size` 128 x `vae_scale_factor` 8); huggingface.co/lodestones/Chroma1-HD is the high-resolution "
    "finetune (diffusers docs `chroma.md`)"
)
register_diffusers(
    DiffusersFamily(
        name="chroma",
        classes=("ChromaTransformer2DModel",),
        rope=turned_axes_rope,  # FluxPosEmbed(theta=10000)
        tables=("module", "pos_embed"),  # FluxPosEmbed(cat([txt_ids, img_ids])): Flux's ids
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        grid_axes=(1, 2),
        time_axis=None,
        widths=axes_widths,
        stock=("FluxAttnProcessor",),
        processor="FluxRopeProcessor",  # Chroma's attention is Flux's: FluxAttention with FluxAttnProcessor
        qk_norm="rms",  # FluxAttnProcessor (transformer_flux.py): RMSNorms over D, then apply_rotary_emb
        timing=Timing(noise=1.0),  # ChromaPipeline passes timestep / 1000; the transformer multiplies by 1000
        max_diff=0.0,
        source=CHROMA_SOURCE,
        axes="(index, y, x): `axes_dims_rope`, theta 10000",
        trained=(TrainedGrid("Chroma1-HD", (1024, 1024), CHROMA_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
