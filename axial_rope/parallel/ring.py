"""Ring attention: each rank keeps its queries; key/value blocks travel around the ring.

At step ``s`` rank ``r`` holds the keys and values of rank ``(r - s) mod P``; it attends its
queries to them, chunk by chunk (one chunk per rank for the contiguous layout, two for
zigzag), and merges the partial result into a running output with the log-sum-exp:

    lse = logaddexp(lse_a, lse_b),  out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse),

the log-sum-exp held as its two parts ``m + log(l)`` (row maximum, sum of exponentials),
as FlashAttention's online softmax does, which keeps float32 results within rounding of
one SDPA call. Sub-blocks a causal mask hides entirely are skipped, and padded keys are
cut off (padding sits at the end of the global sequence), so no mask tensor is ever built
except the lower triangle of a diagonal sub-block. The backward pass (the FlashAttention
recurrence) recomputes each block's probabilities from the saved row maximum and sum, and
sends the key/value gradients around the ring with their block, so every rank saves only
its own ``q, k, v, out`` and the two row statistics: memory ``O(S / P)`` per rank besides
one block of scores.

Scores, softmax and accumulators are float32 here (float64 for float64 inputs, so a test can
compare against one SDPA call to float64 rounding), from explicit matmuls (SDPA does not
return the log-sum-exp). On GPUs the fused kernels that do return it
(``torch.ops.aten._scaled_dot_product_flash_attention`` / ``_efficient_attention`` with
``compute_log_sumexp``, and their backward ops) are where a faster block step would plug in.
"""

from __future__ import annotations

import math

import torch

from ..ops import compute_dtype
from .comm import RingShift

__all__ = ["ring_attention", "block_pairs", "TILE"]

TILE = 512  # query rows and keys per block step: scores [B, H, 512, 512] float32 at most (fastest on CPU)


def block_pairs(q_ids, kv_ids, chunk: int, seq_len: int, causal: bool) -> list[tuple[int, int, int, bool]]:
    """The sub-blocks worth computing between a rank's query chunks and a visiting rank's key chunks.

    Args:
        q_ids, kv_ids: global chunk numbers (see :meth:`ContextParallel.chunk_ids`).
        chunk: tokens per chunk ``c``; ``seq_len``: the unpadded length ``S``.

    Returns:
        ``(a, b, n_keys, diagonal)``: local query chunk ``a`` against local key chunk ``b``, of
        which the first ``n_keys`` are real tokens; ``diagonal``: same chunk under a causal mask
        (lower triangle). Fully masked pairs (a later key chunk, or only padding) are left out.
    """
    pairs = []
    for a, qa in enumerate(q_ids):
        for b, kb in enumerate(kv_ids):
            n_keys = min(max(seq_len - kb * chunk, 0), chunk)
            if n_keys and not (causal and kb > qa):
                pairs.append((a, b, n_keys, causal and kb == qa))
    return pairs


def _scores(q: torch.Tensor, k: torch.Tensor, offset: int | None) -> torch.Tensor:
    """q ``[B, Hk, g, tq, D]`` (softmax scale multiplied in), k ``[B, Hk, tk, D]`` (compute dtype) -> ``[B, Hk, g, tq, tk]``.

    ``offset``: on a causal diagonal, query row ``i`` sees key ``j`` where ``i + offset >= j``
    (``offset`` = first query row minus first key of the tile); ``None``: no mask.
    """
    s = q @ k[:, :, None].transpose(-1, -2)  # the g query heads of a kv head share it (GQA)
    if offset is not None:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(offset)
        s.masked_fill_(~keep, float("-inf"))
    return s


def _tiles(pairs, chunk: int):
    """Tiles of at most ``TILE x TILE`` (query rows x keys) of each sub-block: (query slots, key slots, offset).

    Tiling bounds the scores held at once to ``B H TILE^2`` floats, whatever the length, as a
    fused kernel would. On a causal diagonal, tiles wholly above it are skipped and tiles
    wholly below it need no mask (``offset=None``).
    """
    for a, b, n_keys, diagonal in pairs:
        for q0 in range(0, chunk, TILE):
            q1 = min(q0 + TILE, chunk)
            last = min(n_keys, q1) if diagonal else n_keys  # keys after the tile's last row: hidden
            for k0 in range(0, last, TILE):
                k1 = min(k0 + TILE, last)
                offset = q0 - k0 if diagonal and k1 - 1 > q0 else None
                yield slice(a * chunk + q0, a * chunk + q1), slice(b * chunk + k0, b * chunk + k1), offset


def _merge(acc, row_max, row_sum, s: torch.Tensor, v: torch.Tensor) -> None:
    """Fold a block of scores ``s [.., c, n]`` and values ``v [.., n, D]`` into the running state, in place.

    The state of each query row is its running score maximum ``row_max``, the sum ``row_sum``
    of ``exp(score - row_max)`` and the unnormalised output ``acc``: the log-sum-exp is
    ``row_max + log(row_sum)``, kept in two parts so that no ``exp(s - lse)`` amplifies the
    rounding of a large ``lse``.
    """
    new = torch.maximum(row_max, s.amax(-1))  # row_max starts at -inf: exp(-inf - new) = 0
    safe = torch.where(new == float("-inf"), 0.0, new)  # a row with no key yet: exp(-inf - 0) = 0, not nan
    p = s.sub_(safe[..., None]).exp_()  # in place: the tile's scores are not needed again
    old = torch.exp(row_max - safe)
    acc.mul_(old[..., None]).add_(p @ v)
    row_sum.mul_(old).add_(p.sum(-1))
    row_max.copy_(new)


