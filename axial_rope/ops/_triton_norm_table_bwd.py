"""Backward of the QK-norm + table rotation kernel (``_triton_norm_table_kernels.py``): one pass, same tiles.

With ``x_hat = (x - mean) rstd`` (mean 0 for RMSNorm), ``z = x_hat w + bias`` and ``y = R z``, the output
gradient ``g`` turns back to ``gz = R^T g`` (the rotation by minus the angle), and over each row of
``count`` channels (``D``, or ``H * D`` across heads), with ``gh = gz w``:

    dx = rstd (gh - mean(gh) - x_hat mean(gh x_hat))     (no ``mean(gh)`` term for RMSNorm)
    dw = sum over rows of gz x_hat,   dbias = sum over rows of gz
    dcos = sum over heads of g_re z_re + g_im z_im,   dsin = sum over heads of g_im z_re - g_re z_im

Across heads, the two row means need every head of the token: a walk over the heads gathers them
before the walk that writes ``dx``. Weight and bias gradients: one partial row per program
(``pw`` ``[programs, 2, ROW]``); table gradients: one partial ``[BLOCK_S, N]`` per program in
``pt`` ``[2, B, groups, S, N]``; the launcher adds them up.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_kernels import _rest, _rotate, _rows, _store_planes, _table_cos_sin
from ._triton_norm_table_kernels import (
    _centred,
    _load_tile,
    _param_planes,
    _param_rest,
    _program,
    _program_index,
    _row_sum,
    _stats,
    _token_stats,
    _valid_planes,
)


@triton.jit
def _grad_tile(x_ptr, g_ptr, w_ptr, x_strides, g_strides, n_heads, b, heads, tokens, token_mask, c, s, mean, rstd,
               eps, LAYER: tl.constexpr, ACROSS: tl.constexpr, N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr,
               HAS_REST: tl.constexpr):  # fmt: skip
    """One group's rows: (mask, rstd, x_hat (re, im, rest), g (re, im), gh = w R^T g (re, im, rest), gz (re, im, rest)).

    ``mean``, ``rstd``: the token statistics with ACROSS; otherwise each row's own, taken here.
    """
    dtype = c.dtype
    _, mask, x_re, x_im, x_rest = _load_tile(x_ptr, x_strides, n_heads, b, heads, tokens, token_mask, N, D, VEC,
                                             BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, dtype)  # fmt: skip
    _, _, g_re, g_im, gz_rest = _load_tile(g_ptr, g_strides, n_heads, b, heads, tokens, token_mask, N, D, VEC,
                                           BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, dtype)  # fmt: skip
    if not ACROSS:
        mean, rstd = _stats(x_re, x_im, x_rest, mask, D, eps, LAYER, False, N, D, BLOCK_N, BLOCK_R, INTERLEAVED,
                            HAS_REST)  # fmt: skip
    x_re, x_im, x_rest = _centred(x_re, x_im, x_rest, mask, mean, N, D, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)
    gz_re, gz_im = _rotate(g_re, g_im, c, -s, N)  # the rotation's transpose: by minus the angle
    w_re, w_im = _param_planes(w_ptr, heads, n_heads, 1.0, N, D, BLOCK_N, INTERLEAVED, ACROSS, dtype)
    w_rest = _param_rest(w_ptr, heads, n_heads, 1.0, N, D, BLOCK_R, ACROSS, dtype)
    xh_re, xh_im, xh_rest = x_re * rstd, x_im * rstd, x_rest * rstd
    gh_re, gh_im, gh_rest = gz_re * w_re, gz_im * w_im, gz_rest * w_rest
    return mask, rstd, xh_re, xh_im, xh_rest, g_re, g_im, gh_re, gh_im, gh_rest, gz_re, gz_im, gz_rest


@triton.jit
def _store_param_grads(pw_ptr, gz_re, gz_im, gz_rest, xh_re, xh_im, xh_rest, heads, n_heads, ROW,
                       N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                       INTERLEAVED: tl.constexpr, ACROSS: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """This program's partial weight and bias gradients ``pw[program, 0|1]``: summed over its tokens (and, per
    head, its heads); with ACROSS one ``[D]`` slice per head at ``h * D``."""
    row = pw_ptr + _program_index().to(tl.int64) * (2 * ROW)
    j = tl.arange(0, BLOCK_N)
    ch_re = 2 * j if INTERLEAVED else j
    ch_im = ch_re + 1 if INTERLEAVED else j + N
    r, r_mask = _rest(N, D, BLOCK_R)
    mask = _valid_planes(N, D, BLOCK_N, INTERLEAVED)
    for part in tl.static_range(2):  # 0: weight (gz x_hat), 1: bias (gz)
        if part == 0:
            t_re, t_im, t_rest = gz_re * xh_re, gz_im * xh_im, gz_rest * xh_rest
        else:
            t_re, t_im, t_rest = gz_re, gz_im, gz_rest
        if ACROSS:  # [HEADS, BLOCK_N]
            base = row + part * ROW + heads[:, None] * D
            h_mask = (heads < n_heads)[:, None]
            tl.store(base + ch_re, tl.sum(t_re, axis=1), mask=h_mask & mask[None, :])
            tl.store(base + ch_im, tl.sum(t_im, axis=1), mask=h_mask & mask[None, :])
            if HAS_REST:
                tl.store(base + r, tl.sum(t_rest, axis=1), mask=h_mask & r_mask[None, :])
        else:  # [BLOCK_N]
            base = row + part * ROW
            tl.store(base + ch_re, tl.sum(tl.sum(t_re, axis=1), axis=0), mask=mask)
            tl.store(base + ch_im, tl.sum(tl.sum(t_im, axis=1), axis=0), mask=mask)
            if HAS_REST:
                tl.store(base + r, tl.sum(tl.sum(t_rest, axis=1), axis=0), mask=r_mask)


@triton.jit
def _bwd_group(x_ptr, g_ptr, w_ptr, bias_ptr, dx_ptr, pw_ptr, x_strides, g_strides, dx_strides, n_heads, b, heads,
               tokens, token_mask, c, s, mean, rstd, sum_gh, sum_ghx, count, eps, ROW, LAYER: tl.constexpr,
               ACROSS: tl.constexpr, PARAM_GRAD: tl.constexpr, N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr,
               HAS_REST: tl.constexpr):  # fmt: skip
    """dx of one group of heads, its partial weight and bias gradients, and its table gradients (summed over
    the heads) ``[BLOCK_S, BLOCK_N]`` each. ACROSS: the token's statistics and row sums are given; otherwise
    (placeholders given) each row's own are taken here."""
    dtype = c.dtype
    mask, rstd, xh_re, xh_im, xh_rest, g_re, g_im, gh_re, gh_im, gh_rest, gz_re, gz_im, gz_rest = _grad_tile(
        x_ptr, g_ptr, w_ptr, x_strides, g_strides, n_heads, b, heads, tokens, token_mask, c, s, mean, rstd, eps,
        LAYER, ACROSS, N, D, VEC, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)  # fmt: skip
    if not ACROSS:
        sum_gh = _row_sum(gh_re, gh_im, gh_rest, False)
        sum_ghx = _row_sum(gh_re * xh_re, gh_im * xh_im, gh_rest * xh_rest, False)
    shift = sum_gh / count if LAYER else tl.zeros([1, 1, 1], dtype)
    dot = sum_ghx / count
    dx_rows = _rows(dx_strides, b, heads, tokens, VEC)
    _store_planes(dx_ptr, dx_rows, dx_strides[3], mask, rstd * (gh_re - shift - xh_re * dot),
                  rstd * (gh_im - shift - xh_im * dot), N, D, BLOCK_N, INTERLEAVED)  # fmt: skip
    if HAS_REST:
        r, r_mask = _rest(N, D, BLOCK_R)
        dx_rest = rstd * (gh_rest - shift - xh_rest * dot)
        tl.store(dx_ptr + dx_rows + r * dx_strides[3], dx_rest.to(dx_ptr.dtype.element_ty), mask=mask & r_mask)
    if PARAM_GRAD:
        _store_param_grads(pw_ptr, gz_re, gz_im, gz_rest, xh_re, xh_im, xh_rest, heads, n_heads, ROW,
                           N, D, BLOCK_N, BLOCK_R, INTERLEAVED, ACROSS, HAS_REST)  # fmt: skip
    # table gradients from z, the normalised and weighted row before the turn (0 on masked rows)
    w_re, w_im = _param_planes(w_ptr, heads, n_heads, 1.0, N, D, BLOCK_N, INTERLEAVED, ACROSS, dtype)
    b_re, b_im = _param_planes(bias_ptr, heads, n_heads, 0.0, N, D, BLOCK_N, INTERLEAVED, ACROSS, dtype)
    z_re = tl.where(mask, xh_re * w_re + b_re, 0.0)
    z_im = tl.where(mask, xh_im * w_im + b_im, 0.0)
    return tl.sum(g_re * z_re + g_im * z_im, axis=0), tl.sum(g_im * z_re - g_re * z_im, axis=0)


