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

__all__ = ["batch_timesteps", "check_fields"]


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
    t = torch.as_tensor(t, device=device)
    if not t.is_floating_point():
        t = t.float()
    if t.numel() == 1:
        return t.reshape(1).expand(batch)
    if tuple(t.shape) != (batch,):
        raise ValueError(f"timesteps must be one value or [B] = [{batch}], got shape {tuple(t.shape)}")
    return t
