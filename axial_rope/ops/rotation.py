"""The rotation contract: the one explicit description of a rotation that every rope-like object hands the backends.

A :class:`Rotation` is data only (tensors and one string), so ``torch.compile``, ``torch.export``
and the meta device see all of it: no state keyed on tensor identity, no cache, no module.
Plane ``j`` of every token turns by

    angle[..., s, (h,) j] = sum_a pos[..., s, a] * freqs[(h,) a, j]

and its two channels are multiplied by ``attention_factor`` after the turn.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Rotation"]


class Rotation(NamedTuple):
    """What to rotate by: positions, frequency matrix, attention factor and channel pairing.

    Attributes:
        pos: ``[B|1, S, R]`` coordinates, after any position map (float32, float64 or an integer dtype);
            ``R`` rows of ``freqs`` (the axes, or a packed sequence's block axes).
        freqs: ``F``, float64 (float32 when learned) ``[R, n]``, or per head ``[H, R, n]``.
        attention_factor: float64 ``[n]`` per plane or ``[B|1, S, n]`` per token, or ``None`` (1).
        pairing: ``"interleaved"`` (plane ``j`` = channels ``2j, 2j + 1``) or ``"half"`` (``j, j + n``).
        turns: on a device without float64 (or when asked), ``F`` as int64 fixed-point turns
            (:func:`axial_rope.ops.turns.fixed_turns`, same shape as ``freqs``, which is then float32):
            the angles are computed from them exactly, with no float64 tensor; ``None``: float64 angles.

    Channels past ``2n`` pass through unrotated.
    """

    pos: torch.Tensor
    freqs: torch.Tensor
    attention_factor: torch.Tensor | None
    pairing: str
    turns: torch.Tensor | None = None

    @property
    def n_pairs(self) -> int:
        return self.freqs.shape[-1]

    @property
    def per_token_factor(self) -> bool:
        """Whether the attention factor differs per token (``[B|1, S, n]``)."""
        return self.attention_factor is not None and self.attention_factor.ndim > 1

    def without_attention_factor(self) -> Rotation:
        """The same turn at unit amplitude (for callers that put the factor into the softmax scale)."""
        return self._replace(attention_factor=None)
