"""Bria (diffusers ``BriaEmbedND``, ``BriaFiboEmbedND``): Flux's per-axis spectra over Flux-style ids."""

from __future__ import annotations

from ._fields import axes_sum, field
from ._registry import DiffusersFamily, register_diffusers
from ._tables import ids_positions
from .flux import flux

__all__: list[str] = []

BRIA_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_bria.py` `BriaEmbedND`"
FIBO_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_bria_fibo.py` `BriaFiboEmbedND`"


def _rope(config):
    return flux(axes_sum(config, "axes_dims_rope", "attention_head_dim"), field(config, "rope_theta", 10000))


def _record(name: str, cls: str, processor: str, source: str) -> DiffusersFamily:
    return DiffusersFamily(
        name=name,
        classes=(cls,),
        rope=_rope,
        tables=("module", "pos_embed"),  # pos_embed(cat([txt_ids, img_ids])): text (0, 0, 0), image (0, y, x)
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        grid_axes=(1, 2),
        time_axis=None,
        stock=(processor,),
        noise_timestep=1000.0,  # the pipelines pass the scheduler's timestep (1000 sigma)
        max_diff=0.0,
        source=source,
        axes="(index, y, x): `axes_dims_rope`, `rope_theta`",
    )


register_diffusers(_record("bria", "BriaTransformer2DModel", "BriaAttnProcessor", BRIA_SOURCE))
register_diffusers(_record("bria_fibo", "BriaFiboTransformer2DModel", "BriaFiboAttnProcessor", FIBO_SOURCE))
