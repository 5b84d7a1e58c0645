"""The cross-rank check: every rank of a context-parallel group describes its call the same way.

A collective whose ranks disagree fails badly: shards of different lengths or dtypes abort
one process inside gloo (``gloo::EnforceNotMet``, a ``SIGABRT`` no ``except`` catches) while
another may return a tensor, and a different ``seq_len``, layout, ``causal`` or ``scale``
runs without an error and returns the wrong attention. So before its first collective a call
all-gathers one small int64 tensor that encodes what every rank must agree on (shapes,
dtypes, ``seq_len``, layout, method, ``causal``, scale) and, where anything differs, every
rank raises the same ``ValueError`` naming the field and each rank's value. The tensor has
the same size on every rank whatever the call, so the check itself can never disagree.

It runs in eager calls (:func:`~axial_rope.parallel.sequence_parallel_attention` and
:meth:`~axial_rope.parallel.ContextParallel.gather` call it) and is left out of compiled
graphs (it needs the gathered values on the host); compiled code runs
:meth:`ContextParallel.check_consistent` once, eagerly, before it. ``ContextParallel(check=False)``
skips it in eager calls too (on GPUs its host read waits for the queued work).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import torch
import torch.distributed as dist

from .comm import collective

__all__ = ["call_fields", "check_fields"]

CALLS = ("sequence_parallel_attention", "cp.gather")  # the calls that check, by index
_SLOTS = 48  # int64 sent by every rank whatever the call (attention uses 36), so the gather always matches
_DIMS = 8  # shape slots per tensor: a tensor of more dims has the product of the rest in the last slot
_DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))


# Each field: (name, codes, decode). ``codes`` is a fixed number of int64 per field name, so every
# rank sends the same number of them; ``decode`` turns another rank's codes back into a readable value.
Field = tuple[str, tuple[int, ...], Callable[[tuple[int, ...]], object]]


def _shape(name: str, t: torch.Tensor | None) -> Field:
    dims = (-1,) if t is None else tuple(t.shape)
    if len(dims) > _DIMS:
        dims = (*dims[: _DIMS - 1], math.prod(dims[_DIMS - 1 :]))
    codes = (-1 if t is None else t.ndim, *dims, *(-1,) * (_DIMS - len(dims)))
    return f"{name}.shape", codes, lambda c: None if c[0] < 0 else tuple(c[1 : 1 + min(c[0], _DIMS)])


def _dtype(name: str, t: torch.Tensor | None) -> Field:
    codes = (-1 if t is None else _DTYPES.index(t.dtype),)
    return f"{name}.dtype", codes, lambda c: None if c[0] < 0 else _DTYPES[c[0]]


def _choice(name: str, value: str, options: tuple[str, ...]) -> Field:
    return name, (options.index(value),), lambda c: options[c[0]]


def _int(name: str, value: int | None) -> Field:
    return name, (-1 if value is None else int(value),), lambda c: None if c[0] < 0 else c[0]


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(bits: int) -> float | None:
    x = struct.unpack("<d", struct.pack("<q", bits))[0]
    return None if math.isnan(x) else x


def _float(name: str, value: float | None) -> Field:
    return name, (_float_bits(math.nan if value is None else float(value)),), lambda c: _bits_float(c[0])


def call_fields(
    cp, options: dict[str, tuple[str, ...]], tensors: dict[str, torch.Tensor | None], **values
) -> list[Field]:
    """What the ranks of ``cp.group`` must agree on for one call: ``cp``'s fields named in ``options``
    (a string from the tuple given) and its ``seq_len``, the shapes and dtypes of ``tensors``, and
    ``values`` (ints, bools, floats or ``None``)."""
    fields = [_choice(name, getattr(cp, name), choices) for name, choices in options.items()]
    fields.append(_int("seq_len", cp.seq_len))
    for name, t in tensors.items():
        fields += [_shape(name, t), _dtype(name, t)]
    for name, value in values.items():
        if isinstance(value, bool):
            fields.append((name, (int(value),), lambda c: bool(c[0])))
        else:
            fields.append(_float(name, value) if isinstance(value, float) else _int(name, value))
    return fields


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def check_fields(cp, fields: list[Field], what: str, device: torch.device | None = None) -> None:
    """All-gather ``fields`` over ``cp.group``; on every rank, ``ValueError`` naming each field that differs.

    ``what`` is one of ``CALLS``: ranks making different calls (one attention, one gather) are
    told so. Collective: every rank of the group calls it. One rank, or no process group:
    nothing to compare.
    """
    if cp.world == 1:
        return
    fields = [("call", (CALLS.index(what),), lambda c: CALLS[c[0]]), *fields]
    what = f"a call of {what}"
    flat = [c for _, field_codes, _ in fields for c in field_codes]
    if len(flat) > _SLOTS:
        raise AssertionError(f"{len(flat)} codes do not fit the check's {_SLOTS} slots")
    codes = torch.tensor(flat + [0] * (_SLOTS - len(flat)), dtype=torch.int64, device=device)
    parts = [torch.empty_like(codes) for _ in range(cp.world)]
    with collective(f"the consistency check of {what}"):
        dist.all_gather(parts, codes, group=cp.group)
    table = torch.stack(parts).tolist()  # [P, _SLOTS], the same on every rank
    differences = []
    start = 0
    for name, field_codes, decode in fields:
        stop = start + len(field_codes)
        values = [tuple(row[start:stop]) for row in table]
        start = stop
        if len(set(values)) > 1:
            by_value: dict[tuple[int, ...], list[int]] = {}
            for rank, v in enumerate(values):
                by_value.setdefault(v, []).append(rank)
            differences.append(f"{name}: " + ", ".join(f"{decode(v)!r} on {_ranks(r)}" for v, r in by_value.items()))
            if name == "call":  # the other ranks' codes follow another call's fields: not comparable
                what = "the collective to make"
                break
    if differences:
        raise ValueError(
            f"the {cp.world} ranks of the context-parallel group disagree about {what}: "
            + "; ".join(differences)
            + " (every rank must make the same call with its own shard of the same sequence)"
        )
