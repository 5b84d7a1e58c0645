"""The torch ops of the fused QK-norm + table rotation: ``axial_rope::norm_rope_table`` and its backward.

Kernels: ``_triton_norm_table_kernels.py`` (forward) and ``_triton_norm_table_bwd.py``; plans:
``_triton_launch.py``. As the other ops of the Triton backend (``_triton.py``), each is a
``torch.library.custom_op`` with a fake (meta) implementation, and the forward has its autograd
registered, so ``torch.compile(fullgraph=True)`` traces callers as opaque calls (also under the
Triton interpreter). The forward saves its inputs only: the norm is recomputed backward.
"""

from __future__ import annotations

import torch

from ._triton_launch import plan_norm_rope_table, plan_norm_rope_table_bwd

Tensor = torch.Tensor

__all__ = ["norm_rope_table_op", "norm_rope_table_bwd_op"]


def _contiguous(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.contiguous()  # weights and biases [D] / [H * D]: the kernels index them densely


@torch.library.custom_op("axial_rope::norm_rope_table", mutates_args=())
def norm_rope_table_op(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor | None,
    k_weight: Tensor | None,
    q_bias: Tensor | None,
    k_bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    eps: float,
    layer: bool,
    across: bool,
    interleaved: bool,
    layout: str,
) -> tuple[Tensor, Tensor]:
    """QK-norm (RMSNorm, or LayerNorm with ``layer``; per head, or ``across`` heads) of q and k, then rotation
    by plane tables cos/sin (``[B|1, S, 1, n]``, or ``[B|1, 1, S, n]`` for bhsd)."""
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    params = [_contiguous(t) for t in (q_weight, k_weight, q_bias, k_bias)]
    plan_norm_rope_table(q, k, *params, qo, ko, cos, sin, eps, layer, across, interleaved, layout)()
    return qo, ko


@norm_rope_table_op.register_fake
def _(q, k, q_weight, k_weight, q_bias, k_bias, cos, sin, eps, layer, across, interleaved, layout):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("axial_rope::norm_rope_table_bwd", mutates_args=())
def norm_rope_table_bwd_op(
    gq: Tensor,
    gk: Tensor,
    q: Tensor,
    k: Tensor,
    q_weight: Tensor | None,
    k_weight: Tensor | None,
    q_bias: Tensor | None,
    k_bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    eps: float,
    layer: bool,
    across: bool,
    interleaved: bool,
    layout: str,
    table_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`norm_rope_table_op`: dq, dk, then those of q's and k's weights and biases and of
    cos and sin (the tables' only with ``table_grad``); an empty tensor for each one missing."""
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    params = [_contiguous(t) for t in (q_weight, k_weight, q_bias, k_bias)]
    launch = plan_norm_rope_table_bwd(gq, gk, q, k, *params, dq, dk, cos, sin, eps, layer, across, interleaved,
                                      layout, table_grad)  # fmt: skip
    launch()
    grads = [q.new_empty(0) for _ in range(4)]  # q_weight, k_weight, q_bias, k_bias
    if launch.partial is not None:  # [B, groups, token blocks, 2, ROW]: q's groups first, then k's
        blocks, groups, batch = launch.grid
        rows = launch.partial.view(batch, groups, blocks, 2, -1)
        for i, part in enumerate((rows[:, : launch.q_groups], rows[:, launch.q_groups :])):
            total = part.sum((0, 1, 2), dtype=torch.float64)  # [2, ROW]: weight, bias
            for j, t in enumerate(((q_weight, q_bias), (k_weight, k_bias))[i]):
                if t is not None:
                    grads[2 * j + i] = total[j, : t.shape[0]].to(t.dtype, copy=True)  # no output may alias
    if launch.table_partial is not None:  # [2, B, groups, S, n] -> [2, B|1, S, n] -> the tables' shape
        tables = launch.table_partial.sum(2, dtype=torch.float64)
        if cos.shape[0] == 1:
            tables = tables.sum(1, keepdim=True)
        tables = tables.unsqueeze(3 if layout == "bshd" else 2)  # [2, B|1, S, 1, n] or [2, B|1, 1, S, n]
        grads += [tables[0].to(cos.dtype, copy=True), tables[1].to(sin.dtype, copy=True)]
    else:
        grads += [q.new_empty(0), q.new_empty(0)]
    return dq, dk, *grads


@norm_rope_table_bwd_op.register_fake
def _(gq, gk, q, k, q_weight, k_weight, q_bias, k_bias, cos, sin, eps, layer, across, interleaved, layout, table_grad):
    params = [q.new_empty(0) if t is None else torch.empty_like(t) for t in (q_weight, k_weight, q_bias, k_bias)]
    tables = [torch.empty_like(t) if table_grad else q.new_empty(0) for t in (cos, sin)]
    return torch.empty_like(q), torch.empty_like(k), *params, *tables


def _setup(ctx, inputs, output):
    q, k, q_weight, k_weight, q_bias, k_bias, cos, sin, eps, layer, across, interleaved, layout = inputs
    ctx.save_for_backward(q, k, q_weight, k_weight, q_bias, k_bias, cos, sin)  # inputs only
    ctx.flags = (eps, layer, across, interleaved, layout)


def _backward(ctx, gq, gk):
    q, k, q_weight, k_weight, q_bias, k_bias, cos, sin = ctx.saved_tensors
    table_grad = bool(ctx.needs_input_grad[6] or ctx.needs_input_grad[7])
    grads = norm_rope_table_bwd_op(gq, gk, q, k, q_weight, k_weight, q_bias, k_bias, cos, sin, *ctx.flags, table_grad)
    dq, dk, dqw, dkw, dqb, dkb, dcos, dsin = grads
    params = [None if t is None else g for t, g in zip((q_weight, k_weight, q_bias, k_bias), (dqw, dkw, dqb, dkb))]
    tables = (dcos, dsin) if table_grad else (None, None)
    return dq, dk, *params, *tables, None, None, None, None, None


norm_rope_table_op.register_autograd(_backward, setup_context=_setup)
