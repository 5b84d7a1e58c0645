"""QK-norm + rotation by cos/sin tables in one pass, forward and backward (the diffusers processors' step).

Same tiles, addresses and planes as the other kernels (``_triton_kernels.py``). The norm
(:mod:`axial_rope.ops.norm`) is RMSNorm or LayerNorm (``LAYER``), with optional weight and bias,
over each head's ``D`` channels or, with ``ACROSS``, over a token's ``H * D`` channels (Wan):

- per head: a program owns ``HEADS`` heads x ``BLOCK_S`` tokens (grid axis 1: q's head groups,
  then k's), loads the tile once and takes each row's statistics in registers;
- across heads: a program owns all heads of ``BLOCK_S`` tokens of q or of k (grid axis 1 has
  two entries) and walks them ``HEADS`` at a time: a first walk for the statistics (two for
  LayerNorm: the mean, then the centred squares, which keeps the variance exact where
  ``E[x^2] - mean^2`` would cancel), a last one to normalise, rotate and store. The later walks
  re-read rows the program has just read (cache hits): the tensor crosses DRAM once.

Arithmetic in float32 (float64 for float64 inputs); each output is rounded once. Weight, bias
and table gradients are per-program partial sums the launcher adds up (deterministic, no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_kernels import _load_planes, _rest, _rotate, _rows, _store_planes, _table_cos_sin, _tokens


@triton.jit
def _valid_planes(N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Planes ``[BLOCK_N]`` whose two channels exist (interleaved: ``2j < D``, pass-through planes too; half: ``j < N``)."""
    j = tl.arange(0, BLOCK_N)
    return (2 * j < D) if INTERLEAVED else (j < N)


@triton.jit
def _program_index():
    """Linear index of this program, grid axes (tokens, group, sample) from fastest: ``[B, groups, blocks]``."""
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


