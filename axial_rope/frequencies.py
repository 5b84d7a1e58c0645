"""The frequency model: which axis and frequency each rotary plane listens to, and how positions are read.

A head's rotary channels form ``n`` planes. Plane ``j`` of head ``h`` turns by

    angle[h, j] = sum_a T_a(pos[a]) * F[h, a, j]

- ``F`` (:attr:`Frequencies.freqs`): float64 ``[n_axes, n]`` shared by every head, or
  ``[H, n_axes, n]`` per head (LTX-Video's frequencies spread over the whole hidden size,
  Mochi's and RoPE-Mixed's learned mixed frequencies). A column with one non-zero is an
  axial plane; a zero column is an *unrotated* plane (partial rotary as a mask, p-RoPE's
  removed frequencies, LTX's padding planes); a column with several non-zeros mixes axes.
- ``scale`` (float64 ``[n]``): the attention factor of each plane, multiplied into cos and sin.
- ``T`` (:class:`PositionTransform`): a per-axis map of the positions, in float64, before
  the angle: normalisation to ``[-1, 1]``, centring, scale, offset.

The spectra of :class:`~axial_rope.AxialRoPE` (``per_axis``, ``split``, ``cycled``) are
constructors of ``F`` (:meth:`Frequencies.from_spectrum`); the conventions of
:mod:`axial_rope.conventions` build others. The backends take any ``F``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from . import scaling as scaling_methods
from .scaling import Scaling, inv_freq
from .time_scaling import is_time_dependent, sampling_time

__all__ = ["Frequencies", "PositionTransform", "SPECTRA", "NORMALIZE", "plane_axes", "spectrum_frequencies"]

SPECTRA = ("per_axis", "split", "cycled")
NORMALIZE = (None, "separate", "max", "min")


def per_axis(name: str, value, n_axes: int, shared_only: bool = False) -> tuple:
    """One value per axis from one value or a sequence of them (``shared_only``: one value only)."""
    if not isinstance(value, (tuple, list)):
        return (value,) * n_axes
    if shared_only:
        raise ValueError(
            f"{name} must be one value with spectrum 'split'/'cycled' (one shared spectrum), got {value!r}"
        )
    if len(value) != n_axes:
        raise ValueError(f"{name} has {len(value)} entries, expected one per axis ({n_axes})")
    return tuple(value)


def scaling_method(value) -> Scaling | None:
    """A scaling method, ``None``, or its dict form (:meth:`Scaling.to_dict`, e.g. from a config)."""
    if value is None or isinstance(value, Scaling):
        return value
    if isinstance(value, dict):
        return scaling_methods.from_dict(value)
    raise TypeError(f"scaling must be None, an axial_rope.scaling method or its dict form, got {value!r}")


def plane_axes(axes_dim: Sequence[int], spectrum: str) -> list[int]:
    """The axis of each plane: contiguous sections, or (``"cycled"``) Qwen3-VL's interleaved M-RoPE.

    ``cycled`` is transformers' rule (``Qwen3VLTextRotaryEmbedding``, ``apply_interleaved_mrope``): with
    ``n`` axes and shares ``s_a = axes_dim[a] / 2``, plane ``j`` belongs to axis ``a >= 1`` when
    ``j % n == a`` and ``j < n * s_a``, else to axis 0. With ``s_0`` the largest share that is the round
    robin ``t, h, w, t, ...`` with axis 0 taking the rest ([24, 20, 20]); otherwise an axis may get more
    or fewer planes than its share, as in transformers ([16, 24, 24]: 22, 21, 21).
    """
    shares = [d // 2 for d in axes_dim]
    if spectrum != "cycled":
        return [a for a, n in enumerate(shares) for _ in range(n)]
    n = len(shares)
    return [next((a for a in range(1, n) if j % n == a and j < n * shares[a]), 0) for j in range(sum(shares))]


def spectrum_frequencies(
    axes_dim: tuple[int, ...],
    theta: tuple[float, ...],
    scaling: tuple[Scaling | None, ...],
    spectrum: str,
    seq_len: tuple[int | None, ...],
    t: torch.Tensor | float | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``F`` float64 ``[n_axes, n_pairs]`` and the attention factor per plane ``[n_pairs]`` of a spectrum.

    ``per_axis``: axis ``a`` owns ``axes_dim[a] / 2`` consecutive planes, ``inv_freq(d_a, theta_a,
    scaling_a)``; ``split`` / ``cycled``: one spectrum over ``sum(axes_dim)`` dealt to the axes
    (``theta[0]``, ``scaling[0]``, the longest ``seq_len``). On the CPU, or with a time-dependent
    method (:mod:`axial_rope.time_scaling`), at sampling time ``t`` on ``t``'s device (torch ops on
    ``t``: no host sync, so a compiled graph takes every ``t``).

    The factor is ``None`` when every plane's is 1: decided from the methods' Python numbers, so a
    compiled caller branches on it without reading a tensor. ``dtype``: of a time-dependent ``F(t)``
    (default float64, float32 on a device without float64); the others are float64 on the CPU.
    """
    n_axes, rot_dim = len(axes_dim), sum(axes_dim)
    timed = any(is_time_dependent(s) for s in scaling)
    if timed and t is None:
        names = sorted({type(s).__name__ for s in scaling if is_time_dependent(s)})
        raise ValueError(f"{', '.join(names)} depend(s) on the sampling time: pass t= (the noise level in [0, 1])")
    t = sampling_time(t, dtype=dtype) if timed else None  # 0-d; numbers on the CPU
    device = t.device if timed else torch.device("cpu")
    dtype = t.dtype if timed else torch.float64  # F(t) in t's dtype: float32 on a device without float64

    def one(d: int, base: float, method, length) -> tuple[torch.Tensor, float]:  # [d // 2] on device
        if is_time_dependent(method):
            return method.inv_freq_at(d, float(base), t), method.attention_scale()
        inv, factor = inv_freq(d, base, method, seq_len=length)  # float64 on the CPU
        return inv.to(dtype).to(device), factor

    if spectrum == "per_axis":
        spectra = [one(d, th, s, n) for d, th, s, n in zip(axes_dim, theta, scaling, seq_len)]
    else:  # one spectrum over rot_dim, planes dealt to the axes
        longest = None if all(n is None for n in seq_len) else max(seq_len)
        spectra = [one(rot_dim, theta[0], scaling[0], longest)]
    widths = axes_dim if spectrum == "per_axis" else (rot_dim,)
    values = torch.cat([inv for inv, _ in spectra])  # [n_pairs]
    scale = None
    if any(af != 1.0 for _, af in spectra):
        scale = torch.cat(
            [torch.full((d // 2,), af, dtype=dtype, device=device) for d, (_, af) in zip(widths, spectra)]
        )
    placed = torch.zeros(n_axes, rot_dim // 2, dtype=dtype, device=device)  # one 1 per column
    placed[plane_axes(axes_dim, spectrum), torch.arange(rot_dim // 2, device=device)] = 1.0
    return placed * values, scale


def _floats(name: str, value, n_axes: int | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * (n_axes or 1)
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not abs(v) < math.inf:  # traceable isfinite
            raise ValueError(f"PositionTransform: {name} must hold finite numbers, got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class PositionTransform:
    """A per-axis map of positions, applied in float64 before the angle.

    For each axis, in this order (the order of :func:`axial_rope.grid`):

    1. ``normalize``: cell centres of a grid mapped into ``[-1, 1]``, ``2 (p - min + 1/2) / n - 1``
       with ``n = max - min + 1`` the axis' extent (``"separate"``), or every axis by the largest
       (``"max"``) or smallest (``"min"``) extent: DINOv3's coordinates from integer grid positions;
    2. ``center``: shifted by the midpoint ``(min + max) / 2``, so the grid is symmetric about 0;
    3. ``scale``: multiplied (one number, or one per axis), e.g. ``2 / base`` for LTX-Video's fractions;
    4. ``offset``: added (one number, or one per axis), e.g. ``-1`` for LTX-Video's ``2 g - 1``.

    ``normalize`` and ``center`` read the extent of the positions along the sequence, per sample
    (device reductions, no host sync), so they are for positions that form one grid.
    """

    scale: tuple[float, ...] | float | None = None
    offset: tuple[float, ...] | float | None = None
    center: bool = False
    normalize: str | None = None

    def __post_init__(self):
        if self.normalize not in NORMALIZE:
            raise ValueError(f"PositionTransform: normalize must be one of {NORMALIZE}, got {self.normalize!r}")
        if not isinstance(self.center, bool):
            raise TypeError(f"PositionTransform: center must be a bool, got {self.center!r}")
        object.__setattr__(self, "scale", _floats("scale", self.scale, None))
        object.__setattr__(self, "offset", _floats("offset", self.offset, None))

    def check(self, n_axes: int) -> None:
        for name in ("scale", "offset"):
            values = getattr(self, name)
            if values is not None and len(values) not in (1, n_axes):
                raise ValueError(f"PositionTransform: {name} has {len(values)} entries, expected 1 or {n_axes} axes")

    def __call__(self, pos: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """``pos`` ``[..., S, n_axes]`` -> the transformed positions in ``dtype`` (float64; float32 on a device without
        it), same shape."""
        p = pos.to(dtype)
        if self.normalize is not None:
            lo, hi = p.amin(-2, keepdim=True), p.amax(-2, keepdim=True)  # [..., 1, n_axes]
            extent = hi - lo + 1
            if self.normalize == "max":
                extent = extent.amax(-1, keepdim=True)
            elif self.normalize == "min":
                extent = extent.amin(-1, keepdim=True)
            p = 2 * (p - lo + 0.5) / extent - 1
        if self.center:
            p = p - (p.amin(-2, keepdim=True) + p.amax(-2, keepdim=True)) / 2
        if self.scale is not None:
            p = p * torch.tensor(self.scale, dtype=dtype, device=p.device)
        if self.offset is not None:
            p = p + torch.tensor(self.offset, dtype=dtype, device=p.device)
        return p

    def to_dict(self) -> dict:
        return {"scale": self.scale, "offset": self.offset, "center": self.center, "normalize": self.normalize}


def _as_float64(name: str, value, ndims: tuple[int, ...]) -> torch.Tensor:
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        raise ValueError(f"Frequencies: {name} is a meta tensor; the frequency model needs its values (CPU)")
    t = torch.as_tensor(value, dtype=torch.float64, device="cpu").detach().clone()  # cpu: also under a meta default
    if t.ndim not in ndims:
        raise ValueError(
            f"Frequencies: {name} must have {' or '.join(map(str, ndims))} dims, got shape {tuple(t.shape)}"
        )
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"Frequencies: {name} holds NaN or inf")
    return t


@dataclass(frozen=True, eq=False)
class Frequencies:
    """The general frequency model of a rotary head: ``F``, the attention factor per plane, the position map.

    Attributes:
        freqs: ``F``, float64 on the CPU, ``[n_axes, n]`` (all heads) or ``[H, n_axes, n]`` (per head).
        scale: float64 ``[n]``, the attention factor per plane (``None``: 1 everywhere).
        transform: :class:`PositionTransform` applied to the positions first, or ``None``.
    """

    freqs: torch.Tensor
    scale: torch.Tensor | None = None
    transform: PositionTransform | None = field(default=None)

    def __post_init__(self):
        freqs = _as_float64("freqs", self.freqs, (2, 3))
        if freqs.shape[-1] == 0 or freqs.shape[-2] == 0 or (freqs.ndim == 3 and freqs.shape[0] == 0):
            raise ValueError(f"Frequencies: freqs needs at least one head, axis and plane, got {tuple(freqs.shape)}")
        object.__setattr__(self, "freqs", freqs)
        if self.scale is not None:
            scale = _as_float64("scale", self.scale, (1,))
            if scale.shape[0] != freqs.shape[-1]:
                raise ValueError(f"Frequencies: scale has {scale.shape[0]} planes, freqs has {freqs.shape[-1]}")
            object.__setattr__(self, "scale", scale)
        if self.transform is not None:
            if isinstance(self.transform, dict):
                object.__setattr__(self, "transform", PositionTransform(**self.transform))
            if not isinstance(self.transform, PositionTransform):
                raise TypeError(f"Frequencies: transform must be a PositionTransform or None, got {self.transform!r}")
            self.transform.check(freqs.shape[-2])

    # -- shape ---------------------------------------------------------------------------

    @property
    def n_axes(self) -> int:
        return self.freqs.shape[-2]

    @property
    def n_pairs(self) -> int:
        return self.freqs.shape[-1]

    @property
    def num_heads(self) -> int | None:
        """``H`` for per-head frequencies, ``None`` when every head shares ``F``."""
        return self.freqs.shape[0] if self.freqs.ndim == 3 else None

    @property
    def unrotated(self) -> torch.Tensor:
        """bool ``[n]``: planes with a zero column in every head (they pass through unrotated)."""
        columns = self.freqs if self.freqs.ndim == 3 else self.freqs[None]
        return (columns == 0).all(dim=1).all(dim=0)

    @property
    def plane_axis(self) -> list[int | None]:
        """The axis of each plane (one non-zero per column, in every head), ``None`` for unrotated or mixed planes."""
        columns = (self.freqs if self.freqs.ndim == 3 else self.freqs[None]) != 0  # [H, A, n]
        listens = columns.any(dim=0)  # [A, n]: does any head read axis a in plane j
        return [int(c.nonzero()[0]) if int(c.sum()) == 1 else None for c in listens.T]

    @property
    def axes_dim(self) -> tuple[int, ...]:
        """Rotary channels per axis among the axial planes (``2 x`` their count)."""
        axes = self.plane_axis
        return tuple(2 * axes.count(a) for a in range(self.n_axes))

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def from_spectrum(
        cls,
        axes_dim: int | Sequence[int],
        theta: float | Sequence[float] = 10000.0,
        scaling=None,
        spectrum: str = "per_axis",
        *,
        seq_len: int | Sequence[int] | None = None,
        transform: PositionTransform | None = None,
        t: float | None = None,
    ) -> Frequencies:
        """The axial ``F`` of :class:`~axial_rope.AxialRoPE`'s arguments (see :func:`spectrum_frequencies`).

        ``t``: the sampling time (noise level in ``[0, 1]``) of time-dependent methods
        (:mod:`axial_rope.time_scaling`).
        """
        axes_dim = tuple(axes_dim) if isinstance(axes_dim, (tuple, list)) else (axes_dim,)
        shared = spectrum != "per_axis"
        thetas = per_axis("theta", theta, len(axes_dim), shared)
        methods = tuple(scaling_method(s) for s in per_axis("scaling", scaling, len(axes_dim), shared))
        lengths = per_axis("seq_len", seq_len, len(axes_dim)) if seq_len is not None else (None,) * len(axes_dim)
        freqs, scale = spectrum_frequencies(axes_dim, thetas, methods, spectrum, lengths, t)
        return cls(freqs.cpu(), None if scale is None else scale.cpu(), transform)

    @classmethod
    def axial(
        cls,
        plane_axis: Sequence[int | None],
        values: Sequence[float] | torch.Tensor,
        n_axes: int | None = None,
        *,
        scale: torch.Tensor | None = None,
        transform: PositionTransform | None = None,
    ) -> Frequencies:
        """``F`` with plane ``j`` on axis ``plane_axis[j]`` at frequency ``values[j]`` (``None``: unrotated)."""
        values = _as_float64("values", values, (1,))
        if len(plane_axis) != values.shape[0]:
            raise ValueError(f"Frequencies.axial: {len(plane_axis)} plane axes for {values.shape[0]} values")
        used = [a for a in plane_axis if a is not None]
        n_axes = n_axes if n_axes is not None else max(used, default=0) + 1
        if any(not isinstance(a, int) or a < 0 or a >= n_axes for a in used):
            raise ValueError(f"Frequencies.axial: plane axes must be ints in [0, {n_axes}) or None, got {plane_axis}")
        freqs = torch.zeros(n_axes, len(plane_axis), dtype=torch.float64, device="cpu")
        for j, a in enumerate(plane_axis):
            if a is not None:
                freqs[a, j] = values[j]
        return cls(freqs, scale, transform)

    @classmethod
    def per_head(cls, heads: Sequence[Frequencies]) -> Frequencies:
        """Stack shared-``F`` models (same axes, planes, scale and transform) into one per-head model."""
        if not heads or any(h.num_heads is not None for h in heads):
            raise ValueError("Frequencies.per_head takes one or more shared-F models, one per head")
        first = heads[0]
        for h in heads[1:]:
            if h.freqs.shape != first.freqs.shape or h.transform != first.transform:
                raise ValueError("Frequencies.per_head: every head needs the same F shape and position transform")
            if (h.scale is None) != (first.scale is None) or (
                h.scale is not None and not torch.equal(h.scale, first.scale)
            ):
                raise ValueError("Frequencies.per_head: every head needs the same attention factor per plane")
        return cls(torch.stack([h.freqs for h in heads]), first.scale, first.transform)

    def masked(self, keep: Sequence[bool] | torch.Tensor) -> Frequencies:
        """The same model with the planes where ``keep`` is False unrotated (their columns zeroed)."""
        keep = torch.as_tensor(keep, dtype=torch.bool)
        if keep.shape != (self.n_pairs,):
            raise ValueError(
                f"Frequencies.masked: keep must have one entry per plane ({self.n_pairs}), got {tuple(keep.shape)}"
            )
        return Frequencies(self.freqs * keep.to(torch.float64), self.scale, self.transform)

    def with_transform(self, transform: PositionTransform | None) -> Frequencies:
        return Frequencies(self.freqs, self.scale, transform)

    # -- serialisation ---------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain lists and numbers (JSON): ``Frequencies.from_dict(json.loads(json.dumps(d)))`` rebuilds it exactly."""
        return {
            "freqs": self.freqs.tolist(),
            "scale": None if self.scale is None else self.scale.tolist(),
            "transform": None if self.transform is None else self.transform.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Frequencies:
        unknown = sorted(set(data) - {"freqs", "scale", "transform"})
        if unknown:
            raise ValueError(f"Frequencies.from_dict: unknown key(s) {unknown}; valid keys are freqs, scale, transform")
        transform = data.get("transform")
        return cls(data["freqs"], data.get("scale"), None if transform is None else PositionTransform(**transform))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Frequencies):
            return NotImplemented
        same_scale = (self.scale is None and other.scale is None) or (
            self.scale is not None and other.scale is not None and torch.equal(self.scale, other.scale)
        )
        return torch.equal(self.freqs, other.freqs) and same_scale and self.transform == other.transform

    __hash__ = None