@triton.jit
def _norm_rotate_tensor_bwd(x_ptr, g_ptr, w_ptr, bias_ptr, dx_ptr, pw_ptr, pt_ptr, x_strides, g_strides, dx_strides,
                            n_heads, b, h0, tokens, token_mask, c, s, eps, S, ROW, LAYER: tl.constexpr,
                            ACROSS: tl.constexpr, PARAM_GRAD: tl.constexpr, TABLE_GRAD: tl.constexpr,
                            N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr,
                            HAS_REST: tl.constexpr):  # fmt: skip
    """Gradients through one tensor's heads of the program (``[h0, h0 + HEADS)``, or all with ACROSS)."""
    dtype = c.dtype
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    if ACROSS:  # the token's statistics, then its two row sums over every head, then dx head group by group
        count = n_heads * D
        mean, rstd = _token_stats(x_ptr, x_strides, n_heads, b, tokens, token_mask, eps, LAYER, N, D, VEC, HEADS,
                                  BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, dtype)  # fmt: skip
        sum_gh = tl.zeros([1, tokens.shape[0], 1], dtype)
        sum_ghx = tl.zeros([1, tokens.shape[0], 1], dtype)
        for g in range(0, tl.cdiv(n_heads, HEADS)):
            _, _, xh_re, xh_im, xh_rest, _, _, gh_re, gh_im, gh_rest, _, _, _ = _grad_tile(
                x_ptr, g_ptr, w_ptr, x_strides, g_strides, n_heads, b, heads + g * HEADS, tokens, token_mask, c, s,
                mean, rstd, eps, LAYER, True, N, D, VEC, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)  # fmt: skip
            sum_gh += _row_sum(gh_re, gh_im, gh_rest, True)
            sum_ghx += _row_sum(gh_re * xh_re, gh_im * xh_im, gh_rest * xh_rest, True)
        d_cos = tl.zeros([tokens.shape[0], BLOCK_N], dtype)
        d_sin = tl.zeros([tokens.shape[0], BLOCK_N], dtype)
        for g in range(0, tl.cdiv(n_heads, HEADS)):
            dc, ds = _bwd_group(x_ptr, g_ptr, w_ptr, bias_ptr, dx_ptr, pw_ptr, x_strides, g_strides, dx_strides,
                                n_heads, b, heads + g * HEADS, tokens, token_mask, c, s, mean, rstd, sum_gh, sum_ghx,
                                count, eps, ROW, LAYER, True, PARAM_GRAD, N, D, VEC, BLOCK_N, BLOCK_R, INTERLEAVED,
                                HAS_REST)  # fmt: skip
            d_cos += dc
            d_sin += ds
    else:
        d_cos, d_sin = _bwd_group(x_ptr, g_ptr, w_ptr, bias_ptr, dx_ptr, pw_ptr, x_strides, g_strides, dx_strides,
                                  n_heads, b, heads, tokens, token_mask, c, s, 0.0, 1.0, 0.0, 0.0, D, eps, ROW,
                                  LAYER, False, PARAM_GRAD, N, D, VEC, BLOCK_N, BLOCK_R, INTERLEAVED,
                                  HAS_REST)  # fmt: skip
    if TABLE_GRAD:  # pt [2, B, groups, S, N]
        j = tl.arange(0, BLOCK_N)
        cell = (b * tl.num_programs(1) + tl.program_id(1)) * S * N + tokens[:, None] * N + j[None, :]
        t_mask = token_mask[:, None] & (j < N)[None, :]
        tl.store(pt_ptr + cell, d_cos, mask=t_mask)
        tl.store(pt_ptr + tl.num_programs(2).to(tl.int64) * tl.num_programs(1) * S * N + cell, d_sin, mask=t_mask)


