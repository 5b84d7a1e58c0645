"""Packing: items of any size (images, videos, texts) in one token sequence, with per-item positions.

NaViT (Dehghani et al. 2023), Lumina-Image 2.0 and timm's NaFlexViT train at native resolution
by packing: each item keeps its own grid, the tokens of all items are laid end to end, and
attention is masked to each item (:mod:`axial_rope.varlen`). Positions are data, so packing
is concatenation: each token keeps the coordinates of its own item's grid.

- :class:`Item`: one item's tokens ``[S_i, C]``, coordinates ``[S_i, n_axes_i]`` and shape
  (:meth:`Item.grid` for images / videos, optionally after a text prefix; :meth:`Item.text`);
- :func:`pack` -> :class:`Packed`: tokens ``[T, C]``, positions ``[T, n_axes]``, the boundaries
  (:class:`~axial_rope.varlen.Segments`: ``cu_seqlens`` and segment ids), each item's shape and scaling;
- :func:`unpack`: per-token outputs ``[T, C']`` back to each item's ``[*shape, C']``;
- :func:`greedy_pack`: first-fit-decreasing bins of a token budget, with the waste.

Axis convention when items of fewer axes join a pack of ``n_axes`` (``pack`` lifts them): a
grid is the first frame of a video (zeros prepended: an image is frame 0), text tokens carry
their one coordinate on every axis (M-RoPE, Qwen2-VL; ``step=0``: Flux's all-zero text ids).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .position_checks import check_positions
from .positions import grid as _grid
from .positions import text_positions
from .segments import Segments, as_int

__all__ = ["Item", "Packed", "PackPlan", "greedy_pack", "pack", "unpack"]


@dataclass(frozen=True, eq=False)
class Item:
    """One item to pack: its tokens, their coordinates and the shape to unpack into.

    Attributes:
        tokens: ``[S_i, C]``: ``prefix`` text tokens, then the grid row-major (first axis slowest).
        pos: ``[S_i, n_axes_i]`` coordinates of those tokens.
        shape: the grid, ``(h, w)`` or ``(t, h, w)``; ``(L,)`` for text.
        prefix: text tokens before the grid (Flux, Lumina: a caption per image).
        scaling: per-axis scaling methods of this item's rope (e.g. ``positions_for_size(...).scaling``),
            or ``None`` for the model rope's own; see :func:`axial_rope.packed_rope.item_rope`.
        kind: ``"grid"`` or ``"text"``.
    """

    tokens: torch.Tensor
    pos: torch.Tensor
    shape: tuple[int, ...]
    prefix: int = 0
    scaling: tuple | None = None
    kind: str = "grid"

    def __post_init__(self):
        try:  # numpy and torch integer sides and prefixes are sizes (stored as Python ints)
            object.__setattr__(self, "shape", tuple(as_int(s) for s in self.shape))
        except TypeError as err:
            raise TypeError(f"Item.shape must hold ints, got {err} in {self.shape}") from None
        try:
            object.__setattr__(self, "prefix", as_int(self.prefix))
        except TypeError as err:
            raise TypeError(f"Item.prefix must be an int (text tokens before the grid), got {err}") from None
        if self.prefix < 0:
            raise ValueError(f"Item.prefix must be an int >= 0 (text tokens before the grid), got {self.prefix}")
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.ndim != 2:
            raise ValueError(f"Item.tokens must be [S, C], got {getattr(self.tokens, 'shape', type(self.tokens))}")
        if not isinstance(self.pos, torch.Tensor) or self.pos.ndim != 2:
            raise ValueError(f"Item.pos must be [S, n_axes], got {getattr(self.pos, 'shape', type(self.pos))}")
        check_positions(self.pos)
        n = self.prefix + math.prod(self.shape)
        if n == 0 or any(s <= 0 for s in self.shape):
            raise ValueError(f"Item is empty or has a non-positive size: shape {self.shape}, prefix {self.prefix}")
        if self.tokens.shape[0] != n or self.pos.shape[0] != n:
            raise ValueError(
                f"Item of shape {self.shape} with prefix {self.prefix} has {n} tokens, got tokens "
                f"{tuple(self.tokens.shape)} and pos {tuple(self.pos.shape)}"
            )
        if self.kind not in ("grid", "text"):
            raise ValueError(f"Item.kind must be 'grid' or 'text', got {self.kind!r}")

    @classmethod
    def grid(
        cls,
        x: torch.Tensor,
        *,
        prefix: torch.Tensor | None = None,
        prefix_step: float = 1.0,
        pos: torch.Tensor | None = None,
        scaling: tuple | None = None,
    ) -> Item:
        """An image ``[h, w, C]`` or video ``[t, h, w, C]`` of tokens at ``ar.grid(*shape)`` (or ``pos``).

        ``prefix`` ``[L, C]``: text tokens before the grid, at ``prefix_step * i`` on every axis; the
        grid is then offset by ``prefix_step * L`` on every axis (``prefix_step=0``: Flux's zero text ids).
        """
        shape, width = tuple(x.shape[:-1]), x.shape[-1]
        if pos is None:
            pos = _grid(*shape, device=x.device)
        tokens, n_text = x.reshape(-1, width), 0
        if prefix is not None:
            n_text = prefix.shape[0]
            text = text_positions(n_text, len(shape), step=prefix_step, device=x.device)
            pos = torch.cat([text, pos + prefix_step * n_text])
            tokens = torch.cat([prefix, tokens])
        return cls(tokens, pos, shape, n_text, scaling, "grid")

    @classmethod
    def text(cls, x: torch.Tensor, *, start: float = 0.0, step: float = 1.0) -> Item:
        """Text tokens ``[L, C]`` at ``start + step * i`` (on every axis once packed)."""
        return cls(
            x, text_positions(x.shape[0], 1, start=start, step=step, device=x.device), (x.shape[0],), kind="text"
        )


def _lift(item: Item, n_axes: int, index: int) -> torch.Tensor:
    """The item's positions ``[S_i, n_axes]``: text rows repeat their coordinate, grid rows get leading zeros."""
    pos, have = item.pos, item.pos.shape[1]
    if have == n_axes:
        return pos
    if have > n_axes:
        raise ValueError(f"pack: item {index} has {have} position axes, the pack has {n_axes}")
    if item.kind == "text" or have == 1:
        return pos[:, :1].expand(-1, n_axes)
    text = pos[: item.prefix, :1].expand(-1, n_axes)
    grid = torch.cat([pos.new_zeros(pos.shape[0] - item.prefix, n_axes - have), pos[item.prefix :]], dim=1)
    return torch.cat([text, grid])


@dataclass(frozen=True, eq=False)
class Packed:
    """A packed sequence: what :func:`pack` returns.

    Attributes:
        tokens: ``[T, C]``; pos: ``[T, n_axes]``; segments: the boundaries (items, then the padding if any).
        shapes, prefixes, scalings: per item, as given to :func:`pack`.
        pad: padding tokens at the end (one extra segment of zeros at position 0; no item).
    """

    tokens: torch.Tensor | None
    pos: torch.Tensor
    segments: Segments
    shapes: tuple[tuple[int, ...], ...]
    prefixes: tuple[int, ...]
    scalings: tuple
    pad: int = 0

    @property
    def n_items(self) -> int:
        return len(self.shapes)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return self.segments.cu_seqlens

    @property
    def segment_ids(self) -> torch.Tensor:
        return self.segments.segment_ids

    @property
    def lengths(self) -> tuple[int, ...]:
        """Tokens per item (padding excluded)."""
        return self.segments.lengths[: self.n_items]

    def rope(self, rope):
        """``rope`` for these tokens, each item with its own scaling (:func:`~axial_rope.packed_rope.item_rope`)."""
        from .packed_rope import item_rope

        return item_rope(rope, self.scalings, self.segments, pos=self.pos, padded=self.pad > 0)

    def with_tokens(self, tokens: torch.Tensor) -> Packed:
        """The same layout holding other per-token values ``[T, C']`` (e.g. after an embedding)."""
        self.segments.check("tokens", tokens)
        return Packed(tokens, self.pos, self.segments, self.shapes, self.prefixes, self.scalings, self.pad)


def _check_items(items: Sequence[Item]) -> None:
    if not items:
        raise ValueError("pack needs at least one item")
    first = items[0]
    for i, item in enumerate(items):
        if not isinstance(item, Item):
            raise TypeError(f"pack: item {i} must be an axial_rope.packing.Item, got {type(item).__name__}")
        t = item.tokens
        for what, got, want in (("width", t.shape[1], first.tokens.shape[1]), ("dtype", t.dtype, first.tokens.dtype)):
            if got != want:
                raise ValueError(f"pack: item {i} has token {what} {got}, item 0 has {want}")
        for what, x in (("tokens", t), ("pos", item.pos)):
            if x.device != first.tokens.device:
                raise ValueError(f"pack: item {i}'s {what} are on {x.device}, item 0's tokens on {first.tokens.device}")


def _pos_dtype(items: Sequence[Item]) -> torch.dtype:
    """The packed positions' dtype: one that every item's coordinates convert to without rounding.

    Integer dtypes promote among themselves (int64 stays int64) and float32 with float32; any
    other mix is float64 (float32 holds integers only up to ``2**24``: ``2**24 + 1`` would become
    ``2**24``). float64 holds integers up to ``2**53``, so integers past that, mixed with floats,
    are refused (a ``ValueError``): build those items' positions as float64 yourself.
    """
    dtypes = [item.pos.dtype for item in items]
    dtype = dtypes[0]
    for other in dtypes[1:]:
        dtype = torch.promote_types(dtype, other)
    if not dtype.is_floating_point or all(d == dtype for d in dtypes):
        return dtype  # integers only, or one float dtype: exact as they are
    for i, item in enumerate(items):  # integers about to become float64: exact up to 2**53 (a host read)
        if not item.pos.is_floating_point() and item.pos.numel() and int(item.pos.abs().max()) > 2**53:
            raise ValueError(
                f"pack: item {i} has integer positions up to {int(item.pos.abs().max())}, past 2**53, and other "
                "items have float positions: float64 would round them; give every item integer positions"
            )
    return torch.float64


def pack(items: Sequence[Item], *, n_axes: int | None = None, pad_to: int | None = None) -> Packed:
    """Lay ``items`` end to end: tokens ``[T, C]``, positions ``[T, n_axes]`` and their boundaries.

    Args:
        items: :class:`Item` s, all of one token width, dtype and device.
        n_axes: position axes of the pack (default: the most any item has); items with fewer are
            lifted (see the module docstring).
        pad_to: pad with zero tokens to this many (fixed shapes for compiled code, equal rows); the
            padding is one extra segment at position 0, which attends to itself only.

    Returns:
        :class:`Packed`, positions in a dtype that holds every item's exactly (:func:`_pos_dtype`):
        the items' own when they share one, int64 for integers, float64 when floats are mixed with
        float64 or with integers.
    """
    items = list(items)
    _check_items(items)
    n_axes = n_axes or max(item.pos.shape[1] for item in items)
    pos_dtype = _pos_dtype(items)
    tokens = torch.cat([item.tokens for item in items])
    pos = torch.cat([_lift(item, n_axes, i).to(pos_dtype) for i, item in enumerate(items)])
    lengths, pad = [item.tokens.shape[0] for item in items], 0
    if pad_to is not None:
        if pad_to < tokens.shape[0]:
            raise ValueError(f"pad_to={pad_to} is less than the {tokens.shape[0]} tokens of the items")
        pad = pad_to - tokens.shape[0]
    if pad:
        tokens = torch.cat([tokens, tokens.new_zeros(pad, tokens.shape[1])])
        pos = torch.cat([pos, pos.new_zeros(pad, n_axes)])
        lengths.append(pad)
    segments = Segments(lengths, tokens.device)
    shapes = tuple(item.shape for item in items)
    prefixes = tuple(item.prefix for item in items)
    return Packed(tokens, pos, segments, shapes, prefixes, tuple(item.scaling for item in items), pad)


def unpack(packed: Packed, y: torch.Tensor, *, prefix: bool = False) -> list:
    """Per-token outputs back to the items: ``y [T, C']`` (or ``[1, T, C']``) -> ``[*shape_i, C']`` per item.

    With ``prefix=True`` each entry is ``(text [L_i, C'] or None, grid [*shape_i, C'])``. Views of ``y``.
    """
    if isinstance(y, torch.Tensor) and y.ndim == 3 and y.shape[0] == 1:
        y = y[0]
    packed.segments.check("y", y)
    out = []
    for part, shape, n_text in zip(y.split(packed.segments.lengths), packed.shapes, packed.prefixes):  # one backward
        grid = part[n_text:].reshape(*shape, *y.shape[1:])
        out.append((part[:n_text] if n_text else None, grid) if prefix else grid)
    return out


@dataclass(frozen=True)
class PackPlan:
    """Bins of item indices from :func:`greedy_pack`, their token loads, and what did not fit."""

    bins: tuple[tuple[int, ...], ...]
    loads: tuple[int, ...]
    budget: int
    dropped: tuple[int, ...] = ()

    @property
    def waste(self) -> float:
        """Fraction of the bins' ``len(bins) * budget`` token slots left empty (padding if rows are padded)."""
        return 1.0 - sum(self.loads) / (len(self.bins) * self.budget) if self.bins else 0.0


def greedy_pack(lengths: Sequence[int], budget: int, *, max_bins: int | None = None) -> PackPlan:
    """First-fit decreasing: items (longest first) into the first bin of ``budget`` tokens with room.

    Args:
        lengths: tokens per item.
        budget: tokens per bin (a row of a packed batch, or one step's sequence).
        max_bins: at most this many bins; items that fit none are returned in ``dropped``
            (a data loader keeps them for the next step).

    Returns:
        :class:`PackPlan`; each bin's items in decreasing length. FFD uses at most ``11/9 OPT + 1`` bins.
    """
    try:  # numpy and torch integers are counts too
        budget = as_int(budget)
    except TypeError as err:
        raise TypeError(f"budget must be a positive int (tokens per bin), got {err}") from None
    if budget <= 0:
        raise ValueError(f"budget must be a positive int (tokens per bin), got {budget!r}")
    try:
        max_bins = None if max_bins is None else as_int(max_bins)
    except TypeError as err:
        raise TypeError(f"max_bins must be None (no limit) or an int >= 1, got {err}") from None
    if max_bins is not None and max_bins < 1:  # 0 or fewer bins would drop every item
        raise ValueError(f"max_bins must be None (no limit) or an int >= 1, got {max_bins}")
    sizes = []
    for i, n in enumerate(lengths):
        try:
            sizes.append(as_int(n))
        except TypeError:
            raise TypeError(
                f"greedy_pack: item {i} has a length of type {type(n).__name__} ({n!r}), expected an int"
            ) from None
    lengths = sizes
    for i, n in enumerate(lengths):
        if n <= 0:
            raise ValueError(f"greedy_pack: item {i} has length {n!r}, expected an int > 0")
        if n > budget:
            raise ValueError(f"greedy_pack: item {i} has {n} tokens, more than the budget of {budget} per bin")
    bins: list[list[int]] = []
    loads: list[int] = []
    dropped = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):  # stable: ties keep their order
        n = lengths[i]
        slot = next((b for b, load in enumerate(loads) if load + n <= budget), None)
        if slot is None and (max_bins is None or len(bins) < max_bins):
            bins.append([])
            loads.append(0)
            slot = len(bins) - 1
        if slot is None:
            dropped.append(i)
            continue
        bins[slot].append(i)
        loads[slot] += n
    return PackPlan(tuple(map(tuple, bins)), tuple(loads), budget, tuple(sorted(dropped)))
