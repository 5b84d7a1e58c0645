"""Angles without float64: whole turns in int64 fixed point, so a device without float64 keeps the precision.

The float64 path computes ``angle = pos * f`` as one exactly rounded float64 product (error
``|angle| 2**-53``) and takes its cos and sin in float64. Apple's MPS and several NPUs have no
float64, and a plain float32 product is off by ``|angle| 2**-24``: 0.06 rad a million positions
out. Here the frequency of each plane is held as ``W = frac(f / 2 pi) * 2**48``, the fraction of a
turn it advances per unit position, in int64 (:func:`fixed_turns`, on the host, once). For an
integer position ``p`` the angle modulo a full turn is then ``p W mod 2**48``, computed exactly in
int64 from 24-bit limbs (no product exceeds ``2**49``, so nothing overflows); only ``W``'s rounding,
``2**-49`` turns per position, is an error: ``p 2**-49 * 2 pi`` rad, 1.1e-8 rad at ``p = 10**6``
and 1.1e-5 rad at ``10**9``. The reduced angle, in ``[-pi, pi)``, goes to float32 (within half an
ulp of ``pi``, 1.2e-7 rad) and cos and sin are float32, so the tables are within a few float32 ulps
of the float64 path's.

A fractional position ``p = n + r`` (``n = floor(p)``, ``0 <= r < 1``, exact in float32) adds
``r f`` in float32 to the exact turn of ``n``: an error of ``|r f| 2**-24`` rad, below 6e-8 rad for
``f <= 1`` (every unscaled spectrum with ``theta >= 1``). Integer dtypes up to ``2**48`` are exact.
"""

from __future__ import annotations

import math

import torch

__all__ = ["TURN_BITS", "fixed_turns", "turn_angles"]

TURN_BITS = 48  # a turn is 2**48 units
_LIMB = 24  # positions and turns in 24-bit limbs: every limb product stays below 2**48
_TWO_PI = 2 * math.pi


def fixed_turns(freqs: torch.Tensor) -> torch.Tensor:
    """``F`` -> int64 ``frac(F / 2 pi) * 2**48``, same shape. From float64 (on the host) the turns are exact to
    ``2**-49``; a float32 ``F`` (a time-dependent ``F(t)`` computed on a device without float64) gives them
    to its own 24 bits."""
    w = freqs / _TWO_PI  # turns per unit position, in F's dtype
    frac = w - torch.floor(w)  # [0, 1): whole turns do not change an integer position's angle
    return torch.round(frac * 2.0**TURN_BITS).to(torch.int64) % (1 << TURN_BITS)  # round(x) may reach 2**48


def _limbs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``x = hi * 2**24 + lo`` with ``0 <= lo < 2**24`` (``hi`` negative for negative ``x``)."""
    return x >> _LIMB, x & ((1 << _LIMB) - 1)


def turn_angles(pos: torch.Tensor, freqs: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotation angle of every plane, reduced to ``[-pi, pi)``, in float32 (no float64 anywhere).

    Args:
        pos: ``[..., S, R]`` coordinates (float32, or integers below ``2**48``).
        freqs: ``F`` float32 ``[R, n]`` or per head ``[H, R, n]``: the fractional positions' term.
        turns: :func:`fixed_turns` of the same ``F``, int64, same shape.

    Returns:
        float32 ``[..., S, n]`` (per head ``[..., S, H, n]``), as :func:`~axial_rope.ops.rope_angles`.
    """
    per_head = turns.ndim == 3
    if pos.is_floating_point():
        whole = torch.floor(pos)
        frac, whole = pos - whole, whole.to(torch.int64)  # pos - floor(pos): exact in float32
    else:
        frac, whole = None, pos.to(torch.int64)
    p_hi, p_lo = _limbs(whole)  # [..., S, R]
    w_hi, w_lo = _limbs(turns)  # [(H,) R, n], w_hi < 2**24
    mask, low = (1 << TURN_BITS) - 1, (1 << _LIMB) - 1
    acc = None
    for a in range(turns.shape[-2]):  # one axis (row of F) at a time: [..., S, (H,) n] at most
        shape = (..., None, None) if per_head else (..., None)
        hi, lo = p_hi[..., a][shape], p_lo[..., a][shape]
        wh, wl = (w_hi[:, a], w_lo[:, a]) if per_head else (w_hi[a], w_lo[a])
        # p W mod 2**48 = lo*wl + ((lo*wh + hi*wl) mod 2**24) * 2**24   (hi*wh * 2**48 vanishes)
        term = lo * wl + (((lo * wh + hi * wl) & low) << _LIMB)
        acc = term if acc is None else acc + term
    acc = acc & mask  # the whole positions' turn, in 2**-48 of a turn
    signed = acc - ((acc >> (TURN_BITS - 1)) << TURN_BITS)  # [-2**47, 2**47): [-pi, pi)
    angle = signed.to(torch.float32) * (_TWO_PI / 2.0**TURN_BITS)
    if frac is None:
        return angle
    f = freqs.to(torch.float32)
    fractional = torch.einsum("...sr,hrn->...shn", frac, f) if per_head else frac @ f
    angle = angle + fractional
    return angle - _TWO_PI * torch.round(angle / _TWO_PI)  # back into [-pi, pi]
