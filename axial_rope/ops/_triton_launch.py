"""Launch plans of the Triton kernels: one tile policy, vector width, strides, grid and arguments.

A plan (:class:`Launch`) is the kernel, its grid and its exact arguments; calling it
launches. The torch ops of ``_triton.py`` run plans, the static tests compile the same
plans for sm_90 without a GPU (with the specialisation a real launch gets), and
``scripts/kernel_sweep.py`` times them with other tiles.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton

from ._triton_kernels import rope_kernel, rope_table_kernel
from ._triton_norm_kernels import freqs_grad_kernel, norm_rope_bwd_kernel, norm_rope_kernel
from ._triton_norm_table_bwd import norm_rope_table_bwd_kernel
from ._triton_norm_table_kernels import norm_rope_table_kernel

Tensor = torch.Tensor

# triton.jit reads the variable when the kernels are decorated, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# -- tiles: one policy for every kernel ------------------------------------------------------------


@dataclass(frozen=True)
class Tile:
    """One program's work: ``heads`` heads of q or k x ``block_s`` tokens, run by ``warps`` warps."""

    block_s: int
    heads: int
    warps: int


# Padded tile elements per thread, per kernel (bf16: 4 loads of 16 bytes in flight per thread at 32).
# The norm backward holds two tiles and its weight-gradient products: 16 keeps it under 80 registers.
PER_THREAD = {"rope": 32, "rope_table": 32, "norm_rope": 32, "norm_rope_bwd": 16, "freqs_grad": 32,
              "norm_rope_table": 32, "norm_rope_table_bwd": 16}  # fmt: skip
MAX_HEADS = 4  # heads per program: each cos/sin value serves 4 heads, each thread has 4+ loads in flight
WARPS = 4
PROGRAMS_PER_SM = 8  # small problems: tokens per program halved until every SM has this many programs
DEFAULT_SMS = 132  # plans made off the GPU (static tests): an H100 SXM / H200
TILE_OVERRIDE: dict[str, Tile] = {}  # kernel name -> tile, set by scripts/kernel_sweep.py to time other tiles


