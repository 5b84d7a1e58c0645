"""Rope-like objects: one written contract, and the calls every one of them shares.

A rope-like object implements one method,

    rotation(pos, *, seq_len=None, t=None) -> Rotation

the explicit description of how the tokens at ``pos`` turn (:class:`~axial_rope.ops.rotation.Rotation`:
positions, ``F``, attention factor and pairing, tensors only), plus the attributes ``pairing``,
``n_axes``, ``rot_dim`` and ``backend``. :class:`Rotary` gives it every call on top of that,
written once: ``rope(q, k, pos)``, :meth:`~Rotary.rotate`, :meth:`~Rotary.norm_and_rotate` and
:meth:`~Rotary.cos_sin`, each handing the rotation to :func:`axial_rope.ops.rotate` (the backends).
The rope-like classes are :class:`~axial_rope.AxialRoPE`, its time-bound form
(``rope.at_time(t)``, :class:`~axial_rope.rope.TimedRoPE`) and the packed per-item
:class:`~axial_rope.packed_rope.PackedRoPE`; a test checks that each satisfies the contract.

Nothing here keeps state between calls: the same positions give the same rotation because it is
computed from them, which is what lets ``torch.compile`` and ``torch.export`` trace every call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ops import (
    channel_table,
    check_grouped_heads,
    check_qk,
    check_tensor,
    head_axis,
    norm_rotate,
    rotate,
    rotation_tables,
    seq_dim,
)
from .ops.rotation import QKRotation, Rotation, check_qk_rotation
from .position_checks import check_positions

__all__ = ["QKRotation", "Rotary", "Rotation", "as_positions", "check_rotation"]


def as_positions(pos: torch.Tensor, n_axes: int) -> torch.Tensor:
    """Checked coordinates as ``[B|1, S, n_axes]``, from ``[S, n_axes]``, ``[B, S, n_axes]`` (one axis: ``[S]`` too)."""
    if not isinstance(pos, torch.Tensor):
        raise TypeError(f"pos must be a torch.Tensor, got {type(pos).__name__}")
    check_positions(pos)
    if pos.ndim == 1 and n_axes == 1:
        pos = pos[:, None]
    if pos.ndim not in (2, 3) or pos.shape[-1] != n_axes:
        expected = "[S], [S, 1] or [B, S, 1]" if n_axes == 1 else f"[S, {n_axes}] or [B, S, {n_axes}]"
        raise ValueError(f"pos must be {expected} for {n_axes} axes, got shape {tuple(pos.shape)}")
    return pos if pos.ndim == 3 else pos[None]


def check_rotation(rotation: Rotation | QKRotation, q: torch.Tensor, k: torch.Tensor | None, layout: str) -> None:
    """A rotation must fit q and k: tokens, batch, rotated channels and (per-head ``F``) heads.

    A :class:`~axial_rope.ops.rotation.QKRotation` must fit q with its query side and k with its key side, and
    its key must turn the query's planes (:func:`~axial_rope.ops.rotation.check_qk_rotation`).
    """
    if isinstance(rotation, QKRotation):
        check_qk_rotation(rotation)
        _check_side(rotation.query, q, "q", "rotation.query", layout)
        if k is not None:
            _check_side(rotation.key, k, "k", "rotation.key", layout)
        return
    if not isinstance(rotation, Rotation):
        raise TypeError(f"rotation must be an axial_rope.ops.Rotation or QKRotation, got {type(rotation).__name__}")
    for name, x in (("q", q), ("k", k)):
        if x is not None:
            _check_side(rotation, x, name, "rotation", layout)


def _check_side(rotation: Rotation, x: torch.Tensor, name: str, field: str, layout: str) -> None:
    s = seq_dim(layout)
    tokens, batch = rotation.pos.shape[1], rotation.pos.shape[0]
    if tokens != x.shape[s]:
        raise ValueError(f"{field}: pos has {tokens} positions, {name} has S={x.shape[s]} tokens (layout={layout!r})")
    if batch not in (1, x.shape[0]):
        raise ValueError(f"{field}: pos batch {batch} must be 1 or {name}'s batch {x.shape[0]}")
    if x.shape[-1] < 2 * rotation.n_pairs:
        raise ValueError(
            f"{field}: {name}'s head_dim {x.shape[-1]} is smaller than rot_dim = {2 * rotation.n_pairs} "
            "(2 x the planes of F)"
        )
    if rotation.freqs.ndim == 3:
        check_grouped_heads("per-head frequencies", rotation.freqs.shape[0], name, x.shape[head_axis(layout)])


class Rotary:
    """The calls of a rope-like object, over its :meth:`rotation` (see the module docstring)."""

    pairing: str
    backend: str | None = None

    def rotation(
        self, pos: torch.Tensor, *, seq_len: int | Sequence[int] | None = None, t: float | torch.Tensor | None = None
    ) -> Rotation:
        """How the tokens at ``pos`` turn (``[S, n_axes]``, ``[B, S, n_axes]``; one axis: ``[S]``)."""
        raise NotImplementedError

    def _rotation_for(self, q, k, pos, layout, seq_len, t, with_attention_factor) -> Rotation:
        check_qk(q, k, layout)
        rotation = self.rotation(pos, seq_len=seq_len, t=t)
        check_rotation(rotation, q, k, layout)
        return rotation if with_attention_factor else rotation.without_attention_factor()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        pos: torch.Tensor,
        layout: str = "bshd",
        *,
        seq_len: int | Sequence[int] | None = None,
        t: float | torch.Tensor | None = None,
        backend: str | None = None,
        with_attention_factor: bool = True,
        inplace: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate queries and keys.

        Args:
            q: ``[B, S, H, D]`` (``layout="bshd"``) or ``[B, H, S, D]`` (``"bhsd"``).
            k: same layout, ``H_k`` heads dividing ``H`` (grouped-query attention), or ``None``.
            pos: ``[S, n_axes]`` or per-sample ``[B, S, n_axes]`` (1-D: ``[S]`` too).
            seq_len: length per axis for length-dependent scaling (default: ``max(pos) + 1``, read from
                the device: pass it under ``torch.compile``).
            t: sampling time of a time-dependent scaling (:mod:`axial_rope.time_scaling`): the noise
                level in ``[0, 1]`` (1 = pure noise), a number, a 0-d tensor or ``[B]`` equal entries; a
                tensor under ``torch.compile`` (a Python number would be a constant of the graph).
            backend: overrides the object's backend for this call.
            with_attention_factor: ``False`` rotates without the scaling's attention factor.
            inplace: write the results into ``q`` and ``k`` (no output allocation when no
                gradient is recorded; see :func:`axial_rope.ops.rotate_qk`).

        Returns:
            ``(q, k)`` rotated, same shapes and dtypes.
        """
        rotation = self._rotation_for(q, k, pos, layout, seq_len, t, with_attention_factor)
        return rotate(q, k, rotation, layout, backend or self.backend, inplace=inplace)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module it compiles, a submodule of a torch.fx GraphModule
        # included: the rotation (keyword-only arguments, dataclass records) is Python TorchScript cannot compile
        raise RuntimeError(
            f"{type(self).__name__} cannot be scripted with TorchScript (axial_rope's rotation is not scriptable); "
            "use torch.compile, torch.export or torch.fx (supported)"
        )

    def rotate(self, x: torch.Tensor, pos: torch.Tensor, layout: str = "bshd", **kwargs) -> torch.Tensor:
        """Rotate one tensor (queries or keys alone); same arguments as :meth:`forward`."""
        check_tensor("x", x, 4)
        return self.forward(x, None, pos, layout, **kwargs)[0]

    def norm_and_rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        pos: torch.Tensor,
        q_weight: torch.Tensor | None = None,
        k_weight: torch.Tensor | None = None,
        layout: str = "bshd",
        *,
        eps: float = 1e-6,
        seq_len: int | Sequence[int] | None = None,
        t: float | torch.Tensor | None = None,
        backend: str | None = None,
        with_attention_factor: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head QK-RMSNorm (weights ``[D]``, or ``None``) then rotation; one fused launch on Triton.

        Same arguments as :meth:`forward`; the norm runs over the whole head (``D``
        channels) in float32 and the result is rounded to the input dtype once.
        """
        if k is None:
            raise ValueError("norm_and_rotate needs k; use forward() for q alone")
        rotation = self._rotation_for(q, k, pos, layout, seq_len, t, with_attention_factor)
        for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
            if w is not None and tuple(w.shape) != (q.shape[-1],):
                raise ValueError(f"{name} must have shape [head_dim] = [{q.shape[-1]}], got {tuple(w.shape)}")
        return norm_rotate(q, k, q_weight, k_weight, rotation, layout, backend or self.backend, eps=eps)

    def cos_sin(
        self,
        pos: torch.Tensor,
        *,
        seq_len: int | Sequence[int] | None = None,
        t: float | torch.Tensor | None = None,
        with_attention_factor: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables in the pairing's channel layout, attention factor multiplied in.

        Args:
            pos: ``[S, n_axes]`` or ``[B, S, n_axes]`` (1-D RoPE: ``[S]`` too).
            with_attention_factor: multiply the scaling's attention factor in (``False``: unit rotation,
                for callers that put the factor into the softmax scale instead).

        Returns:
            float32 ``cos``, ``sin`` of shape ``[..., S, rot_dim]`` (``pos``'s leading dims);
            per-head frequencies give ``[..., S, H, rot_dim]``.
        """
        batched = isinstance(pos, torch.Tensor) and pos.ndim == 3
        rotation = self.rotation(pos, seq_len=seq_len, t=t)
        if not with_attention_factor:
            rotation = rotation.without_attention_factor()
        cos, sin = (channel_table(x, rotation.pairing) for x in rotation_tables(rotation, torch.float32))
        return (cos, sin) if batched else (cos[0], sin[0])