@triton.jit
def norm_rope_table_bwd_kernel(
    q_ptr, k_ptr, gq_ptr, gk_ptr, qw_ptr, kw_ptr, qb_ptr, kb_ptr, dq_ptr, dk_ptr, pw_ptr, pt_ptr, cos_ptr, sin_ptr,
    q_strides, k_strides, gq_strides, gk_strides, dq_strides, dk_strides, table_strides, eps, S, HQ, HK, ROW,
    N: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr, LAYER: tl.constexpr,
    ACROSS: tl.constexpr, PARAM_GRAD: tl.constexpr, TABLE_GRAD: tl.constexpr, F64: tl.constexpr, VEC: tl.constexpr,
    HEADS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Backward of ``norm_rope_table_kernel``: dq, dk, and the partial sums of the weight, bias and table gradients."""
    b, tokens, token_mask, is_k, h0 = _program(S, HQ, ACROSS, HEADS, BLOCK_S)
    dtype = tl.float64 if F64 else tl.float32
    c, s = _table_cos_sin(cos_ptr, sin_ptr, table_strides, b, tokens, token_mask, tokens, N, BLOCK_N, False, False,
                          dtype)  # fmt: skip
    if is_k:
        _norm_rotate_tensor_bwd(k_ptr, gk_ptr, kw_ptr, kb_ptr, dk_ptr, pw_ptr, pt_ptr, k_strides, gk_strides,
                                dk_strides, HK, b, h0, tokens, token_mask, c, s, eps, S, ROW, LAYER, ACROSS,
                                PARAM_GRAD, TABLE_GRAD, N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED,
                                HAS_REST)  # fmt: skip
    else:
        _norm_rotate_tensor_bwd(q_ptr, gq_ptr, qw_ptr, qb_ptr, dq_ptr, pw_ptr, pt_ptr, q_strides, gq_strides,
                                dq_strides, HQ, b, h0, tokens, token_mask, c, s, eps, S, ROW, LAYER, ACROSS,
                                PARAM_GRAD, TABLE_GRAD, N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED,
                                HAS_REST)  # fmt: skip
