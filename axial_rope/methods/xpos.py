"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554): opposite decays on q and k.

Plane ``i`` of ``n`` (head width ``D = 2n`` rotated channels) gets the base

    zeta_i = (i / (D/2) + gamma) / (1 + gamma)                     (gamma = 0.4 in the paper)

and a token at position ``p`` scales plane ``i`` of its query by ``zeta_i ** (p / scale_base)`` and of its key by
``zeta_i ** (-p / scale_base)`` (``scale_base`` = 512), on top of RoPE's turn. The logit term of query ``m``, key
``n`` is then scaled by ``zeta_i ** ((m - n) / scale_base)``: relative, and decaying with distance for ``m > n``
(the paper's Eq. for the "relative position embedding" ``ĝ``; torchscale's ``XPOS`` module builds the same
``zeta`` as ``(arange(0, D, 2) + gamma D) / ((1 + gamma) D)``).

In the rotation contract the two decays are per-token attention factors ``[B|1, S, n]`` of a
:class:`~axial_rope.ops.rotation.QKRotation`'s two sides. ``zeta ** (±p / scale_base)`` overflows in float32
for long sequences (plane 0 at ``p = 10**5``: ``0.29 ** 195``); a ``center`` subtracted from every position (the
same for every call of a stream, torchscale uses ``-(length // 2)``) keeps the exponents small and leaves the
logits unchanged.

A rolling KV cache is refused: its roll moves a kept key to a new position but keeps the amplitude written with
it, so the key's decay would stay at its written position and its logits drift by ``zeta ** (move / scale_base)``
(see ``axial_rope/cache.py``). The pair and its key side carry that refusal (``roll_refusal``), which
:meth:`axial_rope.KVCache.advance` raises.
"""

from __future__ import annotations

import math

import torch

from ..ops.rotation import QKRotation, Rotation

__all__ = ["XPosKey", "XPosRotation", "xpos_rotation", "xpos_zeta"]

_ROLL_REFUSAL = (
    "xPos keys carry a decay zeta ** (-p / scale_base) of the position p they were written at; a rolling cache "
    "moves kept keys without rescaling that amplitude, so their logits would be off by the decay of the move. "
    "Use a static cache (window=None) with xPos, or plain RoPE for a rolling one"
)


class XPosKey(Rotation):
    """The key side of an xPos pair: a :class:`~axial_rope.ops.rotation.Rotation` that refuses rolling caches."""

    __slots__ = ()

    @property
    def roll_refusal(self) -> str:
        """Why a rolling cache cannot hold these keys (raised by :meth:`axial_rope.KVCache.advance`)."""
        return _ROLL_REFUSAL


class XPosRotation(QKRotation):
    """An xPos :class:`~axial_rope.ops.rotation.QKRotation` (key side an :class:`XPosKey`): rolling caches refused."""

    __slots__ = ()

    @property
    def roll_refusal(self) -> str:
        """Why a rolling cache cannot hold these keys (raised by :meth:`axial_rope.KVCache.advance`)."""
        return _ROLL_REFUSAL


def xpos_zeta(n_pairs: int, gamma: float = 0.4) -> torch.Tensor:
    """xPos's per-plane base ``zeta_i = (i / n + gamma) / (1 + gamma)``, float64 ``[n]`` (``n = D / 2`` planes)."""
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs <= 0:
        raise ValueError(f"n_pairs must be a positive int, got {n_pairs!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma < math.inf:
        raise ValueError(f"gamma must be a finite number > 0, got {gamma!r}")
    i = torch.arange(n_pairs, dtype=torch.float64)
    return (i / n_pairs + gamma) / (1 + gamma)


def xpos_rotation(
    rotation: Rotation,
    *,
    gamma: float = 0.4,
    scale_base: float = 512.0,
    axis: int = 0,
    center: float = 0.0,
) -> XPosRotation:
    """Queries and keys turned by ``rotation`` and scaled by xPos's opposite decays.

    Args:
        rotation: the shared rotation (``rope.rotation(pos)``), ``pos`` ``[B|1, S, R]``.
        gamma: xPos's ``gamma`` (0.4 in the paper).
        scale_base: the positions' divisor in the exponent (512 in the paper).
        axis: the axis whose coordinate is the position ``p`` (the time axis; 0 for 1-D).
        center: subtracted from every position before the exponent (logits unchanged, exponents small).

    Returns:
        :class:`XPosRotation` ``(query, key)``: ``attention_factor`` ``[B|1, S, n]`` =
        rotation's factor ``* zeta ** (±(p - center) / scale_base)``, ``+`` on the queries.
    """
    if not isinstance(rotation, Rotation):
        raise TypeError(f"rotation must be an axial_rope.ops.Rotation, got {type(rotation).__name__}")
    if isinstance(scale_base, bool) or not isinstance(scale_base, (int, float)) or not 0 < scale_base < math.inf:
        raise ValueError(f"scale_base must be a finite number > 0, got {scale_base!r}")
    if isinstance(center, bool) or not isinstance(center, (int, float)) or not math.isfinite(center):
        raise ValueError(f"center must be a finite number, got {center!r}")
    n_axes = rotation.pos.shape[-1]
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < n_axes:
        raise ValueError(f"axis must be one of the rotation's {n_axes} axes, got {axis!r}")
    dtype = torch.float64 if rotation.turns is None else torch.float32  # no float64 where F goes by turns
    zeta = xpos_zeta(rotation.n_pairs, gamma).to(rotation.pos.device, dtype)  # [n]
    power = (rotation.pos[..., axis : axis + 1].to(dtype) - center) / scale_base  # [B|1, S, 1]
    own = 1.0 if rotation.attention_factor is None else rotation.attention_factor.to(dtype)
    query = rotation._replace(attention_factor=own * zeta**power)
    key = XPosKey(*rotation._replace(attention_factor=own * zeta ** (-power)))
    return XPosRotation(query, key)
