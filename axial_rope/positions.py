"""Token coordinates as data: ``pos`` is float32 ``[S, n_axes]``, one column per axis.

A grid lists its points with the first axis slowest (``meshgrid(indexing="ij")``),
which is the order of a ``(t, y, x)`` latent flattened row-major: the token at
flat index ``(ti * H + yi) * W + xi`` sits at ``(ti, yi, xi)``.

Sizes may be symbolic (``torch.compile(dynamic=True)``, ``torch.export`` with dynamic
dimensions): the functions here build positions from them with torch ops and branch on a size
only where a mode must (whether an axis is longer than in training, for NTK and YaRN).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from .scaling import NTK, Scaling, YaRN

__all__ = ["grid", "crop_grid", "text_positions", "positions_for_size", "sized_coordinates", "SizedPositions",
           "POSITION_MODES", "POSITION_ONLY_MODES"]

POSITION_MODES = ("none", "interpolate", "ntk", "yarn", "normalize", "content")

_NORMALIZE = (False, True, "separate", "max", "min")


_SYMBOLIC = (torch.SymInt, torch.SymFloat)


def _per_axis(name: str, value: float | Sequence[float], n_axes: int) -> list[float]:
    values = [value] * n_axes if isinstance(value, (int, float, *_SYMBOLIC)) else list(value)
    if len(values) != n_axes:
        raise ValueError(f"{name} must be a number or a sequence of {n_axes} numbers (one per axis), got {value!r}")
    for v in values:
        if isinstance(v, _SYMBOLIC):  # a traced size's ratio: finite by construction
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not abs(v) < math.inf:  # refuses NaN, inf
            raise ValueError(f"{name} must hold finite numbers, got {value!r}")
    return [v if isinstance(v, _SYMBOLIC) else float(v) for v in values]


def _check_sizes(sizes: Sequence[int]) -> None:
    """Positive ints; a symbolic size (``torch.SymInt``) passes, a traced size being a positive extent."""
    if not sizes:
        raise ValueError("grid needs at least one size, e.g. grid(H, W)")
    for s in sizes:
        if isinstance(s, torch.SymInt):
            continue
        if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
            raise ValueError(f"grid sizes must be positive ints, got {tuple(sizes)!r}")


def _cast(coords: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """float64 coordinates in ``dtype``, refusing a dtype that would change one.

    An integer dtype would truncate fractional coordinates (``grid(4, dtype=torch.int64,
    scale=0.5)``); float16 and bfloat16 round integers past 2048 / 256.
    """
    if dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype {dtype} rounds coordinates (257 becomes 256 in bfloat16); use float32 or float64")
    if not dtype.is_floating_point and bool((coords != coords.round()).any()):
        raise ValueError(f"dtype {dtype} would truncate fractional coordinates; use a float dtype")
    return coords.to(dtype=dtype, device=device)


def _mesh(axes: list[torch.Tensor], dtype: torch.dtype, device) -> torch.Tensor:
    """float64 coordinates per axis ``[n_a]`` -> ``[prod(n), n_axes]`` in ``dtype``, first axis slowest."""
    return _cast(torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(axes)), dtype, device)


def grid(
    *sizes: int,
    offset: float | Sequence[float] = 0.0,
    scale: float | Sequence[float] = 1.0,
    center: bool = False,
    normalize: bool | str = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Coordinates of a regular grid of tokens.

    Each axis of extent ``n`` starts from integer coordinates ``0 .. n - 1``, then:

    1. ``normalize``: cell centres mapped into ``[-1, 1]`` as DINOv3 does,
       ``2 (i + 0.5) / n - 1`` (``True`` or ``"separate"``: each axis by its own
       extent; ``"max"`` / ``"min"``: every axis by the largest / smallest extent, so
       the aspect ratio is kept);
    2. ``center``: the coordinates are shifted to be symmetric about 0 (``i - (n - 1) / 2``);
    3. ``scale`` (per axis): multiplied, e.g. ``0.5`` to interpolate a 2x larger grid
       into the trained range;
    4. ``offset`` (per axis): added, e.g. the text length so image tokens follow text.

    Args:
        *sizes: the extent of each axis, e.g. ``grid(T, H, W)``.

    Returns:
        ``pos``: ``[prod(sizes), len(sizes)]`` in ``dtype`` (float32 by default; integer
        coordinates up to 2**24 are exact there).
    """
    _check_sizes(sizes)
    n_axes = len(sizes)
    if normalize not in _NORMALIZE:
        raise ValueError(f"normalize must be one of {_NORMALIZE}, got {normalize!r}")
    offsets, scales = _per_axis("offset", offset, n_axes), _per_axis("scale", scale, n_axes)
    ref = {"max": functools.reduce(torch.sym_max, sizes), "min": functools.reduce(torch.sym_min, sizes)}
    axes = []
    for n, o, s in zip(sizes, offsets, scales):
        c = torch.arange(n, dtype=torch.float64)
        if normalize:
            c = 2 * (c + 0.5) / ref.get(normalize, n) - 1
        if center:
            c = c - c.mean()
        axes.append(c * s + o)  # float64 until here, so scale and offset add no rounding
    return _mesh(axes, dtype, device)


