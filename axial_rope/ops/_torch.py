"""The fast pure-PyTorch backend: arithmetic in float32, any device, compile-friendly.

No host synchronisation (``.item()``, ``.tolist()``) and no data-dependent control
flow, so ``torch.compile(fullgraph=True)`` traces it (the traced path uses real dtypes only).

Two paths compute the same thing:

- the *expression path* (:func:`rotate_expr`): plain differentiable elementwise ops. It
  runs under ``torch.compile`` (inductor fuses it into one kernel) and whenever the
  tables need a gradient (learnable frequencies).
- the *eager path* (:class:`_RotateByTable`), everywhere else on CPU and CUDA. Eager
  PyTorch spends its time on memory, not arithmetic: every op of the expression path
  writes a fresh float32 tensor of x's size, and on CPU a fresh large tensor also costs
  a page fault per 4 KiB. The eager path does the least memory traffic plain ops allow:
  interleaved planes are complex numbers, rotated by one complex multiplication
  (``view_as_complex``, no copy); half planes take ``(x1 c - x2 s, x2 c + x1 s)`` in four
  half-width ``out=``/in-place passes. Inputs are handled chunk by chunk (512K elements
  on CPU): each chunk is read once into a float32 work buffer that stays in cache
  (converted on the way in), rotated there and written once (rounded on the way out),
  so no temporary is larger than a chunk and in place needs no second buffer. The work
  buffers (scratch memory only, never results) are kept per thread, so a call does not
  page-fault in fresh memory. Its backward is the same function rotating by minus the
  angle; it saves only the tables.
"""

from __future__ import annotations

import itertools
import threading

import torch

from ._common import compute_dtype, head_axis, plane_cos_sin, qk_norm, rms_norm, table_for_layout
from .backend import Call

CHUNK = 1 << 19  # elements per CPU chunk: two float32 work buffers of 2 MiB, cache-resident
EAGER_DEVICES = ("cpu", "cuda")  # full complex support; elsewhere (MPS) the expression path


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


