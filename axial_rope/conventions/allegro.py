"""Allegro (diffusers ``get_3d_rotary_pos_embed_allegro``, ``apply_rotary_emb_allegro``): the head cut in three
thirds ``(t, y, x)``, each half-paired within itself, at grid indices over the pipeline's interpolation scales.

The pipeline passes ``image_rotary_emb = ((cos, sin) per axis, index per axis)``: per axis ``a`` a table of
``D/3`` channels (``[c, c]`` halves, spectrum ``10000 ** (-2j / (D/3))``) over coordinates ``i /
interpolation_scale_a``, and the token's row in it (``[1, S]`` longs, from ``cartesian_prod`` of the grid).
The adapter hands the processors the same structure with one row per token: each axis table ``[S, D/3]`` holds
the token's own (scaled, sized) angles and its index is ``arange(S)``.
"""

from __future__ import annotations

import torch

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import field, kind, size
from .tables import grid_positions, latent_grid

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/embeddings.py` `get_3d_rotary_pos_embed_allegro`, `apply_rotary_emb_allegro`"


def _rope(config):
    d = size(config, "attention_head_dim")
    if d % 6:
        raise ValueError(f"{kind(config)} config: attention_head_dim {d} must split into three even thirds (t, y, x)")
    return AxialRoPE((d // 3,) * 3, theta=10000.0, pairing="half")


def _scales(config) -> tuple[float, float, float]:  # the model's own defaults where the config leaves None
    frames = field(config, "sample_frames", 22)
    t = field(config, "interpolation_scale_t", None)
    t = t if t is not None else ((frames - 1) // 16 + 1 if frames % 2 == 1 else frames // 16)
    h = field(config, "interpolation_scale_h", None)
    w = field(config, "interpolation_scale_w", None)
    h = h if h is not None else field(config, "sample_height", 90) / 30
    w = w if w is not None else field(config, "sample_width", 160) / 40
    return float(t), float(h), float(w)


def _positions(config):
    patch = (field(config, "patch_size_t", 1), field(config, "patch_size"), field(config, "patch_size"))
    scales = _scales(config)

    def positions(rope, sizing, latent):  # latent [B, C, T, H, W]
        pos, scaling = grid_positions(latent_grid(latent.shape, patch), rope, sizing, latent.device)
        return pos / pos.new_tensor(scales), scaling

    return positions


def _layout(cos, sin):  # half pairing over three axes: axis a's planes are channels a d/2 ... (a + 1) d/2
    n = cos.shape[-1] // 6  # planes per axis
    per_axis = tuple(
        tuple(torch.cat([t[:, a * n : (a + 1) * n]] * 2, dim=-1) for t in (cos, sin)) for a in range(3)
    )  # ((cos, sin) [S, D/3]) per axis
    index = torch.arange(cos.shape[0], device=cos.device).expand(3, 1, -1)  # every token reads its own row
    return per_axis, index


ALLEGRO_TRAINED_SOURCE = (
    "github.com/rhymes-ai/Allegro README: 88 frames of 720 x 1280; the transformer's sample_frames 22 and 90 x 160 "
    "latents"
)
register_diffusers(
    DiffusersFamily(
        name="allegro",
        classes=("AllegroTransformer3DModel",),
        rope=_rope,
        tables=("argument", "image_rotary_emb"),  # the pipeline's ((cos, sin) per axis, index per axis)
        positions=_positions,
        layout=_layout,
        stock=("AllegroAttnProcessor2_0",),
        blocks=("transformer_blocks.",),
        timing=Timing(noise=1000.0),
        max_diff=2e-9,  # float64 models, tables replaced: 1.1e-9 measured (the pipeline's float32 tables)
        source=SOURCE,
        axes="(t, y, x): D/3 each, theta 10000, each third half-paired; indices / `interpolation_scale_{t,h,w}`",
        trained=(TrainedGrid("Allegro (88x720P)", (88, 720, 1280), ALLEGRO_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
