"""The fast pure-PyTorch backend: real arithmetic in float32, any device, compile-friendly.

No complex dtypes, no host synchronisation (``.item()``, ``.tolist()``), no
data-dependent control flow, so ``torch.compile(fullgraph=True)`` traces it.

Two paths compute the same thing:

- the *expression path* (:func:`rotate_expr`): plain differentiable elementwise ops. It
  runs under ``torch.compile`` (inductor fuses it into one kernel) and whenever the
  tables need a gradient (learnable frequencies).
- the *eager path* (:class:`_RotateByTable`), everywhere else. Eager PyTorch spends its
  time on memory, not arithmetic: every op of the expression path writes a fresh
  float32 tensor of x's size, and on CPU a fresh large tensor also costs a page fault
  per 4 KiB. The eager path writes into preallocated buffers with ``out=``/in-place ops
  (``out = x * cos_full``, then ``addcmul_`` of the signed sin table with x's plane
  partners: one gather for interleaved pairs, because stride-2 elementwise ops are not
  vectorised; the two contiguous halves for half pairs) and, on CPU, walks x in chunks
  of 256K elements so the float32 work buffers stay in cache. Its backward is the same
  function rotating by minus the angle; it saves only the tables.
"""

from __future__ import annotations

import functools

import torch

from .common import compute_dtype, rotate_qk_by_tables

CHUNK = 1 << 18  # elements per CPU chunk: three float32 work buffers of 1 MiB, cache-resident


def rotate_expr(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """The differentiable expression path (same contract as :func:`apply_table`)."""
    n = cos.shape[-1]
    rotated = x[..., : 2 * n].to(compute_dtype(x))
    if pairing == "interleaved":  # plane i = channels (2i, 2i + 1)
        pairs = rotated.unflatten(-1, (n, 2))
        re, im = pairs[..., 0], pairs[..., 1]
        out = torch.stack((re * cos - im * sin, im * cos + re * sin), dim=-1).flatten(-2)
    else:  # "half": plane i = channels (i, i + n)
        re, im = rotated[..., :n], rotated[..., n:]
        out = torch.cat((re * cos - im * sin, im * cos + re * sin), dim=-1)
    out = out.to(x.dtype)
    if 2 * n == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 2 * n :]), dim=-1)


