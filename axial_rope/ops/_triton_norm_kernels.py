"""The fused QK-RMSNorm + RoPE kernels (forward and backward) and the gradient of learnable F.

Same tiles, grid and addressing as the rotation kernels (``_triton_kernels.py``): a
program owns ``HEADS`` heads of q or k for ``BLOCK_S`` tokens of one sample, computes
its cos/sin once, and handles the tile's planes ``(re, im)`` ``[HEADS, BLOCK_S, BLOCK_N]``.
Reductions over a program's heads and tokens (weight gradient, F gradient) accumulate
the whole tile first and reduce once, to one partial sum per program that the launcher
adds up (deterministic, no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_kernels import (
    _load_planes,
    _program_cos_sin,
    _rest,
    _rotate,
    _rows,
    _store_planes,
)


@triton.jit
def _program_index():
    """Linear index of this program, grid axes (tokens, group, sample) from fastest: ``[B, groups, blocks]``."""
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


@triton.jit
def _weight_planes(w_ptr, N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, INTERLEAVED: tl.constexpr,
                   dtype: tl.constexpr):  # fmt: skip
    """Norm weights ``[D]`` as planes (w_re, w_im) ``[BLOCK_N]`` (ones without a weight).

    Each half is loaded on its own (``w[2j]``, ``w[2j + 1]`` or ``w[j]``, ``w[j + N]``), so
    it takes the layout of the data tiles it multiplies: no exchange between threads.
    """
    j = tl.arange(0, BLOCK_N)
    if w_ptr is None:
        w_re = tl.full([BLOCK_N], 1.0, dtype)
        w_im = w_re
    elif INTERLEAVED:  # planes >= N: the pass-through channels, also normalised
        w_re = tl.load(w_ptr + 2 * j, mask=2 * j < D, other=0.0).to(dtype)
        w_im = tl.load(w_ptr + 2 * j + 1, mask=2 * j + 1 < D, other=0.0).to(dtype)
    else:
        w_re = tl.load(w_ptr + j, mask=j < N, other=0.0).to(dtype)
        w_im = tl.load(w_ptr + N + j, mask=j < N, other=0.0).to(dtype)
    return w_re, w_im


@triton.jit
def _weight_rest(w_ptr, N: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, dtype: tl.constexpr):
    """Norm weights of the channels past ``2N`` ``[BLOCK_R]`` (ones without a weight)."""
    r, r_mask = _rest(N, D, BLOCK_R)
    if w_ptr is None:
        w = tl.full([BLOCK_R], 1.0, dtype)
    else:
        w = tl.load(w_ptr + r, mask=r_mask, other=0.0).to(dtype)
    return w


@triton.jit
def _norm_rotate_heads(x_ptr, w_ptr, o_ptr, x_strides, o_strides, n_heads, b, h0, tokens, token_mask, c, s, eps,
                       N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """RMSNorm heads ``[h0, h0 + HEADS)`` of one tensor over their D channels (float32), then rotate them into o."""
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    mask = (heads < n_heads)[:, None, None] & token_mask[None, :, None]
    x_rows, o_rows = _rows(x_strides, b, heads, tokens, VEC), _rows(o_strides, b, heads, tokens, VEC)
    re, im = _load_planes(x_ptr, x_rows, x_strides[3], mask, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    squares = tl.sum(re * re + im * im, axis=2)  # [HEADS, BLOCK_S]
    if HAS_REST:  # half pairing, partial rotary: the norm spans every channel
        r, r_mask = _rest(N, D, BLOCK_R)
        rest = tl.load(x_ptr + x_rows + r * x_strides[3], mask=mask & r_mask, other=0.0).to(c.dtype)
        squares += tl.sum(rest * rest, axis=2)
    rstd = (1.0 / tl.sqrt(squares / D + eps))[:, :, None]
    w_re, w_im = _weight_planes(w_ptr, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    re, im = _rotate(re * rstd * w_re, im * rstd * w_im, c, s, N)
    _store_planes(o_ptr, o_rows, o_strides[3], mask, re, im, N, D, BLOCK_N, INTERLEAVED)
    if HAS_REST:
        rest = rest * rstd * _weight_rest(w_ptr, N, D, BLOCK_R, c.dtype)
        tl.store(o_ptr + o_rows + r * o_strides[3], rest.to(o_ptr.dtype.element_ty), mask=mask & r_mask)


@triton.jit
def norm_rope_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, qo_ptr, ko_ptr, pos_ptr, freqs_ptr, scale_ptr,
    q_strides, k_strides, qo_strides, ko_strides, pos_strides, freqs_strides, eps, S, HQ, HK, HF,
    N: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_REST: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Per-head RMSNorm of q and k (weights ``[D]`` or None) then rotation by ``pos @ F``; the grid of ``rope_kernel``."""
    b, tokens, token_mask, is_k, h0, c, s = _program_cos_sin(
        pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, S, HQ, HK, HF,
        N, N_AXES, BLOCK_N, PER_HEAD, False, F64, FAST_TRIG, HEADS, BLOCK_S,
    )  # fmt: skip
    if is_k:
        _norm_rotate_heads(k_ptr, kw_ptr, ko_ptr, k_strides, ko_strides, HK, b, h0, tokens, token_mask, c, s, eps,
                           N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)  # fmt: skip
    else:
        _norm_rotate_heads(q_ptr, qw_ptr, qo_ptr, q_strides, qo_strides, HQ, b, h0, tokens, token_mask, c, s, eps,
                           N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)  # fmt: skip


