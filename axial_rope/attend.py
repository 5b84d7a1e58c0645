"""How an attention attends once its queries and keys are normed and rotated: one small record per path.

:class:`~axial_rope.Attention` runs project -> norm + rotate -> attend -> output, and the attend step is
one of four records, each holding what its path needs and attending in one call:

- :class:`Sdpa` ``(mask)``: PyTorch's ``scaled_dot_product_attention`` over the call's own tokens (the default);
- :class:`Cached` ``(cache, input_pos, write, mask)``: through a :class:`~axial_rope.KVCache`, writing the new
  keys and values at ``input_pos`` (or, ``write=False``, reading the cache beside them without a write);
- :class:`Varlen` ``(segments)``: a packed sequence, each item attending within itself
  (:func:`~axial_rope.varlen.varlen_attention`);
- :class:`Sharded` ``(cp)``: a sequence sharded over a process group (ring or Ulysses,
  :func:`~axial_rope.parallel.sequence_parallel_attention`); collective.

One record per call, so the paths are exclusive by construction: a cache under context parallelism or a mask on
a packed sequence cannot be written down. Every record has the same two methods: ``check(x, pos, rope, seq_len)``
refuses what its path cannot take before any work (and before any collective), and
``record(q, k, v, causal=, scale=)`` attends: q ``[B, S, H, D]``, k and v ``[B, S, H_kv, D]`` (``H_kv`` dividing
``H``: grouped-query attention) -> ``[B, S, H, D]``. Records are named tuples (tensors and the objects they
name), so ``torch.compile`` and ``torch.export`` see through them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .cache import KVCache
from .parallel import ContextParallel, sequence_parallel_attention
from .varlen import Segments, check_packed_attention, varlen_attention

__all__ = ["ATTEND", "Cached", "Sdpa", "Sharded", "Varlen", "attend_record"]


def _allow(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """Restrict an SDPA mask (bool: True = attend, or additive float) to ``allowed`` (bool)."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return torch.where(allowed, mask, torch.full_like(mask, float("-inf")))


def _sdpa(q, k, v, mask, is_causal: bool, scale: float) -> torch.Tensor:
    """SDPA on ``[B, H, S, D]`` inputs (``k``, ``v`` may have ``H_kv`` heads) -> ``[B, S, H, D]``."""
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )
    return out.transpose(1, 2)


class Sdpa(NamedTuple):
    """Attention over the call's own tokens, PyTorch's fused SDPA.

    Attributes:
        mask: broadcastable to ``[B, H, S, S]`` (bool: True = attend; or additive float), or ``None``. With a
            causal attention the future is masked too (``is_causal`` where there is no mask).
    """

    mask: torch.Tensor | None = None

    def check(self, x, pos, rope, seq_len) -> None:
        """Nothing to refuse: any mask SDPA broadcasts."""

    def __call__(self, q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D] for SDPA
        if not causal or self.mask is None:
            return _sdpa(q, k, v, self.mask, causal, scale)
        past = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()  # [S, S]: keys <= query
        return _sdpa(q, k, v, _allow(self.mask, past), False, scale)


class Cached(NamedTuple):
    """Attention through a KV cache: the new keys (rotated once) and values written at ``input_pos``, the queries
    attending to every slot written so far (causal: those ``<= input_pos``).

    Attributes:
        cache: a :class:`~axial_rope.KVCache`.
        input_pos: int ``[S]``, the cache slots of the new tokens (also their default positions).
        write: ``False`` reads without writing (:meth:`KVCache.peek`): the queries attend to the cached slots and to
            the new tokens (causal: those before them), and the cache is left as it was.
        mask: as :class:`Sdpa`'s over the keys: ``S_max`` slots, or (``write=False``) the slots then the new tokens.
    """

    cache: KVCache
    input_pos: torch.Tensor
    write: bool = True
    mask: torch.Tensor | None = None

    def check(self, x, pos, rope, seq_len) -> None:
        if not isinstance(self.cache, KVCache):
            raise TypeError(f"Cached.cache must be an axial_rope.KVCache, got {type(self.cache).__name__}")
        if self.input_pos is None:
            raise ValueError("a KV cache needs input_pos, the int [S] slots of the new tokens")

    def __call__(self, q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
        cache, S = self.cache, q.shape[1]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D]
        if self.write:
            k, v = cache.update(self.input_pos, k, v)  # [B, H_kv, S_max, D], keys rotated when written
            visible = cache.filled[None, :].expand(S, -1)  # [S, S_max]: never-written slots stay hidden
            if causal:
                slots = torch.arange(cache.max_seq_len, device=q.device)
                visible = visible & (slots[None, :] <= self.input_pos[:, None])
        else:  # the slots, then the new tokens: [B, H_kv, S_max + S, D]
            k, v, filled = cache.peek(k, v)
            visible = filled[None, :].expand(S, -1)  # [S, S_max + S]
            if causal:  # every written slot is earlier; among the new tokens, those up to each query
                new = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
                visible = visible & torch.cat([visible[:, : cache.max_seq_len], new], dim=1)
        k, v = k.to(q.dtype), v.to(q.dtype)  # a cache kept in another dtype is read in the model's
        return _sdpa(q, k, v, _allow(self.mask, visible), False, scale)


