"""The rotation contract: the one explicit description of a rotation that every rope-like object hands the backends.

A :class:`Rotation` is data only (tensors and one string), so ``torch.compile``, ``torch.export``
and the meta device see all of it: no state keyed on tensor identity, no cache, no module.
Plane ``j`` of every token turns by

    angle[..., s, (h,) j] = sum_a pos[..., s, a] * freqs[(h,) a, j]

and its two channels are multiplied by ``attention_factor`` after the turn. A per-head ``F``
``[H_F, R, n]`` turns head ``h`` of a tensor with ``H_x`` heads by ``F[h // (H_x / H_F)]``: ``H_F``
divides the heads of q and of k (grouped-query attention: ``H_F`` = k's heads gives each query head
the ``F`` of the key head it attends to).

Queries and keys may turn differently: a :class:`QKRotation` pairs the queries' rotation with the
keys' own, each a :class:`Rotation` (the one formula, twice).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["QKRotation", "Rotation", "check_qk_rotation"]


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


class QKRotation(NamedTuple):
    """Queries and keys turned by rotations of their own: ``q`` by ``query``, ``k`` by ``key``.

    Why a pair of :class:`Rotation` and not a key field on it: the formula stays written once, each side is a
    whole rotation (its own positions, ``F``, attention factor, turns), and every consumer that takes a
    ``Rotation`` takes either side unchanged (tables: ``rotation_tables(r.key)``; a cache roll: ``r.key``).
    The pair must agree on what a plane is: the same ``pairing``, the same ``R`` axes (rows of ``F``,
    columns of ``pos``) and the same ``n`` planes (:func:`check_qk_rotation`).

    *Groups of keys* need no more structure: ``pos`` ``[B|1, S, R]`` and ``attention_factor``
    ``[B|1, S, n]`` are per token, so one key rotation gives each group of key tokens its own rows. Examples
    (``r`` a shared rotation with a per-token factor ``a`` ``[B|1, S, n]``, or none):

    - damping the high-frequency planes of a reference image's keys only (Untwisting RoPE, arXiv 2602.05013):
      ``QKRotation(r, r._replace(attention_factor=a))`` with ``a`` below 1 on those tokens and planes;
    - keys placed on the query's stride (CRPA, arXiv 2511.19778): ``QKRotation(r, r._replace(pos=key_pos))``;
    - opposite per-token decays (xPos, Sun et al. 2023, arXiv 2212.10554):
      ``QKRotation(r._replace(attention_factor=z ** (pos / g)), r._replace(attention_factor=z ** (-pos / g)))``,
      with ``z`` ``[n]`` per plane and ``pos`` the token's position broadcast to ``[B|1, S, n]``.

    Groups whose ``F`` differ use block axes, as packed sequences do: ``F`` stacked ``[F_1; F_2]`` (``2R``
    rows), each group's positions in its own block and zeros in the other; the query takes the same ``2R``
    rows (its positions in the block of the ``F`` it uses).

    What stays relative (plane ``j``, query token ``m``, key token ``n``): the logit's plane term is
    ``a_q[m, j] a_k[n, j] Re(q_j conj(k_j) exp(i (angle_q[m, j] - angle_k[n, j])))``. Amplitudes alone leave the
    angle a function of ``pos_k[n] - pos_q[m]`` (the product of amplitudes scales the term: relative when it
    depends on ``n - m`` only, as xPos's ``z ** ((m - n) / g)``); other key positions make the angle relative
    to where the keys are placed; another key ``F`` leaves nothing relative.

    Attributes:
        query: the queries' rotation.
        key: the keys' rotation.
    """

    query: Rotation
    key: Rotation


def check_qk_rotation(rotation: QKRotation) -> None:
    """``TypeError``/``ValueError`` naming the field when the key rotation does not turn the query's planes: another
    pairing, another number of axes ``R`` or another number of planes ``n``. Shapes only (no host sync)."""
    for name, side in (("query", rotation.query), ("key", rotation.key)):
        if not isinstance(side, Rotation):
            raise TypeError(f"rotation.{name} must be an axial_rope.ops.Rotation, got {type(side).__name__}")
    query, key = rotation
    if key.pairing != query.pairing:
        raise ValueError(
            f"rotation.key.pairing {key.pairing!r} differs from rotation.query.pairing {query.pairing!r}: "
            "q and k must pair their channels into the same planes"
        )
    for name, side in (("query", query), ("key", key)):
        if side.pos.shape[-1] != side.freqs.shape[-2]:
            raise ValueError(
                f"rotation.{name}: pos has {side.pos.shape[-1]} axes (shape {tuple(side.pos.shape)}), freqs has "
                f"{side.freqs.shape[-2]} rows (shape {tuple(side.freqs.shape)}); expected one row of F per axis"
            )
    if key.freqs.shape[-2] != query.freqs.shape[-2]:
        raise ValueError(
            f"rotation.key has {key.freqs.shape[-2]} axes (freqs {tuple(key.freqs.shape)}), rotation.query has "
            f"{query.freqs.shape[-2]} (freqs {tuple(query.freqs.shape)}): expected the query's axes "
            "(groups with another F: block axes on both sides, see QKRotation)"
        )
    if key.n_pairs != query.n_pairs:
        raise ValueError(
            f"rotation.key turns n={key.n_pairs} planes (rot_dim {2 * key.n_pairs}), rotation.query "
            f"n={query.n_pairs} (rot_dim {2 * query.n_pairs}): expected the query's width"
        )
