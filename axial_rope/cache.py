"""Key/value caches for attention layers: static (gpt-fast's design) or rolling, with attention sinks.

The cache is preallocated, so a decoding step has the same shapes every time. Keys are stored
*already rotated*: each key is rotated once, at the position it is written to.

A rolling cache (``window``) keeps the ``sinks`` first entries and the last ``window - sinks``,
as StreamingLLM (Xiao et al. 2024, arXiv:2309.17453) does. When new tokens would not fit, it
drops the oldest entries after the sinks and *re-indexes* the kept ones to contiguous positions
(sinks at ``0 .. sinks - 1``, the rest right after): RoPE turns a key rotated for position ``n``
into the key for ``n - d`` by one more rotation by ``-d``, so kept keys are re-rotated through the
backends, never recomputed from hidden states, and positions stay below ``window`` however long the
stream. Each kept key is rotated from its copy *as written* by the whole shift it has accumulated
since, so it carries two roundings in the cache's dtype (the write and this rotation) however many
rolls it survives; rotating the rolled key again at every roll would add one rounding per roll (in
bfloat16, a relative error of 0.1 after a few hundred rolls). A video cache holds whole frames
(``frame`` tokens sharing one time coordinate), rolls by frames and re-indexes the time axis only.

Keys turned by a rotation of their own (the ``key`` of a :class:`~axial_rope.ops.rotation.QKRotation`: other
positions, another ``F``, an amplitude) are stored as that rotation wrote them, and a roll re-indexes them by
*its* ``F``: pass it (``advance(n, rotation.key)``, or the whole ``QKRotation``). Its time coordinate must count
frames (a stride folds into ``F``'s time row). What stays relative after a roll: the angle (a kept key turns by
minus its move times the key ``F``'s time row, the angle it would have had written at its new position); an
amplitude written with the key stays as written, which is right for an amplitude tied to the key itself (a
reference image's damped planes) but not for one tied to its position (an xPos decay stays at the written
position: against later queries the key's logits are off by the decay of its move).

Bookkeeping and compile: ``length`` (the slots held or reserved) lives on the host and only
:meth:`KVCache.advance` moves it (it reserves the slots it returns; rolls happen there, eagerly);
:meth:`KVCache.update`, which runs inside a compiled model, only writes tensors. An eager update at
explicit positions (a static cache used as gpt-fast's, without ``advance``) also moves ``length``;
a compiled one cannot (it would be a host sync), so mix explicit writes with ``advance`` eagerly only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .ops import check_grouped_heads, rotate
from .ops.rotation import QKRotation, Rotation

__all__ = ["KVCache", "check_rollable", "check_window", "roll_shift"]


def _positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
    return value


def check_window(window: int | None, sinks: int = 0, frame: int = 1, evict: int | None = None) -> int | None:
    """A rolling window's arguments: ``window`` a positive int of whole frames, ``0 <= sinks < window`` whole frames,
    ``evict`` whole frames in ``[1, window - sinks]`` (default: one frame); ``sinks`` and ``evict`` only with a
    window. Returns ``evict`` (``None`` without a window); raises ``ValueError`` naming the argument."""
    _positive("frame", frame)
    if window is None:
        if sinks:
            raise ValueError("KVCache: sinks go with a rolling cache (window=)")
        if evict is not None:
            raise ValueError(
                f"KVCache: evict ({evict!r}) goes with a rolling cache (window=); a static cache never drops"
            )
        return None
    _positive("window", window)
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"KVCache: sinks must be an int >= 0, got {sinks!r}")
    if sinks >= window:
        raise ValueError(f"KVCache: sinks ({sinks}) must be fewer than the window ({window}) entries kept")
    if window < frame or window % frame or sinks % frame:
        raise ValueError(
            f"KVCache: window ({window}) and sinks ({sinks}) must be whole frames of {frame} tokens "
            "(a window shorter than one frame keeps nothing)"
        )
    evict = frame if evict is None else _positive("evict", evict)
    if evict % frame or evict > window - sinks:
        raise ValueError(
            f"KVCache: evict ({evict}) must be whole frames of {frame} tokens, at most window - sinks "
            f"({window - sinks})"
        )
    return evict


def check_rollable(rope) -> None:
    """A rolling cache re-indexes its keys by one rotation, which needs a rope whose angle is linear in the
    position with fixed frequencies: no position map, no length- or time-dependent scaling."""
    if rope is None:
        raise ValueError("a rolling cache re-rotates its keys: pass the layer's rope (advance(n, rope))")
    if rope.transform is not None or rope.length_dependent or rope.time_dependent:
        raise ValueError(
            "a rolling cache re-indexes positions by a rotation, which needs fixed frequencies and no position "
            "map (a length- or time-dependent scaling, or a transform, would change the keys otherwise)"
        )


class _KeyTurn(NamedTuple):
    """The frequencies a roll re-rotates the kept keys with (those the keys were written with)."""

    freqs: torch.Tensor  # F [R, n] or per head [H_F, R, n], detached
    turns: torch.Tensor | None  # F as fixed-point turns (devices without float64), or None
    pairing: str
    backend: str | None
    dtype: torch.dtype  # of the position shift: float64, float32 with turns


def roll_shift(length: int, n: int, window: int, sinks: int, evict: int) -> int:
    """Entries a rolling cache holding ``length`` drops before it writes ``n`` more: none while they fit, else the
    overflow or ``evict`` if more (a roll every ``evict`` tokens, not every token), never a sink."""
    overflow = length + n - window
    return 0 if overflow <= 0 else min(max(overflow, evict), length - sinks)


class KVCache(nn.Module):
    """Preallocated keys and values ``[B_max, H_kv, S_max, D]``, written at ``input_pos``.

    Args:
        max_batch_size: the largest batch the cache serves; a smaller batch uses the first rows.
        max_seq_len: number of slots; a static cache raises ``ValueError`` past it.
        num_kv_heads: key/value heads (fewer than query heads for grouped-query attention).
        head_dim: channels per head.
        window: ``None`` (static: slot = position, up to ``max_seq_len``), or the number of entries a
            rolling cache keeps (``sinks <= window <= max_seq_len``), re-indexed as it rolls.
        sinks: entries kept at the start of a rolling cache whatever the stream's length (attention sinks).
        frame: tokens per frame (video: one time coordinate each); the cache then rolls by whole frames,
            and ``window`` and ``sinks`` count tokens in whole frames.
        time_axis: the axis of the positions a roll re-indexes (video ``(t, y, x)``: 0); checked against the
            rope at each :meth:`advance`.
        evict: entries a roll drops at least (whole frames; default one frame; rolling caches only): a roll
            re-rotates every kept key, so dropping ``evict`` at a time rolls once per ``evict`` tokens instead
            of every token, and each token sees between ``window - sinks - evict + 1`` and ``window - sinks``
            recent entries.

    Memory: a rolling cache also keeps each key as written (``k_written``, the size of ``k``) and, per slot,
    the time positions it has moved down since (``moved``, int64): 1.5x a static cache's keys and values.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        window: int | None = None,
        sinks: int = 0,
        frame: int = 1,
        time_axis: int = 0,
        evict: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        evict = check_window(window, sinks, frame, evict)  # first: a bad window is named as such
        for name, value in (
            ("max_batch_size", max_batch_size),
            ("max_seq_len", max_seq_len),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            _positive(name, value)
        if isinstance(time_axis, bool) or not isinstance(time_axis, int) or time_axis < 0:
            raise ValueError(
                f"KVCache: time_axis must be an int >= 0 (an axis of the rope's positions), got {time_axis!r}"
            )
        if window is not None and window > max_seq_len:
            raise ValueError(f"KVCache: window ({window}) exceeds the cache's max_seq_len ({max_seq_len}) slots")
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.window, self.sinks, self.frame, self.time_axis, self.evict = window, sinks, frame, time_axis, evict
        self.length = 0  # slots held or reserved by advance(), 0 .. length - 1 (a rolling cache is filled in order)
        self._reserved: tuple[int, int] | None = None  # the last advance's slots, not yet written (eager checks)
        shape = (max_batch_size, num_kv_heads, max_seq_len, head_dim)
        # not persistent: a cache is runtime state, never part of a checkpoint
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        # which slots hold a key and value: attention never sees the others (decoding may skip positions)
        self.register_buffer("filled", torch.zeros(max_seq_len, dtype=torch.bool, device=device), persistent=False)
        if window is not None:  # the keys as written, and the time positions each slot moved down since
            self.register_buffer("k_written", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
            self.register_buffer("moved", torch.zeros(max_seq_len, dtype=torch.int64, device=device), persistent=False)

    def _check(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if input_pos.ndim != 1 or input_pos.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"input_pos must be a 1-D int tensor [S], got {input_pos.dtype} {tuple(input_pos.shape)}")
        expected = (k.shape[0], *self.k.shape[1:2], input_pos.shape[0], self.k.shape[3])
        if tuple(k.shape) != expected or k.shape != v.shape:
            raise ValueError(
                f"k and v must be [B, H_kv, S, D] = {expected} (S = len(input_pos)), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.shape[0] > self.max_batch_size:
            raise ValueError(f"batch {k.shape[0]} exceeds the cache's max_batch_size {self.max_batch_size}")
        # host syncs, so only outside torch.compile; the models check their lengths up front (advance)
        if input_pos.numel() and not torch.compiler.is_compiling():
            lo, hi = int(input_pos.min()), int(input_pos.max())
            if lo < 0 or hi >= self.max_seq_len:
                raise ValueError(
                    f"KVCache overflow: input_pos spans [{lo}, {hi}], the cache holds positions "
                    f"0..{self.max_seq_len - 1} (max_seq_len={self.max_seq_len}); allocate a longer cache"
                )
            if input_pos.unique().numel() != input_pos.numel():
                raise ValueError(f"input_pos writes one slot twice in one update: {input_pos.tolist()}")
            if self.window is not None and (
                self._reserved is None or input_pos.tolist() != list(range(*self._reserved))
            ):
                wanted = (
                    "none is reserved" if self._reserved is None else f"{self._reserved[0]}..{self._reserved[1] - 1}"
                )
                raise ValueError(
                    f"a rolling cache is written at the slots advance(n, rope) reserved, in order ({wanted}), got "
                    f"input_pos {input_pos.tolist()}: positions cannot go backwards, skip or be written twice"
                )

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys (rotated) and values at ``input_pos``; return the whole cache for the batch.

        Only tensors are written, so it runs compiled (``fullgraph`` included); a rolling cache's slots come from
        :meth:`advance`, which reserves them on the host.

        Args:
            input_pos: int ``[S]``, the slots (= positions) of the new tokens (a rolling cache: from :meth:`advance`).
            k, v: ``[B, H_kv, S, D]``.

        Returns:
            ``k``, ``v`` ``[B, H_kv, S_max, D]`` (views of the cache; unwritten slots hold zeros and
            are marked in :attr:`filled`, which attention uses as its mask).
        """
        self._check(input_pos, k, v)
        b, k = k.shape[0], k.to(self.k.dtype)
        self.k[:b].index_copy_(2, input_pos, k)
        self.v[:b].index_copy_(2, input_pos, v.to(self.v.dtype))
        self.filled.index_fill_(0, input_pos, True)
        if self.window is not None:
            self.k_written[:b].index_copy_(2, input_pos, k)
            self.moved.index_fill_(0, input_pos, 0)
        if not torch.compiler.is_compiling() and input_pos.numel():  # eager bookkeeping of explicit writes
            self.length = max(self.length, int(input_pos.max()) + 1)
            self._reserved = None
        return self.k[:b], self.v[:b]

    def peek(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cache with new keys (rotated) and values appended after its slots, written nowhere: what the new
        tokens attend to while they are not final (a video frame's denoising steps, before its clean pass writes it).

        Args:
            k, v: ``[B, H_kv, S, D]`` of the new tokens.

        Returns:
            ``k``, ``v`` ``[B, H_kv, S_max + S, D]`` and ``visible`` bool ``[S_max + S]`` (the written slots, then
            the new tokens).
        """
        expected = (k.shape[0], self.k.shape[1], k.shape[2], self.k.shape[3])
        if k.ndim != 4 or tuple(k.shape) != expected or k.shape != v.shape or k.shape[0] > self.max_batch_size:
            raise ValueError(
                f"k and v must be [B, H_kv, S, D] with B <= {self.max_batch_size}, H_kv = {self.k.shape[1]}, "
                f"D = {self.k.shape[3]}; got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        b, new = k.shape[0], torch.ones(k.shape[2], dtype=torch.bool, device=self.filled.device)
        keys = torch.cat([self.k[:b], k.to(self.k.dtype)], dim=2)
        values = torch.cat([self.v[:b], v.to(self.v.dtype)], dim=2)
        return keys, values, torch.cat([self.filled, new])

    def advance(self, n: int, rope=None) -> torch.Tensor:
        """Reserve the slots (= positions) of ``n`` new tokens and return them: ``length .. length + n - 1``.

        A rolling cache first makes room (:meth:`make_room`); a static cache raises past ``max_seq_len``. Call it on
        the host, before the (possibly compiled) forward that writes the slots with :meth:`update`.
        """
        self.make_room(n, rope)
        slots = torch.arange(self.length, self.length + n, device=self.k.device)
        self._reserved, self.length = (self.length, self.length + n), self.length + n
        return slots

    def make_room(self, n: int, rope=None) -> None:
        """Roll if ``n`` new tokens would not fit, reserving nothing: what a read of the cache with ``n`` new tokens
        (:meth:`peek`) needs before it. A rolling cache drops the oldest entries after the sinks (the overflow, or
        ``evict`` if more; whole frames) and re-indexes the kept keys with ``rope`` (the layer's
        :class:`~axial_rope.AxialRoPE`, or the rotation the keys were written with, a ``Rotation`` or a
        ``QKRotation`` whose ``key`` is used); a static cache raises past ``max_seq_len``."""
        _positive("n", n)
        if self.window is None:
            if self.length + n > self.max_seq_len:
                raise ValueError(
                    f"KVCache overflow: {self.length} + {n} tokens exceed max_seq_len={self.max_seq_len} "
                    "(a rolling cache, window=, keeps a stream going)"
                )
            return
        self._check_rope(rope)  # at every call, not only at the first roll
        if n % self.frame:
            raise ValueError(f"a video cache takes whole frames of {self.frame} tokens, got {n} new tokens")
        most = self.window - min(self.length, self.sinks)  # what fits once every entry but the sinks is dropped
        if n > most:
            raise ValueError(
                f"{n} new tokens do not fit a window of {self.window} holding {self.length} with {self.sinks} "
                f"sinks: feed at most {most} at a time"
            )
        shift = roll_shift(self.length, n, self.window, self.sinks, self.evict)
        if shift:
            self.roll(shift, rope)

    def roll(self, shift: int, rope) -> None:
        """Drop the ``shift`` oldest entries after the sinks and move the rest down; each moved key becomes its copy
        as written rotated by minus the time positions it has moved since (one rotation, whatever the rolls)."""
        if self.window is None:
            raise ValueError("roll() is for a rolling cache (window=)")
        turn = self._check_rope(rope)
        if shift % self.frame or not 0 < shift <= self.length - self.sinks:
            raise ValueError(f"roll: shift must be whole frames in (0, {self.length - self.sinks}], got {shift}")
        start, keep = self.sinks, self.length - self.sinks - shift
        with torch.no_grad():
            if keep:
                kept, src = slice(start, start + keep), slice(start + shift, start + shift + keep)
                for buf in (self.k_written, self.v):  # overlapping ranges: through a copy
                    buf[:, :, kept] = buf[:, :, src].clone()
                self.moved[kept] = self.moved[src] + shift // self.frame
                self.k[:, :, kept] = self.k_written[:, :, kept]
                delta = self._delta(turn, self.moved[kept])
                rotate(self.k[:, :, kept], None, delta, "bhsd", turn.backend, inplace=True)
            dropped = slice(start + keep, self.length)
            for buf in (self.k, self.k_written, self.v):
                buf[:, :, dropped] = 0
            self.moved[dropped], self.filled[dropped] = 0, False
        self.length -= shift
        self._reserved = None  # slots reserved before a roll have moved

    def _check_rope(self, rope) -> _KeyTurn:
        """What a roll turns the kept keys by: the key rotation's ``F`` (a ``Rotation``, or a ``QKRotation``'s key),
        or the rope's (a rope-like object whose angle is linear in the position: :func:`check_rollable`). A rotation
        with a ``roll_refusal`` (xPos's decays, :mod:`axial_rope.methods.xpos`) is refused with it."""
        refusal = getattr(rope, "roll_refusal", None)
        if refusal is not None and self.window is not None:
            raise ValueError(f"KVCache: {refusal}")
        if isinstance(rope, QKRotation):
            rope = rope.key
        if isinstance(rope, Rotation):  # an angle linear in pos by construction: pos @ F
            dtype = torch.float64 if rope.turns is None else torch.float32  # turns: a device without float64
            turn = _KeyTurn(rope.freqs.detach(), rope.turns, rope.pairing, None, dtype)
            what, n_axes, rot_dim = "the key rotation's", rope.freqs.shape[-2], 2 * rope.n_pairs
            width = f"rotation.key's rot_dim = 2 x its planes = {rot_dim}"
        else:
            check_rollable(rope)
            learned = rope.learned_freqs is not None
            freqs = (rope.learned_freqs if learned else rope.freqs).detach()
            dtype = torch.float64 if rope.float64_angles() else torch.float32
            turn = _KeyTurn(freqs, None if learned else rope.turns, rope.pairing, rope.backend, dtype)
            what, n_axes, rot_dim = "the rope's", rope.n_axes, rope.rot_dim
            width = f"rope.rot_dim = sum(axes_dim) = {rot_dim}"
        if self.time_axis >= n_axes:
            raise ValueError(f"KVCache: time_axis ({self.time_axis}) is not an axis of {what} {n_axes}-axis positions")
        if rot_dim > self.k.shape[3]:
            raise ValueError(f"{width} exceeds the cache's head_dim = {self.k.shape[3]}")
        if turn.freqs.ndim == 3:
            check_grouped_heads(f"{what} per-head frequencies", turn.freqs.shape[0], "the cache", self.k.shape[1])
        return turn

    def _delta(self, turn: _KeyTurn, moved: torch.Tensor) -> Rotation:
        """The rotation by ``-moved`` (int ``[S]``) on the time axis (no attention factor: the keys carry theirs)."""
        delta = torch.zeros(1, moved.shape[0], turn.freqs.shape[-2], dtype=turn.dtype, device=self.k.device)
        delta[..., self.time_axis] = -moved.to(turn.dtype)
        return Rotation(delta, turn.freqs, None, turn.pairing, turn.turns)

    def reset(self) -> None:
        """Empty the cache: zero keys and values, no slot written or reserved."""
        for buf in self.buffers():
            buf.zero_()
        self.length, self._reserved = 0, None

    def reset_parameters(self) -> None:
        """The re-initialisation after ``to_empty`` (a cache built on the meta device): an empty cache."""
        self.reset()

    def to_empty(self, *, device: torch.device | str | None, recurse: bool = True) -> KVCache:
        """``nn.Module.to_empty``, then :meth:`reset`: the new storage holds nothing, so neither does the cache."""
        super().to_empty(device=device, recurse=recurse)
        self.reset()
        return self

    def extra_repr(self) -> str:
        rolling = (
            ""
            if self.window is None
            else f", window={self.window}, sinks={self.sinks}, frame={self.frame}, evict={self.evict}"
        )
        return f"shape={tuple(self.k.shape)}, dtype={self.k.dtype}{rolling}"
