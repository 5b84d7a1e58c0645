"""The Triton backend: fused RoPE kernels for q and k, forward and backward, registered as torch ops.

Layering: ``@triton.jit`` kernels (``_triton_kernels.py``) -> launchers (strides, grid,
block sizes) -> ``torch.library.custom_op`` ops ``axial_rope::rope``, ``axial_rope::norm_rope``,
``axial_rope::norm_rope_bwd`` and ``axial_rope::rope_freqs_grad``, with fake (meta)
implementations and autograd registered, so ``torch.compile(fullgraph=True)`` traces
callers as opaque calls -> :class:`TritonBackend`, the backend protocol of
:mod:`axial_rope.ops.backend`.

Runs on CUDA tensors, or on CPU tensors under the Triton interpreter when
``TRITON_INTERPRET=1`` was set before triton was imported (tests). A learnable ``F``
(also per head) gets its gradient from ``rope_freqs_grad``. Gradients the kernels do not
compute (positions, cos/sin tables, ``F`` through the fused norm) make ``supports``
decline the call, so the dispatcher picks another backend (or raises, when triton was
asked for): a gradient is never silently missing.
"""

from __future__ import annotations

import os

import torch
import triton  # an ImportError here makes the dispatcher report the backend as unavailable

from .backend import Call
from ._triton_kernels import freqs_grad_kernel, norm_rope_bwd_kernel, norm_rope_kernel, rope_kernel

Tensor = torch.Tensor

# triton.jit reads the variable when the kernels are decorated, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TILE = 4096  # elements of one head tile [BLOCK_S, BLOCK_D]: 8 warps, 16 per thread (cos/sin stay in registers)


# -- launchers -------------------------------------------------------------------------


def _bshd(x: Tensor, layout: str) -> Tensor:
    """The canonical ``[B, S, H, D]`` view the kernels index (no copy)."""
    return x if layout == "bshd" else x.transpose(1, 2)