class Varlen(NamedTuple):
    """Attention within each item of a packed sequence: the ``B * S`` tokens hold several items end to end.

    Attributes:
        segments: the items' boundaries (:class:`~axial_rope.varlen.Segments`).
    """

    segments: Segments

    def check(self, x, pos, rope, seq_len) -> None:
        check_packed_attention(x, pos, self.segments, rope=rope, seq_len=seq_len)

    def __call__(self, q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
        B, S = q.shape[:2]
        out = varlen_attention(*(t.flatten(0, 1) for t in (q, k, v)), self.segments, causal=causal, scale=scale)
        return out.unflatten(0, (B, S))


class Sharded(NamedTuple):
    """Attention over a sequence sharded by ``cp``: the call's ``x [B, L, C]`` and positions are this rank's shard
    (``cp.shard(x)``, ``cp.positions(pos)``: global coordinates) of ``cp.seq_len`` tokens. Collective: every rank
    of the group calls it.

    Attributes:
        cp: a :class:`~axial_rope.parallel.ContextParallel`.
    """

    cp: ContextParallel

    def check(self, x, pos, rope, seq_len) -> None:
        if not isinstance(self.cp, ContextParallel):
            raise TypeError(f"Sharded.cp must be an axial_rope.parallel.ContextParallel, got {type(self.cp).__name__}")
        if rope is not None and rope.length_dependent and seq_len is None:
            raise ValueError(
                "a length-dependent scaling under context_parallel needs seq_len= (the global length): "
                "each rank sees only its shard's positions and would pick a different frequency schedule"
            )

    def __call__(self, q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, L, D]
        return sequence_parallel_attention(q, k, v, self.cp, causal=causal, scale=scale).transpose(1, 2)


ATTEND = (Sdpa, Cached, Varlen, Sharded)  # every attend record


def attend_record(
    attend: Sdpa | Cached | Varlen | Sharded | None = None,
    *,
    mask: torch.Tensor | None = None,
    cache: KVCache | None = None,
    input_pos: torch.Tensor | None = None,
    cache_write: bool = True,
    context_parallel: ContextParallel | None = None,
    segments: Segments | None = None,
) -> Sdpa | Cached | Varlen | Sharded:
    """The record of a call: ``attend`` itself, or the one the keyword form names (``mask=``, ``cache=`` with
    ``input_pos=`` and ``cache_write=``, ``context_parallel=``, ``segments=``), refusing combinations no path takes.
    """
    if attend is not None:
        given = [n for n, v in (("mask", mask), ("cache", cache), ("input_pos", input_pos),
                                ("context_parallel", context_parallel), ("segments", segments)) if v is not None]  # fmt: skip
        if given or not cache_write:
            raise ValueError(f"attend= is the whole attend step; it does not take {given or ['cache_write']} beside it")
        if not isinstance(attend, ATTEND):
            raise TypeError(f"attend must be one of Sdpa, Cached, Varlen, Sharded, got {type(attend).__name__}")
        return attend
    if context_parallel is not None:
        if cache is not None:
            raise ValueError("context_parallel does not take a KV cache (decoding is not sequence-parallel)")
        if mask is not None:
            raise ValueError(
                "context_parallel takes no mask: each rank holds only its shard of the keys; padding to a "
                "multiple of the ranks is masked by the ContextParallel itself (cp.for_length(S))"
            )
        if segments is not None:
            raise ValueError("segments (packed attention within each item) do not take context_parallel")
        return Sharded(context_parallel)
    if segments is not None:
        for name, given in (("a mask", mask), ("a KV cache", cache)):
            if given is not None:
                raise ValueError(f"segments (packed attention within each item) do not take {name}")
        return Varlen(segments)
    if cache is not None:
        if input_pos is None:
            raise ValueError("a KV cache needs input_pos, the int [S] slots of the new tokens")
        return Cached(cache, input_pos, cache_write, mask)
    return Sdpa(mask)
