"""Untwisting RoPE (Mikaeili et al. 2026, arXiv 2602.05013): damp the high-frequency planes of chosen keys.

In shared attention a target image attends to a reference image's keys placed on the same grid; RoPE's
high-frequency planes then pull each query onto the reference token at its own position, and the target copies
the reference. The method scales the planes of the *reference keys only*: plane ``d`` (``d = 0`` the highest
frequency) by

    s_d = s_hf + (s_lf - s_hf) * d~ ** beta,        d~ = d / (D/2 - 1)

(the project page's formula, untwisting-rope.github.io), with ``s_hf < 1`` damping the high bands and
``s_lf > 1`` raising the low ones, and both scales raised linearly over the denoising steps (the page's
"Timestep Scheduling"): early steps lay out the image from low bands, later ones borrow finer style.

A per-plane amplitude on chosen key tokens is exactly a per-token attention factor on the key side of a
:class:`~axial_rope.ops.rotation.QKRotation`: the scale commutes with the plane's turn, so the angle stays
``(pos_k - pos_q) . F`` and only the reference keys' logit terms are scaled.

Where the page counts ``d`` over the head's ``D/2`` planes, a head with several axes (Flux's ``(t, y, x)``)
counts it within each modulated axis, from that axis' highest frequency down, as the ComfyUI ports do
(BigStationW/ComfyUi-Untwisting-RoPE, ruwwww/ComfyUI-Flux.2-Untwisting-RoPE ``flux_untwist/patches.py``); the
axes left alone keep scale 1. With one axis the two readings are the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..ops.rotation import QKRotation, Rotation
from ..time_scaling import sampling_time

__all__ = ["Untwisting", "frequency_bands"]


def frequency_bands(freqs: torch.Tensor, axes: Sequence[int] | None = None) -> torch.Tensor:
    """Each plane's place ``d~`` in its axis' spectrum: 0 for the axis' highest frequency, 1 for its lowest.

    Computed once, outside the forward (a host read of ``F``): plane ``j`` on axis ``a`` with ``n_a`` planes gets
    ``rank_a(j) / (n_a - 1)``, ``rank_a`` ordering the axis' planes by ``|F[a, j]|`` from the highest down (0 when
    the axis has one plane). Planes on other axes than ``axes``, and unrotated planes, get -1 (left alone).

    Args:
        freqs: a shared ``F`` ``[R, n]`` whose columns each read one axis (axial RoPE; ``rope.freqs``).
        axes: the axes whose planes are modulated (default: all).

    Returns:
        float64 ``[n]`` on the CPU.
    """
    if not isinstance(freqs, torch.Tensor) or freqs.ndim != 2:
        got = tuple(freqs.shape) if isinstance(freqs, torch.Tensor) else type(freqs).__name__
        raise ValueError(f"freqs must be a shared F [R, n] (per-head F has no single spectrum), got {got}")
    f = freqs.detach().to("cpu", torch.float64).abs()
    n_axes, n = f.shape
    axes = tuple(range(n_axes)) if axes is None else tuple(axes)
    if not axes or any(not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < n_axes for a in axes):
        raise ValueError(f"axes must name axes of F's {n_axes} rows, got {axes!r}")
    reads = f != 0  # [R, n]
    if bool((reads.sum(0) > 1).any()):
        raise ValueError("freqs mixes axes in a plane (several non-zeros in a column): its bands are not defined")
    bands = torch.full((n,), -1.0, dtype=torch.float64)
    for a in axes:
        planes = reads[a].nonzero().flatten()
        order = planes[torch.argsort(f[a, planes], descending=True, stable=True)]  # highest frequency first
        bands[order] = torch.arange(len(order), dtype=torch.float64) / max(len(order) - 1, 1)
    return bands


def _pair(name: str, value) -> tuple[float, float]:
    pair = value if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in pair):
        raise TypeError(f"Untwisting: {name} must be a number or a (first step, last step) pair, got {value!r}")
    if not all(math.isfinite(v) and v >= 0 for v in pair):
        raise ValueError(f"Untwisting: {name} must hold finite scales >= 0, got {value!r}")
    return float(pair[0]), float(pair[1])


@dataclass(frozen=True)
class Untwisting:
    """The frequency-aware modulation of reference keys, with its timestep schedule.

    Args:
        high: ``s_hf``, the scale of each modulated axis' highest-frequency plane: one number, or its value at
            the first and at the last denoising step (raised linearly between them).
        low: ``s_lf``, the scale of the lowest-frequency plane, likewise.
        beta: the exponent of the polynomial ramp from ``s_hf`` to ``s_lf`` across the spectrum (> 0).

    The defaults, ``s_hf`` 0.25 -> 0.75, ``s_lf`` 1.0 -> 1.4 and ``beta = 2``, are the Flux.2 ComfyUI port's
    (``flux_untwist/patches.py``); the paper's page shows ``s_lf`` between 0.6 and 1.5.
    """

    high: tuple[float, float] | float = (0.25, 0.75)
    low: tuple[float, float] | float = (1.0, 1.4)
    beta: float = 2.0

    def __post_init__(self):
        object.__setattr__(self, "high", _pair("high", self.high))
        object.__setattr__(self, "low", _pair("low", self.low))
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not 0 < self.beta < math.inf:
            raise ValueError(f"Untwisting: beta must be a finite number > 0, got {self.beta!r}")

    @property
    def scheduled(self) -> bool:
        """Whether the scales change over the denoising steps (then every call needs ``t``)."""
        return self.high[0] != self.high[1] or self.low[0] != self.low[1]

    def scale(self, bands: torch.Tensor, t: float | torch.Tensor | None = None) -> torch.Tensor:
        """``s_d`` per plane ``[n]`` at sampling time ``t``, 1 on the planes left alone.

        Args:
            bands: :func:`frequency_bands` of the rope's ``F`` ``[n]`` (on the device of the call).
            t: the noise level in ``[0, 1]`` (1 at the first denoising step, 0 at the last), a tensor under
                compile; needed when :attr:`scheduled`. The progress through the steps is ``1 - t``.

        Returns:
            ``bands``' dtype (float64; float32 on a device without it) ``[n]``.
        """
        if t is None:
            if self.scheduled:
                raise ValueError("Untwisting: high/low change over the steps; pass t (the noise level in [0, 1])")
            progress = torch.zeros((), dtype=bands.dtype, device=bands.device)
        else:
            progress = 1 - sampling_time(t, bands.device, bands.dtype)  # 0-d
        s_hf = self.high[0] + (self.high[1] - self.high[0]) * progress
        s_lf = self.low[0] + (self.low[1] - self.low[0]) * progress
        ramp = s_hf + (s_lf - s_hf) * bands.clamp(min=0) ** self.beta
        return torch.where(bands >= 0, ramp, torch.ones_like(ramp))

    def rotation(
        self,
        rotation: Rotation,
        reference: torch.Tensor,
        bands: torch.Tensor,
        t: float | torch.Tensor | None = None,
    ) -> QKRotation:
        """Queries turned by ``rotation``; keys by it too, with the reference keys' planes scaled by :meth:`scale`.

        Args:
            rotation: the shared rotation of the joint sequence (``rope.rotation(pos)``), ``S`` tokens.
            reference: bool ``[B|1, S]``, True on the reference image's key tokens (the keys that are copied).
            bands: :func:`frequency_bands` ``[n]`` of ``rotation.freqs``.
            t: the noise level (see :meth:`scale`).

        Returns:
            ``QKRotation(rotation, key)``: ``key.attention_factor`` ``[B|1, S, n]`` is the rotation's own factor
            times ``s_d`` on the reference tokens (times 1 elsewhere).
        """
        if not isinstance(rotation, Rotation):
            raise TypeError(f"rotation must be an axial_rope.ops.Rotation, got {type(rotation).__name__}")
        S, n = rotation.pos.shape[-2], rotation.n_pairs
        if (
            not isinstance(reference, torch.Tensor)
            or reference.dtype != torch.bool
            or reference.ndim != 2
            or reference.shape[1] != S
        ):
            got = f"{reference.dtype} {tuple(reference.shape)}" if isinstance(reference, torch.Tensor) else reference
            raise ValueError(f"reference must be a bool [B|1, S={S}] mask of the reference keys, got {got}")
        if not isinstance(bands, torch.Tensor) or bands.shape != (n,):
            got = tuple(bands.shape) if isinstance(bands, torch.Tensor) else type(bands).__name__
            raise ValueError(f"bands must be frequency_bands(F) with one entry per plane [{n}], got {got}")
        dtype = torch.float64 if rotation.turns is None else torch.float32  # no float64 where F goes by turns
        s = self.scale(bands.to(rotation.pos.device, dtype), t)  # [n]
        factor = torch.where(reference[..., None], s, torch.ones_like(s))  # [B|1, S, n]
        if rotation.attention_factor is not None:
            factor = factor * rotation.attention_factor.to(dtype)
        return QKRotation(rotation, rotation._replace(attention_factor=factor))
