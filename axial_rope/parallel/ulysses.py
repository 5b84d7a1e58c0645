"""Ulysses (DeepSpeed-Ulysses) attention: all-to-all from sequence shards to head shards and back.

Each rank starts with all heads of its ``L = S_pad / P`` tokens. One all-to-all per tensor
gives it ``H / P`` heads of all ``S_pad`` tokens; it runs ordinary SDPA (fused kernels on
GPU) over the whole sequence for those heads, and one more all-to-all returns the output
to sequence shards. RoPE is applied before the first all-to-all, on each rank's own
tokens with their global positions, so the rotation never sees the whole sequence.

Heads must divide by ``P``: a ``ValueError`` names both otherwise (use ``method="ring"``,
which has no such constraint). Key/value heads that do not divide (grouped-query
attention) are repeated to the fewest that do, at the cost of more bytes on the wire.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .comm import all_to_all

__all__ = ["ulysses_attention", "ulysses_kv_heads"]


def ulysses_kv_heads(num_heads: int, num_kv_heads: int, world: int) -> int:
    """The key/value heads Ulysses sends: ``num_kv_heads`` times the least repeat that ``world`` divides.

    Raises ``ValueError`` when ``num_heads`` does not divide by ``world``.
    """
    if num_heads % world:
        raise ValueError(
            f"Ulysses shards heads over ranks: {num_heads} query heads do not divide by {world} ranks; "
            f"use a head count divisible by {world} or method='ring'"
        )
    group = num_heads // num_kv_heads
    repeat = next(r for r in range(1, group + 1) if group % r == 0 and (num_kv_heads * r) % world == 0)
    return num_kv_heads * repeat


def _seq_to_heads(x: torch.Tensor, cp) -> torch.Tensor:
    """``[B, h, L, D]`` (all heads, this rank's tokens) -> ``[B, h / P, P * L, D]`` (rank-major slots)."""
    B, h, L, D = x.shape
    P = cp.world
    send = x.reshape(B, P, h // P, L, D).transpose(0, 1)  # [P, B, h/P, L, D]: head group i to rank i
    recv = all_to_all(send, cp.group)  # [P, B, h/P, L, D]: slot block j from rank j
    return recv.permute(1, 2, 0, 3, 4).reshape(B, h // P, P * L, D)


def _heads_to_seq(x: torch.Tensor, cp) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`: ``[B, h / P, P * L, D]`` -> ``[B, h, L, D]``."""
    B, hp, SP, D = x.shape
    P = cp.world
    send = x.reshape(B, hp, P, SP // P, D).permute(2, 0, 1, 3, 4)  # [P, B, h/P, L, D]: slots of rank i
    recv = all_to_all(send, cp.group)  # [P, B, h/P, L, D]: head group j from rank j
    return recv.transpose(0, 1).reshape(B, P * hp, SP // P, D)


def ulysses_attention(q, k, v, cp, seq_len: int, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention of this rank's queries over the whole sharded sequence, by head-sharding all-to-all.

    Same arguments and result as :func:`~axial_rope.parallel.ring.ring_attention`; differentiable
    through autograd (the all-to-all's gradient is the reverse all-to-all).
    """
    B, H, L, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kv_heads = ulysses_kv_heads(H, k.shape[1], cp.world)
    if kv_heads != k.shape[1]:
        repeat = kv_heads // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    q, k, v = (_seq_to_heads(t, cp) for t in (q, k, v))  # [B, h/P, S_pad, D]
    # Slots arrive rank-major: the global order already for contiguous shards (padding at the end);
    # zigzag slots are put in global order, so that is_causal and the key cut-off below hold.
    order = None
    if cp.layout == "zigzag":
        order = torch.cat([cp.indices(seq_len, r, q.device) for r in range(cp.world)]).argsort()
        q, k, v = (t.index_select(2, order) for t in (q, k, v))
    if not causal:  # padded keys cut off; with a causal mask they come after every real query anyway
        k, v = k[:, :, :seq_len], v[:, :, :seq_len]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if order is not None:
        out = out.index_select(2, order.argsort())
    return _heads_to_seq(out, cp)
