"""The Triton backend: fused RoPE kernels for q and k, forward and backward, registered as torch ops.

Layering: ``@triton.jit`` kernels (``_triton_kernels.py``: rotation and the tile helpers;
``_triton_norm_kernels.py``: fused QK-norm and the gradient of F) -> launch plans
(``_triton_launch.py``: tile policy, vector width, strides, grid) -> the
``torch.library.custom_op`` ops below, ``axial_rope::rope``, ``axial_rope::rope_table``,
``axial_rope::rope_`` (in place), ``axial_rope::norm_rope``, ``axial_rope::norm_rope_bwd``
and ``axial_rope::rope_freqs_grad`` (and, in ``_triton_norm_table.py``, ``axial_rope::norm_rope_table`` and
its backward: QK-norm + rotation by tables), with fake (meta) implementations and autograd
registered, so ``torch.compile(fullgraph=True)`` traces callers as opaque calls ->
:class:`TritonBackend`, the backend protocol of :mod:`axial_rope.ops.backend`.

Runs on CUDA tensors, or on CPU tensors under the Triton interpreter when
``TRITON_INTERPRET=1`` was set before triton was imported (tests). A learnable ``F``
(also per head) gets its gradient from ``rope_freqs_grad``. Gradients the kernels do not
compute (positions, cos/sin tables, ``F`` through the fused norm) make ``supports``
decline the call, so the dispatcher picks another backend (or raises, when triton was
asked for): a gradient is never silently missing. Nothing here synchronises with the
host, so the ops can be captured in CUDA graphs.
"""

from __future__ import annotations

import torch

from ._triton_launch import (
    INTERPRETED,
    plan_freqs_grad,
    plan_norm_rope,
    plan_norm_rope_bwd,
    plan_rope,
    plan_rope_table,
)
from ._triton_norm_table import norm_rope_table_op
from .backend import Call

Tensor = torch.Tensor

__all__ = ["BACKEND", "INTERPRETED", "TritonBackend"]


# -- launches: outputs allocated like the inputs (empty_like), partial sums reduced here --------------


def _launch_rope(q, k, pos, freqs, scale, interleaved: bool, layout: str, conj: bool, inplace: bool = False):
    """q (and k) rotated by ``pos @ freqs`` into fresh tensors laid out like them, or into themselves."""
    qo = q if inplace else torch.empty_like(q)
    ko = k if inplace or k is None else torch.empty_like(k)
    plan_rope(q, k, qo, ko, pos, freqs, scale, interleaved, layout, conj)()
    return qo, ko


def _launch_rope_table(x, cos, sin, interleaved: bool, layout: str, conj: bool, inplace: bool = False):
    o = x if inplace else torch.empty_like(x)
    plan_rope_table(x, o, cos, sin, interleaved, layout, conj)()
    return o


def _launch_norm_rope(q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout):
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    plan_norm_rope(q, k, q_weight, k_weight, qo, ko, eps, pos, freqs, scale, interleaved, layout)()
    return qo, ko


def _launch_norm_rope_bwd(gq, gk, q, k, q_weight, k_weight, eps, pos, freqs, scale, interleaved, layout):
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    launch = plan_norm_rope_bwd(gq, gk, q, k, q_weight, k_weight, dq, dk, eps, pos, freqs, scale, interleaved, layout)
    launch()
    dw = [q.new_empty(0), q.new_empty(0)]
    if launch.partial is not None:  # rows [B, groups, token blocks, D]: q's groups first, then k's
        blocks, groups, batch = launch.grid
        rows = launch.partial.view(batch, groups, blocks, -1).sum((0, 2), dtype=torch.float64)
        for i, (w, part) in enumerate(((q_weight, rows[: launch.q_groups]), (k_weight, rows[launch.q_groups :]))):
            if w is not None:
                dw[i] = part.sum(0).to(w.dtype)
    return dq, dk, dw[0], dw[1]


def _launch_freqs_grad(q, k, gq, gk, pos, freqs, scale, interleaved: bool, layout: str) -> Tensor:
    """Gradient of F ``[(H,) n_axes, n]`` (F's dtype): ``sum pos[a] * d loss / d angle`` over tokens and heads."""
    launch = plan_freqs_grad(q, k, gq, gk, pos, freqs, scale, interleaved, layout)
    launch()
    n_axes, n = freqs.shape[-2:]
    blocks, groups, batch = launch.grid
    # [B, groups, token blocks, HEADS|1, BLOCK_A, BLOCK_N] -> summed over samples and token blocks, in float64
    part = launch.partial.view(batch, groups, blocks, *launch.partial.shape[1:]).sum((0, 2), dtype=torch.float64)
    part = part[..., :n_axes, :n]
    if freqs.ndim == 2:
        return part.sum((0, 1)).to(freqs.dtype)
    # per-head F [HF, A, n]: head h of a tensor with H heads turns by F[h // (H / HF)]; one row per head, summed
    # over the heads that share an F head
    heads = freqs.shape[0]
    q_heads = q.shape[2] if layout == "bshd" else q.shape[1]
    grad = part[: launch.q_groups].flatten(0, 1)[:q_heads].unflatten(0, (heads, -1)).sum(1)
    if k is not None:
        k_heads = k.shape[2] if layout == "bshd" else k.shape[1]
        grad += part[launch.q_groups :].flatten(0, 1)[:k_heads].unflatten(0, (heads, -1)).sum(1)
    return grad.to(freqs.dtype)