@triton.jit
def _param_planes(ptr, heads, n_heads, default, N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                  INTERLEAVED: tl.constexpr, ACROSS: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """A norm weight or bias as planes ``(re, im)`` ``[HEADS|1, 1, BLOCK_N]``: ``[D]``, or ``[H * D]`` with ``ACROSS``.

    ``default`` everywhere without a tensor (1 for a weight, 0 for a bias).
    """
    j = tl.arange(0, BLOCK_N)
    if ptr is None:
        re = tl.full([1, 1, BLOCK_N], default, dtype)
        return re, re
    ch_re = 2 * j if INTERLEAVED else j
    ch_im = ch_re + 1 if INTERLEAVED else j + N
    mask = _valid_planes(N, D, BLOCK_N, INTERLEAVED)[None, None, :]
    if ACROSS:
        offs = heads[:, None, None] * D
        mask = mask & (heads < n_heads)[:, None, None]
    else:
        offs = tl.zeros([1, 1, 1], tl.int64)
    re = tl.load(ptr + offs + ch_re, mask=mask, other=default).to(dtype)
    im = tl.load(ptr + offs + ch_im, mask=mask, other=default).to(dtype)
    return re, im


@triton.jit
def _param_rest(ptr, heads, n_heads, default, N: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
                ACROSS: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """A weight or bias on the channels past ``2N`` (half pairs, partial rotary) ``[HEADS|1, 1, BLOCK_R]``."""
    r, r_mask = _rest(N, D, BLOCK_R)
    if ptr is None:
        return tl.full([1, 1, BLOCK_R], default, dtype)
    if ACROSS:
        offs = heads[:, None, None] * D
        mask = r_mask[None, None, :] & (heads < n_heads)[:, None, None]
    else:
        offs = tl.zeros([1, 1, 1], tl.int64)
        mask = r_mask[None, None, :]
    return tl.load(ptr + offs + r, mask=mask, other=default).to(dtype)


@triton.jit
def _load_tile(ptr, strides, n_heads, b, heads, tokens, token_mask, N: tl.constexpr, D: tl.constexpr,
               VEC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr,
               HAS_REST: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """(row offsets, mask ``[HEADS, BLOCK_S, 1]``, re, im ``[HEADS, BLOCK_S, BLOCK_N]``, rest ``[.., BLOCK_R]``).

    Masked elements read 0; without ``HAS_REST`` rest is a tile of zeros (``BLOCK_R`` is then 1).
    """
    mask = (heads < n_heads)[:, None, None] & token_mask[None, :, None]
    rows = _rows(strides, b, heads, tokens, VEC)
    re, im = _load_planes(ptr, rows, strides[3], mask, N, D, BLOCK_N, INTERLEAVED, dtype)
    if HAS_REST:
        r, r_mask = _rest(N, D, BLOCK_R)
        rest = tl.load(ptr + rows + r * strides[3], mask=mask & r_mask, other=0.0).to(dtype)
    else:
        rest = tl.zeros([re.shape[0], re.shape[1], BLOCK_R], dtype)
    return rows, mask, re, im, rest


@triton.jit
def _row_sum(re, im, rest, ACROSS: tl.constexpr):
    """Sum over each row's channels: per head ``[HEADS, BLOCK_S, 1]``; ``ACROSS``: over the heads too ``[1, BLOCK_S, 1]``."""
    total = tl.sum(re + im, axis=2) + tl.sum(rest, axis=2)  # [HEADS, BLOCK_S]
    if ACROSS:
        return tl.sum(total, axis=0)[None, :, None]
    return total[:, :, None]


@triton.jit
def _centred(re, im, rest, mask, mean, N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """``x - mean`` on the tile's existing channels, 0 elsewhere (padding, masked heads and tokens)."""
    keep = mask & _valid_planes(N, D, BLOCK_N, INTERLEAVED)[None, None, :]
    if HAS_REST:
        _, r_mask = _rest(N, D, BLOCK_R)
        rest = tl.where(mask & r_mask, rest - mean, 0.0)
    return tl.where(keep, re - mean, 0.0), tl.where(keep, im - mean, 0.0), rest


@triton.jit
def _stats(re, im, rest, mask, count, eps, LAYER: tl.constexpr, ACROSS: tl.constexpr, N: tl.constexpr,
           D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr,
           HAS_REST: tl.constexpr):  # fmt: skip
    """Per-head (mean, rstd) ``[HEADS, BLOCK_S, 1]`` of a loaded tile of ``count`` channels per row (mean 0 for RMS)."""
    mean = tl.zeros([re.shape[0], re.shape[1], 1], re.dtype)
    if LAYER:
        mean = _row_sum(re, im, rest, ACROSS) / count
    c_re, c_im, c_rest = _centred(re, im, rest, mask, mean, N, D, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)
    squares = _row_sum(c_re * c_re, c_im * c_im, c_rest * c_rest, ACROSS)
    return mean, _rstd(squares, count, eps)


@triton.jit
def _rstd(squares, count, eps):
    """``1 / sqrt(mean square + eps)``; 0 for an all-zero row with eps 0 (a masked one), never inf or nan."""
    var = squares / count + eps
    return tl.where(var > 0, 1.0 / tl.sqrt(var), 0.0)


@triton.jit
def _token_stats(ptr, strides, n_heads, b, tokens, token_mask, eps, LAYER: tl.constexpr, N: tl.constexpr,
                 D: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr,
                 dtype: tl.constexpr):  # fmt: skip
    """(mean, rstd) ``[1, BLOCK_S, 1]`` of each token's ``n_heads * D`` channels, walking the heads HEADS at a time."""
    count = n_heads * D
    mean = tl.zeros([1, tokens.shape[0], 1], dtype)
    if LAYER:
        for g in range(0, tl.cdiv(n_heads, HEADS)):
            heads = g * HEADS + tl.arange(0, HEADS).to(tl.int64)
            _, _, re, im, rest = _load_tile(ptr, strides, n_heads, b, heads, tokens, token_mask, N, D, VEC,
                                            BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, dtype)  # fmt: skip
            mean += _row_sum(re, im, rest, True)
        mean = mean / count
    squares = tl.zeros([1, tokens.shape[0], 1], dtype)
    for g in range(0, tl.cdiv(n_heads, HEADS)):
        heads = g * HEADS + tl.arange(0, HEADS).to(tl.int64)
        _, mask, re, im, rest = _load_tile(ptr, strides, n_heads, b, heads, tokens, token_mask, N, D, VEC,
                                           BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, dtype)  # fmt: skip
        c_re, c_im, c_rest = _centred(re, im, rest, mask, mean, N, D, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)
        squares += _row_sum(c_re * c_re, c_im * c_im, c_rest * c_rest, True)
    return mean, _rstd(squares, count, eps)


@triton.jit
def _norm_rotate_group(x_ptr, w_ptr, bias_ptr, o_ptr, x_strides, o_strides, n_heads, b, heads, tokens, token_mask,
                       c, s, mean, rstd, eps, LAYER: tl.constexpr, ACROSS: tl.constexpr, N: tl.constexpr,
                       D: tl.constexpr, VEC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                       INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """Normalise and rotate ``heads`` of one tensor: by the token statistics (``ACROSS``), else each row's own."""
    dtype = c.dtype
    rows, mask, re, im, rest = _load_tile(x_ptr, x_strides, n_heads, b, heads, tokens, token_mask, N, D, VEC,
                                          BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, dtype)  # fmt: skip
    if not ACROSS:
        mean, rstd = _stats(re, im, rest, mask, D, eps, LAYER, False, N, D, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)
    re, im, rest = _centred(re, im, rest, mask, mean, N, D, BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST)
    w_re, w_im = _param_planes(w_ptr, heads, n_heads, 1.0, N, D, BLOCK_N, INTERLEAVED, ACROSS, dtype)
    b_re, b_im = _param_planes(bias_ptr, heads, n_heads, 0.0, N, D, BLOCK_N, INTERLEAVED, ACROSS, dtype)
    re, im = _rotate(re * rstd * w_re + b_re, im * rstd * w_im + b_im, c, s, N)
    o_rows = _rows(o_strides, b, heads, tokens, VEC)
    _store_planes(o_ptr, o_rows, o_strides[3], mask, re, im, N, D, BLOCK_N, INTERLEAVED)
    if HAS_REST:
        r, r_mask = _rest(N, D, BLOCK_R)
        rest = rest * rstd * _param_rest(w_ptr, heads, n_heads, 1.0, N, D, BLOCK_R, ACROSS, dtype)
        rest += _param_rest(bias_ptr, heads, n_heads, 0.0, N, D, BLOCK_R, ACROSS, dtype)
        tl.store(o_ptr + o_rows + r * o_strides[3], rest.to(o_ptr.dtype.element_ty), mask=mask & r_mask)


@triton.jit
def _norm_rotate_tensor(x_ptr, w_ptr, bias_ptr, o_ptr, x_strides, o_strides, n_heads, b, h0, tokens, token_mask,
                        c, s, eps, LAYER: tl.constexpr, ACROSS: tl.constexpr, N: tl.constexpr, D: tl.constexpr,
                        VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                        INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """Normalise and rotate one tensor's heads of the program: ``[h0, h0 + HEADS)``, or all of them with ACROSS."""
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    if ACROSS:
        mean, rstd = _token_stats(x_ptr, x_strides, n_heads, b, tokens, token_mask, eps, LAYER, N, D, VEC, HEADS,
                                  BLOCK_N, BLOCK_R, INTERLEAVED, HAS_REST, c.dtype)  # fmt: skip
        for g in range(0, tl.cdiv(n_heads, HEADS)):
            _norm_rotate_group(x_ptr, w_ptr, bias_ptr, o_ptr, x_strides, o_strides, n_heads, b, heads + g * HEADS,
                               tokens, token_mask, c, s, mean, rstd, eps, LAYER, True, N, D, VEC, BLOCK_N, BLOCK_R,
                               INTERLEAVED, HAS_REST)  # fmt: skip
    else:  # mean and rstd: placeholders, each row's own are taken from the loaded tile
        _norm_rotate_group(x_ptr, w_ptr, bias_ptr, o_ptr, x_strides, o_strides, n_heads, b, heads, tokens,
                           token_mask, c, s, 0.0, 1.0, eps, LAYER, False, N, D, VEC, BLOCK_N, BLOCK_R, INTERLEAVED,
                           HAS_REST)  # fmt: skip


@triton.jit
def _program(S, HQ, ACROSS: tl.constexpr, HEADS: tl.constexpr, BLOCK_S: tl.constexpr):
    """(sample, tokens, token mask, is k, first head): a head group of q or k, or (ACROSS) all of q's or k's heads."""
    b, tokens, token_mask = _tokens(S, BLOCK_S)
    if ACROSS:
        is_k = tl.program_id(1) == 1
        h0 = 0
    else:
        q_groups = tl.cdiv(HQ, HEADS)
        is_k = tl.program_id(1) >= q_groups
        h0 = (tl.program_id(1) - q_groups * is_k.to(tl.int32)) * HEADS
    return b, tokens, token_mask, is_k, h0


@triton.jit
def norm_rope_table_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, qb_ptr, kb_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr,
    q_strides, k_strides, qo_strides, ko_strides, table_strides, eps, S, HQ, HK,
    N: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_REST: tl.constexpr, LAYER: tl.constexpr,
    ACROSS: tl.constexpr, F64: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """QK-norm of q ``[B, S, HQ, D]`` and k ``[B, S, HK, D]``, then rotation by plane tables ``[B|1, S, 1, N]``."""
    b, tokens, token_mask, is_k, h0 = _program(S, HQ, ACROSS, HEADS, BLOCK_S)
    dtype = tl.float64 if F64 else tl.float32
    c, s = _table_cos_sin(cos_ptr, sin_ptr, table_strides, b, tokens, token_mask, tokens, N, BLOCK_N, False, False,
                          dtype)  # fmt: skip
    if is_k:
        _norm_rotate_tensor(k_ptr, kw_ptr, kb_ptr, ko_ptr, k_strides, ko_strides, HK, b, h0, tokens, token_mask,
                            c, s, eps, LAYER, ACROSS, N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED,
                            HAS_REST)  # fmt: skip
    else:
        _norm_rotate_tensor(q_ptr, qw_ptr, qb_ptr, qo_ptr, q_strides, qo_strides, HQ, b, h0, tokens, token_mask,
                            c, s, eps, LAYER, ACROSS, N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED,
                            HAS_REST)  # fmt: skip
