"""A study's declared primary family, Holm-corrected on its own; every other comparison exploratory (BH).

A pre-registered design (docs/experiments/design.md) names its primary contrasts before any run. Holm's
step-down correction runs over exactly those, and a declared contrast the page could not test (its cells not
run, one seed) counts with p = 1, so the family never shrinks to what happened to finish. Every other paired
comparison a page makes is exploratory: Benjamini-Hochberg over those alone, and marked so. A primary contrast
also carries its family-adjusted interval: the same seed-level interval at level ``1 - alpha / m``
(Bonferroni: simultaneous over the ``m`` contrasts, so conservative for Holm's test).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .seed_intervals import PairedTest, benjamini_hochberg, holm

__all__ = ["Contrast", "Corrected", "correct_declared"]

Key = tuple[str, str, str, str]  # (group, a, b, metric): the paired difference a - b of metric in group


@dataclass(frozen=True)
class Contrast:
    """A declared contrast: ``a - b`` of ``metric`` at ``group`` (a size), answering ``question``."""

    group: str
    a: str
    b: str
    metric: str
    question: str = ""

    @property
    def key(self) -> Key:
        return (self.group, self.a, self.b, self.metric)


@dataclass(frozen=True)
class Corrected:
    """One comparison after the correction: its raw and adjusted p-values, the method, whether it is primary."""

    p_value: float
    adjusted: float
    method: str  # "holm" (the declared family) or "bh" (exploratory)
    primary: bool

    def significant(self, alpha: float = 0.05) -> bool:
        return self.adjusted < alpha


def correct_declared(tests: Mapping[Key, PairedTest], family: Sequence[Contrast]) -> dict[Key, Corrected]:
    """``{key: Corrected}``: Holm over the declared ``family`` (a contrast without a test, or with an undefined
    p-value, counts as p = 1), Benjamini-Hochberg over every other test in ``tests``. A comparison made in both
    directions (``a - b`` and ``b - a``: the same test) is one comparison, named in its first direction (or the
    declared one)."""
    keys = [c.key for c in family]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the declared family names a contrast twice: {keys}")

    def p_of(key: Key) -> float:
        test = tests.get(key) or tests.get((key[0], key[2], key[1], key[3]))
        return 1.0 if test is None or math.isnan(test.p_value) else float(test.p_value)

    primary = [p_of(k) for k in keys]
    out = {k: Corrected(p, float(a), "holm", True) for k, p, a in zip(keys, primary, holm(primary) if keys else [])}
    declared = set(keys) | {(g, b, a, m) for g, a, b, m in keys}
    rest: dict[Key, float] = {}
    for (g, a, b, m), test in tests.items():
        if (g, a, b, m) in declared or (g, b, a, m) in rest or math.isnan(test.p_value):
            continue
        rest[(g, a, b, m)] = float(test.p_value)
    if rest:
        adjusted = benjamini_hochberg(list(rest.values()))
        out |= {k: Corrected(p, float(a), "bh", False) for (k, p), a in zip(rest.items(), adjusted)}
    return out
