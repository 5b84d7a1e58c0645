"""Positions of the tokens a diffusers model's rotary tables cover, from the inputs of the module computing them.

The diffusers family records (:class:`~axial_rope.conventions.DiffusersFamily`) describe each
model's positions with these: a latent video's token grid (HunyuanVideo, Wan, CogVideoX, ...), a Flux-style
id table, each optionally *sized* (``mode`` and ``train_size``: :func:`axial_rope.positions_for_size`).
Tensor ops only; sizes may be symbolic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..positions import POSITION_ONLY_MODES, grid, positions_for_size, sized_coordinates
from ..rope import AxialRoPE

__all__ = ["Sizing", "at_index", "frames_grid_positions", "grid_coordinates", "grid_positions", "id_extent",
           "ids_positions", "latent_grid", "latent_positions", "sequence_positions", "image_spacing",
           "centred_image_rows", "diagonal_text_rows", "complex_tables"]  # fmt: skip


@dataclass(frozen=True)
class Sizing:
    """``mode`` per grid axis and the training token grid: each forward's positions and scaling come from
    :func:`axial_rope.positions_for_size` (grid axes: video ``(t, y, x)``, Flux ``(y, x)``); ``grid``, the forward's
    token grid (int64 ``[n_grid_axes]``), for models whose tables module is called apart for text and image."""

    train_size: tuple[int, ...]
    mode: tuple[str, ...]
    grid: torch.Tensor | None = None  # this forward's token grid, where the tables module's inputs do not show it


def latent_grid(latent_shape, patch: tuple[int, int, int], *, channels_first: bool = True) -> tuple:
    """The token grid ``(t, y, x)`` of a latent video ``[B, C, F, H, W]`` (``channels_first=False``:
    ``[B, F, C, H, W]``, CogVideoX), cut by ``patch`` as the model's patch embedding cuts it. Symbolic sizes stay
    symbolic."""
    frames, height, width = (latent_shape[2], latent_shape[3], latent_shape[4]) if channels_first else (
        latent_shape[1], latent_shape[3], latent_shape[4])  # fmt: skip
    p_t, p_h, p_w = patch
    return -(-frames // p_t), height // p_h, width // p_w


def ids_positions(
    ids: torch.Tensor, rope: AxialRoPE, sizing: Sizing | None, *, cols: tuple[int, ...] = (1, 2),
    image: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple]:  # fmt: skip
    """Flux-style id tables ``[S, A]`` (or per item ``[B, S, A]``), whose columns ``cols`` hold integer image-grid
    ids (Flux: ``(index, y, x)``, text rows first and all zero) -> positions and scaling per axis.

    With ``sizing``, the grid ids of the image rows (``image``: a bool mask ``[S]`` or ``[B, S]`` of them;
    default every row, Flux's zero text rows included) count from their smallest value, the image's origin
    (0 for Flux; LongCat's images sit after the text), and index ``i`` becomes the origin plus the coordinate
    :func:`~axial_rope.positions_for_size` gives index ``i`` on the forward's grid: ``sizing.grid``, or ``max -
    origin + 1`` of these ids. The modes that move positions only (``none``, ``interpolate``, ``content``,
    ``normalize``) size by tensor ops, so a compiled model follows the grid without a host read or a recompile;
    ``ntk`` and ``yarn`` build frequencies from the extent, one host read (a sized forward in those modes is not
    captured whole by ``torch.compile(fullgraph=True)``; a fixed ``scaling`` is). The other rows and columns keep
    their ids.
    """
    pos = ids.float()
    if sizing is None:
        return pos, rope.scaling
    flat = pos.reshape(-1, pos.shape[-1])  # [N, A]
    rows = torch.ones(flat.shape[0], dtype=torch.bool, device=pos.device) if image is None else image.reshape(-1)
    grid_ids = flat[:, list(cols)]  # [N, n]
    if not torch.compiler.is_compiling():  # a host check, eager only
        chosen = grid_ids[rows]
        if chosen.numel() and not torch.equal(chosen.round(), chosen):
            raise ValueError(f"sizing id tables needs integer image-grid ids (columns {cols}), got fractional ones")
    # the image's origin: the smallest id of its rows (0 without image rows), by tensor ops
    big = torch.finfo(grid_ids.dtype).max
    origin = grid_ids.where(rows[:, None], big).amin(0)  # [n]
    origin = origin.where(origin < big, 0.0)
    index = (grid_ids - origin).round().long()  # [N, n]; the rows outside the image are not read
    if all(m in POSITION_ONLY_MODES for m in sizing.mode):  # positions only: the extent stays a tensor
        extent = sizing.grid if sizing.grid is not None else index.where(rows[:, None], 0).amax(0) + 1
        sized = origin + sized_coordinates(index, extent, sizing.train_size, sizing.mode).to(pos.dtype)
        return _with_image_rows(pos, flat, cols, rows, sized, grid_ids, (None,) * len(cols))
    if sizing.grid is not None:
        sizes = tuple(int(v) for v in sizing.grid)
    else:
        sizes = tuple(int(v) + 1 for v in index[rows].amax(0)) if bool(rows.any()) else (1,) * len(cols)
    coords, scaling = grid_coordinates(sizes, sizing, dtype=pos.dtype, device=pos.device)
    sized = origin + torch.stack([at_index(c, index[:, a]) for a, c in enumerate(coords)], dim=-1)
    return _with_image_rows(pos, flat, cols, rows, sized, grid_ids, scaling)


def _with_image_rows(pos, flat, cols, rows, sized, grid_ids, scaling) -> tuple[torch.Tensor, tuple]:
    """The id table with its image rows' grid columns sized (the other rows and columns as they were), and the
    scaling per column (``None`` outside the grid columns)."""
    flat = flat.clone()
    flat[:, list(cols)] = torch.where(rows[:, None], sized, grid_ids)
    full = [None] * pos.shape[-1]
    for a, col in enumerate(cols):
        full[col] = scaling[a]
    return flat.view(pos.shape), tuple(full)


def grid_coordinates(sizes: tuple[int, ...], sizing: Sizing | None, *, dtype=torch.float32, device=None):
    """The coordinate of each index along each axis of a token grid of ``sizes`` (``[n_a]`` per axis) and the
    scaling per axis: sized by :func:`~axial_rope.positions_for_size` (``sizing``), or the index itself."""
    if sizing is None:
        return [torch.arange(n, dtype=dtype, device=device) for n in sizes], (None,) * len(sizes)
    sized = positions_for_size(sizes, sizing.train_size, sizing.mode, dtype=dtype, device=device)
    mesh = sized.pos.view(*sizes, len(sizes))
    coords = [mesh[(*[0] * a, slice(None), *[0] * (len(sizes) - a - 1), a)] for a in range(len(sizes))]
    return coords, sized.scaling


def at_index(coords: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``coords[index]``, continued past the grid's end at its last step (every mode of
    :func:`~axial_rope.positions_for_size` is affine in the index): ids outside the forward's grid (a
    reference image larger than the target) keep the grid's spacing. Negative indices are clamped (unread)."""
    n = coords.shape[0]
    step = coords[1] - coords[0] if n > 1 else coords.new_ones(())
    return coords[index.clamp(0, n - 1)] + (index - (n - 1)).clamp(min=0).to(coords.dtype) * step


def id_extent(*tables: torch.Tensor | None, cols: tuple[int, ...] = (1, 2)) -> torch.Tensor:
    """The image grid id tables cover: ``max + 1`` of their columns ``cols`` over every table given (int64
    ``[len(cols)]``, tensor ops; ``None`` tables are skipped)."""
    extents = [t.reshape(-1, t.shape[-1])[:, list(cols)].amax(0).long() + 1 for t in tables if t is not None]
    if not extents:
        return torch.ones(len(cols), dtype=torch.long)
    return functools.reduce(torch.maximum, [e.to(extents[0].device) for e in extents])


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


def frames_grid_positions(
    frame_indices: torch.Tensor, height, width, rope: AxialRoPE, sizing: Sizing | None, device
) -> tuple[torch.Tensor, tuple]:
    """Frames at the pipeline's indices, each an ``height x width`` token grid -> positions ``(t, y, x)``.

    ``frame_indices`` ``[F]`` gives ``[F H W, 3]``, ``[B, F]`` gives ``[B, F H W, 3]`` (t slowest). The
    indices are the frames' places in a window of history and new frames (Helios), the same at every video
    length, so ``sizing`` sizes ``(y, x)`` only and time keeps the indices.
    """
    t = frame_indices.to(device=device, dtype=torch.float32)  # [..., F]
    if sizing is None:
        yx, scaling = grid(height, width, device=device), rope.scaling
    else:
        sized = positions_for_size((height, width), sizing.train_size, sizing.mode, device=device)
        yx, scaling = sized.pos, (None, *sized.scaling)
    lead, frames, hw = t.shape[:-1], t.shape[-1], yx.shape[0]
    tt = t[..., None, None].expand(*lead, frames, hw, 1)
    yx = yx.to(t.dtype).expand(*lead, frames, hw, 2)
    return torch.cat([tt, yx], dim=-1).flatten(-3, -2), scaling


def sequence_positions(config):
    """``config -> (rope, sizing, seq_len, device) -> (pos, scaling)``: a tables module called as ``(seq_len, device)``
    (Stable Audio 3, MiniMax): the token indices ``0 .. seq_len - 1``."""

    def positions(rope, sizing, seq_len, device):
        return grid_positions((seq_len,), rope, sizing, device)

    return positions


def image_spacing(shapes, sizing, device) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple]:
    """Qwen-Image's centred images (and NucleusMoE-Image's copy): the position step of y and x (0-d float64) and their scaling, from the largest ``(h, w)`` of ``shapes``."""
    largest = (max(s[1] for s in shapes), max(s[2] for s in shapes))
    axes, scaling = grid_coordinates(largest, sizing, dtype=torch.float64, device=device)
    steps = tuple(c[1] - c[0] if c.shape[0] > 1 else torch.ones((), dtype=c.dtype, device=device) for c in axes)
    return steps, scaling


def centred_image_rows(height: int, width: int, frame: torch.Tensor, steps, device) -> torch.Tensor:
    """An image's rows ``[f h w, 3]`` (frame slowest), y and x centred as ``scale_rope`` centres them."""
    ys = (torch.arange(height, dtype=torch.float64, device=device) - (height - height // 2)) * steps[0]
    xs = (torch.arange(width, dtype=torch.float64, device=device) - (width - width // 2)) * steps[1]
    mesh = torch.meshgrid(frame.to(torch.float64), ys, xs, indexing="ij")
    return torch.stack(mesh, dim=-1).reshape(-1, 3)


def diagonal_text_rows(start, length: int, device) -> torch.Tensor:
    """``length`` text rows from ``start``, the same position on every axis: ``[length, 3]``."""
    return (start + torch.arange(length, dtype=torch.float64, device=device))[:, None].expand(length, 3)


def complex_tables(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved channel tables ``[S, D]`` -> complex ``freqs_cis`` ``[S, D/2]`` (upstream's complex64: Qwen-Image,
    Z-Image, Bria-Fibo 2)."""
    return torch.complex(cos[..., 0::2], sin[..., 0::2])
