"""The doctor's report: what was prescribed, what each site did, the findings, and the extrapolation map."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .diagnose import SiteSummary
from .findings import CLASSES, Finding, finite

__all__ = ["Report"]


def _describe(rope) -> str:
    """A rope in words: axes, theta, scaling, pairing, spectrum (or its frequency model)."""
    return f"AxialRoPE({rope.extra_repr()})"


@dataclass
class Report:
    """The result of :func:`axial_rope.doctor.doctor`: printable (``print(report)``), ``to_dict()`` for JSON.

    Attributes:
        model: the model's class name.
        source: ``"transformers"``, ``"diffusers"`` or ``"axial_rope"`` (a model of this library's layers).
        prescribed: the rope the records prescribe, in words, per site kind.
        sites: per site and pass, what it did (:class:`~axial_rope.doctor.diagnose.SiteSummary`).
        findings: alarms and notes, each with its evidence.
        map: the extrapolation map (:class:`~axial_rope.doctor.extrapolation.ExtrapolationMap`), or ``None``.
        notes: what the doctor could not check, and why.
    """

    model: str
    source: str
    prescribed: dict[str, str]
    sites: list[SiteSummary]
    findings: list[Finding]
    map: object | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def alarms(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "alarm"]

    @property
    def healthy(self) -> bool:
        """No alarm: every site rotates as the records say."""
        return not self.alarms

    def to_dict(self) -> dict:
        """JSON-able, strict JSON (an infinite error, from tables of another shape, is ``null``)."""
        return finite(
            {
                "model": self.model,
                "source": self.source,
                "healthy": self.healthy,
                "prescribed": self.prescribed,
                "sites": [s.to_dict() for s in self.sites],
                "findings": [f.to_dict() for f in self.findings],
                "map": None if self.map is None else self.map.to_dict(),
                "notes": list(self.notes),
            }
        )

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **({"indent": 2, "allow_nan": False} | kwargs))

    def picture(self, path: str) -> str:
        """Draw the extrapolation map (planes x wavelength against the trained extent, per axis) to ``path``."""
        if self.map is None:
            raise ValueError("this report has no extrapolation map (the doctor found no trained extent: pass "
                             "train_size=)")  # fmt: skip
        from .picture import draw

        return draw(self.map, path, title=self.model)

    def __str__(self) -> str:
        verdict = "healthy: every site rotates as its records say" if self.healthy else (
            f"{len(self.alarms)} alarm(s)")  # fmt: skip
        lines = [f"RoPE doctor: {self.model} ({self.source}) - {verdict}", "", "prescribed by the records:"]
        lines += [f"  {site}: {what}" for site, what in self.prescribed.items()]
        lines += ["", "sites (error: largest |observed - prescribed| of the site's tables; bound: a healthy float32 "
                  "table's):"]  # fmt: skip
        lines.append(f"  {'site':<44} {'pass':<8} {'calls':>5} {'layout':<12} {'width':>5} {'dtype':<9} "
                     f"{'error':>9} {'bound':>9} pairing")  # fmt: skip
        for s in self.sites:
            lines.append(
                f"  {s.site:<44} {'autocast' if s.autocast else 'plain':<8} {s.calls:>5} {s.layout:<12} "
                f"{'-' if s.width is None else s.width:>5} {s.dtype:<9} {s.error:>9.2e} {s.bound:>9.2e} "
                f"{s.pairing or '-'}"
            )
        lines += ["", "findings:" if self.findings else "findings: none"]
        for f in self.findings:
            lines.append(f"  {f}")
        kinds = sorted({f.kind for f in self.findings})
        if kinds:
            lines += ["", "legend:"] + [f"  {k}: {CLASSES[k]}" for k in kinds]
        if self.notes:
            lines += ["", "notes:"] + [f"  {n}" for n in self.notes]
        if self.map is not None:
            lines += ["", str(self.map)]
        return "\n".join(lines)