def _blocks(batch: int, seq: int, head_dim: int, device: torch.device) -> tuple[int, int, tuple[int, int], int]:
    """(BLOCK_S, BLOCK_D, grid, num_warps): a head tile of up to TILE elements, enough programs to fill the GPU."""
    block_d = triton.next_power_of_2(head_dim)
    block_s = max(1, min(TILE // block_d, triton.next_power_of_2(seq)))
    if device.type == "cuda":  # small problems (DiT: B*S = 2048 tokens) need shorter tiles for 4 waves
        programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
        while block_s > 4 and batch * triton.cdiv(seq, block_s) < programs:
            block_s //= 2
    # at least 8 elements per thread, so 16-bit rows move in 16-byte vectors
    num_warps = max(1, min(8, block_s * block_d // 256))
    return block_s, block_d, (triton.cdiv(seq, block_s), batch), num_warps


def _precision(q: Tensor) -> dict:
    """float64 inputs compute in float64; float32 cos/sin use the hardware approximations on GPUs."""
    f64 = q.dtype == torch.float64
    return dict(F64=f64, FAST_TRIG=not (f64 or INTERPRETED))


def _angle_args(q: Tensor, pos: Tensor, freqs: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """float64 positions ``[B|1, S, n_axes]`` and F ``[H|, n_axes, n]`` with their strides (0 on broadcast axes)."""
    pos = pos.to(device=q.device, dtype=torch.float64)
    freqs = freqs.detach().to(device=q.device, dtype=torch.float64)
    s_pb = pos.stride(0) if pos.shape[0] > 1 else 0
    s_fh = freqs.stride(0) if freqs.ndim == 3 else 0
    return pos, freqs, (s_pb, pos.stride(1), pos.stride(2), s_fh, freqs.stride(-2), freqs.stride(-1))


def _launch_rope(q, k, pos, freqs, scale, cos, sin, interleaved: bool, layout: str, conj: bool, inplace=False):
    """Rotate q (and k) into fresh tensors laid out like them (or into q and k themselves, ``inplace``);
    ``conj`` rotates by minus the angle."""
    qo = q if inplace else torch.empty_like(q)
    ko = k if inplace or k is None else torch.empty_like(k)
    qc, qoc = _bshd(q, layout), _bshd(qo, layout)
    kc, koc = (qc, qoc) if k is None else (_bshd(k, layout), _bshd(ko, layout))
    batch, seq, hq, head_dim = qc.shape
    if qo.numel() == 0 and (ko is None or ko.numel() == 0):
        return qo, ko
    if cos is not None:  # plane tables broadcastable against q in its layout -> [B, S, H, n] strided views
        n = cos.shape[-1]
        if cos.stride() != sin.stride():
            cos, sin = cos.contiguous(), sin.contiguous()
        table = _bshd(cos.expand(*q.shape[:-1], n), layout)
        table_strides, angle_strides = table.stride(), (0,) * 6
        per_head, n_axes, scale = table.stride(2) != 0, 1, None
    else:
        n = freqs.shape[-1]
        pos, freqs, angle_strides = _angle_args(q, pos, freqs)
        table_strides, n_axes, per_head = (0,) * 4, freqs.shape[-2], freqs.ndim == 3
        if scale is not None:
            scale = scale.to(device=q.device, dtype=torch.float64)
    block_s, block_d, grid, warps = _blocks(batch, seq, head_dim, q.device)
    rope_kernel[grid](
        qc, kc, qoc, koc, q if pos is None else pos, q if freqs is None else freqs, q if scale is None else scale,
        q if cos is None else cos, q if sin is None else sin,
        seq, hq, 0 if k is None else kc.shape[2], n, head_dim,
        *qc.stride(), *kc.stride(), *qoc.stride(), *koc.stride(), *angle_strides, *table_strides,
        N_AXES=n_axes, TABLE=cos is not None, PER_HEAD=per_head, HAS_K=k is not None, HAS_SCALE=scale is not None,
        INTERLEAVED=interleaved, CONJ=conj, INPLACE=inplace, **_precision(q), BLOCK_S=block_s, BLOCK_D=block_d, num_warps=warps,
    )  # fmt: skip
    return qo, ko


def _norm_flags(q, q_weight, k_weight, freqs, scale, interleaved: bool, block_s: int, block_d: int, warps: int) -> dict:
    return dict(
        N_AXES=freqs.shape[-2], PER_HEAD=freqs.ndim == 3, HAS_QW=q_weight is not None, HAS_KW=k_weight is not None,
        HAS_SCALE=scale is not None, INTERLEAVED=interleaved, **_precision(q),
        BLOCK_S=block_s, BLOCK_D=block_d, num_warps=warps,
    )  # fmt: skip


def _launch_norm_rope(q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout):
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    qc, kc, qoc, koc = (_bshd(t, layout) for t in (q, k, qo, ko))
    batch, seq, hq, head_dim = qc.shape
    pos, freqs, angle_strides = _angle_args(q, pos, freqs)
    scale = None if scale is None else scale.to(device=q.device, dtype=torch.float64)
    block_s, block_d, grid, warps = _blocks(batch, seq, head_dim, q.device)
    norm_rope_kernel[grid](
        qc, kc, q if q_weight is None else q_weight, q if k_weight is None else k_weight, qoc, koc, pos, freqs,
        q if scale is None else scale, eps, seq, hq, kc.shape[2], freqs.shape[-1], head_dim,
        *qc.stride(), *kc.stride(), *qoc.stride(), *koc.stride(), *angle_strides,
        **_norm_flags(q, q_weight, k_weight, freqs, scale, interleaved, block_s, block_d, warps),
    )  # fmt: skip
    return qo, ko


def _launch_norm_rope_bwd(gq, gk, q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout):
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    qc, kc, gqc, gkc, dqc, dkc = (_bshd(t, layout) for t in (q, k, gq, gk, dq, dk))
    batch, seq, hq, head_dim = qc.shape
    pos, freqs, angle_strides = _angle_args(q, pos, freqs)
    scale = None if scale is None else scale.to(device=q.device, dtype=torch.float64)
    block_s, block_d, grid, warps = _blocks(batch, seq, head_dim, q.device)
    # weight grads: one partial sum per program [programs, D], reduced here (deterministic, no atomics)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    partial = [torch.empty(grid[0] * grid[1], head_dim, device=q.device, dtype=acc) for _ in range(2)]
    norm_rope_bwd_kernel[grid](
        qc, kc, gqc, gkc, q if q_weight is None else q_weight, q if k_weight is None else k_weight, dqc, dkc,
        partial[0], partial[1], pos, freqs, q if scale is None else scale, eps,
        seq, hq, kc.shape[2], freqs.shape[-1], head_dim,
        *qc.stride(), *kc.stride(), *gqc.stride(), *gkc.stride(), *dqc.stride(), *dkc.stride(), *angle_strides,
        **_norm_flags(q, q_weight, k_weight, freqs, scale, interleaved, block_s, block_d, warps),
    )  # fmt: skip
    dw = [p.sum(0).to(w.dtype) if w is not None else q.new_empty(0) for p, w in zip(partial, (q_weight, k_weight))]
    return dq, dk, dw[0], dw[1]


def _launch_freqs_grad(q, k, gq, gk, pos, freqs, scale, interleaved: bool, layout: str) -> Tensor:
    """Gradient of F ``[(H,) n_axes, n]`` (F's dtype): ``sum pos[a] * d loss / d angle`` over tokens and heads."""
    qc, gqc = _bshd(q, layout), _bshd(gq, layout)
    kc, gkc = (qc, gqc) if k is None else (_bshd(k, layout), _bshd(gk, layout))
    batch, seq, hq, head_dim = qc.shape
    n, dtype = freqs.shape[-1], freqs.dtype
    pos, freqs, angle_strides = _angle_args(q, pos, freqs)
    scale = None if scale is None else scale.to(device=q.device, dtype=torch.float64)
    # smaller tiles than the rotation (it holds x, its partners and the gradient): 1024 elements, 4 warps
    block_d = triton.next_power_of_2(head_dim)
    block_s = max(1, min(1024 // block_d, triton.next_power_of_2(seq)))
    grid, warps = (triton.cdiv(seq, block_s), batch), max(1, min(4, block_s * block_d // 256))
    heads = freqs.shape[0] if freqs.ndim == 3 else 1
    # one partial sum per program (and head), reduced here in float64: deterministic, no atomics
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    partial = torch.empty(grid[0] * grid[1], heads, freqs.shape[-2], block_d, device=q.device, dtype=acc)
    freqs_grad_kernel[grid](
        qc, kc, gqc, gkc, partial, pos, freqs, q if scale is None else scale,
        seq, hq, 0 if k is None else kc.shape[2], n, head_dim,
        *qc.stride(), *kc.stride(), *gqc.stride(), *gkc.stride(), *angle_strides,
        N_AXES=freqs.shape[-2], PER_HEAD=freqs.ndim == 3, HAS_K=k is not None, HAS_SCALE=scale is not None,
        INTERLEAVED=interleaved, **_precision(q), BLOCK_S=block_s, BLOCK_D=block_d, num_warps=warps,
    )  # fmt: skip
    channels = partial.sum(0, dtype=torch.float64)[..., : 2 * n]  # [H|1, n_axes, 2n]: fold each plane's channels
    per_plane = channels.unflatten(-1, (n, 2)).sum(-1) if interleaved else channels[..., :n] + channels[..., n:]
    return (per_plane if freqs.ndim == 3 else per_plane[0]).to(dtype)


# -- torch ops: opaque to torch.compile, with meta shapes and autograd -----------------------------


@torch.library.custom_op("axial_rope::rope", mutates_args=())
def rope_op(
    q: Tensor,
    k: Tensor | None,
    pos: Tensor | None,
    freqs: Tensor | None,
    scale: Tensor | None,
    cos: Tensor | None,
    sin: Tensor | None,
    interleaved: bool,
    layout: str,
    conj: bool,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k by ``pos @ freqs`` (or by half tables cos/sin); k's output is empty when k is None."""
    qo, ko = _launch_rope(q, k, pos, freqs, scale, cos, sin, interleaved, layout, conj)
    return qo, (q.new_empty(0) if ko is None else ko)


@rope_op.register_fake
def _(q, k, pos, freqs, scale, cos, sin, interleaved, layout, conj):
    return torch.empty_like(q), (q.new_empty(0) if k is None else torch.empty_like(k))


@torch.library.custom_op("axial_rope::rope_", mutates_args=("q", "k"))
def rope_inplace_op(
    q: Tensor,
    k: Tensor | None,
    pos: Tensor | None,
    freqs: Tensor | None,
    scale: Tensor | None,
    cos: Tensor | None,
    sin: Tensor | None,
    interleaved: bool,
    layout: str,
) -> None:
    """:func:`rope_op` writing into q and k (declared as mutated, so compiled graphs order it correctly).

    No autograd: ``ops.rotate_qk`` calls it only when no gradient is to be recorded.
    """
    _launch_rope(q, k, pos, freqs, scale, cos, sin, interleaved, layout, False, inplace=True)


@rope_inplace_op.register_fake
def _(q, k, pos, freqs, scale, cos, sin, interleaved, layout):
    return None


@torch.library.custom_op("axial_rope::rope_freqs_grad", mutates_args=())
def rope_freqs_grad_op(
    q: Tensor,
    k: Tensor | None,
    gq: Tensor,
    gk: Tensor | None,
    pos: Tensor,
    freqs: Tensor,
    scale: Tensor | None,
    interleaved: bool,
    layout: str,
) -> Tensor:
    """Gradient of the frequencies of :func:`rope_op` from its inputs q, k and output gradients gq, gk."""
    return _launch_freqs_grad(q, k, gq, gk, pos, freqs, scale, interleaved, layout)


@rope_freqs_grad_op.register_fake
def _(q, k, gq, gk, pos, freqs, scale, interleaved, layout):
    return torch.empty_like(freqs)


def _rope_setup(ctx, inputs, output):
    q, k, pos, freqs, scale, cos, sin, interleaved, layout, conj = inputs
    ctx.freqs_grad = freqs is not None and freqs.requires_grad
    # positions/tables only: no activations, unless F is learned (its gradient needs q and k)
    ctx.save_for_backward(pos, freqs, scale, cos, sin, *((q, k) if ctx.freqs_grad else (None, None)))
    ctx.flags = (k is not None, interleaved, layout, conj)


def _rope_backward(ctx, gq, gk):
    # the transpose of a rotation is the rotation by minus the angle: same kernel, sign flipped
    pos, freqs, scale, cos, sin, q, k = ctx.saved_tensors
    has_k, interleaved, layout, conj = ctx.flags
    gk = gk if has_k else None
    dq, dk = rope_op(gq, gk, pos, freqs, scale, cos, sin, interleaved, layout, not conj)
    dfreqs = rope_freqs_grad_op(q, k, gq, gk, pos, freqs, scale, interleaved, layout) if ctx.freqs_grad else None
    return dq, (dk if has_k else None), None, dfreqs, None, None, None, None, None, None


rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


@torch.library.custom_op("axial_rope::norm_rope", mutates_args=())
def norm_rope_op(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor | None,
    k_weight: Tensor | None,
    eps: float,
    pos: Tensor,
    freqs: Tensor,
    scale: Tensor | None,
    interleaved: bool,
    layout: str,
) -> tuple[Tensor, Tensor]:
    """Per-head RMSNorm (float32 math, weights ``[D]``) of q and k, then rotation by ``pos @ freqs``."""
    return _launch_norm_rope(q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout)


@norm_rope_op.register_fake
def _(q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("axial_rope::norm_rope_bwd", mutates_args=())
def norm_rope_bwd_op(
    gq: Tensor,
    gk: Tensor,
    q: Tensor,
    k: Tensor,
    q_weight: Tensor | None,
    k_weight: Tensor | None,
    eps: float,
    pos: Tensor,
    freqs: Tensor,
    scale: Tensor | None,
    interleaved: bool,
    layout: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`norm_rope_op`: dq, dk, d q_weight, d k_weight (empty for a missing weight)."""
    return _launch_norm_rope_bwd(gq, gk, q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout)


@norm_rope_bwd_op.register_fake
def _(gq, gk, q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout):
    dw = [q.new_empty(0) if w is None else torch.empty_like(w) for w in (q_weight, k_weight)]
    return torch.empty_like(q), torch.empty_like(k), dw[0], dw[1]


def _norm_setup(ctx, inputs, output):
    q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout = inputs
    ctx.save_for_backward(q, k, q_weight, k_weight, pos, freqs, scale)  # inputs only; the norm is recomputed
    ctx.flags = (eps, interleaved, layout)


def _norm_backward(ctx, gq, gk):
    q, k, q_weight, k_weight, pos, freqs, scale = ctx.saved_tensors
    eps, interleaved, layout = ctx.flags
    dq, dk, dqw, dkw = norm_rope_bwd_op(gq, gk, q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout)
    return dq, dk, (None if q_weight is None else dqw), (None if k_weight is None else dkw), *(None,) * 6


norm_rope_op.register_autograd(_norm_backward, setup_context=_norm_setup)


# -- the backend protocol --------------------------------------------------------------

# the gradients the kernels compute, per operation (anything else: supports() declines)
_GRADS = {
    "rotate_table": frozenset({"x"}),
    "rotate_qk": frozenset({"q", "k", "freqs"}),
    "norm_rotate_qk": frozenset({"q", "k", "q_weight", "k_weight"}),
}


class TritonBackend:
    name = "triton"

    def supports(self, call: Call) -> str | None:
        if INTERPRETED and call.device.type != "cpu":
            return f"the kernels were loaded for the Triton interpreter (TRITON_INTERPRET=1), which needs CPU tensors, got {call.device}"
        if not INTERPRETED and call.device.type != "cuda":
            return f"tensors on {call.device} need CUDA (or TRITON_INTERPRET=1 set before triton is imported, for CPU)"
        missing = call.grads - _GRADS[call.op]
        if missing:
            return f"the kernels of {call.op} give no gradient for {sorted(missing)}"
        return None

    def rotate_table(self, x, cos, sin, pairing, layout, *, inplace):
        if inplace:
            rope_inplace_op(x, None, None, None, None, cos, sin, pairing == "interleaved", layout)
            return x
        return rope_op(x, None, None, None, None, cos, sin, pairing == "interleaved", layout, False)[0]

    def rotate_qk(self, q, k, pos, freqs, scale, pairing, layout, *, inplace):
        """q and k rotated in one launch (and one launch backward)."""
        if inplace:
            rope_inplace_op(q, k, pos, freqs, scale, None, None, pairing == "interleaved", layout)
            return q, k
        qo, ko = rope_op(q, k, pos, freqs, scale, None, None, pairing == "interleaved", layout, False)
        return qo, (None if k is None else ko)

    def norm_rotate_qk(self, q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout):
        """Fused per-head RMSNorm + rotation of q and k (grads for q, k and both weights); one launch each way."""
        return norm_rope_op(q, k, q_weight, k_weight, float(eps), pos, freqs, scale, pairing == "interleaved", layout)


BACKEND = TritonBackend()
