"""The automatic choice of position scaling, per axis, for a size a model was not trained at.

One decision table (:data:`DECISIONS`), one row per kind of axis, each with the evidence it rests on: the
studies of this repository (``docs/experiments/``) and the papers whose claims they check. :func:`plan`
applies it to a model's trained token grid and a target grid and returns a :class:`Plan`: per axis what
was chosen and why, which a reader can print and an adapter installs (``plan.modes`` for a model whose
positions are sized per forward by :func:`axial_rope.positions_for_size`, ``plan.scaling(rope)`` for a
fixed per-axis scaling).

The rules, in words (the table holds their limits and citations):

- **space** (image y, x): ``"content"`` positions: interpolated by the growth every spatial axis shares, unit
  spacing for the extent one side gains beyond it. Inside the trained extent that is the trained positions;
  a square upscale is interpolation; a wider canvas of the trained height is plain positions.
- **time** (video frames, with a per-axis spectrum): the trained positions up to the trained frame count,
  RIFLEx beyond it (the intrinsic pair reined in to one period over the target frames); without a spectrum
  to rein in (learned frequencies), interpolation.
- **sequence** (a one-axis audio latent): the trained positions inside the trained length; beyond it no
  study or paper we reproduce supports a method, so the plan refuses rather than guesses.

A factor past a rule's evidence warns (:class:`PolicyWarning`) up to the rule's hard limit and raises
``ValueError`` beyond it; an explicit ``scaling=`` / ``mode=`` always overrides the policy.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from .scaling import RIFLEx, Scaling

__all__ = ["DECISIONS", "POLICIES", "AxisPlan", "Decision", "Plan", "PolicyWarning", "plan"]

POLICIES = ("auto",)
KINDS = ("space", "time", "sequence")


class PolicyWarning(UserWarning):
    """A planned factor lies past what the decision's evidence measured (but within its hard limit)."""


@dataclass(frozen=True)
class Decision:
    """One row of the decision table: what an axis of ``kind`` gets beyond its trained extent.

    Attributes:
        kind: ``"space"``, ``"time"`` or ``"sequence"``.
        choice: the position mode (``"content"``, ``"interpolate"``) or method (``"riflex"``) beyond the trained
            extent; ``None``: refused.
        measured: the largest factor the evidence covers; past it the plan warns.
        limit: the largest factor served at all; past it the plan raises ``ValueError``.
        why: the choice's reason, in one sentence.
        evidence: where the reason comes from (pages of this repository, papers).
    """

    kind: str
    choice: str | None
    measured: float
    limit: float
    why: str
    evidence: tuple[str, ...]


RESOLUTION = "docs/experiments/resolution.md"
FRAMES = "docs/experiments/frames.md"

DECISIONS: dict[str, Decision] = {
    "space": Decision(
        "space", "content", measured=3.0, limit=4.0,
        why="content that grows with the image is interpolated: on grown scenes interpolation had the lowest loss "
        "of the training-free arms at 1.5x, 2x and 3x and drew the conditioned class (accuracy 0.95, 0.91, 0.75 "
        "against 0.72, 0.42, 0.17 with plain positions)",
        evidence=(f"{RESOLUTION} (1.5x, 2x, 3x)", "Chen et al. 2023, arXiv:2306.15595 (position interpolation)",
                  "Issachar et al. 2025, DyPE, arXiv:2510.20766 (FLUX.1 at 4x: the hard limit here)"),
    ),  # fmt: skip
    "space aspect": Decision(
        "space", "content", measured=2.0, limit=3.0,
        why="the extent one side gains beyond the other keeps unit spacing: at 1:2 plain positions had the lowest "
        "loss, and interpolating the long side stretched objects to twice their width",
        evidence=(f"{RESOLUTION} (1:2)", "Lu et al. 2024, FiT, arXiv:2402.12376 (scores 1:2 and 1:3 from square)"),
    ),  # fmt: skip
    "time": Decision(
        "time", "riflex", measured=3.0, limit=3.0,
        why="RIFLEx reins in the intrinsic frequency so the video does not repeat: the paper extrapolates 2x "
        "training-free; in the frame study (8 -> 16, 24 frames) it removed most of the repetition with the "
        "lowest denoising loss (not significant after Holm) and slowed the motion less than interpolation",
        evidence=("Zhao et al. 2025, RIFLEx, arXiv:2502.15894 (2x training-free)", f"{FRAMES} (2x, 3x)"),
    ),  # fmt: skip
    "time without spectrum": Decision(
        "time", "interpolate", measured=3.0, limit=3.0,
        why="with learned frequencies there is no intrinsic pair for RIFLEx; interpolating time removed the most "
        "repetition in the frame study, at the cost of slower motion",
        evidence=(f"{FRAMES} (2x, 3x)",),
    ),  # fmt: skip
    "sequence": Decision(
        "sequence", None, measured=1.0, limit=1.0,
        why="no study of this repository and no paper it reproduces measures a one-axis audio latent beyond its "
        "trained length",
        evidence=(),
    ),
}


