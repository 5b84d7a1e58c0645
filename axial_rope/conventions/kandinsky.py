"""Kandinsky 5 and 6 (diffusers ``Kandinsky5RoPE3D``, ``Kandinsky6RoPE3D``): per-axis spectra over the latent
video, as 2x2 matrices.

``visual_rope_embeddings(shape, pos, scale_factor)`` takes the latent grid's shape ``(B, T, H, W)``, the
index of each frame, row and column (``pos``: three integer sequences, ``arange`` in the pipeline) and the
pipeline's ``scale_factor`` per axis (its own interpolation at high resolution); axis ``a`` turns plane ``j``
by ``pos[a] / scale_factor[a] * 10000 ** (-2j / d_a)`` over ``axes_dims``, and the tables are rotation
matrices ``[B, T, H, W, 1, D/2, 2, 2]`` (``[[cos, -sin], [sin, cos]]`` per interleaved plane). The text
tokens' 1-D table (``text_rope_embeddings``, text encoder blocks only) is not sized and stays the model's.

Kandinsky 6 (and its super-resolution model, whose copy is the same) computes the same tables from ``(pos, scale_factor)`` alone (its config's ``scale_factor``, the grid
the indices' lengths), ``[T, H, W, 1, D/2, 2, 2]`` without a batch axis; its audio tokens' 1-D tables (and, with
``ca_rope``, their cross-modal use) stay the model's: the video is what is sized.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import field
from .flux import flux
from .hidream import rotation_matrices
from .tables import at_index, grid_coordinates

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_kandinsky.py` `Kandinsky5RoPE3D`"
SOURCE6 = (
    "diffusers 0.42.1 `models/transformers/transformer_kandinsky6.py` `Kandinsky6RoPE3D`, "
    "`transformer_kandinsky6_sr.py` `Kandinsky6SRRoPE3D`"
)


def _grid(rope, sizing, sizes, pos, scale_factor):
    """The indices ``pos`` per axis of a ``sizes`` grid, divided by ``scale_factor`` -> positions ``[T H W, 3]``
    and the scaling per axis; sized, each index sits at its sized coordinate first."""
    index = [torch.as_tensor(p) for p in pos]  # [T], [H], [W]
    if sizing is None:
        axes, scaling = [i.to(torch.float64) for i in index], rope.scaling
    else:
        coords, scaling = grid_coordinates(sizes, sizing, dtype=torch.float64, device=index[0].device)
        axes = [at_index(c, i) for c, i in zip(coords, index)]
    axes = [a / s for a, s in zip(axes, scale_factor)]  # the pipeline's own interpolation on top
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3).float(), scaling


def _positions(config):
    def positions(rope, sizing, shape, pos, scale_factor=(1.0, 1.0, 1.0)):  # shape (B, T, H, W)
        return (*_grid(rope, sizing, tuple(shape[1:]), pos, scale_factor), tuple(shape))

    return positions


def _positions6(config):
    def positions(rope, sizing, pos, scale_factor=(1.0, 1.0, 1.0)):  # the grid is the indices' lengths
        sizes = tuple(len(p) for p in pos)
        return (*_grid(rope, sizing, sizes, pos, scale_factor), sizes)

    return positions


def _layout(cos, sin, shape):  # [S, D] -> [B, T, H, W, 1, D/2, 2, 2], the batch repeated as stock
    b, t, h, w = shape
    return rotation_matrices(cos, sin).view(1, t, h, w, 1, -1, 2, 2).repeat(b, 1, 1, 1, 1, 1, 1, 1)


def _layout6(cos, sin, sizes):  # [S, D] -> [T, H, W, 1, D/2, 2, 2]
    return rotation_matrices(cos, sin).view(*sizes, 1, -1, 2, 2)


KANDINSKY5_TRAINED_SOURCE = (
    "github.com/kandinskylab/kandinsky-5 README example: width 768, height 512, 5 s at 24 fps; diffusers 0.42.1 "
    "(github.com/huggingface/diffusers) `pipelines/kandinsky5/pipeline_kandinsky_t2i.py` resolutions (1024 x 1024, "
    "640 x 1408, 1408 x 640, 768 x 1280, ...); arXiv:2511.14993"
)
register_diffusers(
    DiffusersFamily(
        name="kandinsky5",
        classes=("Kandinsky5Transformer3DModel",),
        rope=lambda c: flux(tuple(field(c, "axes_dims")), 10000.0),  # head_dim = sum(axes_dims)
        tables=("module", "visual_rope_embeddings"),  # (visual_shape, visual_rope_pos, scale_factor)
        positions=_positions,
        layout=_layout,
        stock=("Kandinsky5AttnProcessor",),
        processor="Kandinsky5RopeProcessor",
        blocks=("visual_transformer_blocks.",),
        qk_norm="rms",  # Kandinsky5AttnProcessor: query_norm, key_norm (RMSNorm over D, float32), then apply_rotary
        timing=Timing(noise=1000.0),  # the pipeline passes the scheduler's timestep
        max_diff=0.0,
        source=SOURCE,
        axes="(t, y, x): `axes_dims` (the head), theta 10000, positions / the pipeline's `scale_factor`",
        trained=(
            TrainedGrid("Kandinsky 5.0 T2V Lite", (121, 512, 768), KANDINSKY5_TRAINED_SOURCE),
            TrainedGrid("Kandinsky 5.0 T2I Lite", (1, 1024, 1024), KANDINSKY5_TRAINED_SOURCE),
            TrainedGrid("Kandinsky 5.0 T2I Lite", (1, 1408, 640), KANDINSKY5_TRAINED_SOURCE),
            TrainedGrid("Kandinsky 5.0 T2I Lite", (1, 640, 1408), KANDINSKY5_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
KANDINSKY6_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/kandinsky6/pipeline_kandinsky6_ti2va.py` default "
    "height 512, width 768, num_frames 121"
)
register_diffusers(
    DiffusersFamily(
        name="kandinsky6",
        classes=("Kandinsky6Transformer3DModel", "Kandinsky6SRTransformer3DModel"),
        rope=lambda c: flux(tuple(field(c, "axes_dims")), 10000.0),
        tables=("module", "visual_rope_embeddings"),  # (visual_rope_pos, config scale_factor): no batch axis
        positions=_positions6,
        layout=_layout6,
        stock=("Kandinsky6AttnProcessor", "Kandinsky6SRAttnProcessor"),
        processor="Kandinsky6RopeProcessor",
        blocks=("visual_transformer_blocks.",),
        qk_norm="rms",  # Kandinsky6(SR)AttnProcessor: query_norm, key_norm (RMSNorm over D), then apply_rotary
        timing=Timing(noise=1000.0),  # the timestep on the [0, num_train_timesteps] scale
        max_diff=5e-8,  # float64 models, tables replaced: 4.4e-8 measured (6 SR at 8 x 8; 6: bit for bit)
        source=SOURCE6,
        axes="(t, y, x): `axes_dims` (the head), theta 10000, positions / `scale_factor`",
        trained=(TrainedGrid("Kandinsky 6", (121, 512, 768), KANDINSKY6_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
