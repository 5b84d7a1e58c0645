"""The ``@triton.jit`` kernels of the Triton backend (launchers live in ``triton.py``).

Every kernel sees q and k in the canonical ``[B, S, H, D]`` index order through
their strides (a ``bhsd`` tensor is passed as its transposed view), so one code path
serves both layouts and any strided view. The grid is ``(cdiv(S, BLOCK_S), B)``: a
program owns ``BLOCK_S`` tokens of one sample and loops over all heads of q, then of
k, so the cos/sin of a token's planes are computed (or loaded) once and reused by
every head.

A head row is handled channel-wise with contiguous loads: channel ``d`` of a plane
``(d, partner(d))`` becomes ``x[d] * cos + x[partner(d)] * sin * sign`` with
``sign = -1`` on the plane's first channel, ``+1`` on its second. Channels past
``rot_dim`` get ``cos = 1, sin = 0`` and so pass through in the same store. The
backward pass is the same code with the sign flipped (rotation by minus the angle).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

TWO_PI = tl.constexpr(6.283185307179586)  # float64 2*pi: reduction error |angle| * 2.4e-16, below 1e-9 at angle 1e6


@triton.jit
def _channels(offs_d, N, INTERLEAVED: tl.constexpr):
    """Channel ``d`` -> (its plane, the plane's other channel, rotated?, -1/+1 sign of the sin term)."""
    if INTERLEAVED:  # plane j = channels (2j, 2j + 1)
        first = (offs_d % 2) == 0
        plane = offs_d // 2
        partner = offs_d ^ 1
    else:  # plane j = channels (j, j + N)
        first = offs_d < N
        plane = tl.where(first, offs_d, offs_d - N)
        partner = tl.where(first, offs_d + N, offs_d - N)
    rot = offs_d < 2 * N
    plane = tl.where(rot, plane, 0)
    partner = tl.where(rot, partner, offs_d)  # pass-through channels read themselves
    sign = tl.where(first, -1.0, 1.0)
    return plane, partner, rot, sign


@triton.jit
def _cos_sin(
    pos_ptr, freqs_ptr, scale_ptr, cos_ptr, sin_ptr, b, h, offs_s, mask_s, plane, rot, sign,
    s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, s_tb, s_ts, s_th, s_tn,
    N_AXES: tl.constexpr, TABLE: tl.constexpr, HAS_SCALE: tl.constexpr, CONJ: tl.constexpr, F64: tl.constexpr,
    FAST_TRIG: tl.constexpr,
):  # fmt: skip
    """cos and signed sin ``[BLOCK_S, BLOCK_D]`` for tokens ``offs_s`` of sample ``b`` (head ``h``)."""
    mask = mask_s[:, None] & rot[None, :]
    if TABLE:  # half tables [B|1, S, H|1, N] addressed through strides (0 on broadcast axes)
        t = b * s_tb + offs_s[:, None] * s_ts + h * s_th + plane[None, :] * s_tn
        c = tl.load(cos_ptr + t, mask=mask, other=1.0)
        s = tl.load(sin_ptr + t, mask=mask, other=0.0)
        if F64:
            c, s = c.to(tl.float64), s.to(tl.float64)
        else:
            c, s = c.to(tl.float32), s.to(tl.float32)
    else:  # angle = sum_a pos[a] * F[a, plane] in float64, reduced to [-pi, pi] before any rounding
        angle = tl.zeros(mask.shape, dtype=tl.float64)
        for a in tl.static_range(N_AXES):
            p = tl.load(pos_ptr + b * s_pb + offs_s * s_ps + a * s_pa, mask=mask_s, other=0.0).to(tl.float64)
            f = tl.load(freqs_ptr + h * s_fh + a * s_fa + plane * s_fn, mask=rot, other=0.0).to(tl.float64)
            angle += p[:, None] * f[None, :]
        angle = angle - TWO_PI * tl.floor(angle * (1.0 / TWO_PI) + 0.5)
        if not F64:
            angle = angle.to(tl.float32)  # |angle| <= pi: float32 keeps it to 2e-7
        if FAST_TRIG:  # |angle| <= pi: the hardware approximations are within 1e-6 and need few registers
            c, s = libdevice.fast_cosf(angle), libdevice.fast_sinf(angle)
        else:  # float64, or the interpreter (which has no libdevice)
            c, s = tl.cos(angle), tl.sin(angle)
        if HAS_SCALE:  # attention factor per plane (float64 buffer)
            f = tl.load(scale_ptr + plane, mask=rot, other=1.0).to(c.dtype)
            c, s = c * f[None, :], s * f[None, :]
    if CONJ:
        sign = -sign
    c = tl.where(mask, c, 1.0)
    s = tl.where(mask, s * sign[None, :], 0.0)
    return c, s


@triton.jit
def _swap_pairs(x):
    """``[BLOCK_S, BLOCK_D]`` -> the same with channels (2j, 2j+1) exchanged, in registers."""
    a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
    return tl.reshape(tl.join(b, a), [x.shape[0], x.shape[1]])


@triton.jit
def _partner(ptr, row, partner, mask, s_d, x, INTERLEAVED: tl.constexpr):
    """The value of every channel's plane partner: a register swap (interleaved) or a second, cached load."""
    if INTERLEAVED:
        return _swap_pairs(x)
    return tl.load(ptr + row[:, None] + partner[None, :] * s_d, mask=mask, other=0.0).to(x.dtype)


@triton.jit
def _rotate_head(x_ptr, o_ptr, row_x, row_o, offs_d, partner, rot, mask, s_xd, s_od, c, s,
                 INTERLEAVED: tl.constexpr, INPLACE: tl.constexpr):  # fmt: skip
    """out[rows, d] = x[d] * cos + x[partner(d)] * signed sin, rounded once; channels past rot_dim copied."""
    x = tl.load(x_ptr + row_x[:, None] + offs_d[None, :] * s_xd, mask=mask, other=0.0).to(c.dtype)
    xp = _partner(x_ptr, row_x, partner, mask, s_xd, x, INTERLEAVED)
    if INPLACE:  # out is x: every thread has loaded its channels and their partners before any store
        tl.debug_barrier()
    y = tl.where(rot[None, :], x * c + xp * s, x)  # where, not * 1 + * 0: an inf passes through as inf
    tl.store(o_ptr + row_o[:, None] + offs_d[None, :] * s_od, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, freqs_ptr, scale_ptr, cos_ptr, sin_ptr,
    S, HQ, HK, N: tl.constexpr, D: tl.constexpr,
    s_qb, s_qs, s_qh, s_qd, s_kb, s_ks, s_kh, s_kd,
    s_ob, s_os, s_oh, s_od, s_pb_, s_ps_, s_ph_, s_pd_,
    s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, s_tb, s_ts, s_th, s_tn,
    N_AXES: tl.constexpr, TABLE: tl.constexpr, PER_HEAD: tl.constexpr, HAS_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, INTERLEAVED: tl.constexpr, CONJ: tl.constexpr, INPLACE: tl.constexpr, F64: tl.constexpr,
    FAST_TRIG: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Rotate q ``[B, S, HQ, D]`` and k ``[B, S, HK, D]`` (strided) into qo/ko; ``CONJ`` rotates backwards.

    ``s_o*`` are qo's strides, ``s_p*_`` ko's. ``PER_HEAD``: angles (per-head F) or
    tables differ per head and are recomputed in the head loop.
    """
    b = tl.program_id(1).to(tl.int64)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < S
    mask = mask_s[:, None] & (offs_d < D)[None, :]
    plane, partner, rot, sign = _channels(offs_d, N, INTERLEAVED)
    offs_s = offs_s.to(tl.int64)
    c0, s0 = _cos_sin(
        pos_ptr, freqs_ptr, scale_ptr, cos_ptr, sin_ptr, b, 0, offs_s, mask_s, plane, rot, sign,
        s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, s_tb, s_ts, s_th, s_tn, N_AXES, TABLE, HAS_SCALE, CONJ, F64, FAST_TRIG,
    )  # fmt: skip
    row_x, row_o = b * s_qb + offs_s * s_qs, b * s_ob + offs_s * s_os  # int64 offsets of head 0, moved per head
    for h in range(HQ):
        c, s = c0, s0
        if PER_HEAD:
            c, s = _cos_sin(
                pos_ptr, freqs_ptr, scale_ptr, cos_ptr, sin_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, s_tb, s_ts, s_th, s_tn, N_AXES, TABLE, HAS_SCALE, CONJ, F64, FAST_TRIG,
            )  # fmt: skip
        _rotate_head(q_ptr, qo_ptr, row_x, row_o, offs_d, partner, rot, mask, s_qd, s_od, c, s, INTERLEAVED, INPLACE)
        row_x += s_qh
        row_o += s_oh
    if HAS_K:
        row_x, row_o = b * s_kb + offs_s * s_ks, b * s_pb_ + offs_s * s_ps_
        for h in range(HK):
            c, s = c0, s0
            if PER_HEAD:
                c, s = _cos_sin(
                    pos_ptr, freqs_ptr, scale_ptr, cos_ptr, sin_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                    s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, s_tb, s_ts, s_th, s_tn, N_AXES, TABLE, HAS_SCALE, CONJ, F64, FAST_TRIG,
                )  # fmt: skip
            _rotate_head(
                k_ptr, ko_ptr, row_x, row_o, offs_d, partner, rot, mask, s_kd, s_pd_, c, s, INTERLEAVED, INPLACE
            )
            row_x += s_kh
            row_o += s_ph_


@triton.jit
def _weights(w_ptr, offs_d, partner, D: tl.constexpr, HAS_W: tl.constexpr, dtype: tl.constexpr):
    """Norm weights at every channel and at its plane partner ``[BLOCK_D]`` (ones without a weight)."""
    if HAS_W:
        m = offs_d < D
        return tl.load(w_ptr + offs_d, mask=m, other=0.0).to(dtype), tl.load(w_ptr + partner, mask=m, other=0.0).to(
            dtype
        )
    ones = tl.full(offs_d.shape, 1.0, dtype)
    return ones, ones


@triton.jit
def _norm_rotate_head(x_ptr, w, wp, o_ptr, row_x, row_o, offs_d, partner, rot, mask, s_xd, s_od, c, s, eps,
                      D: tl.constexpr, INTERLEAVED: tl.constexpr):  # fmt: skip
    """RMSNorm a head row over its D channels (weight ``w``, partner weights ``wp``) and rotate the normalised row."""
    x = tl.load(x_ptr + row_x[:, None] + offs_d[None, :] * s_xd, mask=mask, other=0.0).to(c.dtype)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # [BLOCK_S]
    y = x * rstd[:, None] * w[None, :]
    if INTERLEAVED:
        yp = _swap_pairs(y)
    else:
        yp = _partner(x_ptr, row_x, partner, mask, s_xd, x, False) * rstd[:, None] * wp[None, :]
    y = tl.where(rot[None, :], y * c + yp * s, y)
    tl.store(o_ptr + row_o[:, None] + offs_d[None, :] * s_od, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_rotate_head_bwd(x_ptr, g_ptr, w, dx_ptr, row_x, row_g, row_o, offs_d, partner, rot, mask,
                          s_xd, s_gd, s_od, c, s, eps, D: tl.constexpr, dw, INTERLEAVED: tl.constexpr):  # fmt: skip
    """Gradient of one head row through rotation (by minus the angle) and RMSNorm; returns dw += sum(gy * x_hat)."""
    g = tl.load(g_ptr + row_g[:, None] + offs_d[None, :] * s_gd, mask=mask, other=0.0).to(c.dtype)
    gp = _partner(g_ptr, row_g, partner, mask, s_gd, g, INTERLEAVED)
    gy = tl.where(rot[None, :], g * c + gp * s, g)  # gradient w.r.t. the normalised (weighted) row
    x = tl.load(x_ptr + row_x[:, None] + offs_d[None, :] * s_xd, mask=mask, other=0.0).to(c.dtype)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)  # [BLOCK_S]
    x_hat = x * rstd[:, None]
    dw += tl.sum(gy * x_hat, axis=0)
    gy = gy * w[None, :]
    dx = rstd[:, None] * (gy - x_hat * (tl.sum(gy * x_hat, axis=1) / D)[:, None])
    tl.store(dx_ptr + row_o[:, None] + offs_d[None, :] * s_od, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    return dw


@triton.jit
def norm_rope_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, qo_ptr, ko_ptr, pos_ptr, freqs_ptr, scale_ptr, eps,
    S, HQ, HK, N: tl.constexpr, D: tl.constexpr,
    s_qb, s_qs, s_qh, s_qd, s_kb, s_ks, s_kh, s_kd,
    s_ob, s_os, s_oh, s_od, s_pb_, s_ps_, s_ph_, s_pd_,
    s_pb, s_ps, s_pa, s_fh, s_fa, s_fn,
    N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, HAS_QW: tl.constexpr, HAS_KW: tl.constexpr,
    HAS_SCALE: tl.constexpr, INTERLEAVED: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Fused per-head RMSNorm + rotation of q and k; same grid and strides as :func:`rope_kernel`."""
    b = tl.program_id(1).to(tl.int64)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < S
    mask = mask_s[:, None] & (offs_d < D)[None, :]
    plane, partner, rot, sign = _channels(offs_d, N, INTERLEAVED)
    offs_s = offs_s.to(tl.int64)
    c0, s0 = _cos_sin(
        pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, 0, offs_s, mask_s, plane, rot, sign,
        s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, False, F64, FAST_TRIG,
    )  # fmt: skip
    qw, qwp = _weights(qw_ptr, offs_d, partner, D, HAS_QW, c0.dtype)
    kw, kwp = _weights(kw_ptr, offs_d, partner, D, HAS_KW, c0.dtype)
    row_x, row_o = b * s_qb + offs_s * s_qs, b * s_ob + offs_s * s_os  # int64 offsets of head 0, moved per head
    for h in range(HQ):
        c, s = c0, s0
        if PER_HEAD:
            c, s = _cos_sin(
                pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, False, F64, FAST_TRIG,
            )  # fmt: skip
        _norm_rotate_head(
            q_ptr, qw, qwp, qo_ptr, row_x, row_o, offs_d, partner, rot, mask, s_qd, s_od, c, s, eps, D, INTERLEAVED
        )
        row_x += s_qh
        row_o += s_oh
    row_x, row_o = b * s_kb + offs_s * s_ks, b * s_pb_ + offs_s * s_ps_
    for h in range(HK):
        c, s = c0, s0
        if PER_HEAD:
            c, s = _cos_sin(
                pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, False, F64, FAST_TRIG,
            )  # fmt: skip
        _norm_rotate_head(
            k_ptr, kw, kwp, ko_ptr, row_x, row_o, offs_d, partner, rot, mask, s_kd, s_pd_, c, s, eps, D, INTERLEAVED
        )
        row_x += s_kh
        row_o += s_ph_


@triton.jit
def norm_rope_bwd_kernel(
    q_ptr, k_ptr, gq_ptr, gk_ptr, qw_ptr, kw_ptr, dq_ptr, dk_ptr, dqw_ptr, dkw_ptr, pos_ptr, freqs_ptr, scale_ptr, eps,
    S, HQ, HK, N: tl.constexpr, D: tl.constexpr,
    s_qb, s_qs, s_qh, s_qd, s_kb, s_ks, s_kh, s_kd,
    s_gqb, s_gqs, s_gqh, s_gqd, s_gkb, s_gks, s_gkh, s_gkd,
    s_ob, s_os, s_oh, s_od, s_pb_, s_ps_, s_ph_, s_pd_,
    s_pb, s_ps, s_pa, s_fh, s_fa, s_fn,
    N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, HAS_QW: tl.constexpr, HAS_KW: tl.constexpr,
    HAS_SCALE: tl.constexpr, INTERLEAVED: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Backward of :func:`norm_rope_kernel`: dq, dk, and per-program partial weight grads ``[programs, D]``."""
    b = tl.program_id(1).to(tl.int64)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < S
    mask = mask_s[:, None] & (offs_d < D)[None, :]
    plane, partner, rot, sign = _channels(offs_d, N, INTERLEAVED)
    offs_s = offs_s.to(tl.int64)
    c0, s0 = _cos_sin(
        pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, 0, offs_s, mask_s, plane, rot, sign,
        s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, True, F64, FAST_TRIG,
    )  # fmt: skip
    qw, _ = _weights(qw_ptr, offs_d, partner, D, HAS_QW, c0.dtype)
    kw, _ = _weights(kw_ptr, offs_d, partner, D, HAS_KW, c0.dtype)
    dw = tl.zeros([BLOCK_D], dtype=c0.dtype)
    row_x, row_g, row_o = b * s_qb + offs_s * s_qs, b * s_gqb + offs_s * s_gqs, b * s_ob + offs_s * s_os
    for h in range(HQ):
        c, s = c0, s0
        if PER_HEAD:
            c, s = _cos_sin(
                pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, True, F64, FAST_TRIG,
            )  # fmt: skip
        dw = _norm_rotate_head_bwd(
            q_ptr, gq_ptr, qw, dq_ptr, row_x, row_g, row_o, offs_d, partner, rot, mask, s_qd, s_gqd, s_od,
            c, s, eps, D, dw, INTERLEAVED,
        )  # fmt: skip
        row_x += s_qh
        row_g += s_gqh
        row_o += s_oh
    if HAS_QW:
        tl.store(dqw_ptr + pid * D + offs_d, dw, mask=offs_d < D)
    dw = tl.zeros([BLOCK_D], dtype=c0.dtype)
    row_x, row_g, row_o = b * s_kb + offs_s * s_ks, b * s_gkb + offs_s * s_gks, b * s_pb_ + offs_s * s_ps_
    for h in range(HK):
        c, s = c0, s0
        if PER_HEAD:
            c, s = _cos_sin(
                pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, True, F64, FAST_TRIG,
            )  # fmt: skip
        dw = _norm_rotate_head_bwd(
            k_ptr, gk_ptr, kw, dk_ptr, row_x, row_g, row_o, offs_d, partner, rot, mask, s_kd, s_gkd, s_pd_,
            c, s, eps, D, dw, INTERLEAVED,
        )  # fmt: skip
        row_x += s_kh
        row_g += s_gkh
        row_o += s_ph_
    if HAS_KW:
        tl.store(dkw_ptr + pid * D + offs_d, dw, mask=offs_d < D)


@triton.jit
def _angle_grad_head(x_ptr, g_ptr, row_x, row_g, offs_d, partner, rot, sign, mask, s_xd, s_gd, c, s,
                     INTERLEAVED: tl.constexpr):  # fmt: skip
    """d loss / d angle of one head row, per channel ``[BLOCK_S, BLOCK_D]`` (a plane's two channels sum to it).

    The output is ``y = scale R(angle) x``, so ``dy/dangle = J y``: channel ``d`` contributes
    ``sign(d) g[d] y[partner(d)]``, with ``y[partner(d)] = x[partner(d)] cos - x[d] sin(d)``.
    """
    x = tl.load(x_ptr + row_x[:, None] + offs_d[None, :] * s_xd, mask=mask, other=0.0).to(c.dtype)
    xp = _partner(x_ptr, row_x, partner, mask, s_xd, x, INTERLEAVED)
    g = tl.load(g_ptr + row_g[:, None] + offs_d[None, :] * s_gd, mask=mask, other=0.0).to(c.dtype)
    return tl.where(rot[None, :], sign[None, :] * g * (xp * c - x * s), 0.0)


@triton.jit
def _store_freqs_grad(dtheta, out_ptr, pos_ptr, b, offs_s, mask_s, offs_d, s_pb, s_ps, s_pa, BLOCK_D: tl.constexpr,
                      N_AXES: tl.constexpr):  # fmt: skip
    """out[a, d] = sum over the block's tokens of pos[a] * dtheta[:, d], for every axis (compute dtype)."""
    for a in tl.static_range(N_AXES):
        p = tl.load(pos_ptr + b * s_pb + offs_s * s_ps + a * s_pa, mask=mask_s, other=0.0).to(dtheta.dtype)
        tl.store(out_ptr + a * BLOCK_D + offs_d, tl.sum(p[:, None] * dtheta, axis=0))


@triton.jit
def freqs_grad_kernel(
    q_ptr, k_ptr, gq_ptr, gk_ptr, out_ptr, pos_ptr, freqs_ptr, scale_ptr,
    S, HQ, HK, N: tl.constexpr, D: tl.constexpr,
    s_qb, s_qs, s_qh, s_qd, s_kb, s_ks, s_kh, s_kd,
    s_gqb, s_gqs, s_gqh, s_gqd, s_gkb, s_gks, s_gkh, s_gkd,
    s_pb, s_ps, s_pa, s_fh, s_fa, s_fn,
    N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, HAS_K: tl.constexpr, HAS_SCALE: tl.constexpr,
    INTERLEAVED: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Gradient of F: per program, sum over its tokens (and heads) of ``pos[a] * d loss / d angle``.

    Writes ``out[program, (h,) a, channel]`` (float32, ``[programs, (H,) N_AXES, BLOCK_D]``);
    the launcher sums the programs and the two channels of every plane.
    """
    b = tl.program_id(1).to(tl.int64)
    pid = (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < S
    mask = mask_s[:, None] & (offs_d < D)[None, :]
    plane, partner, rot, sign = _channels(offs_d, N, INTERLEAVED)
    offs_s = offs_s.to(tl.int64)
    c0, s0 = _cos_sin(
        pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, 0, offs_s, mask_s, plane, rot, sign,
        s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, False, F64, FAST_TRIG,
    )  # fmt: skip
    heads = HQ if PER_HEAD else 1  # per-head F: q head h and k head h (same count) share F[h]
    base = out_ptr + pid * heads * N_AXES * BLOCK_D
    total = tl.zeros([BLOCK_S, BLOCK_D], dtype=c0.dtype)
    row_x, row_g = b * s_qb + offs_s * s_qs, b * s_gqb + offs_s * s_gqs  # int64 offsets of head 0, moved per head
    row_kx, row_kg = b * s_kb + offs_s * s_ks, b * s_gkb + offs_s * s_gks
    for h in range(HQ):
        c, s = c0, s0
        if PER_HEAD:
            c, s = _cos_sin(
                pos_ptr, freqs_ptr, scale_ptr, pos_ptr, pos_ptr, b, h, offs_s, mask_s, plane, rot, sign,
                s_pb, s_ps, s_pa, s_fh, s_fa, s_fn, 0, 0, 0, 0, N_AXES, False, HAS_SCALE, False, F64, FAST_TRIG,
            )  # fmt: skip
        dtheta = _angle_grad_head(
            q_ptr, gq_ptr, row_x, row_g, offs_d, partner, rot, sign, mask, s_qd, s_gqd, c, s, INTERLEAVED
        )
        row_x += s_qh
        row_g += s_gqh
        if PER_HEAD:
            if HAS_K:
                dtheta += _angle_grad_head(
                    k_ptr, gk_ptr, row_kx, row_kg, offs_d, partner, rot, sign, mask, s_kd, s_gkd, c, s, INTERLEAVED
                )
                row_kx += s_kh
                row_kg += s_gkh
            _store_freqs_grad(dtheta, base + h * N_AXES * BLOCK_D, pos_ptr, b, offs_s, mask_s, offs_d,
                              s_pb, s_ps, s_pa, BLOCK_D, N_AXES)  # fmt: skip
        else:
            total += dtheta
    if not PER_HEAD:
        if HAS_K:
            for _h in range(HK):  # GQA: k has its own head count
                total += _angle_grad_head(
                    k_ptr, gk_ptr, row_kx, row_kg, offs_d, partner, rot, sign, mask, s_kd, s_gkd, c0, s0, INTERLEAVED
                )
                row_kx += s_kh
                row_kg += s_gkh
        _store_freqs_grad(total, base, pos_ptr, b, offs_s, mask_s, offs_d, s_pb, s_ps, s_pa, BLOCK_D, N_AXES)