# -- torch ops: opaque to torch.compile, with meta shapes and autograd -----------------------------


@torch.library.custom_op("axial_rope::rope", mutates_args=())
def rope_op(
    q: Tensor,
    k: Tensor | None,
    pos: Tensor,
    freqs: Tensor,
    scale: Tensor | None,
    interleaved: bool,
    layout: str,
    conj: bool,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k by ``pos @ freqs`` (``conj``: by minus it); k's output is empty when k is None."""
    qo, ko = _launch_rope(q, k, pos, freqs, scale, interleaved, layout, conj)
    return qo, (q.new_empty(0) if ko is None else ko)


@rope_op.register_fake
def _(q, k, pos, freqs, scale, interleaved, layout, conj):
    return torch.empty_like(q), (q.new_empty(0) if k is None else torch.empty_like(k))


@torch.library.custom_op("axial_rope::rope_", mutates_args=("q", "k"))
def rope_inplace_op(
    q: Tensor, k: Tensor | None, pos: Tensor, freqs: Tensor, scale: Tensor | None, interleaved: bool, layout: str
) -> None:
    """:func:`rope_op` writing into q and k (declared as mutated, so compiled graphs order it correctly).

    No autograd: ``ops.rotate_qk`` calls it only when no gradient is to be recorded.
    """
    _launch_rope(q, k, pos, freqs, scale, interleaved, layout, False, inplace=True)


@rope_inplace_op.register_fake
def _(q, k, pos, freqs, scale, interleaved, layout):
    return None


@torch.library.custom_op("axial_rope::rope_table", mutates_args=())
def rope_table_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, layout: str, conj: bool) -> Tensor:
    """Rotate x by plane tables cos/sin (broadcastable against x in its layout, one value per plane)."""
    return _launch_rope_table(x, cos, sin, interleaved, layout, conj)


@rope_table_op.register_fake
def _(x, cos, sin, interleaved, layout, conj):
    return torch.empty_like(x)


@torch.library.custom_op("axial_rope::rope_table_", mutates_args=("x",))
def rope_table_inplace_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, layout: str) -> None:
    """:func:`rope_table_op` writing into x (no autograd, as :func:`rope_inplace_op`)."""
    _launch_rope_table(x, cos, sin, interleaved, layout, False, inplace=True)


@rope_table_inplace_op.register_fake
def _(x, cos, sin, interleaved, layout):
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
    q, k, pos, freqs, scale, interleaved, layout, conj = inputs
    ctx.freqs_grad = freqs.requires_grad
    # positions and F only: no activations, unless F is learned (its gradient needs q and k)
    ctx.save_for_backward(pos, freqs, scale, *((q, k) if ctx.freqs_grad else (None, None)))
    ctx.flags = (k is not None, interleaved, layout, conj)


def _rope_backward(ctx, gq, gk):
    # the transpose of a rotation is the rotation by minus the angle: same kernel, sign flipped
    pos, freqs, scale, q, k = ctx.saved_tensors
    has_k, interleaved, layout, conj = ctx.flags
    gk = gk if has_k else None
    dq, dk = rope_op(gq, gk, pos, freqs, scale, interleaved, layout, not conj)
    dfreqs = rope_freqs_grad_op(q, k, gq, gk, pos, freqs, scale, interleaved, layout) if ctx.freqs_grad else None
    return dq, (dk if has_k else None), None, dfreqs, None, None, None, None


rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


def _table_setup(ctx, inputs, output):
    x, cos, sin, interleaved, layout, conj = inputs
    ctx.save_for_backward(cos, sin)  # tables only
    ctx.flags = (interleaved, layout, conj)


def _table_backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    interleaved, layout, conj = ctx.flags
    return rope_table_op(grad, cos, sin, interleaved, layout, not conj), None, None, None, None, None


rope_table_op.register_autograd(_table_backward, setup_context=_table_setup)


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
    "norm_rotate_table": frozenset({"q", "k", "q_weight", "k_weight", "q_bias", "k_bias", "cos", "sin"}),
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
            rope_table_inplace_op(x, cos, sin, pairing == "interleaved", layout)
            return x
        return rope_table_op(x, cos, sin, pairing == "interleaved", layout, False)

    def rotate_qk(self, q, k, pos, freqs, scale, pairing, layout, *, inplace):
        """q and k rotated in one launch (and one launch backward)."""
        if inplace:
            rope_inplace_op(q, k, pos, freqs, scale, pairing == "interleaved", layout)
            return q, k
        qo, ko = rope_op(q, k, pos, freqs, scale, pairing == "interleaved", layout, False)
        return qo, (None if k is None else ko)

    def norm_rotate_qk(self, q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout):
        """Fused per-head RMSNorm + rotation of q and k (grads for q, k and both weights); one launch each way."""
        return norm_rope_op(q, k, q_weight, k_weight, float(eps), pos, freqs, scale, pairing == "interleaved", layout)

    def norm_rotate_table(self, q, k, norm, cos, sin, pairing, layout):
        """Fused QK-norm (RMS or Layer, per head or across heads) + rotation by tables; one launch each way."""
        layer, across = norm.kind == "layer", norm.span == "heads"
        return norm_rope_table_op(q, k, norm.q_weight, norm.k_weight, norm.q_bias, norm.k_bias, cos, sin,
                                  float(norm.eps), layer, across, pairing == "interleaved", layout)  # fmt: skip


BACKEND = TritonBackend()
