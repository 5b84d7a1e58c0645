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

The attention factor (YaRN, LongRoPE) is an amplitude, not an angle: a per-plane ``scale``
cannot differ per token. When the items' factors differ, the rotation reads cos/sin tables
``[T, rot_dim]`` computed once per packed batch (float64 angles times the token's factor,
rounded once), through :func:`axial_rope.apply_rope` on the same backends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .frequencies import Frequencies, per_axis, scaling_method
from .ops import apply_rope
from .ops.common import channel_table, plane_cos_sin, rms_norm
from .rope import AxialRoPE
from .segments import Segments

__all__ = ["PackedRoPE", "item_rope"]


def _group_frequencies(rope: AxialRoPE, keys: list) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``F_k`` ``[n_axes, n]`` and ``scale_k`` ``[n]`` (float64, CPU) of each distinct (scaling, seq_len)."""
    freqs, scales = [], []
    shared = rope.spectrum not in ("per_axis", "custom")  # split / cycled: with_scaling takes one method
    for scaling, seq_len in keys:
        f, s = rope.with_scaling(scaling[0] if shared else scaling).frequencies(seq_len)
        freqs.append(f.cpu())
        scales.append(s.cpu())
    return freqs, scales


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
    ids = segments.segment_ids[:, None].expand(-1, pos.shape[-1])
    top = torch.full((segments.n, pos.shape[-1]), float("-inf"), dtype=torch.float64, device=pos.device)
    top = top.scatter_reduce(0, ids, pos.to(torch.float64), "amax")
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
) -> AxialRoPE | PackedRoPE:
    """The rope for a packed sequence whose items each have their own scaling.

    Args:
        rope: the model's rope (a spectrum rope: ``with_scaling`` builds each item's).
        scalings: per item, a scaling for ``rope.with_scaling`` (one method, or one per axis with ``None``
            for an unscaled axis; e.g. ``ar.positions_for_size(shape, train, "yarn").scaling``), or ``None``
            for the rope's own. A trailing padding segment (``segments.n == len(scalings) + 1``) takes the rope's own.
        segments: the packed sequence's boundaries.
        pos: the packed positions ``[T, n_axes]``; needed only by length-dependent methods (DynamicNTK,
            LongRoPE), which then see each item's own ``max(pos) + 1``, as a rope called on that item alone.

    Returns:
        ``rope.with_scaling(s)`` when every item has the same ``s`` (nothing to pack), else a
        :class:`PackedRoPE`. Either takes the rope's calls on the natural positions ``[T, n_axes]``.
    """
    n_items = len(scalings)
    if segments.n not in (n_items, n_items + 1):
        raise ValueError(f"{n_items} item scalings for {segments.n} segments (items, and at most one padding)")
    scalings = list(scalings) + [None] * (segments.n - n_items)
    shared = rope.spectrum not in ("per_axis", "custom")  # split / cycled: one method for all axes
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
    first = [keys.index(k) for k in distinct]  # an item of each group
    if len(distinct) == 1 and lengths[0] is None:
        return rope.with_scaling(methods[0][0] if shared else methods[0])
    freqs, scales = _group_frequencies(rope, [(methods[i], lengths[i]) for i in first])
    block, cols = _block_rows(freqs)
    group = torch.tensor([distinct.index(k) for k in keys], device=segments.device)[segments.segment_ids]  # [T]
    stacked = torch.stack(scales)  # [K, n]
    if bool((stacked == stacked[0]).all()):
        uniform, factor = stacked[0], None
    else:
        uniform, factor = torch.ones_like(stacked[0]), stacked.to(segments.device)[group]  # [T, n]
    return PackedRoPE(rope, block, cols.to(segments.device)[group], uniform, factor)


class PackedRoPE:
    """A rope over the tokens of one packed sequence, each item with its own frequencies (block axes).

    It takes an :class:`~axial_rope.AxialRoPE`'s calls with the natural positions ``[T, n_axes]``
    (or ``[1, T, n_axes]``), so it goes where a rope goes (``Attention(..., rope=)``,
    ``DiTBlock``); built per batch by :func:`item_rope` (cheap: a few small tensors).

    Attributes:
        inner: the rope of ``F_packed`` ``[R, n]``; cols: int64 ``[T, n_axes]``, each token's rows;
        factor: float64 ``[T, n]`` attention factor per token and plane, or ``None`` (uniform, in ``inner``).
    """

    length_dependent = False  # each item's frequencies are fixed for this batch
    time_dependent = False

    def __init__(self, base: AxialRoPE, block: torch.Tensor, cols: torch.Tensor, scale: torch.Tensor, factor):
        scale = scale if bool((scale != 1).any()) else None
        model = Frequencies(block, scale)
        device = cols.device
        self.inner = AxialRoPE.from_frequencies(model, base.pairing, backend=base.backend).to(device)
        self.base, self.cols, self.factor = base, cols, factor
        self._memo: tuple | None = None  # (key of the last positions, their block positions, tables)

    rot_dim = property(lambda self: self.inner.rot_dim)
    n_pairs = property(lambda self: self.inner.n_pairs)
    n_axes = property(lambda self: self.base.n_axes)
    pairing = property(lambda self: self.inner.pairing)
    backend = property(lambda self: self.inner.backend)

    @property
    def attention_factor(self) -> float:
        if self.factor is not None:
            raise ValueError("the packed items have different attention factors (one per token)")
        return self.inner.attention_factor

    def block_positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Natural positions ``[..., T, n_axes]`` -> ``[..., T, R]``: each coordinate in its item's row, zeros elsewhere."""
        key = (pos, pos._version)  # the tensor itself (no address reuse while held) and its in-place edits
        if self._memo is not None and self._memo[0][0] is pos and self._memo[0][1] == pos._version:
            return self._memo[1]  # every layer passes the same positions
        flat = pos.reshape(-1, pos.shape[-1])
        if flat.shape[0] != self.cols.shape[0] or flat.shape[1] != self.cols.shape[1]:
            raise ValueError(
                f"pos {tuple(pos.shape)} does not fit this packed rope: {self.cols.shape[0]} tokens, "
                f"{self.cols.shape[1]} axes"
            )
        if self.base.transform is not None:  # scale / offset only (checked): per token
            flat = self.base.transform(flat)
        dtype = torch.float64 if flat.dtype == torch.float64 else torch.float32
        block = flat.new_zeros(flat.shape[0], self.inner.n_axes, dtype=dtype)
        block.scatter_(1, self.cols, flat.to(dtype))
        block = block.reshape(*pos.shape[:-1], -1)
        self._memo = (key, block, None)
        return block

    def cos_sin(self, pos: torch.Tensor, *, with_attention_factor: bool = True, **kwargs):
        """float32 tables ``[..., T, rot_dim]`` in the pairing's layout, each token's factor multiplied in."""
        block = self.block_positions(pos)
        if self.factor is None or not with_attention_factor:
            return self.inner.cos_sin(block, with_attention_factor=with_attention_factor)
        if self._memo[2] is not None:
            return self._memo[2]
        cos, sin = plane_cos_sin(block, self.inner.freqs, None, torch.float64)  # [..., T, n]
        factor = self.factor.reshape(*cos.shape)
        cos, sin = (channel_table((t * factor).to(torch.float32), self.pairing) for t in (cos, sin))
        self._memo = (*self._memo[:2], (cos, sin))
        return cos, sin

    def __call__(
        self, q, k, pos, layout: str = "bshd", *, seq_len=None, backend=None, with_attention_factor=True, inplace=False
    ):
        """Rotate q and k as :meth:`AxialRoPE.forward` does, each token by its own item's frequencies."""
        if self.factor is None or not with_attention_factor:
            block = self.block_positions(pos)
            return self.inner(
                q, k, block, layout, backend=backend, with_attention_factor=with_attention_factor, inplace=inplace
            )
        cos, sin = self.cos_sin(pos)
        rotate = lambda x: apply_rope(x, cos, sin, self.pairing, layout, backend or self.backend, inplace=inplace)
        return rotate(q), (None if k is None else rotate(k))

    forward = __call__

    def apply(self, x, pos, layout: str = "bshd", **kwargs):
        return self(x, None, pos, layout, **kwargs)[0]

    def norm_and_rotate(
        self, q, k, pos, q_weight=None, k_weight=None, layout="bshd", *, eps=1e-6, seq_len=None, backend=None,
        with_attention_factor=True,
    ):  # fmt: skip
        """Per-head RMSNorm then rotation (:meth:`AxialRoPE.norm_and_rotate`); one rounding to the input dtype."""
        if self.factor is None or not with_attention_factor:
            block = self.block_positions(pos)
            kwargs = {"eps": eps, "backend": backend, "with_attention_factor": with_attention_factor}
            return self.inner.norm_and_rotate(q, k, block, q_weight, k_weight, layout, **kwargs)
        cos, sin = self.cos_sin(pos)
        out = []
        for x, w in ((q, q_weight), (k, k_weight)):  # normalised in float32, rotated, rounded once
            y = apply_rope(rms_norm(x, w, eps), cos, sin, self.pairing, layout, backend or self.backend)
            out.append(y.to(x.dtype))
        return tuple(out)

    def __repr__(self) -> str:
        factor = "per token" if self.factor is not None else "uniform"
        return f"PackedRoPE(rows={self.inner.n_axes}, tokens={self.cols.shape[0]}, factor={factor}, base={self.base!r})"