def crop_grid(
    start: Sequence[float],
    stop: Sequence[float],
    sizes: Sequence[int],
    *,
    diffusers_compat: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Coordinates of ``sizes`` points spread over the crop ``[start, stop)`` of each axis.

    Axis ``a`` gets ``start[a] + (stop[a] - start[a]) * i / sizes[a]``: NumPy's
    ``linspace(start, stop, n, endpoint=False)``, as HunyuanDiT and CogVideoX 1.0
    (``crops_coords = ((top, left), (bottom, right))``) define it. This is the default.

    ``diffusers_compat=True`` reproduces diffusers' torch port,
    ``linspace(start, stop * (n - 1) / n, n)``, which agrees only for crops that start
    at 0; use it to match checkpoints tuned with that code.

    Returns:
        ``pos``: ``[prod(sizes), len(sizes)]``, first axis slowest.
    """
    sizes = tuple(sizes)
    _check_sizes(sizes)
    starts, stops = _per_axis("start", start, len(sizes)), _per_axis("stop", stop, len(sizes))
    axes = []
    for a, b, n in zip(starts, stops, sizes):
        if diffusers_compat:
            axes.append(torch.linspace(a, b * (n - 1) / n, n, dtype=torch.float32).double())
        else:
            axes.append(a + (b - a) * torch.arange(n, dtype=torch.float64) / n)
    return _mesh(axes, dtype, device)


def text_positions(
    length: int,
    n_axes: int = 1,
    *,
    start: float = 0.0,
    step: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Positions of ``length`` text tokens, the same value on every axis: ``start + step * i``.

    ``step=0`` gives Flux's all-zero text ids; ``step=1`` the M-RoPE (Qwen2-VL) text
    positions, after which an image grid continues with ``grid(..., offset=start + length)``.

    Returns:
        ``pos``: ``[length, n_axes]``.
    """
    if not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    if not isinstance(n_axes, int) or n_axes <= 0:
        raise ValueError(f"n_axes must be a positive int, got {n_axes!r}")
    column = start + step * torch.arange(length, dtype=torch.float64)
    return _cast(column[:, None].expand(length, n_axes), dtype, device).contiguous()


def _sized(c, n, s, mode: str, common, spread):
    """The coordinate of token indices ``c`` (float64) on an axis of ``n`` tokens grown ``s``-fold under ``mode``:
    the one formula of :func:`positions_for_size` (``common``: the growth the ``"content"`` axes share; ``spread``:
    the ``"normalize"`` ratio); sizes may be Python, symbolic or 0-d tensors."""
    if mode == "interpolate":
        return c / s
    if mode == "content":
        return c / common
    if mode == "normalize":
        return (c + 0.5 - n / 2) * spread
    return c


POSITION_ONLY_MODES = ("none", "interpolate", "normalize", "content")  # modes that move positions, not frequencies


def sized_coordinates(
    index: torch.Tensor, sizes: torch.Tensor, train_sizes: Sequence[int], mode: str | Sequence[str]
) -> torch.Tensor:
    """What :func:`positions_for_size` gives integer grid indices, with the grid's extent a tensor: no host read.

    For the modes that move positions only (:data:`POSITION_ONLY_MODES`) the coordinate is affine in the index, so
    indices past the grid's end continue its spacing (a reference image larger than the target).

    Args:
        index: int ``[N, n_axes]`` grid indices.
        sizes: int ``[n_axes]``, tokens per axis of this forward's grid (e.g. ``index.amax(0) + 1``).
        train_sizes: tokens per axis in training.
        mode: one of :data:`POSITION_ONLY_MODES`, or one per axis.

    Returns:
        float64 ``[N, n_axes]``.
    """
    n_axes = index.shape[-1]
    modes = (mode,) * n_axes if isinstance(mode, str) else tuple(mode)
    if len(modes) != n_axes or any(m not in POSITION_ONLY_MODES for m in modes):
        raise ValueError(f"mode must be one of {POSITION_ONLY_MODES} or one per axis ({n_axes}), got {mode!r}")
    n = sizes.to(torch.float64)
    train = torch.tensor(tuple(train_sizes), dtype=torch.float64, device=n.device)
    factors = (n / train).clamp(min=1.0)  # s_a, as positions_for_size
    pick = lambda name: torch.tensor([m == name for m in modes], device=n.device)  # noqa: E731
    common = factors.where(pick("content"), torch.inf).amin().clamp(max=torch.inf)
    common = torch.where(torch.isinf(common), torch.ones_like(common), common)
    normalized = pick("normalize")
    spread = train.where(normalized, 1.0).amax() / n.where(normalized, 1.0).amax()
    c = index.to(torch.float64)
    return torch.stack([_sized(c[:, a], n[a], factors[a], m, common, spread) for a, m in enumerate(modes)], dim=-1)


class SizedPositions(NamedTuple):
    """What :func:`positions_for_size` decides for one grid size."""

    pos: torch.Tensor  # [prod(sizes), n_axes]
    scaling: tuple[Scaling | None, ...]  # one method (or None) per axis, for AxialRoPE(scaling=...)
    factors: tuple[float, ...]  # s_a = max(n_a / n_train_a, 1) per axis


def positions_for_size(
    sizes: Sequence[int],
    train_sizes: int | Sequence[int],
    mode: str | Sequence[str] = "none",
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> SizedPositions:
    """Positions and per-axis frequency scaling for a grid of ``sizes`` tokens, for a model trained at ``train_sizes``.

    The one place where a size not seen in training changes positions or frequencies: the
    reference DiTs, the timm ViTs, the diffusers adapters and the experiments all call it.
    With ``n_a`` tokens on axis ``a`` now and ``N_a`` in training, the factor is
    ``s_a = max(n_a / N_a, 1)``: only axes longer than in training are scaled. Token
    ``i`` of axis ``a`` then gets (see ``docs/scaling.md``):

    - ``"none"``: ``pos = i``, no scaling (extrapolation);
    - ``"interpolate"``: ``pos = i / s_a`` (position interpolation, Chen et al. 2023);
    - ``"ntk"``: ``pos = i``, :class:`~axial_rope.scaling.NTK` ``(s_a)`` on axes with ``s_a > 1``;
    - ``"yarn"``: ``pos = i``, :class:`~axial_rope.scaling.YaRN` ``(s_a, N_a)`` on axes with ``s_a > 1``;
    - ``"normalize"``: ``pos = (i + 1/2 - n_a / 2) * M / m``, cell centres in ``[-1, 1]`` by the
      longest normalised axis ``m = max n_a`` (the aspect ratio is kept), times ``M / 2`` with
      ``M = max N_a``, so the training size has unit spacing (centred). Sizes below the
      training size are compressed the other way; the mode has no factor;
    - ``"content"``: ``pos = i / c`` with ``c = min_a s_a`` over the axes in this mode: positions
      interpolated by the growth those axes share. Content that grows with the image (the same
      scene at a higher resolution) is interpolated as by ``"interpolate"``; extent one side gains
      beyond the other (a wider canvas, another aspect ratio) keeps unit spacing, as ``"none"``
      would. One ``"content"`` axis is ``"interpolate"``. A square upscale is interpolation and a
      1:2 canvas of the trained height plain positions: what the resolution study measured best
      for each (docs/experiments/resolution.md); the automatic policy (:mod:`axial_rope.policy`)
      plans it for image axes.

    Args:
        sizes: tokens per axis now, e.g. ``(h, w)`` or ``(t, h, w)``.
        train_sizes: tokens per axis in training (one int: every axis).
        mode: one of :data:`POSITION_MODES`, or one per axis (e.g. ``("none", "interpolate",
            "interpolate")`` to interpolate space but not time).

    Returns:
        :class:`SizedPositions` ``(pos, scaling, factors)``: ``pos`` ``[prod(sizes), n_axes]`` in
        ``dtype``, first axis slowest (as :func:`grid`); ``scaling`` one method or ``None`` per axis.
    """
    sizes = tuple(sizes)
    _check_sizes(sizes)
    n_axes = len(sizes)
    train = (train_sizes,) * n_axes if isinstance(train_sizes, int) else tuple(train_sizes)
    if len(train) != n_axes:
        raise ValueError(f"train_sizes must be an int or one size per axis ({n_axes}), got {train_sizes!r}")
    _check_sizes(train)
    modes = (mode,) * n_axes if isinstance(mode, str) else tuple(mode)
    if len(modes) != n_axes or any(m not in POSITION_MODES for m in modes):
        raise ValueError(f"mode must be one of {POSITION_MODES} or one per axis ({n_axes}), got {mode!r}")
    factors = tuple(torch.sym_max(n / t, 1.0) for n, t in zip(sizes, train))  # no branch on a symbolic size
    normalized = [a for a, m in enumerate(modes) if m == "normalize"]
    longest = functools.reduce(torch.sym_max, (sizes[a] for a in normalized), 1)
    longest_train = functools.reduce(torch.sym_max, (train[a] for a in normalized), 1)
    # the growth every "content" axis shares (sym_min: no branch on a symbolic size)
    content = [factors[a] for a, m in enumerate(modes) if m == "content"]
    common = functools.reduce(torch.sym_min, content) if content else 1.0
    axes, scaling = [], []
    for n, t, s, m in zip(sizes, train, factors, modes):
        c = _sized(torch.arange(n, dtype=torch.float64), n, s, m, common, longest_train / longest)
        scaled = m in ("ntk", "yarn") and s > 1  # only these modes look at the factor (a guard when symbolic)
        # the method's frequencies are Python math on the factor: a symbolic one is specialised (float()),
        # so a compiled model recompiles per size in these modes instead of breaking its graph
        scaling.append((NTK(float(s)) if m == "ntk" else YaRN(float(s), t)) if scaled else None)
        axes.append(c)
    return SizedPositions(_mesh(axes, dtype, device), tuple(scaling), factors)