def _steps(shape: torch.Size, limit: int) -> tuple[int, int, int]:
    """How many of each of the first three axes of x ``[d0, d1, d2, D]`` one chunk of at most ``limit`` elements takes
    (one row if a row is larger): whole leading slices when they fit, so a small tensor is a single chunk."""
    d0, d1, d2, d = shape
    step2 = min(d2, max(1, limit // d))
    step1 = min(d1, max(1, limit // (d2 * d))) if step2 == d2 else 1
    step0 = min(d0, max(1, limit // (d1 * d2 * d))) if step1 == d1 else 1
    return step0, step1, step2


def _split(t: torch.Tensor, step: int, dim: int):
    """``t``'s views of ``step`` along ``dim``, or all of ``t`` again and again where it broadcasts along ``dim``."""
    return itertools.repeat(t) if t.shape[dim] == 1 else t.split(step, dim)


def _chunk_views(x: torch.Tensor, out: torch.Tensor, tables: tuple, steps: tuple[int, int, int]):
    """``(x chunk, out chunk, table chunks)`` views, cut by one ``split`` per axis and level (in C: the per-chunk cost
    in Python is a tuple from ``zip``, which is what lets chunks be cache-sized)."""
    s0, s1, s2 = steps
    for x0, o0, *t0 in zip(x.split(s0, 0), out.split(s0, 0), *(_split(t, s0, 0) for t in tables)):
        for x1, o1, *t1 in zip(x0.split(s1, 1), o0.split(s1, 1), *(_split(t, s1, 1) for t in t0)):
            yield from zip(x1.split(s2, 2), o1.split(s2, 2), *(_split(t, s2, 2) for t in t1))


def _as_complex(t: torch.Tensor) -> torch.Tensor | None:
    """Real ``[..., 2n]`` seen as complex ``[..., n]`` (plane i = channels 2i, 2i + 1), or None if strides forbid."""
    if t.stride(-1) != 1 or t.storage_offset() % 2 or any(s % 2 for s in t.stride()[:-1]):
        return None
    return torch.view_as_complex(t.unflatten(-1, (-1, 2)))


def _kernel_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, pairing: str) -> tuple:
    """Plane tables ``[.., n]`` -> the eager kernel's tables in ``dtype`` (float32 or float64).

    Interleaved: ``(cos + i sin,)`` complex ``[.., n]``. Half: ``(cos, sin)`` ``[.., n]``.
    """
    cos, sin = cos.to(dtype), sin.to(dtype)
    return (torch.complex(cos, sin),) if pairing == "interleaved" else (cos, sin)


def _inverse(tables: tuple, pairing: str) -> tuple:
    """The tables of the rotation by minus the angle."""
    if pairing == "interleaved":
        return (tables[0].conj().resolve_conj(),)
    return tables[0], -tables[1]


# Per-thread scratch of the eager path on CPU, reused across calls: chunk work buffers (a fresh
# multi-MiB tensor costs a page fault per 4 KiB on every call). Scratch only: every result is
# computed from the call's own arguments.
_LOCAL = threading.local()


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A ``[2, numel]`` work buffer of this thread (CPU: kept and reused; elsewhere: fresh)."""
    if device.type != "cpu":
        return torch.empty(2, numel, dtype=dtype, device=device)
    buffers = _LOCAL.__dict__.setdefault("buffers", {})
    buf = buffers.get(dtype)
    if buf is None or buf.shape[1] < numel:
        buf = buffers[dtype] = torch.empty(2, numel, dtype=dtype)
    return buf[:, :numel]


def _rotate_chunk(src: torch.Tensor, dst: torch.Tensor, tables: tuple, pairing: str, work: torch.Tensor,
                  views: dict) -> None:  # fmt: skip
    """Rotate one chunk ``src`` ``[.., 2n]`` into ``dst`` (may be ``src``); ``work``: ``[2, >= chunk]`` cache-sized,
    ``views``: its views per chunk shape, made once per call (most chunks share one shape).

    src is read once and dst written once. Inputs in another dtype than the compute dtype
    (bf16, fp16) go through the work buffer (converted on the way in, rounded once on the
    way out); float32/float64 half pairs are rotated in dst itself. Interleaved: one
    complex multiplication. Half: ``(x1 c - x2 s, x2 c + x1 s)`` in four half-width passes,
    the same operations for every dtype.
    """
    converted = src.dtype != work.dtype or pairing == "interleaved"  # complex views need the contiguous buffer
    if converted:
        if src.shape not in views:
            w = work[0, : src.numel()].view(src.shape)
            views[src.shape] = (w, _as_complex(w) if pairing == "interleaved" else None)
        w, wz = views[src.shape]
        w.copy_(src)
    else:
        w = dst if dst.data_ptr() == src.data_ptr() and dst.stride() == src.stride() else dst.copy_(src)
    if pairing == "interleaved":
        wz.mul_(tables[0])
    else:
        cos, sin = tables
        n = cos.shape[-1]
        x1, x2 = w[..., :n], w[..., n:]
        x1_sin = torch.mul(x1, sin, out=work[1, : x1.numel()].view(x1.shape))
        x1.mul_(cos).addcmul_(x2, sin, value=-1)
        torch.addcmul(x1_sin, x2, cos, out=x2)
    if converted:
        dst.copy_(w)


def _rotate_into(x: torch.Tensor, tables: tuple, pairing: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """Eager kernel: x rotated by :func:`_kernel_tables`' tables (4-D, broadcastable) into ``out``; no autograd.

    Interleaved float32/float64 inputs with even strides: one complex multiplication from
    x into out. Otherwise chunk by chunk (CHUNK elements on CPU, cache-resident) through
    :func:`_rotate_chunk`. Channels past the rotated ones are copied. ``out`` may be ``x``
    itself (in place): every chunk is read before it is written, and no temporary is
    larger than a chunk.
    """
    table = tables[0]
    dtype = table.real.dtype if table.is_complex() else table.dtype
    n = table.shape[-1]
    out = torch.empty_like(x) if out is None else out
    if x.numel() == 0:
        return out
    if x.dtype == dtype and pairing == "interleaved":
        xz, oz = _as_complex(x[..., : 2 * n]), _as_complex(out[..., : 2 * n])
        if xz is not None and oz is not None:
            torch.mul(xz, table, out=oz)
            if 2 * n < x.shape[-1] and out is not x:
                out[..., 2 * n :].copy_(x[..., 2 * n :])
            return out
    limit = CHUNK if x.device.type == "cpu" else x.numel()  # accelerators: one chunk (launches are the cost)
    work, views = _scratch(min(limit + x.shape[-1], x.numel()), dtype, x.device), {}
    partial = 2 * n < x.shape[-1]
    if limit >= x.numel():  # one chunk: no slicing (small tensors pay per op)
        chunks = [(x, out, *tables)]
    else:
        chunks = _chunk_views(x, out, tables, _steps(x.shape, limit))  # [n0, n1, n2, D] views
    for xc, oc, *tc in chunks:
        if partial:
            _rotate_chunk(xc[..., : 2 * n], oc[..., : 2 * n], tc, pairing, work, views)
            if out is not x:
                oc[..., 2 * n :].copy_(xc[..., 2 * n :])
        else:
            _rotate_chunk(xc, oc, tc, pairing, work, views)
    return out


class _RotateByTable(torch.autograd.Function):
    """Eager rotation with a hand-written backward: the rotation by minus the angle (tables saved only)."""

    @staticmethod
    def forward(ctx, x, pairing, *tables):
        ctx.save_for_backward(*tables)
        ctx.pairing = pairing
        return _rotate_into(x, tables, pairing)

    @staticmethod
    def backward(ctx, grad):
        tables = _inverse(ctx.saved_tensors, ctx.pairing)
        return _RotateByTable.apply(grad, ctx.pairing, *tables), None, *(None for _ in tables)


def _eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the eager path applies: not tracing, tables without gradient, the backends' 4-D shapes."""
    tables_need_grad = torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)
    return not (
        torch.compiler.is_compiling()
        or tables_need_grad
        or x.ndim != 4
        or cos.ndim != 4
        or x.device.type not in EAGER_DEVICES
    )


def _table_dtype(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.dtype:
    # as in the expression path: float32 (float64 for float64 x), promoted by the tables' dtype
    return torch.promote_types(compute_dtype(x), torch.promote_types(cos.dtype, sin.dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str, prepared: dict, inplace: bool):
    """One tensor through the eager or the expression path; ``prepared`` caches kernel tables per dtype."""
    if not _eager(x, cos, sin):
        out = rotate_expr(x, cos, sin, pairing)
        return x.copy_(out) if inplace else out
    dtype = _table_dtype(x, cos, sin)
    if dtype not in prepared:
        prepared[dtype] = _kernel_tables(cos, sin, dtype, pairing)
    if inplace:  # the dispatcher sends in-place calls only when no gradient is to be recorded
        return _rotate_into(x, prepared[dtype], pairing, out=x)
    if not (torch.is_grad_enabled() and x.requires_grad):  # nothing to record: no autograd node per call
        return _rotate_into(x, prepared[dtype], pairing)
    return _RotateByTable.apply(x, pairing, *prepared[dtype])


def _rotate_heads(x, cos, sin, pairing: str, prepared: dict, inplace: bool, layout: str) -> torch.Tensor:
    """:func:`_rotate` by tables for ``H_t`` heads: ``1`` or x's ``H`` as they are; grouped (``H_t`` dividing ``H``,
    head ``h`` by table head ``h // (H / H_t)``) through the expression path on x seen as ``H_t`` groups of
    ``H / H_t`` heads, each group broadcasting its table head (no table is repeated per head)."""
    axis = head_axis(layout)
    groups, heads = cos.shape[axis], x.shape[axis]
    if groups in (1, heads):
        return _rotate(x, cos, sin, pairing, prepared, inplace)
    grouped = x.unflatten(axis, (groups, heads // groups))
    out = _rotate(grouped, cos.unsqueeze(axis + 1), sin.unsqueeze(axis + 1), pairing, {}, inplace)
    return x if inplace else out.flatten(axis, axis + 1)


def _tables(pos, freqs, scale, dtype: torch.dtype, layout: str) -> tuple:
    """Plane tables for ``layout`` and a dict for the eager kernel's tables made from them (per compute dtype),
    shared by q and k. Computed on every call: nothing is kept between calls (a model that wants its
    tables once per forward computes them once, e.g. with :func:`axial_rope.ops.rotation_tables`)."""
    cos, sin = plane_cos_sin(pos, freqs, scale, dtype)
    return table_for_layout(cos, layout), table_for_layout(sin, layout), {}  # {} filled by _rotate


class TorchBackend:
    name = "torch"

    def supports(self, call: Call) -> str | None:
        return None  # every device, dtype and gradient: plain PyTorch ops

    def rotate_table(self, x, cos, sin, pairing, layout, *, inplace):
        return _rotate_heads(x, cos, sin, pairing, {}, inplace, layout)

    def rotate_qk(self, q, k, pos, freqs, scale, pairing, layout, *, inplace):
        """Plane tables built once from ``pos @ freqs`` (float64 angles, q's compute dtype), applied to q and k."""
        cos, sin, prepared = _tables(pos, freqs, scale, compute_dtype(q), layout)
        q_out = _rotate_heads(q, cos, sin, pairing, prepared, inplace, layout)
        return q_out, (None if k is None else _rotate_heads(k, cos, sin, pairing, prepared, inplace, layout))

    def norm_rotate_qk(self, q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout):
        # normalise in float32 and rotate the float32 result, so the output is rounded once
        q32, k32 = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
        q32, k32 = self.rotate_qk(q32, k32, pos, freqs, scale, pairing, layout, inplace=False)
        return q32.to(q.dtype), k32.to(k.dtype)

    def norm_rotate_table(self, q, k, norm, cos, sin, pairing, layout):
        """Normalised in float32 (a fresh tensor), rotated there, rounded once; tables prepared once for q and k.

        Without a gradient to record the rotation runs in place on the fresh float32 result (no third tensor).
        """
        prepared, outs = {}, []
        for x, weight, bias in ((q, norm.q_weight, norm.q_bias), (k, norm.k_weight, norm.k_bias)):
            x32 = qk_norm(x, norm, weight, bias, layout)
            inplace = not (torch.is_grad_enabled() and (x32.requires_grad or cos.requires_grad or sin.requires_grad))
            outs.append(_rotate(x32, cos, sin, pairing, prepared, inplace).to(x.dtype))
        return outs[0], outs[1]


BACKEND = TorchBackend()
