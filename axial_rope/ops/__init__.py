"""``apply_rope`` and the dispatcher that sends every rotation to one backend.

Backends (:mod:`axial_rope.ops.backend` lists them): ``"reference"`` (complex-number
oracle), ``"torch"`` (fast real arithmetic, any device) and ``"triton"`` (fused GPU
kernels, when importable). The choice is the ``backend`` argument, else the
environment variable ``AXIAL_ROPE_BACKEND`` (read at every call), else automatic.

The dispatcher alone decides. It describes each request as a
:class:`~axial_rope.ops.backend.Call` (operation, device, dtype, which inputs need a
gradient, in place or not) and asks the backend's ``supports``: an explicit choice that
cannot serve the call raises ``RuntimeError`` with the backend's reason; the automatic
choice takes the first capable backend of the registry for the device (triton, then
torch) and falls back quietly. ``inplace=True`` with a gradient to record runs out of
place and copies the result back, so autograd records the copy.

Every rope-like object describes its rotation as a :class:`~axial_rope.ops.rotation.Rotation`
(positions, ``F``, attention factor, pairing: tensors only) and rotates through :func:`rotate`
or :func:`norm_rotate`; :func:`rotation_tables` turns one into cos/sin tables. Queries and keys
turned differently are a :class:`~axial_rope.ops.rotation.QKRotation` (a rotation each), which
:func:`rotate` and :func:`norm_rotate` take in place of one ``Rotation``.
"""

from __future__ import annotations

import os

import torch

from . import backend as backends
from ._common import (
    FLOAT_DTYPES,
    LAYOUTS,
    PAIRINGS,
    channel_table,
    check_choice,
    check_grouped_heads,
    check_head_tables,
    check_inplace,
    check_qk,
    check_table_pair,
    check_tensor,
    compute_dtype,
    has_float64,
    head_axis,
    plane_cos_sin,
    plane_table,
    qk_norm,
    rms_norm,
    rope_angles,
    seq_dim,
    table_for_layout,
)
from .backend import Backend, Call, load
from .norm import QKNorm, check_norm
from .rotation import QKRotation, Rotation, check_qk_rotation

__all__ = [
    "apply_rope", "norm_apply_rope", "rotate", "norm_rotate", "rotation_tables", "rotate_qk", "norm_rotate_qk",
    "Rotation", "QKRotation", "QKNorm", "select_backend", "preload", "BACKENDS", "ENV_VAR",
    # what the floors above share (ops/_common.py): choices, checks, layouts, tables, angles, norms
    "PAIRINGS", "LAYOUTS", "FLOAT_DTYPES", "check_choice", "check_tensor", "check_qk", "check_grouped_heads",
    "check_table_pair", "check_head_tables", "check_inplace", "seq_dim", "head_axis", "compute_dtype", "has_float64",
    "plane_table", "channel_table", "table_for_layout", "rope_angles", "plane_cos_sin", "rms_norm", "qk_norm",
]  # fmt: skip

BACKENDS = tuple(backends.REGISTRY)  # the built-in names (the registry may grow)
ENV_VAR = "AXIAL_ROPE_BACKEND"


def preload(*, triton: bool | None = None) -> None:
    """Import the backends now, so that code compiled later finds them.

    ``triton=None`` loads it when CUDA is available or ``TRITON_INTERPRET=1`` is set.
    :class:`~axial_rope.AxialRoPE` calls this when constructed.
    """
    if triton is None:
        triton = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    for name in backends.REGISTRY:
        if name != "triton" or triton:
            load(name)


def select_backend(backend: str | None, call: Call) -> Backend:
    """The backend that will serve ``call`` (see the module docstring for the rules)."""
    name = backend if backend is not None else os.environ.get(ENV_VAR) or None
    if name is not None:
        source = "backend" if backend is not None else f"environment variable {ENV_VAR}"
        if name not in backends.REGISTRY:
            raise ValueError(f"{source} must be one of {tuple(backends.REGISTRY)}, got {name!r}")
        chosen, reason = load(name)
        if chosen is not None:
            reason = chosen.supports(call)
        if reason is not None:
            raise RuntimeError(f"backend {name!r} (from {source}) cannot run {call.op}: {reason}")
        return chosen
    for name, (_, devices) in backends.REGISTRY.items():
        if devices is None or call.device.type in devices:
            chosen, _ = load(name)
            if chosen is not None and chosen.supports(call) is None:
                return chosen
    raise RuntimeError(f"no backend can run {call}")  # torch serves every call; kept as a guard


