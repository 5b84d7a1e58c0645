"""The rotation kernels of the Triton backend and the tile helpers every kernel shares.

Launchers live in ``_triton.py``; the fused QK-norm and gradient kernels in
``_triton_norm_kernels.py``.

**Tiles.** A program owns one *tile*: ``HEADS`` heads of one tensor (q or k) for
``BLOCK_S`` tokens of one sample, ``[HEADS, BLOCK_S, D]``. The grid is
``(cdiv(S, BLOCK_S), q_groups + k_groups, B)``: axis 1 walks q's head groups, then k's
(grouped-query attention: k has its own head count). The cos/sin of the program's
(token, plane) pairs are computed once and reused by its ``HEADS`` heads. The whole tile
is loaded by one ``tl.load``, so every thread has all its 16-byte loads in flight at
once before any arithmetic (``HEADS`` x token repeats of them).

**Addresses.** Tensors are indexed as ``[B, S, H, D]`` through strides (a ``bhsd``
tensor is passed as its transposed view). The batch, token and head strides are passed
in units of ``VEC`` elements and multiplied back by the constant ``VEC`` in the kernel,
so the compiler knows every row starts on a ``VEC``-element boundary: a head dim of 72
(a stride of 72 is not divisible by 16, so Triton would not specialise it) still gets
16-byte loads. The launcher picks ``VEC`` from the real strides and pointers (1 when
they are not aligned, or the channel stride is not 1).

**Planes.** A head row is handled as its planes ``(re, im)``, each ``[.., BLOCK_N]``:
interleaved pairs (channels ``2j, 2j + 1``) are one contiguous load split in registers
(``reshape`` + ``split``, each thread holds whole pairs); half pairs (channels ``j,
j + N``) are two tiles, one per half. Channels past ``2N`` (partial rotary) pass
through: interleaved, as planes ``j >= N`` of the same load; half, as a third tile
(``BLOCK_R``), copied only when writing out of place. Every thread stores exactly the
elements it loaded, so writing in place needs no barrier.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

TWO_PI = tl.constexpr(6.283185307179586)  # float64 2*pi: reduction error |angle| * 2.4e-16, below 1e-9 at angle 1e6


# -- tile geometry and memory ------------------------------------------------------------------


@triton.jit
def _tokens(S, BLOCK_S: tl.constexpr):
    """(sample, tokens [BLOCK_S] int64, token mask) of this program."""
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    return tl.program_id(2).to(tl.int64), tokens.to(tl.int64), tokens < S


@triton.jit
def _group(HQ, HEADS: tl.constexpr):
    """(is k, first head) of this program's head group: axis 1 walks q's groups, then k's."""
    q_groups = tl.cdiv(HQ, HEADS)
    group = tl.program_id(1)
    is_k = group >= q_groups
    return is_k, (group - q_groups * is_k.to(tl.int32)) * HEADS


@triton.jit
def _rows(strides, b, heads, tokens, VEC: tl.constexpr):
    """Element offsets of the head rows ``[HEADS, BLOCK_S, 1]``; ``strides`` (b, s, h, d): b, s, h in VEC units."""
    rows = b * strides[0] + tokens[None, :] * strides[1] + heads[:, None] * strides[2]
    return (rows * VEC)[:, :, None]