def _chunks(shape: torch.Size, limit: int):
    """Chunks of x ``[d0, d1, d2, D]`` of at most ``limit`` elements (one row if a row is larger).

    Yields ``((start, length),) * 3`` over the first three axes: whole leading slices
    when they fit, so a small tensor is a single chunk.
    """
    d0, d1, d2, d = shape
    step2 = min(d2, max(1, limit // d))
    step1 = min(d1, max(1, limit // (d2 * d))) if step2 == d2 else 1
    step0 = min(d0, max(1, limit // (d1 * d2 * d))) if step1 == d1 else 1
    for a0 in range(0, d0, step0):
        for a1 in range(0, d1, step1):
            for a2 in range(0, d2, step2):
                yield (a0, min(step0, d0 - a0)), (a1, min(step1, d1 - a1)), (a2, min(step2, d2 - a2))


@functools.lru_cache(maxsize=32)
def _swap_index(n: int, device: torch.device) -> torch.Tensor:
    """``[1, 0, 3, 2, ...]``: the other channel of every interleaved plane, ``[2n]``."""
    return torch.arange(2 * n, device=device).view(n, 2).flip(-1).flatten()


def _index(ranges) -> tuple[slice, ...]:
    return tuple(slice(start, start + length) for start, length in ranges)


def _cut(t: torch.Tensor, ranges) -> torch.Tensor:
    """A table's part for one chunk (kept whole along axes where it broadcasts)."""
    return t[tuple(slice(None) if size == 1 else index for size, index in zip(t.shape, _index(ranges)))]


def _rotate_into(x: torch.Tensor, cos_full: torch.Tensor, sin_full: torch.Tensor, pairing: str) -> torch.Tensor:
    """Eager kernel: ``out[..., :2n] = x * cos_full + swap(x) * sin_full``, rest copied; no autograd.

    ``cos_full``/``sin_full``: ``[.., 2n]`` tables in the pairing's channel layout, the sin
    one signed (``-sin`` on each plane's first channel), 4-D, broadcastable against x and in
    the compute dtype. ``swap`` exchanges the two channels of every plane.
    """
    n = sin_full.shape[-1] // 2
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    direct = x.dtype == cos_full.dtype  # float32/float64 input: no conversion, compute straight into out
    limit = CHUNK if x.device.type == "cpu" else x.numel()  # accelerators: one chunk (launches are the cost)
    size = min(limit + x.shape[-1], x.numel())
    buffers = torch.empty(3, size, dtype=cos_full.dtype, device=x.device)
    if pairing == "interleaved":  # strided (stride-2) ops are not vectorised: swap planes with one gather
        swap = _swap_index(n, x.device)
    for ranges in _chunks(x.shape, limit):
        if limit >= x.numel():  # one chunk: no slicing (small tensors pay per op)
            xc, oc, c, s = x, out, cos_full, sin_full
        else:
            xc, oc = x[_index(ranges)], out[_index(ranges)]  # [n0, n1, n2, D] views
            c, s = _cut(cos_full, ranges), _cut(sin_full, ranges)
        xr, orot = xc[..., : 2 * n], oc[..., : 2 * n]
        m = xr.numel()
        # x's chunk in a contiguous buffer (converted to the compute dtype), unless it already is one
        xf = xr if direct and xr.is_contiguous() else buffers[0, :m].view(xr.shape).copy_(xr)
        of = orot if direct else buffers[1, :m].view(xr.shape)
        torch.mul(xf, c, out=of)
        if pairing == "interleaved":  # a 2-D gather is several times faster than one over [n1, n2, 2n]
            swapped = torch.index_select(xf.view(-1, 2 * n), 1, swap, out=buffers[2, :m].view(-1, 2 * n))
            of.addcmul_(swapped.view(xr.shape), s)
        else:  # the halves are contiguous: two half-width ops, no gather
            of[..., :n].addcmul_(xf[..., n:], s[..., :n])
            of[..., n:].addcmul_(xf[..., :n], s[..., n:])
        if not direct:
            orot.copy_(of)
        if 2 * n < x.shape[-1]:
            oc[..., 2 * n :].copy_(xc[..., 2 * n :])
    return out


class _RotateByTable(torch.autograd.Function):
    """Eager rotation with a hand-written backward: the rotation by minus the angle (tables saved only)."""

    @staticmethod
    def forward(ctx, x, cos_full, sin_full, pairing):
        ctx.save_for_backward(cos_full, sin_full)
        ctx.pairing = pairing
        return _rotate_into(x, cos_full, sin_full, pairing)

    @staticmethod
    def backward(ctx, grad):
        cos_full, sin_full = ctx.saved_tensors
        return _RotateByTable.apply(grad, cos_full, -sin_full, ctx.pairing), None, None, None


def _eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the eager path applies: not tracing, tables without gradient, the backends' 4-D shapes."""
    tables_need_grad = torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)
    return not (torch.compiler.is_compiling() or tables_need_grad or x.ndim != 4 or cos.ndim != 4)


def _full_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, pairing: str):
    """Half tables ``[.., n]`` -> cos and signed sin ``[.., 2n]`` in the pairing's channel layout, in ``dtype``."""
    cos, sin = cos.to(dtype), sin.to(dtype)
    if pairing == "interleaved":
        return cos.unsqueeze(-1).expand(*cos.shape, 2).flatten(-2), torch.stack((-sin, sin), dim=-1).flatten(-2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _table_dtype(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.dtype:
    # as in the expression path: float32 (float64 for float64 x), promoted by the tables' dtype
    return torch.promote_types(compute_dtype(x), torch.promote_types(cos.dtype, sin.dtype))


def apply_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """Rotate the first ``2n`` channels of ``x`` by half tables ``cos``/``sin`` ``[..., n]``.

    The tables broadcast against ``x[..., :n]``; the arithmetic runs in float32
    (float64 for float64 inputs or tables) and the result is cast back to ``x.dtype``.
    """
    if not _eager(x, cos, sin):
        return rotate_expr(x, cos, sin, pairing)
    return _RotateByTable.apply(x, *_full_tables(cos, sin, _table_dtype(x, cos, sin), pairing), pairing)


def rotate_qk(q, k, pos, freqs, scale, pairing, layout):
    """Rotate q (and k, if not None) by the angles ``pos @ freqs``; pos ``[B|1, S, n_axes]``."""
    full = {}  # full-width tables per compute dtype, built once for q and k

    def apply(x, cos, sin, pairing):
        if not _eager(x, cos, sin):
            return rotate_expr(x, cos, sin, pairing)
        dtype = _table_dtype(x, cos, sin)
        if dtype not in full:
            full[dtype] = _full_tables(cos, sin, dtype, pairing)
        return _RotateByTable.apply(x, *full[dtype], pairing)

    return rotate_qk_by_tables(apply, q, k, pos, freqs, scale, pairing, layout, compute_dtype(q))
