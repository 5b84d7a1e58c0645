"""Per-item frequency scaling on a packed sequence, on every backend, without a loop over items: block axes.

FiT and NaViT-style models scale each sample by its own resolution factor (NTK, YaRN per
sample). The backends compute ``angle_j = sum_a pos[a] * F[a, j]`` for any ``F``; so with
``K`` distinct item scalings, stack their rows of ``F``:

    F_packed[(a, k), j] = F_k[a, j]          R = at most K * n_axes rows (identical rows shared)

and give each token its coordinates in the rows of its own item's scaling, zeros elsewhere
(``pos_packed [T, R]``). Then ``pos_packed @ F_packed`` is, token by token, exactly
``pos @ F_item`` (the other terms are exact zeros), on the reference, torch and Triton
backends as they are (Triton loops over ``R`` at compile time). Rows are shared per axis:
items of the same height share their ``y`` row, so ``R`` is the number of distinct
per-axis schedules, not ``K * n_axes``.

The attention factor (YaRN, LongRoPE) is an amplitude, not an angle. When the items' factors
differ, the rotation carries one per token (``attention_factor [1, T, n]``), and :func:`axial_rope.ops.rotate`
rotates by cos/sin tables computed from it (float64 angles times the token's factor, rounded once)
on the same backends.

:func:`item_rope` reads the items' sizes on the host (it runs where a packed batch is assembled, in
eager code); the :class:`PackedRoPE` it returns holds tensors only, so the blocks that rotate with it
compile.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .frequencies import per_axis, scaling_method
from .ops.rotation import Rotation
from .ops.turns import fixed_turns
from .rope import AxialRoPE
from .rotary import Rotary, as_positions
from .segments import Segments

__all__ = ["PackedRoPE", "item_rope"]


def _block_rows(freqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct rows per axis: ``F_packed [R, n]`` and ``cols [K, n_axes]``, group k's row of axis a."""
    rows, index, cols = [], {}, []
    for f in freqs:
        group = []
        for a in range(f.shape[0]):
            key = (a, f[a].numpy().tobytes())
            if key not in index:
                index[key] = len(rows)
                rows.append(f[a])
            group.append(index[key])
        cols.append(group)
    return torch.stack(rows), torch.tensor(cols, dtype=torch.int64)


def _item_lengths(pos: torch.Tensor, segments: Segments, n_items: int) -> list[tuple[int, ...]]:
    """Per item, ``max(pos) + 1`` per axis (a rope's default ``seq_len``), one host read."""
    ids = segments.segment_ids.cpu()[:, None].expand(-1, pos.shape[-1])
    top = torch.full((segments.n, pos.shape[-1]), float("-inf"), dtype=torch.float64)  # on the host: it is read
    top = top.scatter_reduce(0, ids, pos.to("cpu", torch.float64), "amax")
    return [tuple(int(v) + 1 for v in row) for row in top[:n_items].tolist()]


def _check_rope(rope: AxialRoPE, n_groups: int) -> None:
    transform = rope.transform
    if transform is not None and (transform.normalize is not None or transform.center):
        raise ValueError(
            "this rope's position transform normalises or centres over the whole sequence, which on a packed "
            "sequence mixes the items: normalise each item's grid before packing (ar.grid(normalize=...))"
        )
    if n_groups > 1 and rope.learned_freqs is not None:
        raise ValueError("per-item scaling needs fixed frequencies; this rope learns its own (learnable=True)")
    if n_groups > 1 and rope.time_dependent:
        raise ValueError("per-item scaling takes a rope without time-dependent scaling (bind t first: rope.at_time)")


def item_rope(
    rope: AxialRoPE,
    scalings: Sequence,
    segments: Segments,
    *,
    pos: torch.Tensor | None = None,
    padded: bool = False,
) -> AxialRoPE | PackedRoPE:
    """The rope for a packed sequence whose items each have their own scaling.

    Args:
        rope: the model's rope (a spectrum rope: each item's ``F`` comes from its axes and theta).
        scalings: per item, a scaling (one method, or one per axis with ``None`` for an unscaled axis; e.g.
            ``ar.positions_for_size(shape, train, "yarn").scaling``), or ``None`` for the rope's own.
        segments: the packed sequence's boundaries.
        pos: the packed positions ``[T, n_axes]``; needed only by length-dependent methods (DynamicNTK,
            LongRoPE), which then see each item's own ``max(pos) + 1``, as a rope called on that item alone.
        padded: the last segment is padding (``pack(..., pad_to=)``), which takes the rope's own scaling.

    Returns:
        ``rope`` itself when every item has the rope's own scaling, else a :class:`PackedRoPE`.
        Either takes the rope's calls on the natural positions ``[T, n_axes]``.
    """
    n_items = len(scalings)
    if segments.n != n_items + int(padded):
        padding = " (the last one padding)" if padded else ""
        raise ValueError(
            f"{n_items} item scalings for {segments.n} segments{padding}: pass one scaling (or None) per item"
        )
    scalings = list(scalings) + [None] * (segments.n - n_items)
    shared = rope.spectrum not in ("per_axis", None)  # split / cycled: one method for all axes
    scalings = [rope.scaling if s is None else s for s in scalings]  # None: the rope's own
    # a shared spectrum takes one method: a per-axis tuple of one method (positions_for_size's form) is that method
    scalings = [s[0] if shared and isinstance(s, tuple) and len(set(map(repr, s))) == 1 else s for s in scalings]
    methods = [tuple(scaling_method(m) for m in per_axis("scaling", s, rope.n_axes, shared)) for s in scalings]
    lengths = [None] * segments.n
    if any(m is not None and m.length_dependent for group in methods for m in group):  # the rope's own or an item's
        if pos is None:
            raise ValueError("a length-dependent scaling needs pos= (each item's lengths come from its positions)")
        segments.check("pos", pos)
        lengths[:n_items] = _item_lengths(pos, segments, n_items)
    keys = [repr((m, n)) for m, n in zip(methods, lengths)]  # methods may hold lists: keyed by their repr
    distinct = list(dict.fromkeys(keys))  # first-seen order
    _check_rope(rope, len(distinct))
    if len(distinct) == 1 and lengths[0] is None and methods[0] == tuple(rope.scaling):
        return rope
    first = [keys.index(k) for k in distinct]  # an item of each group
    # each group's F and factor from the rope's spectrum (CPU float64): no rope module is built per group
    groups = [rope.frequencies(lengths[i], scaling=methods[i][0] if shared else methods[i]) for i in first]
    block, cols = _block_rows([f for f, _ in groups])
    group = torch.tensor([distinct.index(k) for k in keys], device=segments.device)[segments.segment_ids]  # [T]
    stacked = torch.stack([s for _, s in groups])  # [K, n]
    device = segments.device
    if bool((stacked == stacked[0]).all()):
        scale = stacked[0] if bool((stacked[0] != 1).any()) else None  # [n], one for every item
    else:
        scale = stacked[group.cpu()]  # [T, n]: each token its item's
    # where the rope's angles go by turns (no float64 on the device), F and the factor travel as float32
    exact = rope.float64_angles(device)
    turns = None if exact else fixed_turns(block).to(device)
    dtype = torch.float64 if exact else torch.float32
    scale = None if scale is None else scale.to(dtype).to(device)
    return PackedRoPE(rope, block.to(dtype).to(device), cols.to(device)[group], scale, turns)


