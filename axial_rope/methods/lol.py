"""LoL's multi-head RoPE jitter (Cui et al. 2026, "LoL: Longer than Longer", arXiv 2601.16914): a base per head.

Streaming video generators keep the first frames as attention sinks. Far from them, RoPE's planes come back
into phase with the sinks together (the angles ``(t - t_sink) omega_j`` all near multiples of ``2 pi`` at once),
every head then attends to the sinks at the same frames, and the video snaps back to its start ("sink
collapse", at latent frames 132 and 201 in LongLive and Self-Forcing++). LoL gives each head its own RoPE base,
so the heads' planes stop re-aligning at the same frames; training-free, on all heads, strength about 0.8 in
the paper's ablation.

The paper's text was not reachable here (only summaries saying "perturbs the RoPE base per head" and the
strength), so this module fixes one reading and exposes the jitter itself: head ``h`` takes the base

    theta_h = theta * (1 + j_h)        on the jittered axes (the time axis by default)

and its frequencies ``theta_h ** (-2i / d)`` as any per-axis spectrum; :func:`lol_jitter` draws
``j_h = strength * u_h``, ``u_h`` uniform in ``[-1, 1]`` from a seeded generator. Any other draw is a tensor
passed as ``jitter``. The result is a fixed per-head ``F`` ``[H, R, n]`` (:class:`~axial_rope.Frequencies`), the
rotation contract's per-head frequencies: relative per head, and rolled by a cache with its own ``F``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..frequencies import Frequencies, per_axis
from ..rope import AxialRoPE

__all__ = ["lol_frequencies", "lol_jitter", "lol_rope", "phase_concentration", "sink_alignment"]


def lol_jitter(num_heads: int, strength: float = 0.8, *, seed: int = 0) -> torch.Tensor:
    """Relative base offsets ``j_h = strength * u_h``, ``u_h ~ U[-1, 1]`` from ``torch.Generator().manual_seed(seed)``:
    float64 ``[num_heads]`` on the CPU (the same for a seed on every machine). ``strength`` in ``[0, 1)`` keeps
    every base positive."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not 0 <= strength < 1:
        raise ValueError(f"strength must be a number in [0, 1) (bases theta (1 + j) stay positive), got {strength!r}")
    u = torch.rand(num_heads, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 - 1
    return strength * u


def lol_frequencies(
    axes_dim: int | Sequence[int],
    theta: float | Sequence[float],
    jitter: torch.Tensor,
    *,
    axes: Sequence[int] = (0,),
) -> Frequencies:
    """Per-head frequencies: head ``h`` has base ``theta_a (1 + jitter[h])`` on each axis ``a`` of ``axes``.

    Args:
        axes_dim: rotary channels per axis (as :class:`~axial_rope.AxialRoPE`'s, per-axis spectrum).
        theta: the base, one for all axes or one per axis.
        jitter: ``[H]`` relative offsets (:func:`lol_jitter`), each ``> -1``; ``H`` divides the query and key
            heads (grouped heads: one per key head).
        axes: the axes whose base is jittered (default ``(0,)``: the time axis of ``(t, y, x)``).

    Returns:
        :class:`~axial_rope.Frequencies` with ``F`` float64 ``[H, len(axes_dim), sum(axes_dim) / 2]``.
    """
    axes_dim = tuple(axes_dim) if isinstance(axes_dim, (tuple, list)) else (axes_dim,)
    thetas = per_axis("theta", theta, len(axes_dim))
    axes = tuple(axes)
    if not axes or any(isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(axes_dim) for a in axes):
        raise ValueError(f"axes must name axes of axes_dim {axes_dim}, got {axes!r}")
    if not isinstance(jitter, torch.Tensor) or jitter.ndim != 1 or jitter.numel() == 0:
        got = tuple(jitter.shape) if isinstance(jitter, torch.Tensor) else type(jitter).__name__
        raise ValueError(f"jitter must be a [num_heads] tensor of relative base offsets, got {got}")
    offsets = jitter.detach().to("cpu", torch.float64).tolist()
    if not all(math.isfinite(j) and j > -1 for j in offsets):
        raise ValueError(f"jitter must hold finite offsets > -1 (positive bases), got {offsets}")
    heads = [
        Frequencies.from_spectrum(axes_dim, tuple(th * (1 + j) if a in axes else th for a, th in enumerate(thetas)))
        for j in offsets
    ]
    return Frequencies.per_head(heads)


def lol_rope(
    axes_dim: int | Sequence[int],
    theta: float | Sequence[float] = 10000.0,
    num_heads: int | None = None,
    *,
    strength: float = 0.8,
    seed: int = 0,
    jitter: torch.Tensor | None = None,
    axes: Sequence[int] = (0,),
    pairing: str = "interleaved",
    backend: str | None = None,
) -> AxialRoPE:
    """An :class:`~axial_rope.AxialRoPE` with LoL's fixed per-head ``F`` (:func:`lol_frequencies`).

    Args:
        num_heads: heads with their own base (with ``strength`` and ``seed``: :func:`lol_jitter`); or pass ``jitter``.
        jitter: ``[H]`` relative offsets, instead of ``num_heads``/``strength``/``seed``.
        Others: as :func:`lol_frequencies` and :class:`~axial_rope.AxialRoPE`.
    """
    if (jitter is None) == (num_heads is None):
        raise ValueError("lol_rope takes num_heads (drawn jitter: strength, seed) or jitter, exactly one")
    if jitter is None:
        jitter = lol_jitter(num_heads, strength, seed=seed)
    frequencies = lol_frequencies(axes_dim, theta, jitter, axes=axes)
    return AxialRoPE.from_frequencies(frequencies, pairing, backend=backend)


def _axis_planes(freqs: torch.Tensor, axis: int) -> torch.Tensor:
    """The frequencies of the planes reading ``axis``: float64 ``[H, n_axis]`` from ``F`` ``[R, n]`` or ``[H, R, n]``."""
    if not isinstance(freqs, torch.Tensor) or freqs.ndim not in (2, 3):
        got = tuple(freqs.shape) if isinstance(freqs, torch.Tensor) else type(freqs).__name__
        raise ValueError(f"freqs must be F [R, n] or per head [H, R, n], got {got}")
    f = freqs.detach().to("cpu", torch.float64)
    f = f[None] if f.ndim == 2 else f  # [H, R, n]
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < f.shape[1]:
        raise ValueError(f"axis must name one of F's {f.shape[1]} axes, got {axis!r}")
    reads = (f[:, axis] != 0).any(0)  # [n]: the planes turning with this axis (every head's layout alike)
    if not bool(reads.any()):
        raise ValueError(f"no plane of F turns with axis {axis}")
    return f[:, axis, reads]  # [H, n_axis]


def sink_alignment(freqs: torch.Tensor, delta: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """How far each head's planes are back in phase with the sinks ``delta`` steps away on ``axis``.

    ``a_h(delta) = mean_j cos(delta F[h, axis, j])`` over the planes turning with ``axis``: 1 when every plane of
    head ``h`` has turned a whole number of times since the sink (a query there meets the sink keys as it met them
    at distance 0), near 0 when the planes' phases spread. The reason LoL gives for sink collapse is that with one
    base every head returns to 1 at the same frames.

    Args:
        freqs: ``F`` ``[R, n]`` (shared by the heads: one row) or per head ``[H, R, n]`` (``rope.freqs``).
        delta: distances from the sink positions ``[T]`` (frames on the time axis).
        axis: the axis whose planes are read (default 0, time in ``(t, y, x)``).

    Returns:
        float64 ``[T, H]`` on the CPU.
    """
    f = _axis_planes(freqs, axis)
    d = torch.as_tensor(delta).detach().to("cpu", torch.float64).reshape(-1)
    return torch.cos(d[:, None, None] * f[None]).mean(-1)  # [T, H]


def phase_concentration(freqs: torch.Tensor, delta: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """How much the heads' phases agree ``delta`` steps from the sinks: ``mean_j |mean_h exp(i delta F[h, axis, j])|``.

    The mean resultant length of the heads' angles per plane, averaged over the planes of ``axis``: 1 for heads
    sharing ``F`` (every head turns alike, so they collapse onto the sinks together), falling with the distance
    when each head has its own base (LoL's jitter). Arguments as :func:`sink_alignment`.

    Returns:
        float64 ``[T]`` on the CPU.
    """
    f = _axis_planes(freqs, axis)
    d = torch.as_tensor(delta).detach().to("cpu", torch.float64).reshape(-1)
    angle = d[:, None, None] * f[None]  # [T, H, n_axis]
    resultant = torch.complex(torch.cos(angle).mean(1), torch.sin(angle).mean(1)).abs()  # [T, n_axis]
    return resultant.mean(-1)
