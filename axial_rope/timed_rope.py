"""``TimedRoPE``: an :class:`~axial_rope.rope.AxialRoPE` bound to one sampling time (``rope.at_time(t)``).

Time-dependent scaling (DyPE, :mod:`axial_rope.time_scaling`) makes the frequencies a function of the
noise level ``t``; a sampler binds the rope once per step and every layer reuses ``F(t)``.
"""

from __future__ import annotations

import torch

from .ops.rotation import Rotation
from .rotary import Rotary
from .time_scaling import sampling_time

__all__ = ["OWN_SCALING", "TimedRoPE"]

OWN_SCALING = object()  # AxialRoPE.rotation(scaling=...) left out: the rope's own scaling


class TimedRoPE(Rotary):
    """An :class:`~axial_rope.rope.AxialRoPE` bound to one sampling time (``rope.at_time(t)``): ``F(t)`` computed once.

    It takes the rope's calls without ``t``, so it goes where a rope goes (``Attention(..., rope=timed)``,
    ``DiTBlock(..., rope=timed)``): a sampler binds once per step and every layer reuses its frequencies.
    """

    def __init__(self, rope, t: float | torch.Tensor):  # rope: an AxialRoPE (not imported: rope.py imports this)
        dtype = torch.float64 if rope.float64_angles() else torch.float32
        self.rope, self.t = rope, sampling_time(t, rope.freqs.device, dtype)
        self.pairing, self.backend = rope.pairing, rope.backend
        # length-dependent axes need each call's seq_len: then F is computed per call from t
        self._bound = None if rope.length_dependent else rope.call_frequencies(t=self.t)

    def rotation(self, pos, *, seq_len=None, t=None) -> Rotation:
        if t is not None:
            raise ValueError("this rope is bound to one sampling time (rope.at_time(t)): call it without t")
        if self._bound is None:
            return self.rope.rotation(pos, seq_len=seq_len, t=self.t)
        freqs, factor, turns = self._bound
        return Rotation(self.rope.positions(pos), freqs, factor, self.pairing, turns)

    def frequencies(self, seq_len=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope.frequencies(seq_len, t=self.t)

    rot_dim = property(lambda self: self.rope.rot_dim)
    n_axes = property(lambda self: self.rope.n_axes)
    n_pairs = property(lambda self: self.rope.n_pairs)
    attention_factor = property(lambda self: self.rope.attention_factor)
    length_dependent = property(lambda self: self.rope.length_dependent)
    scaling = property(lambda self: self.rope.scaling)
    time_dependent = False  # the time is bound: calls need no t

    def __repr__(self) -> str:
        return f"TimedRoPE({self.rope!r}, t={self.t})"
