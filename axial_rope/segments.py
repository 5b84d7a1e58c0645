"""Boundaries of the items of a packed sequence: lengths, ``cu_seqlens``, segment ids, checked.

:class:`Segments` is what :mod:`axial_rope.varlen` attention, :mod:`axial_rope.packing` and
:mod:`axial_rope.packed_rope` share: where each item of a packed sequence starts and ends, as
host ints (no device sync when read), flash-attn's int32 ``cu_seqlens`` and FlexAttention's
per-token document ids. Boundaries that disagree with each other or with a tensor raise an
error naming the item.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import accumulate

import torch

__all__ = ["Segments", "as_int"]


def as_int(value) -> int:
    """``value`` as a Python int: Python, numpy and one-element torch integers pass; a ``TypeError`` (whose
    message is the type and value) for bools, floats and everything else, so the caller names the argument."""
    if (
        isinstance(value, bool)
        or getattr(value, "dtype", None) in (torch.bool, bool)
        or type(value).__name__ == "bool_"
    ):
        raise TypeError(f"bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{type(value).__name__} {value!r}") from None


def _fail_item(what: str, item: int, detail: str, kind: type[Exception] = ValueError) -> None:
    raise kind(f"{what}: item {item} {detail}") from None


class Segments:
    """Where each item of a packed sequence starts and ends.

    Built from host-side lengths (no device sync later: the per-item loop and the kernels
    read ``lengths`` and ``max_seqlen`` as Python ints) or checked from ``cu_seqlens`` /
    segment ids (one host read, at construction).

    Attributes:
        lengths: tokens per item (Python ints, each > 0).
        cu_seqlens: int32 ``[N + 1]``, ``0, l_0, l_0 + l_1, ..., T`` (flash-attn's convention).
        segment_ids: int64 ``[T]``, the item of each token (FlexAttention's document ids).
        bounds: ``cu_seqlens`` as Python ints.
        total: ``T``; max_seqlen: the longest item.
    """

    def __init__(self, lengths: Sequence[int], device: torch.device | str | None = None):
        lengths = tuple(lengths)
        if not lengths:
            raise ValueError("Segments need at least one item")
        ints = []  # numpy and torch integers too: host ints from here on
        for i, n in enumerate(lengths):
            try:
                ints.append(as_int(n))
            except TypeError:
                _fail_item("segment lengths", i, f"has a length of type {type(n).__name__}, expected an int", TypeError)
            if ints[-1] <= 0:
                _fail_item("segment lengths", i, f"is empty (length {n}); drop empty items before packing")
        self.lengths = lengths = tuple(ints)
        self.bounds = (0, *accumulate(lengths))  # host ints: the per-item loop never reads the device
        self.total, self.max_seqlen = self.bounds[-1], max(lengths)
        if self.total >= 2**31:
            raise ValueError(f"{self.total} packed tokens do not fit int32 cu_seqlens")
        self.cu_seqlens = torch.tensor(self.bounds, dtype=torch.int32, device=device)
        counts = torch.tensor(lengths, device=device)
        items = torch.arange(len(lengths), device=device)
        self.segment_ids = torch.repeat_interleave(items, counts, output_size=self.total)  # [T], no device sync
        self._masks: dict = {}  # FlexAttention block masks per (device, causal), built on first use

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, total: int | None = None) -> Segments:
        """Segments from cumulative lengths ``[N + 1]`` (int), checked; ``total``: the tokens they must cover."""
        if (
            not isinstance(cu_seqlens, torch.Tensor)
            or cu_seqlens.dtype.is_floating_point
            or cu_seqlens.dtype in (torch.bool,)
            or cu_seqlens.is_complex()
            or cu_seqlens.ndim != 1
        ):
            got = cu_seqlens.dtype if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
            raise TypeError(f"cu_seqlens must be a 1-D integer tensor [N + 1], got {got}")
        cu = [int(v) for v in cu_seqlens.tolist()]  # the one host read
        if len(cu) < 2 or cu[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0 and hold N + 1 >= 2 boundaries, got {cu[:4]}...")
        for i in range(len(cu) - 1):
            if cu[i + 1] <= cu[i]:
                _fail_item(
                    "cu_seqlens", i, f"is empty or reversed (cu_seqlens[{i}] = {cu[i]}, [{i + 1}] = {cu[i + 1]})"
                )
            if total is not None and cu[i + 1] > total:
                _fail_item("cu_seqlens", i, f"ends at {cu[i + 1]}, past the end of the {total} tokens")
        if total is not None and cu[-1] != total:
            raise ValueError(f"cu_seqlens cover {cu[-1]} tokens, the sequence has {total}")
        return cls([b - a for a, b in zip(cu[:-1], cu[1:])], cu_seqlens.device)

    @classmethod
    def from_segment_ids(cls, segment_ids: torch.Tensor) -> Segments:
        """Segments from one item id per token ``[T]``: ids ``0, 0, 1, 1, 1, 2, ...``, each item contiguous."""
        ids = segment_ids
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.ndim != 1:
            got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise TypeError(f"segment_ids must be a 1-D integer tensor [T], got {got}")
        if ids.numel() == 0:
            raise ValueError("segment_ids is empty: a packed sequence needs at least one token")
        values = ids.tolist()
        if values[0] != 0:
            _fail_item("segment_ids", 0, f"is empty (the first token belongs to item {values[0]})")
        lengths = [1]
        for t in range(1, len(values)):
            step = values[t] - values[t - 1]
            if step == 0:
                lengths[-1] += 1
            elif step == 1:
                lengths.append(1)
            elif step > 1:
                _fail_item("segment_ids", values[t - 1] + 1, f"is empty (token {t} jumps from item {values[t - 1]})")
            else:
                _fail_item("segment_ids", values[t], f"is not contiguous (it appears again at token {t})")
        return cls(lengths, ids.device)

    @property
    def n(self) -> int:
        """Number of items (segments)."""
        return len(self.lengths)

    @property
    def device(self) -> torch.device:
        return self.cu_seqlens.device

    def to(self, device: torch.device | str) -> Segments:
        return self if torch.device(device) == self.device else Segments(self.lengths, device)

    def check(self, name: str, x: torch.Tensor, dim: int = 0) -> None:
        """Raise if ``x``'s packed axis ``dim`` does not hold these segments' tokens, or sits on another device."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.device != self.device:
            raise ValueError(f"{name} is on {x.device}, the segments (cu_seqlens) on {self.device}: move them together")
        n = x.shape[dim] if x.ndim > dim else 0
        if n < self.total:  # the first item that does not fit
            i = next(i for i in range(self.n) if self.bounds[i + 1] > n)
            a, b = self.bounds[i], self.bounds[i + 1]
            raise ValueError(f"{name} has {n} tokens on axis {dim}: item {i} (tokens {a}..{b - 1}) lies past its end")
        if n > self.total:
            raise ValueError(
                f"{name} has {n} tokens on axis {dim}, {n - self.total} past the last item "
                f"(item {self.n - 1} ends at {self.total})"
            )

    def dense_mask(self, causal: bool = False) -> torch.Tensor:
        """bool ``[T, T]``: True where query and key belong to the same item (and key <= query if ``causal``)."""
        ids = self.segment_ids
        mask = ids[:, None] == ids[None, :]
        return mask.tril() if causal else mask

    def block_mask(self, causal: bool = False):
        """FlexAttention's ``BlockMask`` of the document mask (cached per device and causal flag)."""
        key = (str(self.device), causal)
        if key not in self._masks:
            from torch.nn.attention.flex_attention import create_block_mask

            ids = self.segment_ids

            def document(b, h, q_idx, kv_idx):
                same = ids[q_idx] == ids[kv_idx]
                return same & (kv_idx <= q_idx) if causal else same

            self._masks[key] = create_block_mask(document, None, None, self.total, self.total, device=self.device)
        return self._masks[key]

    def __repr__(self) -> str:
        shown = ", ".join(map(str, self.lengths[:8])) + (", ..." if self.n > 8 else "")
        return f"Segments(n={self.n}, total={self.total}, max_seqlen={self.max_seqlen}, lengths=[{shown}])"
