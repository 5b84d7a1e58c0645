"""Krea 2 (diffusers ``Krea2RotaryPosEmbed``): Flux's per-axis spectra (theta 1000) over Flux-style ids."""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum, field
from .flux import flux
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_krea2.py` `Krea2RotaryPosEmbed`"

KREA2_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/krea2/pipeline_krea2.py` default height = width = "
    "1024, as the docs' (`krea2.md`) examples"
)
register_diffusers(
    DiffusersFamily(
        name="krea2",
        classes=("Krea2Transformer2DModel",),
        rope=lambda c: flux(axes_sum(c, "axes_dims_rope", "attention_head_dim"), field(c, "rope_theta", 1000.0)),
        tables=("module", "rotary_emb"),  # rotary_emb(position_ids): text rows (0, 0, 0) first, image (0, y, x)
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        grid_axes=(1, 2),
        time_axis=None,
        stock=("Krea2AttnProcessor",),
        processor="Krea2RopeProcessor",
        blocks=("transformer_blocks.",),
        qk_norm="rms",  # Krea2AttnProcessor: norm_q, norm_k (Krea2RMSNorm over D), then apply_rotary_emb
        timing=Timing(noise=1.0),  # the pipeline passes timestep / num_train_timesteps
        max_diff=0.0,
        source=SOURCE,
        axes="(index, y, x): `axes_dims_rope`, `rope_theta` (1000)",
        trained=(TrainedGrid("Krea-2-Raw, Krea-2-Turbo", (1024, 1024), KREA2_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
