"""A line per paper: its claim, what a page measured that bears on it, agree / disagree / not shown / not tested.

One place for the paper table of every experiment page and of the guide (docs/scaling.md). The claims are
here (:data:`PAPERS`); what each page measured comes from its published json, through the page's own
intervals (:mod:`models.studies.paper_findings` reads them), so a page regenerated from its json gets the same
table. A :class:`Finding` holds one or more paired differences with the direction the paper's claim predicts;
its verdict follows their intervals (:func:`verdict_of`):

- **agree**: every interval that excludes 0 lies on the predicted side (at least one does);
- **disagree**: every one that excludes 0 lies on the other side;
- **mixed**: some on each side;
- **not shown**: no interval excludes 0 (at this many seeds the data cannot tell);
- **not tested**: the page has no measurement of it (a cell not run, or one seed: no seed-level interval).

Each finding says why its verdict is plausible at this scale (tiny models, minutes of CPU training).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .bootstrap import Interval

__all__ = ["PAPERS", "Finding", "Measurement", "Paper", "guide_lines", "section_lines", "verdict_of"]


@dataclass(frozen=True)
class Paper:
    name: str
    cite: str
    claim: str


PAPERS = {
    p.name: p
    for p in (
        Paper("PI", "Chen et al. 2023, arXiv:2306.15595",
              "interpolating positions into the trained range beats extrapolating them past it, and a short fine-tune "
              "under interpolation (1000 steps) adapts better than one under extrapolated positions"),
        Paper("NTK-aware", "bloc97 2023 (r/LocalLLaMA, 'NTK-Aware Scaled RoPE'); FiT's VisionNTK",
              "raising the base theta extends the context without fine-tuning, with less damage than plain positions "
              "or interpolation"),
        Paper("YaRN", "Peng et al. 2023, arXiv:2309.00071",
              "YaRN's ramp (high frequencies kept, low ones interpolated) with its attention temperature beats PI and "
              "NTK without fine-tuning and after it; the temperature itself lowers the loss"),
        Paper("Llama 3", "Dubey et al. 2024, arXiv:2407.21783 (its RoPE scaling rule)",
              "scaling the low frequencies by the factor and keeping the high ones extends the context (with "
              "continued training there)"),
        Paper("Dual Chunk Attention", "An et al. 2024, arXiv:2402.17463",
              "chunked attention with positions inside the trained range keeps the loss flat far past the context, "
              "training-free"),
        Paper("ALiBi", "Press et al. 2022, arXiv:2108.12409",
              "trained short, a linear distance bias keeps the loss flat past the training length, where rotary "
              "and sinusoidal positions degrade"),
        Paper("NoPE", "Kazemnejad et al. 2023, arXiv:2305.19466",
              "a decoder without positional encoding length-generalises better than RoPE, ALiBi and T5's bias"),
        Paper("StreamingLLM", "Xiao et al. 2024, arXiv:2309.17453",
              "window attention collapses once the first tokens leave the cache; keeping 4 of them as attention "
              "sinks restores the loss"),
        Paper("RIFLEx", "Zhao et al. 2025, arXiv:2502.15894",
              "reining in the intrinsic frequency to under one period over the generated frames removes repetition "
              "at 2x frames training-free, where interpolation slows the motion and NTK keeps repeating"),
        Paper("DyPE", "Issachar et al. 2025, arXiv:2510.20766",
              "a scaling that relaxes with the sampling time (Dy-YaRN) beats static YaRN beyond the trained "
              "resolution, training-free"),
        Paper("FiT", "Lu et al. 2024, arXiv:2402.12376; FiTv2, arXiv:2410.13925",
              "at 1.25x and at 1:2 and 1:3 aspects, VisionNTK and VisionYaRN beat plain extrapolation and PI (which "
              "degrades sharply), and training on native mixed resolutions generalises beyond fixed-size training"),
        Paper("Diffusion Forcing", "Chen et al. 2024, arXiv:2407.01392",
              "a causal model trained with a noise level per frame rolls out past its training horizon more stably "
              "than full-sequence diffusion"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Measurement:
    """One paired difference a page measured: what it is, its interval (``None``: not measured), the predicted sign."""

    what: str  # e.g. "YaRN - interpolation, loss on grown scenes at 2x"
    interval: Interval | None
    expects: str  # "lower" or "higher": the sign of the difference the paper's claim predicts
    digits: int = 3

    def text(self) -> str:
        return f"{self.what}: {'not run' if self.interval is None else self.interval.format(self.digits)}"


@dataclass(frozen=True)
class Finding:
    """What one page says about one paper: its measurements and why the verdict is plausible at this scale."""

    paper: str
    measurements: tuple[Measurement, ...]
    why: dict[str, str] = field(default_factory=dict)  # verdict -> reason, "*": for any verdict
    note: str = ""  # a figure the page shows without a paired difference (e.g. a pass rate)

    @property
    def verdict(self) -> str:
        return verdict_of(self.measurements)


def verdict_of(measurements) -> str:
    """``agree`` / ``disagree`` / ``mixed`` / ``not shown`` / ``not tested`` from the intervals (module docstring)."""
    signs = []
    for m in measurements:
        if m.interval is None:
            continue
        side = "higher" if m.interval.low > 0 else "lower" if m.interval.high < 0 else None
        signs.append(None if side is None else side == m.expects)
    if not signs:
        return "not tested"
    if True in signs and False in signs:
        return "mixed"
    return "agree" if True in signs else "disagree" if False in signs else "not shown"


def _cell(text: str) -> str:
    return text.replace("|", "/")


def section_lines(page: str, findings: list[Finding]) -> list[str]:
    """The page's section "Where the papers and this page agree": a row per paper of :data:`PAPERS` (those this
    page does not measure in one closing line, with the pages that do in the guide)."""
    tested = {f.paper: f for f in findings}
    lines = [
        "## Where the papers and this page agree",
        "",
        "Each paper's claim against this page's paired differences (seed-level 95% intervals, uncorrected: a verdict"
        " is a reading of the intervals, not a test): *agree* when every interval that excludes 0 lies on the side"
        " the claim predicts, *disagree* when on the other, *mixed* when both, *not shown* when none excludes 0;"
        " models of about a million parameters trained for minutes (`models/studies/papers.py`).",
        "",
        "| paper | its claim | this page | verdict | why, at this scale |",
        "|---|---|---|---|---|",
    ]
    for name, paper in PAPERS.items():
        if name not in tested:
            continue
        f = tested[name]
        result = "; ".join(m.text() for m in f.measurements) + (f"; {f.note}" if f.note else "")
        lines.append(
            f"| {name} ({paper.cite}) | {_cell(paper.claim)} | {_cell(result)} | {f.verdict} |"
            f" {_cell(f.why.get(f.verdict, f.why.get('*', '')))} |"
        )
    untested = [n for n in PAPERS if n not in tested]
    if untested:
        lines += ["", f"Not tested on this page: {', '.join(untested)} (the guide's table says where they are)."]
    return lines + [""]


def guide_lines(findings_by_page: dict[str, list[Finding]]) -> list[str]:
    """The guide's paper table: per paper its claim and each page's verdict (linked), from the published json."""
    lines = ["| paper | its claim | what our pages found |", "|---|---|---|"]
    for name, paper in PAPERS.items():
        found = [
            f"[{page}](experiments/{page}.md#where-the-papers-and-this-page-agree): {f.verdict}"
            for page, findings in findings_by_page.items()
            for f in findings
            if f.paper == name
        ]
        lines.append(f"| {name} ({paper.cite}) | {_cell(paper.claim)} | {'; '.join(found) or 'not tested'} |")
    return lines
