"""Kandinsky 5 (diffusers ``Kandinsky5RoPE3D``): per-axis spectra over the latent video, as 2x2 matrices.

``visual_rope_embeddings(shape, pos, scale_factor)`` takes the latent grid's shape ``(B, T, H, W)``, the
index of each frame, row and column (``pos``: three integer sequences, ``arange`` in the pipeline) and the
pipeline's ``scale_factor`` per axis (its own interpolation at high resolution); axis ``a`` turns plane ``j``
by ``pos[a] / scale_factor[a] * 10000 ** (-2j / d_a)`` over ``axes_dims``, and the tables are rotation
matrices ``[B, T, H, W, 1, D/2, 2, 2]`` (``[[cos, -sin], [sin, cos]]`` per interleaved plane). The text
tokens' 1-D table (``text_rope_embeddings``, text encoder blocks only) is not sized and stays the model's.
"""

from __future__ import annotations

import torch

from ._fields import field
from ._registry import DiffusersFamily, register_diffusers
from ._tables import at_index, grid_coordinates
from .flux import flux
from .hidream import rotation_matrices

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_kandinsky.py` `Kandinsky5RoPE3D`"


def _positions(config):
    def positions(rope, sizing, shape, pos, scale_factor=(1.0, 1.0, 1.0)):
        index = [torch.as_tensor(p) for p in pos]  # [T], [H], [W]
        sizes = tuple(shape[1:])
        if sizing is None:
            axes, scaling = [i.to(torch.float64) for i in index], rope.scaling
        else:  # each index at its sized coordinate
            coords, scaling = grid_coordinates(sizes, sizing, dtype=torch.float64, device=index[0].device)
            axes = [at_index(c, i) for c, i in zip(coords, index)]
        axes = [a / s for a, s in zip(axes, scale_factor)]  # the pipeline's own interpolation on top
        mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)  # [T H W, 3]
        return mesh.float(), scaling, tuple(shape)

    return positions


def _layout(cos, sin, shape):  # [S, D] -> [B, T, H, W, 1, D/2, 2, 2], the batch repeated as stock
    b, t, h, w = shape
    return rotation_matrices(cos, sin).view(1, t, h, w, 1, -1, 2, 2).repeat(b, 1, 1, 1, 1, 1, 1, 1)


register_diffusers(
    DiffusersFamily(
        name="kandinsky5",
        classes=("Kandinsky5Transformer3DModel",),
        rope=lambda c: flux(tuple(field(c, "axes_dims")), 10000.0),  # head_dim = sum(axes_dims)
        tables=("module", "visual_rope_embeddings"),  # (visual_shape, visual_rope_pos, scale_factor)
        positions=_positions,
        layout=_layout,
        stock=("Kandinsky5AttnProcessor",),
        blocks=("visual_transformer_blocks.",),
        noise_timestep=1000.0,  # the pipeline passes the scheduler's timestep
        max_diff=0.0,
        source=SOURCE,
        axes="(t, y, x): `axes_dims` (the head), theta 10000, positions / the pipeline's `scale_factor`",
    )
)
