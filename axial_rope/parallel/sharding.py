"""Which tokens a rank holds: :class:`ContextParallel`, its layouts, padding, shard / gather / positions.

A sequence of ``S`` tokens is padded at its end to ``S_pad``, a multiple of ``P * n``
(``P`` ranks, ``n`` chunks per rank: 1 for ``"contiguous"``, 2 for ``"zigzag"``), and cut
into ``P * n`` chunks of ``c = S_pad / (P * n)`` tokens. Rank ``r`` holds chunk ``r``
(contiguous) or chunks ``r`` and ``2P - 1 - r`` (zigzag: under a causal mask the early
and the late chunk together cost every rank the same work). Padding tokens (global
index ``>= S``) are never attended to, and their outputs are dropped by :meth:`gather`
and by :meth:`ContextParallel.valid` masks in a loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from .comm import all_gather
from .consistency import call_fields, check_fields

__all__ = ["ContextParallel", "METHODS", "LAYOUTS", "padded_length", "split_groups"]

METHODS = ("ulysses", "ring")
LAYOUTS = ("contiguous", "zigzag")


def padded_length(seq_len: int, world: int, layout: str = "contiguous") -> int:
    """``S_pad``: ``seq_len`` rounded up to a multiple of ``world`` chunks (``2 * world`` for zigzag)."""
    m = world * (2 if layout == "zigzag" else 1)
    return -(-seq_len // m) * m


@dataclass(frozen=True)
class ContextParallel:
    """How one sequence is sharded over the ranks of a process group, and how attention crosses the shards.

    Args:
        group: the ``torch.distributed`` process group of the sequence's ranks (``None``: the default
            group; without an initialised default group, one rank holds everything).
        method: ``"ulysses"`` (all-to-all from sequence shards to head shards and back; heads must
            divide by the group size) or ``"ring"`` (key/value blocks passed around the ring).
        layout: ``"contiguous"`` or ``"zigzag"`` (two chunks per rank, balanced causal work).
        seq_len: the unpadded global length ``S``; ``None``: no padding (``S = P * local length``).
            Set it per sequence with :meth:`for_length`.
        check: every eager call that communicates first checks that the ranks agree on it
            (:meth:`check_consistent`: one all-gather of a few int64); ``False`` skips that, e.g. on
            GPUs after one explicit check, where reading the result waits for the queued work.
            Compiled code never runs it (call :meth:`check_consistent` before compiled regions).
            Like every field, the same on every rank (the check is collective).
    """

    group: Any = None
    method: str = "ring"
    layout: str = "contiguous"
    seq_len: int | None = None
    check: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len <= 0):
            raise ValueError(f"seq_len must be a positive int or None, got {self.seq_len!r}")
        if not isinstance(self.check, bool):
            raise TypeError(f"check must be a bool, got {self.check!r}")

    # -- the group ------------------------------------------------------------------

    @property
    def world(self) -> int:
        """``P``, the number of ranks the sequence is sharded over."""
        return dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:
        """This process' rank within the group."""
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    def for_length(self, seq_len: int) -> ContextParallel:
        """The same sharding for a sequence of ``seq_len`` tokens (what attention needs to mask padding)."""
        return replace(self, seq_len=seq_len)

    def check_consistent(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        *,
        causal: bool = False,
        scale: float | None = None,
    ) -> None:
        """Check that every rank of the group makes the same attention call; collective.

        One all-gather of a few int64 (the shapes and dtypes of ``q``, ``k``, ``v``; ``method``,
        ``layout``, ``seq_len``, ``causal``, ``scale``). Where they differ, every rank raises the
        same ``ValueError`` naming each field that differs and each rank's value, before any
        collective that could abort a process or return a wrong result. Eager
        :func:`~axial_rope.parallel.sequence_parallel_attention` runs it on every call (unless
        ``check=False``); before compiled code, call it once yourself (with the ``[B, H, L, D]``
        tensors or tensors of their shapes and dtypes). With one rank it does nothing.
        """
        scale_code = math.nan if scale is None else float(scale)  # a float field either way; nan reads as None
        fields = call_fields(
            self, {"method": METHODS, "layout": LAYOUTS}, {"q": q, "k": k, "v": v}, causal=causal, scale=scale_code
        )
        check_fields(self, fields, "sequence_parallel_attention", q.device)

    def eager_check(self) -> bool:
        """Whether an eager call checks that the ranks agree (:meth:`check_consistent`): ``check`` is set, more than
        one rank, and not inside a compiled graph (the check reads gathered values on the host)."""
        return self.check and not torch.compiler.is_compiling() and self.world > 1

    # -- the layout -----------------------------------------------------------------

    @property
    def chunks_per_rank(self) -> int:
        return 2 if self.layout == "zigzag" else 1

    def padded_len(self, seq_len: int) -> int:
        """``S_pad``: ``seq_len`` rounded up to a multiple of ``P * chunks_per_rank``."""
        return padded_length(seq_len, self.world, self.layout)

    def local_len(self, seq_len: int) -> int:
        """``L = S_pad / P``, the tokens (padding included) each rank holds."""
        return self.padded_len(seq_len) // self.world

    def chunk_ids(self, rank: int | None = None) -> tuple[int, ...]:
        """The global chunk numbers a rank holds, in its local order."""
        r, P = self.rank if rank is None else rank, self.world
        return (r, 2 * P - 1 - r) if self.layout == "zigzag" else (r,)

    def indices(self, seq_len: int, rank: int | None = None, device=None) -> torch.Tensor:
        """int64 ``[L]``: the global token index of each local slot (``>= seq_len`` for padding)."""
        c = self.local_len(seq_len) // self.chunks_per_rank
        starts = torch.tensor(self.chunk_ids(rank), device=device) * c
        return (starts[:, None] + torch.arange(c, device=device)).reshape(-1)

    def valid(self, seq_len: int | None = None, device=None) -> torch.Tensor:
        """bool ``[L]``: which local slots hold real tokens (``False``: padding; keep it out of a loss)."""
        S = self._length(seq_len)
        return self.indices(S, device=device) < S

    def _length(self, seq_len: int | None) -> int:
        S = self.seq_len if seq_len is None else seq_len
        if S is None:
            raise ValueError("the global sequence length is unknown: pass seq_len or use cp.for_length(S)")
        return S

    # -- moving tensors ---------------------------------------------------------------

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of a full sequence ``x`` (``S`` along ``dim``), zero-padded to ``L``.

        Differentiable: the gradient reaching ``x`` is this rank's share (zeros elsewhere), so
        parameters before and after sharding both need their gradients summed over the group.
        """
        dim, S = dim % x.ndim, x.shape[dim]
        if self.seq_len is not None and self.seq_len != S:
            raise ValueError(f"x has {S} tokens along dim {dim}, this ContextParallel is for seq_len={self.seq_len}")
        pad = self.padded_len(S) - S
        if pad:
            x = torch.cat([x, x.new_zeros((*x.shape[:dim], pad, *x.shape[dim + 1 :]))], dim)
        return x.index_select(dim, self.indices(S, device=x.device))

    def positions(self, pos: torch.Tensor) -> torch.Tensor:
        """This rank's rows of global coordinates ``pos`` (``[S]``, ``[S, n_axes]`` or ``[B, S, n_axes]``).

        A padding slot repeats the last token's coordinates: any finite value does, since padded
        keys are masked and padded outputs dropped. The rotation built from these rows is this
        rank's alone: angles and tables for ``L = S_pad / P`` tokens.
        """
        dim = 1 if pos.ndim == 3 else 0
        S = pos.shape[dim]
        if self.seq_len is not None and self.seq_len != S:
            raise ValueError(f"pos has {S} positions, this ContextParallel is for seq_len={self.seq_len}")
        return pos.index_select(dim, self.indices(S, device=pos.device).clamp(max=S - 1))

    def gather(self, x: torch.Tensor, dim: int = 1, seq_len: int | None = None) -> torch.Tensor:
        """The full sequence from every rank's shard ``x`` (``L`` along ``dim``), padding removed.

        Differentiable for a loss computed identically on every rank from the gathered tensor:
        the gradient of the shard is this rank's slice of the gathered tensor's gradient.
        """
        dim = dim % x.ndim
        if self.eager_check():  # an all-gather of shards that differ in shape would abort in gloo
            fields = call_fields(self, {"layout": LAYOUTS}, {"x": x}, dim=dim, gather_seq_len=seq_len)
            check_fields(self, fields, "cp.gather", x.device)
        S = seq_len or self.seq_len or x.shape[dim] * self.world
        if x.shape[dim] != self.local_len(S):
            raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim}, a shard of {S} holds {self.local_len(S)}")
        slots = all_gather(x, self.group, dim)  # [.., P * L, ..], rank-major slot order
        order = torch.cat([self.indices(S, r, x.device) for r in range(self.world)]).argsort()
        return slots.index_select(dim, order[:S])


def split_groups(context_size: int) -> tuple[Any, Any]:
    """Process groups for context parallel over ``context_size`` consecutive ranks, data parallel over the rest.

    Every rank must call this (each ``new_group`` is collective). With 8 ranks and
    ``context_size=4``: context groups ``{0..3}``, ``{4..7}``; data groups ``{0, 4}``, ``{1, 5}``, ...

    Returns:
        ``(context_group, data_group)`` of this rank.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if context_size <= 0 or world % context_size:
        raise ValueError(f"context_size ({context_size}) must divide the world size ({world})")
    context_group = data_group = None
    for start in range(0, world, context_size):
        ranks = list(range(start, start + context_size))
        group = dist.new_group(ranks)
        context_group = group if rank in ranks else context_group
    for offset in range(context_size):
        ranks = list(range(offset, world, context_size))
        group = dist.new_group(ranks)
        data_group = group if rank in ranks else data_group
    return context_group, data_group