@dataclass(frozen=True)
class AxisPlan:
    """What the plan does on one axis, and why.

    Attributes:
        axis: its name (``"t"``, ``"y"``, ``"x"``, ...).
        kind: ``"space"``, ``"time"`` or ``"sequence"``.
        trained: tokens along it in training (the largest released grid's extent).
        target: tokens along it at the planned size, or ``None`` (no size given: the rule, not a number).
        choice: ``"none"`` (trained positions), ``"content"``, ``"interpolate"`` or ``"riflex"``.
        reason: one sentence.
        evidence: the rows of :data:`DECISIONS` it rests on.
        warning: set where the factor lies past the evidence.
    """

    axis: str
    kind: str
    trained: int
    target: int | None
    choice: str
    reason: str
    evidence: tuple[str, ...] = ()
    warning: str | None = None

    @property
    def factor(self) -> float | None:
        return None if self.target is None else self.target / self.trained


@dataclass(frozen=True)
class Plan:
    """The per-axis plan of :func:`plan`: printable, and installable as modes or as a fixed scaling."""

    axes: tuple[AxisPlan, ...]

    @property
    def modes(self) -> tuple[str, ...]:
        """One :data:`~axial_rope.POSITION_MODES` entry per axis (RIFLEx keeps the trained positions: ``"none"``)."""
        return tuple("none" if a.choice == "riflex" else a.choice for a in self.axes)

    @property
    def trained(self) -> tuple[int, ...]:
        return tuple(a.trained for a in self.axes)

    def riflex(self, axis_dim: int, theta: float) -> RIFLEx | None:
        """The RIFLEx of the time axis (``axis_dim`` channels, ``theta``), or ``None`` if the plan has none."""
        for a in self.axes:
            if a.choice == "riflex" and a.target is not None and a.target > a.trained:
                return RIFLEx(RIFLEx.intrinsic_k(axis_dim, theta, a.trained), a.target)
        return None

    def scaling(self) -> tuple[Scaling | None, ...]:
        """A fixed method per axis for the planned size (models whose positions are not a sized grid): the
        positions a mode would give, as the equivalent frequency scaling (``Linear`` for interpolation); RIFLEx
        is built by the caller, which knows the axis' spectrum (:meth:`riflex`)."""
        from .scaling import Linear

        content = [a.target / a.trained for a in self.axes if a.choice == "content" and a.target is not None]
        common = max(1.0, min(content)) if content else 1.0
        out = []
        for a in self.axes:
            grown = a.target is not None and a.target > a.trained
            factor = common if a.choice == "content" else a.target / a.trained if grown else 1.0
            out.append(Linear(factor) if a.choice in ("content", "interpolate") and factor > 1 else None)
        return tuple(out)

    def to_dict(self) -> dict:
        return {"axes": [{**a.__dict__, "factor": a.factor} for a in self.axes]}

    def __str__(self) -> str:
        rows = ["axis  kind      trained  target  factor  choice       why"]
        for a in self.axes:
            target = "-" if a.target is None else str(a.target)
            factor = "-" if a.factor is None else f"{a.factor:.2f}"
            rows.append(f"{a.axis:<5} {a.kind:<9} {a.trained:>7}  {target:>6}  {factor:>6}  {a.choice:<11}  {a.reason}")
            if a.warning:
                rows.append(f"{'':<5} warning: {a.warning}")
        return "\n".join(rows)


def _check_tokens(name: str, values, n: int) -> tuple[int, ...]:
    values = tuple(values) if isinstance(values, (list, tuple)) else values
    if not isinstance(values, tuple) or len(values) != n or any(
        not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values
    ):
        raise ValueError(f"{name} must be {n} positive ints (tokens per axis), got {values!r}")
    return values