class PackedRoPE(Rotary):
    """A rope over the tokens of one packed sequence, each item with its own frequencies (block axes).

    It takes an :class:`~axial_rope.AxialRoPE`'s calls with the natural positions ``[T, n_axes]``
    (or ``[1, T, n_axes]``), so it goes where a rope goes (``Attention(..., rope=)``,
    ``DiTBlock``); built per batch by :func:`item_rope` (a few small tensors).

    Attributes:
        freqs: ``F_packed`` float64 ``[R, n]``; cols: int64 ``[T, n_axes]``, each token's rows;
        scale: the attention factor, float64 ``[n]`` shared by every item or ``[T, n]`` per token, or ``None``.
        turns: ``F_packed`` in fixed-point turns where the rope's angles go by turns (then ``freqs`` and
            ``scale`` are float32), else ``None``.
    """

    length_dependent = False  # each item's frequencies are fixed for this batch
    time_dependent = False

    def __init__(self, base: AxialRoPE, freqs: torch.Tensor, cols: torch.Tensor, scale: torch.Tensor | None,
                 turns: torch.Tensor | None = None):  # fmt: skip
        self.base, self.freqs, self.cols, self.scale, self.turns = base, freqs, cols, scale, turns
        self.pairing, self.backend = base.pairing, base.backend

    rot_dim = property(lambda self: 2 * self.freqs.shape[-1])
    n_pairs = property(lambda self: self.freqs.shape[-1])
    n_axes = property(lambda self: self.base.n_axes)

    @property
    def attention_factor(self) -> float:
        if self.scale is not None and self.scale.ndim == 2:
            raise ValueError("the packed items have different attention factors (one per token)")
        return self.base.attention_factor if self.scale is not None else 1.0

    def block_positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Natural positions -> ``[1, T, R]``: each coordinate in its item's row, zeros elsewhere (checked as a rope's)."""
        natural = as_positions(pos, self.base.n_axes)  # [1, T, n_axes]
        if natural.shape[0] != 1 or natural.shape[1] != self.cols.shape[0]:
            raise ValueError(
                f"pos {tuple(pos.shape)} does not fit this packed rope: {self.cols.shape[0]} tokens of one sequence, "
                f"{self.cols.shape[1]} axes"
            )
        exact = self.turns is None
        if self.base.transform is not None:  # scale / offset only (checked by item_rope): per token
            natural = self.base.transform(natural, torch.float64 if exact else torch.float32)
        # ints and float64 stay exact (by turns: int64 is, float32 as given)
        if not exact:
            dtype = natural.dtype if natural.dtype in (torch.float32, torch.int64) else torch.float32
        else:
            dtype = torch.float32 if natural.dtype == torch.float32 else torch.float64
        block = natural.new_zeros(1, natural.shape[1], self.freqs.shape[0], dtype=dtype)
        return block.scatter_(2, self.cols[None], natural.to(dtype))

    def rotation(self, pos, *, seq_len=None, t=None) -> Rotation:
        """Rotate each token by its own item's frequencies: block positions and ``F_packed`` (``seq_len``, ``t``:
        fixed per batch by :func:`item_rope`, refused here)."""
        if seq_len is not None or t is not None:
            raise ValueError("a packed rope's lengths and times are fixed per batch by item_rope: call it without them")
        factor = self.scale[None] if self.scale is not None and self.scale.ndim == 2 else self.scale  # [1, T, n] | [n]
        return Rotation(self.block_positions(pos), self.freqs, factor, self.pairing, self.turns)

    def __repr__(self) -> str:
        factor = "per token" if self.scale is not None and self.scale.ndim == 2 else "uniform"
        return (
            f"PackedRoPE(rows={self.freqs.shape[0]}, tokens={self.cols.shape[0]}, factor={factor}, base={self.base!r})"
        )