def _steps(cp, seq_len: int, causal: bool, chunk: int):
    """Per ring step: the source rank of the visiting block and the sub-blocks to compute."""
    rank, P = cp.rank, cp.world
    for step in range(P):
        src = (rank - step) % P
        yield step, block_pairs(cp.chunk_ids(rank), cp.chunk_ids(src), chunk, seq_len, causal)


def _ring_forward(q, k, v, cp, seq_len, causal, scale):
    """q ``[B, H, L, D]``, k/v ``[B, Hk, L, D]`` -> out ``[B, Hk, g, L, D]``; row max and sum ``[B, Hk, g, L]``.

    All three in the compute dtype (float32; float64 for float64 inputs)."""
    B, H, L, D = q.shape
    Hk, c, P = k.shape[1], L // cp.chunks_per_rank, cp.world
    dtype = compute_dtype(q)
    q5 = q.to(dtype).reshape(B, Hk, H // Hk, L, D) * scale  # query head h uses kv head h // g
    acc = q5.new_zeros(q5.shape)
    row_max, row_sum = q5.new_full(q5.shape[:-1], float("-inf")), q5.new_zeros(q5.shape[:-1])
    shift, kv = RingShift(cp.group), [k, v]
    for step, pairs in _steps(cp, seq_len, causal, c):
        if step < P - 1:
            shift.start(kv)  # the next block travels while this one is computed
        for qs, ks, offset in _tiles(pairs, c):
            s = _scores(q5[..., qs, :], kv[0][:, :, ks].to(dtype), offset)
            _merge(acc[..., qs, :], row_max[..., qs], row_sum[..., qs], s, kv[1][:, :, None, ks].to(dtype))
        if step < P - 1:
            kv = shift.wait()
    return acc / row_sum[..., None], row_max, row_sum


def _ring_backward(dout, q, k, v, out, row_max, row_sum, cp, seq_len, causal, scale):
    """Gradients of q, k, v; dk/dv accumulators ride the ring with their block and end at its owner."""
    B, H, L, D = q.shape
    Hk, c, P = k.shape[1], L // cp.chunks_per_rank, cp.world
    dtype = compute_dtype(q)
    q5 = q.to(dtype).reshape(B, Hk, H // Hk, L, D) * scale  # as in the forward pass: scores = q5 k^T
    do5 = dout.to(dtype).reshape(q5.shape)
    delta = (do5 * out.to(dtype).reshape(q5.shape)).sum(-1)  # [B, Hk, g, L]: rowsum(dO * O)
    inv_sum = 1.0 / row_sum
    dq = torch.zeros_like(q5)
    kv, dkv = [k, v], [k.new_zeros(k.shape, dtype=dtype), v.new_zeros(v.shape, dtype=dtype)]
    kv_shift, d_shift = RingShift(cp.group, tag=0), RingShift(cp.group, tag=1)
    for step, pairs in _steps(cp, seq_len, causal, c):
        if step < P - 1:
            kv_shift.start(kv)
        for qs, ks, offset in _tiles(pairs, c):
            kb, vb, qa, dob = kv[0][:, :, ks].to(dtype), kv[1][:, :, ks].to(dtype), q5[..., qs, :], do5[..., qs, :]
            p = _scores(qa, kb, offset).sub_(row_max[..., qs, None]).exp_().mul_(inv_sum[..., qs, None])
            dkv[1][:, :, ks] += (p.transpose(-1, -2) @ dob).sum(2)  # [B, Hk, tk, D]: the g heads sharing v summed
            ds = (dob @ vb[:, :, None].transpose(-1, -2)).sub_(delta[..., qs, None]).mul_(p)  # dS = P (dP - delta)
            dq[..., qs, :] += (ds @ kb[:, :, None]) * scale
            dkv[0][:, :, ks] += (ds.transpose(-1, -2) @ qa).sum(2)  # qa carries the scale already
        dkv = d_shift.start(dkv).wait()  # P shifts in all: each accumulator comes home
        if step < P - 1:
            kv = kv_shift.wait()
    return dq.reshape(q.shape).to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cp, seq_len, causal, scale):
        out, row_max, row_sum = _ring_forward(q, k, v, cp, seq_len, causal, scale)
        out = out.reshape(q.shape).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, row_max, row_sum)  # O(L) per rank: no block of scores is kept
        ctx.args = (cp, seq_len, causal, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, row_max, row_sum = ctx.saved_tensors
        return (*_ring_backward(dout, q, k, v, out, row_max, row_sum, *ctx.args), None, None, None, None)


def ring_attention(q, k, v, cp, seq_len: int, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention of this rank's queries over the whole sharded sequence, by ring.

    Args:
        q: ``[B, H, L, D]`` this rank's queries (rotated with their global positions).
        k, v: ``[B, H_kv, L, D]`` this rank's keys and values (``H_kv`` divides ``H``).
        cp: the :class:`ContextParallel` sharding; ``seq_len``: the unpadded global length ``S``.

    Returns:
        ``[B, H, L, D]`` in ``q``'s dtype; rows of padding slots hold finite values to drop.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _RingAttention.apply(q, k, v, cp, seq_len, causal, scale)
