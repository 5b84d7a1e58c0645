"""``sequence_parallel_attention``: the one entry point, and the communication volume of each method."""

from __future__ import annotations

import torch

from .ring import ring_attention
from .sharding import ContextParallel, padded_length
from .ulysses import ulysses_attention, ulysses_kv_heads

__all__ = ["sequence_parallel_attention", "communication_bytes"]


def sequence_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp: ContextParallel,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention over a sequence sharded by ``cp``, from this rank's shard of it.

    Every rank of ``cp.group`` must call it with its own shard (it is collective). Queries and
    keys are already rotated with their *global* positions (:meth:`ContextParallel.positions`).
    An eager call first checks that the ranks agree on the call (:meth:`ContextParallel.check_consistent`:
    shapes, dtypes, method, layout, ``seq_len``, ``causal``, ``scale``); if not, every rank raises
    the same ``ValueError``. A collective that fails because another rank did raises
    :class:`~axial_rope.parallel.comm.RankFailedError`.

    Args:
        q: ``[B, H, L, D]`` this rank's queries, ``L = cp.local_len(S)`` slots in ``cp``'s layout.
        k, v: ``[B, H_kv, L, D]``, ``H_kv`` dividing ``H`` (grouped-query attention).
        cp: the sharding; ``cp.seq_len`` is the unpadded global length ``S`` (``None``: ``P * L``,
            no padding). Padded keys are never attended to.
        causal: token ``i`` attends to global tokens ``<= i``.
        scale: softmax scale, default ``1 / sqrt(D)``.

    Returns:
        ``[B, H, L, D]``, this rank's rows of the attention output; padding rows are finite and
        meaningless (drop them with ``cp.valid()``).
    """
    if cp.eager_check():  # first: with the ranks in agreement, the checks below fail on all or none
        cp.check_consistent(q, k, v, causal=causal, scale=scale)
    if q.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"q must be [B, H, L, D] and k, v [B, H_kv, L, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"key/value heads ({k.shape[1]}) must divide query heads ({q.shape[1]})")
    L = q.shape[2]
    S = cp.seq_len if cp.seq_len is not None else L * cp.world
    if cp.local_len(S) != L:
        raise ValueError(
            f"q has {L} tokens per rank; a {cp.layout} shard of seq_len={S} over {cp.world} ranks holds "
            f"{cp.local_len(S)} (shard with cp.shard and set the length with cp.for_length)"
        )
    method = ulysses_attention if cp.method == "ulysses" else ring_attention
    return method(q, k, v, cp, S, causal=causal, scale=scale)


def communication_bytes(
    method: str,
    *,
    batch: int,
    seq_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    world: int,
    element_size: int = 4,
    layout: str = "contiguous",
    backward: bool = False,
) -> int:
    """Bytes one rank sends for one attention call (forward, or forward and backward), by formula.

    With ``L = S_pad / P`` tokens per rank and ``e`` bytes per element:

    - Ulysses: four all-to-alls (q, k, v in; out back), each keeping ``1 / P`` of the rank's
      tensor: ``(P - 1) / P * B * L * D * (2 H + 2 H_kv') * e`` (``H_kv'``: the kv heads after any
      repeat); the backward pass sends the same again.
    - Ring: ``P - 1`` shifts of the local keys and values, ``(P - 1) * 2 B H_kv L D e``; the
      backward pass repeats them and sends the key/value gradients, in the compute dtype (float32, or
      float64 for ``e = 8``), ``P`` times: ``P * 2 B H_kv L D * max(e, 4)``.
    """
    if world == 1:
        return 0
    L = padded_length(seq_len, world, layout) // world
    if method == "ulysses":
        kv = ulysses_kv_heads(heads, kv_heads, world)
        forward = (world - 1) * batch * L * head_dim * (2 * heads + 2 * kv) * element_size // world
        return forward * (2 if backward else 1)
    kv_block = 2 * batch * kv_heads * L * head_dim
    forward = (world - 1) * kv_block * element_size
    grad_size = max(element_size, 4)  # gradient accumulators: float32, float64 for float64 inputs
    return forward + ((world - 1) * kv_block * element_size + world * kv_block * grad_size if backward else 0)
