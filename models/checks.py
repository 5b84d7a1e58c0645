"""Checks of the reference models' configs and inputs: clear errors where wrong values would crash deep inside.

A config is checked when it is made (``__post_init__`` of each dataclass), so a wrong
type or a value out of range is a ``TypeError``/``ValueError`` naming the field, never an
arithmetic error in a layer or a model that silently computes something else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from axial_rope.attention import QK_NORMS
from axial_rope.time_scaling import is_time_dependent

__all__ = ["batch_timesteps", "check_fields", "check_labels", "check_time_range"]

# model timesteps within this of 0 or of the top of their range count as the end (float32 rounding:
# 1000 has an ulp of 6e-5, so a few roundings of t = 1000 * sigma land there)
T_ROUNDING = 1e-3


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fields(
    config,
    *,
    positive_ints: Sequence[str] = (),
    counts: Sequence[str] = (),
    positive_reals: Sequence[str] = (),
    probabilities: Sequence[str] = (),
    bools: Sequence[str] = (),
) -> None:
    """Type and range of each named field of ``config`` (a dataclass), and ``qk_norm`` if it has one."""
    name = type(config).__name__
    for field in (*positive_ints, *counts):
        value = getattr(config, field)
        if not _is_int(value):
            raise TypeError(f"{name}.{field} must be an int, got {value!r}")
        if value < (1 if field in positive_ints else 0):
            raise ValueError(f"{name}.{field} must be >= {1 if field in positive_ints else 0}, got {value!r}")
    for field in (*positive_reals, *probabilities):
        value = getattr(config, field)
        if not _is_real(value):
            raise TypeError(f"{name}.{field} must be a number, got {value!r}")
        if field in positive_reals and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}.{field} must be a finite number > 0, got {value!r}")
        if field in probabilities and not 0 <= value < 1:
            raise ValueError(f"{name}.{field} must be in [0, 1), got {value!r}")
    for field in bools:
        if not isinstance(getattr(config, field), bool):
            raise TypeError(f"{name}.{field} must be a bool, got {getattr(config, field)!r}")
    if getattr(config, "qk_norm", None) not in QK_NORMS:
        raise ValueError(f"{name}.qk_norm must be one of {QK_NORMS}, got {config.qk_norm!r}")
    if hasattr(config, "num_heads") and config.hidden_size % config.num_heads:
        raise ValueError(f"{name}: hidden_size {config.hidden_size} must be divisible by num_heads {config.num_heads}")


def batch_timesteps(t: torch.Tensor | float, batch: int, device: torch.device | None = None) -> torch.Tensor:
    """Timesteps as ``[batch]``: one value (a number, ``[]``, ``[1]``, ...) is every sample's; ``[batch]`` is kept.

    Any other shape is a ``ValueError`` (before, ``[B, 1]`` or a scalar tensor failed deep in the
    adaLN modulation with a broadcasting error, or broadcast into the wrong shape). Integer
    timesteps become float32; floating ones keep their dtype.
    """
    if isinstance(t, bool) or not isinstance(t, (int, float, torch.Tensor)):
        raise TypeError(f"t must be the timesteps, a number or a tensor [B] in [0, 1000], got {t!r}")
    t = torch.as_tensor(t, device=device)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"t must be the timesteps, real numbers in [0, 1000], got a {t.dtype} tensor")
    if not t.is_floating_point():
        t = t.float()
    if t.numel() == 1:
        return t.reshape(1).expand(batch)
    if tuple(t.shape) != (batch,):
        raise ValueError(f"timesteps must be one value or [B] = [{batch}], got shape {tuple(t.shape)}")
    return t


def _eager(x: torch.Tensor) -> bool:
    """Whether a check may read ``x`` on the host now: a CPU tensor outside a compiled region (else it asserts
    on the device, ``torch._assert_async``, with no sync)."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def check_time_range(t: torch.Tensor, top: float, scaling=None) -> None:
    """Model timesteps ``t [B]`` within ``[0, top]`` up to float rounding (:data:`T_ROUNDING`); NaN fails too.

    Checked only when ``scaling`` (a method, or one per axis) is time-dependent: it reads ``t / top`` as
    a noise level in ``[0, 1]``, and clamping a value outside would hide the caller's mistake.
    """
    methods = scaling if isinstance(scaling, (tuple, list)) else (scaling,)
    if not any(is_time_dependent(m) for m in methods):
        return
    t = t.detach()
    ok = ((t >= -T_ROUNDING) & (t <= top + T_ROUNDING)).all()
    if _eager(t):
        if not bool(ok):
            raise ValueError(
                f"t must be model timesteps in [0, {top:g}] (the noise level times {top:g}), got {t.tolist()[:8]}"
            )
    else:
        # a constant message: under torch.compile(dynamic=True) a number formatted into it may be symbolic
        torch._assert_async(ok, "t must be model timesteps in [0, T_SCALE] (the noise level times T_SCALE)")


def check_labels(y, embedder, batch: int) -> None:
    """Class labels ``y [batch]`` that ``embedder`` (a :class:`~axial_rope.layers.LabelEmbedder`) has rows for:
    ``0 .. num_classes - 1``, and its null label ``num_classes`` when it has one (label dropout)."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a tensor of class labels [B] = [{batch}], got {y!r}")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise TypeError(f"y must hold integer class labels, got {y.dtype}")
    if tuple(y.shape) != (batch,):
        raise ValueError(f"y must be one label per sample, [B] = [{batch}], got shape {tuple(y.shape)}")
    rows = embedder.embedding_table.num_embeddings  # num_classes, + 1 for the null label
    ok = ((y >= 0) & (y < rows)).all()
    n, null = embedder.num_classes, rows > embedder.num_classes
    expected = f"[0, {rows - 1}] ({n} classes" + (f"; {n}: the null label)" if null else ")")
    if _eager(y):
        if not bool(ok):
            bad = sorted({v for v in y.tolist() if not 0 <= v < rows})
            raise ValueError(f"y must hold class labels in {expected}, got {bad[:8]}")
    else:
        torch._assert_async(ok, f"y must hold class labels in {expected}")
