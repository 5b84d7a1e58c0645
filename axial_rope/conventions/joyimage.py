"""JoyImage Edit and Edit Plus (diffusers ``transformer_joyimage*.py``): per-axis spectra over ``(t, y, x)``, theta 256.

Both compute their tables in a model method, not a submodule: JoyImage Edit in ``get_rotary_pos_embed(
vis_rope_size, txt_rope_size)`` (the latent grid; with ``rope_type="mrope"`` the text tokens too, at
``(p, p, p)`` from ``p = max(grid) + 1`` on), Edit Plus in ``_get_rotary_pos_embed_for_range(start, stop)``,
once per image of each item (the target, then the references, each at the next frame index). The adapter
shadows the method on the instance (tables ``("method", name)``). Interleaved planes.
"""

from __future__ import annotations

import math

import torch

from ..positions import grid
from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, register_diffusers
from .fields import field, size
from .tables import Sizing, frames_grid_positions, grid_positions

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_joyimage.py` `get_rotary_pos_embed`"
PLUS_SOURCE = (
    "diffusers 0.42.1 `models/transformers/transformer_joyimage_edit_plus.py` `_get_rotary_pos_embed_for_range`"
)


def _rope(config) -> AxialRoPE:
    hidden, heads = size(config, "hidden_size"), size(config, "num_attention_heads")
    head_dim = hidden // heads
    axes = field(config, "rope_dim_list", None) or [head_dim // 3] * 3
    if len(axes) != 3 or sum(axes) != head_dim:
        raise ValueError(f"{field(config, '_class_name', 'JoyImage')} config: rope_dim_list {list(axes)} must be "
                         f"3 widths summing to the head dim {head_dim}")  # fmt: skip
    return AxialRoPE(tuple(axes), theta=float(field(config, "theta")), pairing="interleaved")


def _edit_positions(config):
    def positions(rope: AxialRoPE, sizing: Sizing | None, vis_rope_size, txt_rope_size=None):
        sizes = (1,) * (3 - len(vis_rope_size)) + tuple(vis_rope_size)
        pos, scaling = grid_positions(sizes, rope, sizing, rope.freqs.device)  # [t y x, 3]
        n = math.prod(sizes)  # the visual rows, for the layout
        if txt_rope_size is None:
            return pos, scaling, n, False
        start = max(sizes) if sizing is None else pos.amax() + 1  # after the largest visual coordinate
        text = (start + torch.arange(txt_rope_size, device=pos.device, dtype=pos.dtype))[:, None].expand(-1, 3)
        return torch.cat([pos, text]), scaling, n, True

    return positions


def _edit_layout(cos, sin, n, text):
    """``[S, D]`` each, the visual rows' count and whether text rows follow -> ``(vis (cos, sin), text (cos, sin)
    or None)``."""
    return (cos[:n], sin[:n]), ((cos[n:], sin[n:]) if text else None)


register_diffusers(
    DiffusersFamily(
        name="joyimage_edit",
        classes=("JoyImageEditTransformer3DModel",),
        rope=_rope,
        tables=("method", "get_rotary_pos_embed"),
        positions=_edit_positions,
        layout=_edit_layout,
        stock=("JoyImageAttnProcessor",),
        processor="JoyImageRopeProcessor",
        blocks=("double_blocks.",),
        qk_norm="rms",  # JoyImageAttnProcessor: img/txt_attn_q/k_norm (RMSNorm over D), then _apply_rotary_emb
        max_diff=1e-7,  # float64 models, tables replaced: 8.1e-8 measured (the float32 tables)
        source=SOURCE,
        axes="(t, y, x): `rope_dim_list`, `theta`; mrope text at (p, p, p) after the grid",
        # unknown: an editing model: the size is the input image's bucket (`find_best_bucket` of the checkpoint's
        # basesize); no published training size
        trained=(),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)


def _plus_positions(config):
    """One image's ``(t, y, x)`` range -> its positions; sized, ``(y, x)`` only: each call holds one image, whose
    ``t`` is its index in the item (the target, then the references), not a grid that ``mode`` could size."""

    def positions(rope: AxialRoPE, sizing: Sizing | None, start, stop):
        sizes = tuple(b - a for a, b in zip(start, stop))
        device = rope.freqs.device
        if sizing is None:
            return grid(*sizes, offset=tuple(start), device=device), rope.scaling
        frames = torch.arange(start[0], stop[0], device=device)
        pos, scaling = frames_grid_positions(frames, sizes[1], sizes[2], rope, sizing, device)
        return pos + pos.new_tensor((0, start[1], start[2])), scaling

    return positions


register_diffusers(
    DiffusersFamily(
        name="joyimage_edit_plus",
        classes=("JoyImageEditPlusTransformer3DModel",),
        rope=_rope,
        tables=("method", "_get_rotary_pos_embed_for_range"),
        positions=_plus_positions,
        grid_axes=(1, 2),  # the frame index is the image's place in the item: mode sizes (y, x)
        time_axis=None,
        stock=("JoyImageEditPlusAttnProcessor",),
        processor="JoyImageEditPlusRopeProcessor",
        blocks=("double_blocks.",),
        qk_norm="rms",  # JoyImageEditPlusAttnProcessor: img/txt_attn_q/k_norm (RMSNorm over D), then rotation
        max_diff=3e-8,  # float64 models, tables replaced: 2.3e-8 measured (the float32 tables)
        source=PLUS_SOURCE,
        axes="(index, y, x): `rope_dim_list`, `theta`; each image of an item at the next index",
        # unknown: an editing model: the size follows the last reference image's bucket; no published training size
        trained=(),
        units=PipelineUnits(16),
    )
)
