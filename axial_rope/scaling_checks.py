"""Argument checks of the scaling methods (:mod:`axial_rope.scaling`, :mod:`axial_rope.time_scaling`).

Each raises with the method's name (``owner``) and the field's name, so a bad config fails where
it is made; ``docs/scaling.md`` lists the rules.
"""

from __future__ import annotations

import math
import operator

__all__ = ["as_floats", "as_int", "check_positive", "check_theta_above_one"]


def check_positive(owner: str, name: str, value: float, *, strict: bool = True) -> None:
    # abs(v) < inf refuses NaN and inf; unlike math.isfinite, torch.compile traces it on a number
    bad = not isinstance(value, (int, float)) or isinstance(value, bool) or not abs(value) < math.inf
    if bad or (value <= 0 if strict else value < 0):
        need = "a finite number > 0" if strict else "a finite number >= 0"
        raise ValueError(f"{owner}: {name} must be {need}, got {value!r}")


def as_int(owner: str, name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``: ints (numpy's too) and integral floats (``4096.0``, in some JSON) pass."""
    integral_float = isinstance(value, float) and value.is_integer()
    if isinstance(value, bool) or not (integral_float or hasattr(value, "__index__")):
        raise TypeError(f"{owner}: {name} must be an int, got {value!r}")
    number = int(value) if integral_float else operator.index(value)
    if number < minimum:
        raise ValueError(f"{owner}: {name} must be an int >= {minimum}, got {value!r}")
    return number


def as_floats(owner: str, name: str, value: object) -> tuple[float, ...]:
    """A list (JSON) or tuple of numbers > 0 as a tuple of floats (hashable, so the method stays a dict key)."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{owner}: {name} must be a list of numbers, got {value!r}")
    entries = tuple(value)  # once: an iterator would be spent by the check
    for entry in entries:
        check_positive(owner, f"every entry of {name}", entry)
    return tuple(float(entry) for entry in entries)


def check_theta_above_one(owner: str, theta: float, why: str) -> None:
    if theta <= 1:  # theta = 1: log(theta) = 0 and a flat spectrum; theta < 1: frequencies rise with the pair
        raise ValueError(f"{owner}: theta must be > 1 ({why}), got {theta!r}")
