"""The collectives sequence parallelism needs, on ``torch.distributed`` (gloo on CPU, NCCL on GPU).

- :func:`all_to_all`: differentiable equal-split all-to-all (Ulysses); its gradient is the
  same exchange run on the gradient.
- :func:`all_gather`: differentiable gather along a dim; the gradient is this rank's slice.
- :class:`RingShift`: asynchronous send to the next rank / receive from the previous one
  (ring attention calls it inside its own forward and backward, so it needs no autograd).

Every byte this process sends through them is added to a counter (:func:`sent_bytes`),
which the tests and the benchmark compare with the formulas of
:func:`axial_rope.parallel.communication_bytes` (the consistency check's few int64 are not
counted: they are not the method's traffic).

A collective that fails because another rank of the group died or stopped answering (gloo:
"Connection reset by peer", "Timed out waiting ..."; NCCL: ``DistBackendError``) raises
:class:`RankFailedError`, which says so, instead of the transport's message.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_to_all", "all_gather", "RingShift", "RankFailedError", "collective", "sent_bytes", "reset_sent_bytes"]

_SENT = [0]  # bytes sent by this process since the last reset


def sent_bytes() -> int:
    """Bytes this process has sent through :mod:`axial_rope.parallel` since :func:`reset_sent_bytes`."""
    return _SENT[0]


def reset_sent_bytes() -> None:
    _SENT[0] = 0


class RankFailedError(RuntimeError):
    """A collective of the context-parallel group failed because another rank failed, left or did not answer.

    The other rank's own error is in its log; this rank's traceback shows where it was waiting.
    """


# What the transports say when the other end is gone or silent (gloo's tcp pair, NCCL's watchdog)
_PEER_GONE = re.compile(r"connection (reset|closed|refused)|broken pipe|timed out|timeout|peer|abort", re.I)


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Re-raise a collective's failure caused by another rank as :class:`RankFailedError` naming ``what``."""
    try:
        yield
    except RankFailedError:
        raise
    except RuntimeError as err:
        if not (isinstance(err, dist.DistError) or _PEER_GONE.search(str(err))):
            raise
        raise RankFailedError(
            f"{what} failed: another rank of the process group failed, exited or did not reach it within "
            "the process group's timeout (its own error is in its log; a rank that fails and stays alive "
            "blocks the others until that timeout: set it with "
            "dist.init_process_group(..., timeout=timedelta(seconds=...))). "
            f"The transport said: {err}"
        ) from err


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """x ``[P, ...]``: slice ``i`` goes to group rank ``i``; returns ``[P, ...]``, slice ``j`` from rank ``j``."""
    x = x.contiguous()
    out = torch.empty_like(x)
    with collective("an all-to-all of sequence-parallel attention"):
        dist.all_to_all_single(out, x, group=group)
    _SENT[0] += _nbytes(x) * (x.shape[0] - 1) // x.shape[0]  # this rank's own slice stays here
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        # The exchange is a permutation of slices that is its own transpose: the gradient of the
        # slice received from rank j goes back to rank j by the same all-to-all.
        return _exchange(grad, ctx.group), None


def all_to_all(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Differentiable all-to-all of ``x [P, ...]`` over ``group`` (slice ``i`` to rank ``i``)."""
    if _world(group) == 1:
        return x
    return _AllToAll.apply(x, group)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.size = group, dim, x.shape[dim]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        with collective("an all-gather of context-parallel shards"):
            dist.all_gather(parts, x, group=group)
        _SENT[0] += _nbytes(x) * (len(parts) - 1)  # the logical volume: this shard to every other rank
        return torch.cat(parts, dim)

    @staticmethod
    def backward(ctx, grad):
        # The loss is computed identically on every rank from the gathered tensor, so this
        # rank's shard gets its own slice of that gradient (no reduction needed).
        rank = dist.get_rank(ctx.group)
        return grad.narrow(ctx.dim, rank * ctx.size, ctx.size), None, None


def all_gather(x: torch.Tensor, group: Any = None, dim: int = 0) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (differentiable, see :class:`_AllGather`)."""
    if _world(group) == 1:
        return x
    return _AllGather.apply(x, group, dim % x.ndim)


class RingShift:
    """Send tensors to the next rank of ``group`` and receive the previous rank's, asynchronously.

    ``RingShift(group).start(tensors)`` posts the sends and receives and returns at once;
    ``wait()`` returns the received tensors (same shapes and dtypes). Compute placed between
    the two overlaps the transfer. With one rank, the tensors come back unchanged. Two shifts
    in flight at once between the same ranks need different ``tag`` values.
    """

    def __init__(self, group: Any = None, tag: int = 0):
        self.group, self.world, self.tag = group, _world(group), tag
        if self.world > 1:
            rank = dist.get_rank(group)
            whole = group if group is not None else dist.group.WORLD
            self.next = dist.get_global_rank(whole, (rank + 1) % self.world)
            self.prev = dist.get_global_rank(whole, (rank - 1) % self.world)
        self._pending: tuple | None = None

    def start(self, tensors: list[torch.Tensor]) -> RingShift:
        if self.world == 1:
            self._pending = ([], list(tensors))
            return self
        sends = [t.contiguous() for t in tensors]
        recvs = [torch.empty_like(t) for t in sends]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, self.tag) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, self.tag) for t in recvs]
        with collective("a ring shift of ring attention"):
            works = dist.batch_isend_irecv(ops)
        _SENT[0] += sum(_nbytes(t) for t in sends)
        self._pending = (works, recvs, sends)  # the send buffers must live until the sends complete
        return self

    def wait(self) -> list[torch.Tensor]:
        works, recvs = self._pending[0], self._pending[1]
        with collective("a ring shift of ring attention"):
            for work in works:
                work.wait()
        self._pending = None
        return recvs