@triton.jit
def _norm_rotate_heads_bwd(x_ptr, g_ptr, w_ptr, dx_ptr, dw_ptr, x_strides, g_strides, dx_strides, n_heads, b, h0,
                           tokens, token_mask, c, s, eps, N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr,
                           HEADS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                           INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """Gradient of :func:`_norm_rotate_heads` for heads ``[h0, h0 + HEADS)``: dx, and this program's row of ``dw``.

    ``y = R(angle) (x_hat * w)`` with ``x_hat = x * rstd``: the gradient of the weighted row
    is ``gz = R(-angle) g`` (``s`` is already the sin of minus the angle), ``dw = sum gz
    x_hat`` over the tile's rows, and ``dx = rstd (gz w - x_hat mean(gz w x_hat))``.
    """
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    mask = (heads < n_heads)[:, None, None] & token_mask[None, :, None]
    x_rows, g_rows = _rows(x_strides, b, heads, tokens, VEC), _rows(g_strides, b, heads, tokens, VEC)
    g_re, g_im = _load_planes(g_ptr, g_rows, g_strides[3], mask, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    x_re, x_im = _load_planes(x_ptr, x_rows, x_strides[3], mask, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    squares = tl.sum(x_re * x_re + x_im * x_im, axis=2)
    if HAS_REST:
        r, r_mask = _rest(N, D, BLOCK_R)
        x_r = tl.load(x_ptr + x_rows + r * x_strides[3], mask=mask & r_mask, other=0.0).to(c.dtype)
        g_r = tl.load(g_ptr + g_rows + r * g_strides[3], mask=mask & r_mask, other=0.0).to(c.dtype)
        squares += tl.sum(x_r * x_r, axis=2)
    rstd = (1.0 / tl.sqrt(squares / D + eps))[:, :, None]
    g_re, g_im = _rotate(g_re, g_im, c, s, N)  # gradient of the weighted, normalised row
    x_re, x_im = x_re * rstd, x_im * rstd
    w_re, w_im = _weight_planes(w_ptr, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    if w_ptr is not None:  # the whole tile (heads x tokens rows) in one reduction, both halves at once
        rows: tl.constexpr = HEADS * x_re.shape[1]
        dw = tl.sum(tl.reshape(tl.join(g_re * x_re, g_im * x_im), [rows, BLOCK_N, 2]), axis=0)  # [BLOCK_N, 2]
        j, half = tl.arange(0, BLOCK_N)[:, None], tl.arange(0, 2)[None, :]
        ch = 2 * j + half if INTERLEAVED else j + N * half  # interleaved: planes >= N are pass-through channels
        valid = ch < D if INTERLEAVED else (j < N) & (half < 2)
        tl.store(dw_ptr + _program_index().to(tl.int64) * D + ch, dw, mask=valid)
    g_re, g_im = g_re * w_re, g_im * w_im
    dot = tl.sum(g_re * x_re + g_im * x_im, axis=2)
    if HAS_REST:
        x_r = x_r * rstd
        if w_ptr is not None:
            dw_r = tl.sum(tl.reshape(g_r * x_r, [rows, BLOCK_R]), axis=0)
            tl.store(dw_ptr + _program_index().to(tl.int64) * D + r, dw_r, mask=r_mask)
        g_r = g_r * _weight_rest(w_ptr, N, D, BLOCK_R, c.dtype)
        dot += tl.sum(g_r * x_r, axis=2)
    dot = (dot / D)[:, :, None]
    dx_rows = _rows(dx_strides, b, heads, tokens, VEC)
    _store_planes(dx_ptr, dx_rows, dx_strides[3], mask, rstd * (g_re - x_re * dot), rstd * (g_im - x_im * dot),
                  N, D, BLOCK_N, INTERLEAVED)  # fmt: skip
    if HAS_REST:
        dx_r = rstd * (g_r - x_r * dot)
        tl.store(dx_ptr + dx_rows + r * dx_strides[3], dx_r.to(dx_ptr.dtype.element_ty), mask=mask & r_mask)


@triton.jit
def norm_rope_bwd_kernel(
    q_ptr, k_ptr, gq_ptr, gk_ptr, qw_ptr, kw_ptr, dq_ptr, dk_ptr, dw_ptr, pos_ptr, freqs_ptr, scale_ptr,
    q_strides, k_strides, gq_strides, gk_strides, dq_strides, dk_strides, pos_strides, freqs_strides, eps, S, HQ, HK,
    HF,
    N: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_REST: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Backward of :func:`norm_rope_kernel`: dq, dk and one weight-gradient row per program (``dw`` ``[programs, D]``).

    Rows of q's programs belong to q's weight, rows of k's programs to k's; a tensor
    without a weight writes none (its ``w_ptr`` is None).
    """
    b, tokens, token_mask, is_k, h0, c, s = _program_cos_sin(
        pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, S, HQ, HK, HF,
        N, N_AXES, BLOCK_N, PER_HEAD, True, F64, FAST_TRIG, HEADS, BLOCK_S,
    )  # fmt: skip
    if is_k:
        _norm_rotate_heads_bwd(k_ptr, gk_ptr, kw_ptr, dk_ptr, dw_ptr, k_strides,
                               gk_strides, dk_strides, HK, b, h0, tokens, token_mask, c, s, eps,
                               N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)  # fmt: skip
    else:
        _norm_rotate_heads_bwd(q_ptr, gq_ptr, qw_ptr, dq_ptr, dw_ptr, q_strides,
                               gq_strides, dq_strides, HQ, b, h0, tokens, token_mask, c, s, eps,
                               N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)  # fmt: skip


@triton.jit
def _angle_grad_heads(x_ptr, g_ptr, x_strides, g_strides, n_heads, b, h0, tokens, token_mask, c, s,
                      N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr,
                      BLOCK_N: tl.constexpr, INTERLEAVED: tl.constexpr):  # fmt: skip
    """d loss / d angle ``[HEADS, BLOCK_S, BLOCK_N]`` of heads ``[h0, h0 + HEADS)`` of one tensor.

    ``y = R(angle) x`` turns with the angle: ``dy_re/dangle = -y_im``, ``dy_im/dangle = y_re``.
    """
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    mask = (heads < n_heads)[:, None, None] & token_mask[None, :, None]
    x_rows, g_rows = _rows(x_strides, b, heads, tokens, VEC), _rows(g_strides, b, heads, tokens, VEC)
    x_re, x_im = _load_planes(x_ptr, x_rows, x_strides[3], mask, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    g_re, g_im = _load_planes(g_ptr, g_rows, g_strides[3], mask, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    y_re, y_im = _rotate(x_re, x_im, c, s, N)
    return g_im * y_re - g_re * y_im


@triton.jit
def freqs_grad_kernel(
    q_ptr, k_ptr, gq_ptr, gk_ptr, out_ptr, pos_ptr, freqs_ptr, scale_ptr,
    q_strides, k_strides, gq_strides, gk_strides, pos_strides, freqs_strides, S, HQ, HK, HF,
    N: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, INTERLEAVED: tl.constexpr,
    F64: tl.constexpr, FAST_TRIG: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_A: tl.constexpr,
):  # fmt: skip
    """Gradient of F: per program, ``sum over its tokens (and heads) of pos[a] * d loss / d angle``.

    Writes ``out[program, HEADS|1, BLOCK_A, BLOCK_N]`` (compute dtype, one row per head of q or k
    for a per-head F); the launcher sums the programs, and the heads that share an F head.
    """
    b, tokens, token_mask, is_k, h0, c, s = _program_cos_sin(
        pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, S, HQ, HK, HF,
        N, N_AXES, BLOCK_N, PER_HEAD, False, F64, FAST_TRIG, HEADS, BLOCK_S,
    )  # fmt: skip
    d_angle = tl.zeros([HEADS, BLOCK_S, BLOCK_N], dtype=c.dtype)
    if is_k:
        if k_ptr is not None:
            d_angle = _angle_grad_heads(k_ptr, gk_ptr, k_strides, gk_strides, HK, b, h0, tokens, token_mask, c, s,
                                        N, D, VEC, HEADS, BLOCK_N, INTERLEAVED)  # fmt: skip
    else:
        d_angle = _angle_grad_heads(q_ptr, gq_ptr, q_strides, gq_strides, HQ, b, h0, tokens, token_mask, c, s,
                                    N, D, VEC, HEADS, BLOCK_N, INTERLEAVED)  # fmt: skip
    axes = tl.arange(0, BLOCK_A)
    pos = tl.load(
        pos_ptr + b * pos_strides[0] + tokens[:, None] * pos_strides[1] + axes[None, :] * pos_strides[2],
        mask=token_mask[:, None] & (axes[None, :] < N_AXES),
        other=0.0,
    ).to(c.dtype)  # [BLOCK_S, BLOCK_A]
    cells = axes[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BLOCK_A, BLOCK_N]
    if PER_HEAD:  # [HEADS, BLOCK_S, BLOCK_A, BLOCK_N] -> one row [BLOCK_A, BLOCK_N] per head
        grad = tl.sum(pos[None, :, :, None] * d_angle[:, :, None, :], axis=1)
        row = out_ptr + _program_index().to(tl.int64) * (HEADS * BLOCK_A * BLOCK_N)
        tl.store(row + tl.arange(0, HEADS)[:, None, None] * (BLOCK_A * BLOCK_N) + cells[None], grad)
    else:  # heads summed in registers (no exchange), then one reduction over the tokens for every axis
        grad = tl.sum(pos[:, :, None] * tl.sum(d_angle, axis=0)[:, None, :], axis=0)
        tl.store(out_ptr + _program_index().to(tl.int64) * (BLOCK_A * BLOCK_N) + cells, grad)