def _grads(**tensors: torch.Tensor | None) -> frozenset[str]:
    """Names of the inputs whose gradient autograd will ask for."""
    if not torch.is_grad_enabled():
        return frozenset()
    return frozenset(name for name, t in tensors.items() if t is not None and t.requires_grad)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pairing: str = "interleaved",
    layout: str = "bshd",
    backend: str | None = None,
    *,
    inplace: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` by precomputed cos/sin tables (drop-in for other libraries' tables).

    Args:
        x: ``[B, S, H, D]`` (``layout="bshd"``) or ``[B, H, S, D]`` (``"bhsd"``).
        cos, sin: ``[S, r]`` or ``[B, S, r]``, ``r <= D`` even, in the pairing's channel
            layout (each plane's value in both of its channels, as diffusers, timm and
            transformers build them); only the first ``r`` channels are rotated. Per head:
            ``[S, H_t, r]`` or ``[B, S, H_t, r]`` (``B`` may be 1), ``H_t`` equal to x's heads or
            dividing them (grouped heads: head ``h`` turns by table head ``h // (H / H_t)``). A 3-D
            table is read by its shape against x; one that fits both readings differently is refused.
        pairing: ``"interleaved"`` (planes ``(2i, 2i+1)``) or ``"half"`` (``(i, i + r/2)``).
        backend: ``None`` (automatic), ``"reference"``, ``"torch"`` or ``"triton"``.
        inplace: write the result into ``x`` and return ``x``.

    Returns:
        The rotated tensor, same shape and dtype as ``x``.
    """
    check_choice("pairing", pairing, PAIRINGS)
    check_choice("layout", layout, LAYOUTS)
    check_tensor("x", x, 4)
    cos, sin = check_head_tables(cos, sin, x, layout)  # [B|1, S, H_t, r]
    per_head = cos.shape[2] > 1
    cos = table_for_layout(plane_table(cos, pairing), layout)
    sin = table_for_layout(plane_table(sin, pairing), layout)
    grads = _grads(x=x, cos=cos, sin=sin)
    if inplace:
        check_inplace(x=x)
    call = Call("rotate_table", x.device, x.dtype, grads, inplace and not grads, per_head=per_head)
    chosen = select_backend(backend, call)
    out = chosen.rotate_table(x, cos, sin, pairing, layout, inplace=call.inplace)
    return x.copy_(out) if inplace and grads else out


def norm_apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: QKNorm,
    pairing: str = "interleaved",
    layout: str = "bshd",
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm, then rotation of q and k by cos/sin tables: :func:`apply_rope` after ``norm``, fused where it can be.

    Every backend normalises in float32 and rotates the float32 result, so each output is rounded once
    (the Triton kernels read q and k once and write them once, forward and backward).

    Args:
        q, k: ``[B, S, H, D]`` (``layout="bshd"``) or ``[B, H, S, D]`` (``"bhsd"``); k may have fewer heads.
        cos, sin: channel tables as :func:`apply_rope` takes them, ``[S, r]`` or ``[B|1, S, r]``, or
            ``[B|1, S, 1, r]`` (Wan's); ``r <= D`` even. Gradients flow to them when they require one.
        norm: :class:`~axial_rope.ops.norm.QKNorm`: RMSNorm or LayerNorm, per head or across a token's heads,
            weights and biases (gradients flow to those that require one).
        pairing, backend: as :func:`apply_rope`.

    Returns:
        ``(q, k)`` normalised and rotated, shapes and dtypes of the inputs.
    """
    check_choice("pairing", pairing, PAIRINGS)
    check_qk(q, k, layout)
    if k.dtype != q.dtype:
        raise TypeError(f"q and k must have one dtype, got {q.dtype} and {k.dtype}")
    check_norm(norm, q, k, layout)
    tables = []
    for name, t in (("cos", cos), ("sin", sin)):
        if isinstance(t, torch.Tensor) and t.ndim == 4:  # [B|1, S, 1, r]: one table for every head
            if t.shape[2] != 1:
                raise ValueError(f"{name} of 4 dimensions must be [B|1, S, 1, r], got shape {tuple(t.shape)}")
            t = t[:, :, 0]
        tables.append(t)
    cos, sin = tables
    check_table_pair(cos, sin, q, layout)
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    cos = table_for_layout(plane_table(cos, pairing), layout)
    sin = table_for_layout(plane_table(sin, pairing), layout)
    grads = _grads(q=q, k=k, cos=cos, sin=sin, q_weight=norm.q_weight, k_weight=norm.k_weight, q_bias=norm.q_bias,
                   k_bias=norm.k_bias)  # fmt: skip
    call = Call("norm_rotate_table", q.device, q.dtype, grads)
    return select_backend(backend, call).norm_rotate_table(q, k, norm, cos, sin, pairing, layout)


def rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor | None,
    pos: torch.Tensor,
    freqs: torch.Tensor,
    scale: torch.Tensor | None,
    pairing: str,
    layout: str,
    backend: str | None = None,
    inplace: bool = False,
    *,
    key: Rotation | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Table-free entry used by :class:`~axial_rope.AxialRoPE`: rotate q and k by ``pos @ freqs``.

    Arguments are already checked: pos ``[B|1, S, n_axes]``, freqs ``[n_axes, n]`` or
    ``[H_F, n_axes, n]`` (per head, ``H_F`` dividing q's and k's heads), scale ``[n]`` float64 attention
    factor per plane or ``None``. ``key``: the keys' own rotation (:func:`rotate` with a
    :class:`~axial_rope.ops.rotation.QKRotation`); ``None``: k turns as q.

    ``inplace=True`` writes the results into q and k and returns them. Without a gradient
    to record, the backend rotates in place with no output allocation (triton: the
    mutating op ``axial_rope::rope_``, which ``torch.compile`` functionalises). Otherwise
    the rotation runs out of place and is copied back with ``copy_``, which autograd
    records (so a leaf that requires grad gets PyTorch's usual in-place error).
    """
    if key is not None:
        query = Rotation(pos, freqs, None if scale is None else scale, pairing)
        return rotate(q, k, QKRotation(query, key), layout, backend, inplace=inplace)
    grads = _grads(q=q, k=k, pos=pos, freqs=freqs, scale=scale)
    if inplace:
        check_inplace(q=q, k=k)
    call = Call("rotate_qk", q.device, q.dtype, grads, inplace and not grads, per_head=freqs.ndim == 3)
    chosen = select_backend(backend, call)
    q_out, k_out = chosen.rotate_qk(q, k, pos, freqs, scale, pairing, layout, inplace=call.inplace)
    if inplace and grads:
        return q.copy_(q_out), (None if k is None else k.copy_(k_out))
    return q_out, k_out


def norm_rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    pos: torch.Tensor,
    freqs: torch.Tensor,
    scale: torch.Tensor | None,
    pairing: str,
    layout: str,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q and k (weights ``[D]``) followed by rotation, fused where the backend can.

    Every backend normalises in float32 and rotates the float32 result, so the output is
    rounded once.
    """
    grads = _grads(q=q, k=k, q_weight=q_weight, k_weight=k_weight, pos=pos, freqs=freqs, scale=scale)
    call = Call("norm_rotate_qk", q.device, q.dtype, grads, per_head=freqs.ndim == 3)
    chosen = select_backend(backend, call)
    return chosen.norm_rotate_qk(q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout)


def rotation_tables(rotation: Rotation, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Plane tables ``scale * cos(angle)``, ``scale * sin(angle)`` of a rotation: ``[B|1, S, n]`` (per-head ``F``:
    ``[B|1, S, H, n]``) in ``dtype``, from float64 angles, rounded once."""
    return plane_cos_sin(rotation.pos, rotation.freqs, rotation.attention_factor, dtype, rotation.turns)


def _by_tables(x: torch.Tensor, tables, rotation: Rotation, layout: str, backend, inplace: bool) -> torch.Tensor:
    cos, sin = (table_for_layout(t, layout) for t in tables)
    grads = _grads(x=x, cos=cos, sin=sin)
    per_head = cos.shape[head_axis(layout)] > 1
    call = Call("rotate_table", x.device, x.dtype, grads, inplace and not grads, per_head=per_head)
    out = select_backend(backend, call).rotate_table(x, cos, sin, rotation.pairing, layout, inplace=call.inplace)
    return x.copy_(out) if inplace and grads else out


def rotate(
    q: torch.Tensor,
    k: torch.Tensor | None,
    rotation: Rotation | QKRotation,
    layout: str = "bshd",
    backend: str | None = None,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k (or q alone, ``k=None``) by ``rotation``: the one entry every rope-like object calls.

    Arguments are checked by the caller (:class:`~axial_rope.rotary.Rotary`): q ``[B, S, H, D]``
    (``bshd``) or ``[B, H, S, D]`` (``bhsd``), k the same with ``H_k`` dividing ``H``; ``rotation.pos``
    ``[B|1, S, R]``. A per-token attention factor is an amplitude no per-plane kernel takes, and
    fixed-point turns (devices without float64) are angles no backend computes, so those rotations go
    through cos/sin tables computed once here (from float64 angles times the factor, or from the turns)
    and :func:`apply_rope`'s operation on the same backends.

    A :class:`~axial_rope.ops.rotation.QKRotation` turns q by ``rotation.query`` and k by ``rotation.key``:
    each tensor through its own call of the operation above (on Triton, one launch each way per tensor
    instead of one for both; q and k are still each read and written once).
    """
    if isinstance(rotation, QKRotation):
        check_qk_rotation(rotation)
        if inplace:
            check_inplace(q=q, k=k)
        q_out = rotate(q, None, rotation.query, layout, backend, inplace=inplace)[0]
        if k is None:
            return q_out, None
        return q_out, rotate(k, None, rotation.key, layout, backend, inplace=inplace)[0]
    if rotation.per_token_factor or rotation.turns is not None:
        if inplace:
            check_inplace(q=q, k=k)
        tables = rotation_tables(rotation, torch.float32 if q.dtype != torch.float64 else torch.float64)
        q_out = _by_tables(q, tables, rotation, layout, backend, inplace)
        return q_out, (None if k is None else _by_tables(k, tables, rotation, layout, backend, inplace))
    pos, freqs, scale, pairing, _ = rotation
    return rotate_qk(q, k, pos, freqs, scale, pairing, layout, backend, inplace)


def norm_rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    rotation: Rotation | QKRotation,
    layout: str = "bshd",
    backend: str | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q and k (weights ``[D]`` or ``None``), then :func:`rotate`; rounded to the input dtype once.

    The fused kernels turn q and k by one angle; a per-token factor, fixed-point turns or a
    :class:`~axial_rope.ops.rotation.QKRotation` normalise in float32 (a fresh tensor), rotate that by
    :func:`rotate` and round once.
    """
    if isinstance(rotation, QKRotation):
        check_qk_rotation(rotation)
        q_out = rotate(rms_norm(q, q_weight, eps), None, rotation.query, layout, backend)[0]
        k_out = rotate(rms_norm(k, k_weight, eps), None, rotation.key, layout, backend)[0]
        return q_out.to(q.dtype), k_out.to(k.dtype)
    if rotation.per_token_factor or rotation.turns is not None:  # tables computed once for q and k
        tables = rotation_tables(rotation, torch.float32 if q.dtype != torch.float64 else torch.float64)
        out = (_by_tables(rms_norm(x, w, eps), tables, rotation, layout, backend, False) for x, w in
               ((q, q_weight), (k, k_weight)))  # fmt: skip
        q_out, k_out = out
        return q_out.to(q.dtype), k_out.to(k.dtype)
    pos, freqs, scale, pairing, _ = rotation
    return norm_rotate_qk(q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout, backend)


preload(triton=False)
