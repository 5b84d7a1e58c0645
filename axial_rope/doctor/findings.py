"""The doctor's vocabulary: the classes of finding, each with what it means, and one finding with its evidence."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["CLASSES", "Finding", "finite"]

# class -> what it means (the report's legend, and the columns of the confusion table in docs/doctor.md)
CLASSES: dict[str, str] = {
    "scaling_not_applied": "the config asks for a frequency scaling (rope_parameters) that the tables do not carry",
    "attention_factor": "the tables' amplitude (the scaling's attention factor) differs from the config's",
    "wrong_pairing": "q and k are rotated over other channel pairs than the model type's convention",
    "positions_ignored": "the tables follow other positions than those passed (offsets or per-sample values lost)",
    "partial_rotary_width": "another number of channels rotates than the config's partial rotary width",
    "mrope_sections": "M-RoPE planes follow other position axes (sections) than the config assigns",
    "wrong_theta": "the frequencies are another base's (rope_theta) spectrum",
    "low_precision_angles": "the angles are computed in a precision that loses the position (error at the length)",
    "autocast_collapse": "the tables lose their precision under torch.autocast (computed in the autocast dtype)",
    "unexplained_layout": "a frequency layout that no known convention explains (the nearest one is named)",
}
SEVERITIES = ("alarm", "note")


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found, with the numbers that triggered it.

    Attributes:
        kind: a key of :data:`CLASSES`.
        site: where it was seen (a module name, with the pass).
        message: one sentence a person can act on.
        evidence: the numbers (JSON-able: floats, ints, strings, lists of them).
        severity: ``"alarm"`` (the rotation differs from the records) or ``"note"`` (worth knowing, not wrong).
    """

    kind: str
    site: str
    message: str
    evidence: dict = field(default_factory=dict)
    severity: str = "alarm"

    def __post_init__(self):
        if self.kind not in CLASSES:
            raise ValueError(f"Finding kind must be one of {sorted(CLASSES)}, got {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "severity": self.severity, "site": self.site, "message": self.message,
                "evidence": self.evidence}  # fmt: skip

    def __str__(self) -> str:
        numbers = ", ".join(f"{k}={_short(v)}" for k, v in self.evidence.items())
        return f"[{self.severity}] {self.kind} at {self.site}: {self.message}" + (f" ({numbers})" if numbers else "")


def finite(value):
    """``value`` (nested dicts, lists) with infinities and NaNs as ``None``: strict JSON (an error that has no
    finite value, a plane that never turns)."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return "[" + ", ".join(_short(v) for v in value[:8]) + ", ...]"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)
