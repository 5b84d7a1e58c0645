"""CRPA, Cross-Resolution Phase-Aligned Attention (Wu et al. 2025, arXiv 2511.19778): keys on the query's stride.

Mixed-resolution denoising holds tokens of several grids in one sequence: a low-resolution token covers
``s x s`` cells of the finest grid. Mapping each token to RoPE positions by its *own* stride (linear
interpolation, ``pos = x / s_token``) makes one physical distance turn a plane by different angles depending on
which grid its tokens come from, and the heads' sharp phase selectivity breaks. CRPA expresses every query and
key of one attention call on the *query's* stride:

    pos_q = x_q / s_q,        pos_k = x_k / s_q

with ``x`` the tokens' physical coordinates (cell centres in units of the finest grid), so a physical
displacement ``x_k - x_q`` always turns plane ``j`` by ``(x_k - x_q) / s_q . F[:, j]``, as it did in training
at the query's resolution. Queries of different strides are different calls (one per query grid); the keys of
each call are the whole sequence, re-indexed.

In the rotation contract this is a :class:`~axial_rope.ops.rotation.QKRotation` whose key side carries other
positions: the angle stays relative, to where the keys are placed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..ops.rotation import QKRotation
from ..positions import grid

__all__ = ["crpa_positions", "crpa_rotation", "grid_coordinates"]


def _strides(stride: float | Sequence[float], n_axes: int) -> torch.Tensor:
    values = tuple(stride) if isinstance(stride, (tuple, list)) else (stride,) * n_axes
    if len(values) != n_axes or any(
        isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf for v in values
    ):
        raise ValueError(f"query_stride must be one positive number or one per axis ({n_axes}), got {stride!r}")
    return torch.tensor(values, dtype=torch.float64)


def grid_coordinates(
    *sizes: int, stride: float | Sequence[float], origin: float | Sequence[float] = 0.0
) -> torch.Tensor:
    """Physical coordinates of a grid of tokens each ``stride`` cells wide: cell centres ``origin + stride (i + 1/2)``.

    Args:
        *sizes: the grid's extent per axis (tokens), e.g. ``(h, w)``.
        stride: cells of the finest grid per token, one number or one per axis (1: the finest grid).
        origin: where the grid starts, in cells (a region's corner in a mixed-resolution canvas).

    Returns:
        float64 ``[prod(sizes), len(sizes)]`` (first axis slowest, as :func:`axial_rope.grid`).
    """
    strides = _strides(stride, len(sizes)).tolist()
    origins = tuple(origin) if isinstance(origin, (tuple, list)) else (origin,) * len(sizes)
    if len(origins) != len(sizes):
        raise ValueError(f"origin must be one number or one per axis ({len(sizes)}), got {origin!r}")
    offset = [o + s / 2 for o, s in zip(origins, strides)]
    return grid(*sizes, scale=strides, offset=offset, dtype=torch.float64)


def crpa_positions(coords: torch.Tensor, query_stride: float | Sequence[float]) -> torch.Tensor:
    """Physical coordinates ``[..., S, R]`` on the query's stride: ``coords / query_stride`` (float64)."""
    if not isinstance(coords, torch.Tensor) or coords.ndim not in (2, 3) or not coords.is_floating_point():
        got = f"{coords.dtype} {tuple(coords.shape)}" if isinstance(coords, torch.Tensor) else type(coords).__name__
        raise ValueError(f"coords must be float [S, R] or [B, S, R] physical coordinates, got {got}")
    return coords.to(torch.float64) / _strides(query_stride, coords.shape[-1]).to(coords.device)


def crpa_rotation(
    rope,
    query_coords: torch.Tensor,
    key_coords: torch.Tensor,
    query_stride: float | Sequence[float],
    **kwargs,
) -> QKRotation:
    """The rotation of one attention call whose queries share one stride: queries and keys on that stride.

    Args:
        rope: the model's rope (an :class:`~axial_rope.AxialRoPE` or any rope-like object).
        query_coords: the queries' physical coordinates ``[S_q, R]`` or ``[B, S_q, R]`` (:func:`grid_coordinates`).
        key_coords: the keys' physical coordinates ``[S_k, R]`` or ``[B, S_k, R]``, any mix of grids.
        query_stride: the queries' stride in cells, one number or one per axis.
        **kwargs: passed to ``rope.rotation`` (``seq_len=``, ``t=``).

    Returns:
        ``QKRotation(rope.rotation(query_coords / s_q), rope.rotation(key_coords / s_q))``.
    """
    query = rope.rotation(crpa_positions(query_coords, query_stride), **kwargs)
    key = rope.rotation(crpa_positions(key_coords, query_stride), **kwargs)
    return QKRotation(query, key)