@triton.jit
def _load_planes(ptr, rows, sd, mask, N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 INTERLEAVED: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """(re, im) ``[HEADS, BLOCK_S, BLOCK_N]`` of a head tile in ``dtype``; ``mask`` ``[HEADS, BLOCK_S, 1]``."""
    if INTERLEAVED:  # one contiguous row, pairs split in registers; planes >= N are pass-through channels
        ch = tl.arange(0, 2 * BLOCK_N)
        x = tl.load(ptr + rows + ch * sd, mask=mask & (ch < D), other=0.0).to(dtype)
        re, im = tl.split(tl.reshape(x, [x.shape[0], x.shape[1], BLOCK_N, 2]))
    else:  # the two halves as two tiles
        j = tl.arange(0, BLOCK_N)
        re = tl.load(ptr + rows + j * sd, mask=mask & (j < N), other=0.0).to(dtype)
        im = tl.load(ptr + rows + (j + N) * sd, mask=mask & (j < N), other=0.0).to(dtype)
    return re, im


@triton.jit
def _store_planes(ptr, rows, sd, mask, re, im, N: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                  INTERLEAVED: tl.constexpr):  # fmt: skip
    """Inverse of :func:`_load_planes`: rounds to the pointer's dtype once."""
    dtype = ptr.dtype.element_ty
    if INTERLEAVED:
        ch = tl.arange(0, 2 * BLOCK_N)
        x = tl.reshape(tl.join(re, im), [re.shape[0], re.shape[1], 2 * BLOCK_N])
        tl.store(ptr + rows + ch * sd, x.to(dtype), mask=mask & (ch < D))
    else:
        j = tl.arange(0, BLOCK_N)
        tl.store(ptr + rows + j * sd, re.to(dtype), mask=mask & (j < N))
        tl.store(ptr + rows + (j + N) * sd, im.to(dtype), mask=mask & (j < N))


@triton.jit
def _rest(N: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr):
    """Channel indices past the rotated ones (half pairing, partial rotary) ``[BLOCK_R]`` and their mask."""
    r = tl.arange(0, BLOCK_R)
    return 2 * N + r, r < D - 2 * N


# -- cos and sin ------------------------------------------------------------------------------


@triton.jit
def _trig(angle, N: tl.constexpr, planes, scale_ptr, CONJ: tl.constexpr, F64: tl.constexpr,
          FAST_TRIG: tl.constexpr):  # fmt: skip
    """cos and sin of float64 angles (any shape ``[.., BLOCK_N]``), times the attention factor; -sin if CONJ."""
    angle = angle - TWO_PI * tl.floor(angle * (1.0 / TWO_PI) + 0.5)  # to [-pi, pi] before any rounding
    if not F64:
        angle = angle.to(tl.float32)  # |angle| <= pi: float32 keeps it to 2e-7
    if FAST_TRIG:  # |angle| <= pi: the hardware approximations are within 1e-6 and need few registers
        c, s = libdevice.fast_cosf(angle), libdevice.fast_sinf(angle)
    else:  # float64, or the interpreter (which has no libdevice)
        c, s = tl.cos(angle), tl.sin(angle)
    if scale_ptr is not None:  # attention factor per plane [N]
        f = tl.load(scale_ptr + planes, mask=planes < N, other=1.0).to(c.dtype)
        c, s = c * f, s * f
    if CONJ:
        s = -s
    return c, s


@triton.jit
def _angle_cos_sin(pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, b, tokens, token_mask, heads,
                   N: tl.constexpr, N_AXES: tl.constexpr, BLOCK_N: tl.constexpr, PER_HEAD: tl.constexpr,
                   CONJ: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr):  # fmt: skip
    """cos, sin ``[HEADS|1, BLOCK_S, BLOCK_N]`` of ``angle = sum_a pos[b, s, a] * F[(h,) a, j]`` in float64.

    pos and F arrive in any dtype and are converted here (exactly, from float32 or ints).
    ``pos_strides`` (b, s, a); ``freqs_strides`` (h, a, j), h's 0 for a shared F. Without
    ``PER_HEAD`` the angles are shared by all heads (leading axis 1, broadcast).
    """
    planes = tl.arange(0, BLOCK_N)
    f_rows = heads[:, None] * freqs_strides[0] if PER_HEAD else tl.zeros([1, 1], tl.int64)  # [HEADS|1, 1]
    angle = tl.zeros([f_rows.shape[0], tokens.shape[0], BLOCK_N], dtype=tl.float64)
    for a in tl.static_range(N_AXES):
        p = tl.load(pos_ptr + b * pos_strides[0] + tokens * pos_strides[1] + a * pos_strides[2], mask=token_mask,
                    other=0.0)  # fmt: skip
        f = tl.load(freqs_ptr + f_rows + a * freqs_strides[1] + planes[None, :] * freqs_strides[2],
                    mask=planes[None, :] < N, other=0.0)  # fmt: skip
        angle += p.to(tl.float64)[None, :, None] * f.to(tl.float64)[:, None, :]
    return _trig(angle, N, planes, scale_ptr, CONJ, F64, FAST_TRIG)


@triton.jit
def _program_cos_sin(pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, S, HQ, HK, HF, N: tl.constexpr,
                     N_AXES: tl.constexpr, BLOCK_N: tl.constexpr, PER_HEAD: tl.constexpr, CONJ: tl.constexpr,
                     F64: tl.constexpr, FAST_TRIG: tl.constexpr, HEADS: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """The tile of a q/k kernel's program (sample, tokens, token mask, is k, first head) and its cos, sin.

    Per-head F ``[HF, A, N]``: head h of q uses ``F[h // (HQ / HF)]``, head h of k ``F[h // (HK / HF)]`` (HF divides
    both; grouped-query attention with ``HF = HK`` gives each query head its key head's F).
    """
    b, tokens, token_mask = _tokens(S, BLOCK_S)
    is_k, h0 = _group(HQ, HEADS)
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    if PER_HEAD:
        heads = heads // ((HQ + (HK - HQ) * is_k.to(tl.int32)) // HF)  # the tensor's heads per F head
    c, s = _angle_cos_sin(pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, b, tokens, token_mask, heads,
                          N, N_AXES, BLOCK_N, PER_HEAD, CONJ, F64, FAST_TRIG)  # fmt: skip
    return b, tokens, token_mask, is_k, h0, c, s


@triton.jit
def _table_cos_sin(cos_ptr, sin_ptr, table_strides, b, tokens, token_mask, heads, N: tl.constexpr,
                   BLOCK_N: tl.constexpr, PER_HEAD: tl.constexpr, CONJ: tl.constexpr, dtype: tl.constexpr):  # fmt: skip
    """cos, sin ``[HEADS|1, BLOCK_S, BLOCK_N]`` read from plane tables ``[B|1, S, H|1, N]`` (strides b, s, h, j)."""
    planes = tl.arange(0, BLOCK_N)
    h_rows = heads[:, None, None] * table_strides[2] if PER_HEAD else tl.zeros([1, 1, 1], tl.int64)
    offs = h_rows + b * table_strides[0] + tokens[None, :, None] * table_strides[1] + planes * table_strides[3]
    mask = token_mask[None, :, None] & (planes < N)
    c = tl.load(cos_ptr + offs, mask=mask, other=1.0).to(dtype)
    s = tl.load(sin_ptr + offs, mask=mask, other=0.0).to(dtype)
    if CONJ:
        s = -s
    return c, s


# -- rotation ---------------------------------------------------------------------------------


@triton.jit
def _rotate(re, im, c, s, N: tl.constexpr):
    """Planes turned by the angle: (re cos - im sin, im cos + re sin); planes >= N kept (``where``: inf stays inf)."""
    rot = tl.arange(0, re.shape[2]) < N
    return tl.where(rot, re * c - im * s, re), tl.where(rot, im * c + re * s, im)


@triton.jit
def _rotate_heads(x_ptr, o_ptr, x_strides, o_strides, n_heads, b, h0, tokens, token_mask, c, s,
                  N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_R: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_REST: tl.constexpr):  # fmt: skip
    """Rotate heads ``[h0, h0 + HEADS)`` of one tensor (q or k) for the program's tokens into ``o``.

    ``c``, ``s``: ``[HEADS|1, BLOCK_S, BLOCK_N]`` in the compute dtype. ``COPY_REST``:
    copy the channels past ``2N`` (half pairing, out of place).
    """
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    mask = (heads < n_heads)[:, None, None] & token_mask[None, :, None]  # [HEADS, BLOCK_S, 1]
    x_rows, o_rows = _rows(x_strides, b, heads, tokens, VEC), _rows(o_strides, b, heads, tokens, VEC)
    re, im = _load_planes(x_ptr, x_rows, x_strides[3], mask, N, D, BLOCK_N, INTERLEAVED, c.dtype)
    if COPY_REST:
        r, r_mask = _rest(N, D, BLOCK_R)
        rest = tl.load(x_ptr + x_rows + r * x_strides[3], mask=mask & r_mask)
    re, im = _rotate(re, im, c, s, N)
    _store_planes(o_ptr, o_rows, o_strides[3], mask, re, im, N, D, BLOCK_N, INTERLEAVED)
    if COPY_REST:
        tl.store(o_ptr + o_rows + r * o_strides[3], rest, mask=mask & r_mask)


@triton.jit
def rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, freqs_ptr, scale_ptr,
    q_strides, k_strides, qo_strides, ko_strides, pos_strides, freqs_strides, S, HQ, HK, HF,
    N: tl.constexpr, D: tl.constexpr, N_AXES: tl.constexpr, PER_HEAD: tl.constexpr, INTERLEAVED: tl.constexpr,
    CONJ: tl.constexpr, COPY_REST: tl.constexpr, F64: tl.constexpr, FAST_TRIG: tl.constexpr, VEC: tl.constexpr,
    HEADS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Rotate q ``[B, S, HQ, D]`` and k ``[B, S, HK, D]`` by ``pos @ F`` into qo, ko (``CONJ``: backwards).

    ``k_ptr`` None: q alone. ``scale_ptr`` None: no attention factor. Outputs may be the
    inputs (in place).
    """
    b, tokens, token_mask, is_k, h0, c, s = _program_cos_sin(
        pos_ptr, pos_strides, freqs_ptr, freqs_strides, scale_ptr, S, HQ, HK, HF,
        N, N_AXES, BLOCK_N, PER_HEAD, CONJ, F64, FAST_TRIG, HEADS, BLOCK_S,
    )  # fmt: skip
    if is_k:
        if k_ptr is not None:  # (without k the grid has q's groups only)
            _rotate_heads(k_ptr, ko_ptr, k_strides, ko_strides, HK, b, h0, tokens, token_mask, c, s,
                          N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, COPY_REST)  # fmt: skip
    else:
        _rotate_heads(q_ptr, qo_ptr, q_strides, qo_strides, HQ, b, h0, tokens, token_mask, c, s,
                      N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, COPY_REST)  # fmt: skip


@triton.jit
def rope_table_kernel(
    x_ptr, o_ptr, cos_ptr, sin_ptr, x_strides, o_strides, table_strides, S, H, G,
    N: tl.constexpr, D: tl.constexpr, PER_HEAD: tl.constexpr, INTERLEAVED: tl.constexpr, CONJ: tl.constexpr,
    COPY_REST: tl.constexpr, F64: tl.constexpr, VEC: tl.constexpr, HEADS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Rotate x ``[B, S, H, D]`` by plane tables cos/sin ``[B|1, S, H_t|1, N]`` (0 strides on broadcast axes); head
    h reads table head ``h // G`` (``G = H / H_t``: 1, or grouped heads)."""
    b, tokens, token_mask = _tokens(S, BLOCK_S)
    h0 = tl.program_id(1) * HEADS
    heads = h0 + tl.arange(0, HEADS).to(tl.int64)
    dtype = tl.float64 if F64 else tl.float32
    c, s = _table_cos_sin(cos_ptr, sin_ptr, table_strides, b, tokens, token_mask, heads // G, N, BLOCK_N, PER_HEAD,
                          CONJ, dtype)  # fmt: skip
    _rotate_heads(x_ptr, o_ptr, x_strides, o_strides, H, b, h0, tokens, token_mask, c, s,
                  N, D, VEC, HEADS, BLOCK_N, BLOCK_R, INTERLEAVED, COPY_REST)  # fmt: skip