def choose_tile(kernel: str, batch: int, seq: int, head_counts: tuple[int, ...], row: int, load: int, vec: int,
                n_sm: int | None) -> Tile:  # fmt: skip
    """The tile of ``kernel`` for ``batch x seq`` tokens of ``head_counts`` (q, k) heads.

    ``row``: padded channels of a head row; ``load``: the width of its widest tile load
    (the row, or one half for half pairs), of which each thread moves ``vec`` elements.

    - heads per program: the largest power of two up to MAX_HEADS dividing every head
      count (no masked heads);
    - tokens: as many as fill PER_THREAD elements per thread, but at least enough for all
      warps to lie along the tokens (heads fewer otherwise): then a thread holds all the
      program's heads of its (token, plane) pairs, so cos/sin serve them all from registers
      and sums over heads need no exchange between threads;
    - tokens halved while the GPU (``n_sm`` SMs; None: not a GPU) would get fewer than
      PROGRAMS_PER_SM programs per SM (small problems);
    - warps: fewer for tiles too small to give every thread a vector.
    """
    if kernel in TILE_OVERRIDE:
        return TILE_OVERRIDE[kernel]
    heads, elements = MAX_HEADS, PER_THREAD[kernel] * 32 * WARPS
    while any(h % heads for h in head_counts):
        heads //= 2
    token_lanes = WARPS * max(1, 32 // max(1, load // vec))  # threads along the tokens when warps are too
    while heads > 1 and elements // (heads * row) < token_lanes:
        heads //= 2
    block_s = _pow2_floor(max(1, elements // (heads * row)))
    block_s = min(block_s, triton.next_power_of_2(max(seq, 1)))
    programs = lambda: batch * triton.cdiv(seq, block_s) * sum(triton.cdiv(h, heads) for h in head_counts)
    while n_sm and block_s > 1 and programs() < PROGRAMS_PER_SM * n_sm:
        block_s //= 2
    return Tile(block_s, heads, _pow2_floor(max(1, min(WARPS, heads * block_s * row // (32 * vec)))))


def _pow2_floor(x: int) -> int:
    return 1 << (x.bit_length() - 1)


@functools.cache
def _sm_count(device: torch.device) -> int | None:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


# -- arguments ---------------------------------------------------------------------------------------


@dataclass
class Launch:
    """One planned launch, ``kernel[grid](*args, **meta)``.

    ``partial``: its buffer of per-program sums, if any, laid out ``[B, head groups, token
    blocks, ...]`` (grid axes from slowest); the first ``q_groups`` head groups are q's.
    """

    kernel: object
    grid: tuple[int, int, int]
    args: tuple
    meta: dict
    partial: Tensor | None = None
    q_groups: int = 0
    table_partial: Tensor | None = None  # table gradients [2, B, groups, S, n] (norm_rope_table_bwd)

    def __call__(self) -> None:
        if math.prod(self.grid):
            self.kernel[self.grid](*self.args, **self.meta)


def _bshd(x: Tensor | None, layout: str) -> Tensor | None:
    """The canonical ``[B, S, H, D]`` view the kernels index (no copy)."""
    return x if x is None or layout == "bshd" else x.transpose(1, 2)


def _vector(tensors: list[Tensor], head_dim: int, n: int, interleaved: bool) -> int:
    """Elements per aligned vector (16 bytes at most) that every row start is a multiple of; 1 is the fallback.

    Rows start at ``b*sb + s*ss + h*sh`` elements from the base pointer: the strides of
    every axis longer than one and the pointers must be multiples, so must the row length
    and, for half pairs, the offset N of the second half. Channels must be contiguous.
    """
    size = tensors[0].element_size()
    vec = 16 // size
    for t in tensors:
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            return 1
        vec = math.gcd(vec, t.data_ptr() // size, *(st for st, n_ in zip(t.stride()[:3], t.shape[:3]) if n_ > 1))
    return math.gcd(vec, head_dim, 2 * n if interleaved else n)


def _strides(t: Tensor | None, vec: int) -> tuple[int, int, int, int] | None:
    """``[B, S, H, D]`` strides: batch, token and head in units of ``vec`` elements (0 on axes of length 1)."""
    if t is None:
        return None
    return (*(st // vec if n > 1 else 0 for st, n in zip(t.stride()[:3], t.shape[:3])), t.stride(3))


def _grid_and_meta(kernel: str, x: Tensor, head_counts: tuple[int, ...], n: int, interleaved: bool,
                   tensors: list[Tensor], tile: Tile | None, n_sm: int | None) -> tuple[tuple, dict]:  # fmt: skip
    """Grid ``(token blocks, head groups of q then k, B)`` and the constexprs every kernel takes."""
    batch, seq, _, head_dim = x.shape
    vec = _vector(tensors, head_dim, n, interleaved)
    block_n = triton.next_power_of_2(head_dim) // 2 if interleaved else triton.next_power_of_2(n)
    rest = 0 if interleaved else head_dim - 2 * n  # half pairs, partial rotary: a third tile
    row = 2 * block_n + (triton.next_power_of_2(rest) if rest else 0)
    load = 2 * block_n if interleaved else block_n  # the widest single tile load
    n_sm = _sm_count(x.device) if n_sm is None else n_sm
    tile = tile or choose_tile(kernel, batch, seq, head_counts, row, load, vec, n_sm)
    groups = sum(triton.cdiv(h, tile.heads) for h in head_counts)
    meta = dict(N=n, D=head_dim, INTERLEAVED=interleaved, VEC=vec, HEADS=tile.heads, BLOCK_S=tile.block_s,
                BLOCK_N=block_n, num_warps=tile.warps)  # fmt: skip
    if kernel != "freqs_grad":
        meta["BLOCK_R"] = triton.next_power_of_2(max(rest, 1))
    return (triton.cdiv(seq, tile.block_s), groups, batch), meta


def _precision(q: Tensor) -> dict:
    """float64 inputs compute in float64; float32 cos/sin use the hardware approximations on GPUs."""
    f64 = q.dtype == torch.float64
    return dict(F64=f64, FAST_TRIG=not (f64 or INTERPRETED))


def _angles(q: Tensor, pos: Tensor, freqs: Tensor, scale: Tensor | None) -> tuple[tuple, dict]:
    """Arguments ``(pos, F, scale, pos strides, F strides)`` (F as ``[H|1, A, n]``) and their constexprs.

    Kept in their dtypes: the kernels convert them to float64 in registers, so a call is a
    single launch (no conversion kernels before it).
    """
    pos = pos.to(device=q.device)
    freqs = freqs.detach().to(device=q.device)
    freqs = freqs if freqs.ndim == 3 else freqs[None]
    scale = None if scale is None else scale.to(device=q.device)
    pos_strides = (pos.stride(0) if pos.shape[0] > 1 else 0, pos.stride(1), pos.stride(2))
    freqs_strides = (freqs.stride(0) if freqs.shape[0] > 1 else 0, freqs.stride(1), freqs.stride(2))
    meta = dict(N_AXES=freqs.shape[1], PER_HEAD=freqs.shape[0] > 1, **_precision(q))
    return (pos, freqs, scale, pos_strides, freqs_strides), meta


# -- plans, one per kernel ---------------------------------------------------------------------------


@dataclass
class _QKPlan:
    """What the plans of the q/k kernels share (rotation, fused norm and its backward, F gradient).

    ``views``: the tensors as ``[B, S, H, D]`` views (q and k first; None stays None); ``angles``
    ``(pos, F, scale)`` and ``strides`` (the views', then pos's and F's) follow the tensors' pointers
    in every kernel's arguments, ``sizes`` ``(S, HQ, HK, HF)`` (HK 0 without k; HF: F's heads, 1 when
    shared) close them; ``rest``:
    channels past ``2N`` (half pairs, partial rotary).
    """

    views: list
    grid: tuple[int, int, int]
    meta: dict
    angles: tuple
    strides: tuple
    sizes: tuple[int, int, int, int]
    rest: bool


def _qk_plan(kernel: str, tensors: tuple, pos, freqs, scale, interleaved: bool, layout: str, tile: Tile | None,
             n_sm: int | None) -> _QKPlan:  # fmt: skip
    views = [_bshd(t, layout) for t in tensors]
    qc, kc = views[:2]
    heads = tuple(t.shape[2] for t in (qc, kc) if t is not None)
    n = freqs.shape[-1]
    grid, meta = _grid_and_meta(kernel, qc, heads, n, interleaved, [t for t in views if t is not None], tile, n_sm)
    (pos, freqs, scale, *angle_strides), angle_meta = _angles(tensors[0], pos, freqs, scale)
    strides = (*(_strides(t, meta["VEC"]) for t in views), *angle_strides)
    sizes = (qc.shape[1], heads[0], heads[1] if kc is not None else 0, freqs.shape[0])  # F as [HF, A, n]
    rest = not interleaved and qc.shape[3] > 2 * n
    return _QKPlan(views, grid, meta | angle_meta, (pos, freqs, scale), strides, sizes, rest)


def plan_rope(q, k, qo, ko, pos, freqs, scale, interleaved: bool, layout: str, conj: bool, *,
              tile: Tile | None = None, n_sm: int | None = None) -> Launch:  # fmt: skip
    """q (and k, or None) rotated by ``pos @ freqs`` into qo (and ko), which may be q and k (in place)."""
    p = _qk_plan("rope", (q, k, qo, ko), pos, freqs, scale, interleaved, layout, tile, n_sm)
    args = (*p.views, *p.angles, *p.strides, *p.sizes)
    copy_rest = p.rest and qo is not q  # in place: already there
    return Launch(rope_kernel, p.grid, args, p.meta | dict(CONJ=conj, COPY_REST=copy_rest))


def plan_rope_table(x, o, cos, sin, interleaved: bool, layout: str, conj: bool, *,
                    tile: Tile | None = None, n_sm: int | None = None) -> Launch:  # fmt: skip
    """x rotated into o (x itself: in place) by plane tables ``[B|1, S, H_t|1, n]`` in x's layout (``H_t`` dividing
    x's heads: head h reads table head ``h // (H / H_t)``)."""
    xc, oc = _bshd(x, layout), _bshd(o, layout)
    n = cos.shape[-1]
    if cos.stride() != sin.stride():  # the kernel addresses both tables with one set of strides
        cos, sin = cos.contiguous(), sin.contiguous()
    table = _bshd(cos, layout)  # [B|1, S|1, H_t|1, n]: H_t heads, each serving H / H_t heads of x (grouped)
    table_strides = tuple(st if size > 1 else 0 for st, size in zip(table.stride(), table.shape))
    group = xc.shape[2] // table.shape[2] if table.shape[2] > 1 else 1
    grid, meta = _grid_and_meta("rope_table", xc, (xc.shape[2],), n, interleaved, [xc, oc], tile, n_sm)
    args = (xc, oc, cos, sin, _strides(xc, meta["VEC"]), _strides(oc, meta["VEC"]), table_strides, *xc.shape[1:3],
            group)  # fmt: skip
    copy_rest = not interleaved and xc.shape[3] > 2 * n and o is not x
    per_head = table.shape[2] > 1
    meta |= dict(PER_HEAD=per_head, CONJ=conj, COPY_REST=copy_rest, F64=x.dtype == torch.float64)
    return Launch(rope_table_kernel, grid, args, meta)


def plan_norm_rope(q, k, q_weight, k_weight, qo, ko, eps, pos, freqs, scale, interleaved: bool, layout: str, *,
                   tile: Tile | None = None, n_sm: int | None = None) -> Launch:  # fmt: skip
    """Per-head RMSNorm of q and k (weights ``[D]`` or None), then rotation, into qo and ko."""
    p = _qk_plan("norm_rope", (q, k, qo, ko), pos, freqs, scale, interleaved, layout, tile, n_sm)
    qc, kc, qoc, koc = p.views
    args = (qc, kc, q_weight, k_weight, qoc, koc, *p.angles, *p.strides, eps, *p.sizes)
    return Launch(norm_rope_kernel, p.grid, args, p.meta | dict(HAS_REST=p.rest))


def plan_norm_rope_bwd(gq, gk, q, k, q_weight, k_weight, dq, dk, eps, pos, freqs, scale, interleaved: bool,
                       layout: str, *, tile: Tile | None = None, n_sm: int | None = None) -> Launch:  # fmt: skip
    """Gradients of :func:`plan_norm_rope` into dq, dk; ``partial``: one weight-gradient row ``[D]`` per program."""
    p = _qk_plan("norm_rope_bwd", (q, k, gq, gk, dq, dk), pos, freqs, scale, interleaved, layout, tile, n_sm)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    has_weight = q_weight is not None or k_weight is not None
    partial = torch.empty(math.prod(p.grid), q.shape[-1], device=q.device, dtype=acc) if has_weight else None
    args = (*p.views[:4], q_weight, k_weight, *p.views[4:], partial, *p.angles, *p.strides, eps, *p.sizes)
    meta = p.meta | dict(HAS_REST=p.rest)
    return Launch(norm_rope_bwd_kernel, p.grid, args, meta, partial, triton.cdiv(p.sizes[1], meta["HEADS"]))


def plan_freqs_grad(q, k, gq, gk, pos, freqs, scale, interleaved: bool, layout: str, *,
                    tile: Tile | None = None, n_sm: int | None = None) -> Launch:  # fmt: skip
    """Gradient of F from q, k and their output gradients; ``partial`` ``[programs, HEADS|1, BLOCK_A, BLOCK_N]``."""
    p = _qk_plan("freqs_grad", (q, k, gq, gk), pos, freqs, scale, interleaved, layout, tile, n_sm)
    rows = p.meta["HEADS"] if p.meta["PER_HEAD"] else 1
    block_a = triton.next_power_of_2(p.angles[1].shape[1])  # F [H|1, A, n]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    partial = torch.empty(math.prod(p.grid), rows, block_a, p.meta["BLOCK_N"], device=q.device, dtype=acc)
    args = (*p.views, partial, *p.angles, *p.strides, *p.sizes)
    meta = p.meta | dict(BLOCK_A=block_a)
    return Launch(freqs_grad_kernel, p.grid, args, meta, partial, triton.cdiv(p.sizes[1], meta["HEADS"]))


def _norm_table_plan(kernel: str, x_views: list, tensors: list, cos, sin, across: bool, interleaved: bool,
                     layout: str, tile: Tile | None, n_sm: int | None) -> tuple:  # fmt: skip
    """Grid, constexprs and table arguments of the QK-norm + table kernels; ``x_views``: q and k as ``[B, S, H, D]``.

    Across heads a program walks all of its tensor's heads: the grid has two head "groups" (q, k), and
    its tokens are halved while the GPU would get fewer than PROGRAMS_PER_SM programs per SM.
    """
    qc, kc = x_views
    heads = (qc.shape[2], kc.shape[2])
    n = cos.shape[-1]
    grid, meta = _grid_and_meta(kernel, qc, heads, n, interleaved, tensors, tile, n_sm)
    if across:
        block_s, n_sm = meta["BLOCK_S"], _sm_count(qc.device) if n_sm is None else n_sm
        while tile is None and n_sm and block_s > 1 and 2 * qc.shape[0] * triton.cdiv(qc.shape[1], block_s) < (
            PROGRAMS_PER_SM * n_sm
        ):
            block_s //= 2
        row = triton.next_power_of_2(qc.shape[3])
        warps = _pow2_floor(max(1, min(WARPS, meta["HEADS"] * block_s * row // (32 * meta["VEC"]))))
        meta |= dict(BLOCK_S=block_s, num_warps=warps)
        grid = (triton.cdiv(qc.shape[1], block_s), 2, qc.shape[0])
    if cos.stride() != sin.stride():  # one set of strides addresses both tables
        cos, sin = cos.contiguous(), sin.contiguous()
    table = _bshd(cos, layout).expand(*qc.shape[:-1], n)  # [B, S, H, n], 0 strides on broadcast axes
    has_rest = not interleaved and qc.shape[3] > 2 * n
    meta |= dict(HAS_REST=has_rest, ACROSS=across, F64=qc.dtype == torch.float64)
    return grid, meta, (cos, sin, table.stride())


def plan_norm_rope_table(q, k, q_weight, k_weight, q_bias, k_bias, qo, ko, cos, sin, eps: float, layer: bool,
                         across: bool, interleaved: bool, layout: str, *, tile: Tile | None = None,
                         n_sm: int | None = None) -> Launch:  # fmt: skip
    """QK-norm of q and k (RMSNorm or LayerNorm, per head or across heads), then rotation by plane tables.

    Weights and biases ``[D]`` or ``[H * D]`` (contiguous) or None; cos/sin ``[B|1, S, 1, n]`` in bshd order
    (``[B|1, 1, S, n]`` for bhsd); results into qo, ko.
    """
    views = [_bshd(t, layout) for t in (q, k, qo, ko)]
    grid, meta, (cos, sin, table_strides) = _norm_table_plan(
        "norm_rope_table", views[:2], views, cos, sin, across, interleaved, layout, tile, n_sm
    )
    qc, kc, qoc, koc = views
    strides = [_strides(t, meta["VEC"]) for t in views]
    args = (qc, kc, q_weight, k_weight, q_bias, k_bias, qoc, koc, cos, sin, *strides, table_strides, eps,
            qc.shape[1], qc.shape[2], kc.shape[2])  # fmt: skip
    return Launch(norm_rope_table_kernel, grid, args, meta | dict(LAYER=layer))


def plan_norm_rope_table_bwd(gq, gk, q, k, q_weight, k_weight, q_bias, k_bias, dq, dk, cos, sin, eps: float,
                             layer: bool, across: bool, interleaved: bool, layout: str, table_grad: bool, *,
                             tile: Tile | None = None, n_sm: int | None = None) -> Launch:  # fmt: skip
    """Gradients of :func:`plan_norm_rope_table` into dq, dk; ``partial``: weight and bias gradient rows
    ``[programs, 2, ROW]`` (ROW: D, or the larger of q's and k's H * D across heads); ``table_partial``:
    ``[2, B, groups, S, n]`` (with ``table_grad``)."""
    views = [_bshd(t, layout) for t in (q, k, gq, gk, dq, dk)]
    grid, meta, (cos, sin, table_strides) = _norm_table_plan(
        "norm_rope_table_bwd", views[:2], views, cos, sin, across, interleaved, layout, tile, n_sm
    )
    qc, kc = views[:2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    head_dim = qc.shape[3]
    row = max(qc.shape[2], kc.shape[2]) * head_dim if across else head_dim
    params = any(t is not None for t in (q_weight, k_weight, q_bias, k_bias))
    partial = torch.empty(math.prod(grid), 2, row, device=q.device, dtype=acc) if params else None
    n = cos.shape[-1]
    tables = torch.empty(2, qc.shape[0], grid[1], qc.shape[1], n, device=q.device, dtype=acc) if table_grad else None
    strides = [_strides(t, meta["VEC"]) for t in views]
    args = (*views[:4], q_weight, k_weight, q_bias, k_bias, *views[4:], partial, tables, cos, sin, *strides,
            table_strides, eps, qc.shape[1], qc.shape[2], kc.shape[2], row)  # fmt: skip
    meta |= dict(LAYER=layer, PARAM_GRAD=params, TABLE_GRAD=table_grad)
    q_groups = 1 if across else triton.cdiv(qc.shape[2], meta["HEADS"])
    return Launch(norm_rope_table_bwd_kernel, grid, args, meta, partial, q_groups, tables)
