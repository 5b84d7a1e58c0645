"""Positions of the tokens a diffusers model's rotary tables cover, from the inputs of the module computing them.

The diffusers family records (:class:`~axial_rope.conventions._registry.DiffusersFamily`) describe each
model's positions with these: a latent video's token grid (HunyuanVideo, Wan, CogVideoX, ...), a Flux-style
id table, each optionally *sized* (``mode`` and ``train_size``: :func:`axial_rope.positions_for_size`).
Tensor ops only; sizes may be symbolic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..positions import grid, positions_for_size
from ..rope import AxialRoPE

__all__ = ["Sizing", "ids_positions", "grid_positions", "latent_grid", "latent_positions", "reads_inputs"]


@dataclass(frozen=True)
class Sizing:
    """``mode`` per grid axis and the training token grid: each forward's positions and scaling come from
    :func:`axial_rope.positions_for_size` (grid axes: video ``(t, y, x)``, Flux ``(y, x)``)."""

    train_size: tuple[int, ...]
    mode: tuple[str, ...]


def reads_inputs(layout):
    """Mark a record's ``layout`` as taking the tables module's inputs after the tables: ``layout(cos, sin, *inputs,
    **kwargs)``, for stock outputs laid out in a grid shape only the inputs give (Kandinsky's ``[T, H, W, ...]``)."""
    layout.reads_inputs = True
    return layout


def latent_grid(latent_shape, patch: tuple[int, int, int], *, channels_first: bool = True) -> tuple:
    """The token grid ``(t, y, x)`` of a latent video ``[B, C, F, H, W]`` (``channels_first=False``:
    ``[B, F, C, H, W]``, CogVideoX), cut by ``patch`` as the model's patch embedding cuts it. Symbolic sizes stay
    symbolic."""
    frames, height, width = (latent_shape[2], latent_shape[3], latent_shape[4]) if channels_first else (
        latent_shape[1], latent_shape[3], latent_shape[4])  # fmt: skip
    p_t, p_h, p_w = patch
    return -(-frames // p_t), height // p_h, width // p_w


def ids_positions(ids: torch.Tensor, rope: AxialRoPE, sizing: Sizing | None) -> tuple[torch.Tensor, tuple]:
    """Flux-style ids ``[S, 3]`` (index, y, x; text rows first) -> positions and scaling per axis.

    With ``sizing``, the image grid is ``max + 1`` of the integer y and x ids (one host read of the
    extent, so a sized Flux forward is not captured whole by ``torch.compile(fullgraph=True)``; a fixed
    ``scaling`` is), and each id ``i`` becomes the coordinate :func:`~axial_rope.positions_for_size`
    gives grid index ``i`` (text ids, 0, stay 0 in every mode allowed here).
    """
    pos = ids.float()
    if sizing is None:
        return pos, rope.scaling
    yx = pos[:, 1:].round().long()
    if bool((yx < 0).any()) or not torch.equal(yx.to(pos.dtype), pos[:, 1:]):
        raise ValueError("sizing Flux positions needs integer y/x ids >= 0 (an image grid)")
    h, w = (int(v) + 1 for v in yx.amax(0))
    sized = positions_for_size((h, w), sizing.train_size, sizing.mode, dtype=pos.dtype, device=pos.device)
    axes = sized.pos.view(h, w, 2)
    sized_pos = torch.stack([pos[:, 0], axes[:, 0, 0][yx[:, 0]], axes[0, :, 1][yx[:, 1]]], dim=-1)
    return sized_pos, (None, *sized.scaling)


def grid_positions(sizes: tuple, rope: AxialRoPE, sizing: Sizing | None, device) -> tuple[torch.Tensor, tuple]:
    """A token grid ``(t, y, x)`` -> positions ``[t y x, 3]`` and scaling per axis (sized, or the rope's own)."""
    if sizing is None:
        return grid(*sizes, device=device), rope.scaling
    sized = positions_for_size(sizes, sizing.train_size, sizing.mode, device=device)
    return sized.pos, sized.scaling


def latent_positions(patch, *, channels_first: bool = True):
    """``config -> (rope, sizing, latent) -> (pos, scaling)`` for models whose tables module reads a latent video
    ``[B, C, F, H, W]`` (``channels_first=False``: ``[B, F, C, H, W]``), cut by ``patch(config) = (p_t, p_y, p_x)``."""

    def of_config(config):
        cut = patch(config)

        def positions(rope, sizing, latent):
            sizes = latent_grid(latent.shape, cut, channels_first=channels_first)
            return grid_positions(sizes, rope, sizing, latent.device)

        return positions

    return of_config