def plan(
    kinds: tuple[str, ...],
    trained: tuple[int, ...],
    target: tuple[int, ...] | None = None,
    *,
    names: tuple[str, ...] | None = None,
    spectrum: bool = True,
    policy: str = "auto",
) -> Plan:
    """The plan of ``policy`` for a model trained at the token grid ``trained`` run at ``target``.

    Args:
        kinds: per axis ``"space"``, ``"time"`` or ``"sequence"``.
        trained: tokens per axis in training (positive ints).
        target: tokens per axis at the planned size, or ``None``: the plan of the rule (space axes sized per forward;
            time and sequence axes as trained, which no target can exceed then).
        names: the axes' names (default ``"axis 0"``, ...).
        spectrum: whether the time axis has a per-axis spectrum (RIFLEx needs one).
        policy: ``"auto"`` (the only one).

    Raises:
        ValueError: an unknown policy or kind, malformed sizes, or a factor past a decision's hard limit (the
            message names the axis, the factor, the limit and how to override the plan).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    n = len(kinds)
    if any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must each be one of {KINDS}, got {kinds!r}")
    trained = _check_tokens("trained", trained, n)
    if target is not None:
        target = _check_tokens("target", target, n)
    names = names or tuple(f"axis {a}" for a in range(n))
    space = [a for a in range(n) if kinds[a] == "space"]
    common = min((target[a] / trained[a] for a in space), default=1.0) if target is not None else 1.0
    common = max(common, 1.0)
    axes = []
    for a, kind in enumerate(kinds):
        t = None if target is None else target[a]
        factor = None if t is None else t / trained[a]
        if kind == "space":
            axes.append(_space_axis(names[a], trained[a], t, factor, common))
        elif factor is None or factor <= 1:
            inside = "inside the trained extent" if factor is not None else "no target size given"
            axes.append(AxisPlan(names[a], kind, trained[a], t, "none", f"{inside}: the trained positions"))
        else:
            row = DECISIONS["sequence" if kind == "sequence" else "time" if spectrum else "time without spectrum"]
            axes.append(_beyond(names[a], row, trained[a], t, factor))
    return Plan(tuple(axes))


def _space_axis(name: str, trained: int, target: int | None, factor: float | None, common: float) -> AxisPlan:
    """A spatial axis under the ``"content"`` rule: the growth shared by every spatial axis, then the extra."""
    row, aspect = DECISIONS["space"], DECISIONS["space aspect"]
    if factor is None:
        why = "sized per forward: positions interpolated by the growth the spatial axes share, plain beyond it"
        return AxisPlan(name, "space", trained, None, "content", why, row.evidence)
    if factor <= 1:
        return AxisPlan(name, "space", trained, target, "content", "inside the trained extent: the trained positions")
    extra = factor / common
    warning = None
    for rule, value, what in ((row, common, "shared growth"), (aspect, extra, "extra extent of this side")):
        if value > rule.limit + 1e-9:
            raise ValueError(
                f"policy 'auto': axis {name} grows {factor:.2f}x ({what} {value:.2f}x), past the {rule.limit:g}x the "
                f"evidence supports ({'; '.join(rule.evidence)}); pass scaling= or mode= to choose yourself"
            )
        if value > rule.measured + 1e-9:
            warning = f"{what} {value:.2f}x lies past the {rule.measured:g}x measured ({rule.evidence[0]})"
    parts = [f"interpolated by the shared growth {common:.2f}x: {row.why}"] if common > 1 else []
    if extra > 1 + 1e-9:
        parts.append(f"the extra {extra:.2f}x of this side: {aspect.why}")
    why = "; ".join(parts)
    evidence = (row.evidence if common > 1 else ()) + (aspect.evidence if extra > 1 + 1e-9 else ())
    _warn(name, warning)
    return AxisPlan(name, "space", trained, target, "content", why, evidence, warning)


def _beyond(name: str, row: Decision, trained: int, target: int, factor: float) -> AxisPlan:
    """A time or sequence axis past its trained extent: the row's choice, a warning past its evidence, or an error."""
    if row.choice is None or factor > row.limit + 1e-9:
        served = "nothing" if row.choice is None else f"at most {row.limit:g}x"
        raise ValueError(
            f"policy 'auto': axis {name} ({row.kind}) grows {factor:.2f}x ({trained} -> {target} tokens); the policy "
            f"serves {served} there: {row.why}; pass scaling= or mode= to choose yourself"
        )
    warning = None
    if factor > row.measured + 1e-9:
        warning = f"{factor:.2f}x lies past the {row.measured:g}x measured ({row.evidence[0]})"
        _warn(name, warning)
    why = f"{factor:.2f}x the trained extent: {row.why}"
    return AxisPlan(name, row.kind, trained, target, row.choice, why, row.evidence, warning)


def _warn(name: str, warning: str | None) -> None:
    if warning is not None:
        warnings.warn(f"policy 'auto', axis {name}: {warning}", PolicyWarning, stacklevel=4)
