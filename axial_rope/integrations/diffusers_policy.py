"""The automatic policy (:mod:`axial_rope.policy`) on a diffusers family: its record's trained grid and pipeline
units give the axes to plan, the decision table plans them, and the plan becomes what ``set_rope_processors``
installs (a ``mode`` per grid axis sized against the trained grid, and RIFLEx on a video's time axis)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..conventions import DiffusersFamily, PipelineUnits
from ..policy import POLICIES, AxisPlan, Plan, plan
from ..scaling import Scaling

__all__ = ["FamilyPlan", "axis_names", "plan_family"]


def axis_names(family: DiffusersFamily, n_axes: int) -> tuple[str, ...]:
    """The names of a family's rope axes, for messages and plans (``t``, ``y``, ``x``; Flux's ``index``)."""
    if n_axes == 1 and family.time_axis == 0:
        return ("t",)
    if n_axes == 3 and family.time_axis == 0:
        return ("t", "y", "x")
    if n_axes == 3 and family.grid_axes == (1, 2):
        return ("index", "y", "x")
    return ("y", "x") if n_axes == 2 else tuple(f"axis {a}" for a in range(n_axes))


@dataclass(frozen=True)
class FamilyPlan:
    """What ``policy="auto"`` installs on a family, and why (``str()`` prints it).

    Attributes:
        family: the family's name.
        plan: the per-axis :class:`~axial_rope.policy.Plan` over the grid axes.
        train_size: the trained token grid planned against (the records' largest extent per grid axis, or the
            caller's ``train_size``).
        scaling: one method or ``None`` per rope axis, installed with the plan's modes (RIFLEx on time), or
            ``None``: none.
        applied: ``False`` where an explicit ``scaling=`` / ``mode=`` overrode the plan (shown, not installed).
        source: where ``train_size`` comes from.
    """

    family: str
    plan: Plan
    train_size: tuple[int, ...]
    scaling: tuple[Scaling | None, ...] | None
    applied: bool = True
    source: str = ""

    @property
    def modes(self) -> tuple[str, ...]:
        return self.plan.modes

    def to_dict(self) -> dict:
        return {"family": self.family, "train_size": list(self.train_size), "applied": self.applied,
                "source": self.source, **self.plan.to_dict()}  # fmt: skip

    def __str__(self) -> str:
        head = f"policy 'auto' for {self.family}, trained grid {self.train_size} ({self.source})"
        if not self.applied:
            head += "\n(not applied: an explicit scaling= or mode= was given and overrides it)"
        return f"{head}\n{self.plan}"


def _tokens(family: DiffusersFamily, size, what: str, units: PipelineUnits | None = None) -> tuple[int, ...]:
    """A pipeline size (pixels, frames; tokens for a one-axis latent) -> the token grid of the grid axes, in ``units``
    (default the record's: the released model's VAE and patch)."""
    units = family.units if units is None else units
    n = 1 if units.pixels is None else 3 if units.frames is not None else 2
    shape = {1: "(tokens,)", 2: "(height, width) in pixels", 3: "(frames, height, width)"}[n]
    values = tuple(size) if isinstance(size, (list, tuple)) else size
    ok = isinstance(values, tuple) and len(values) in ((n, 3) if n == 2 else (n,))
    if not ok or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
        raise ValueError(f"{what} must be {shape} for {family.name}: positive ints, got {size!r}")
    tokens = units.tokens(values)
    if len(tokens) != len(family.grid_axes) or min(tokens) <= 0:
        raise ValueError(
            f"{what} {size!r} gives the token grid {tokens} on {family.name}, which sizes {len(family.grid_axes)} grid "
            "axes with at least one token each: pass a larger size, or train_size and size in tokens via mode="
        )
    return tokens


def _trained(family: DiffusersFamily, train_size) -> tuple[tuple[int, ...], str]:
    """The trained token grid per grid axis: ``train_size`` (tokens), else the records' largest extent per axis."""
    n = len(family.grid_axes)
    if train_size is not None:
        values = tuple(train_size) if isinstance(train_size, (list, tuple)) else train_size
        if not isinstance(values, tuple) or len(values) != n or any(
            not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values
        ):
            raise ValueError(f"train_size must be the trained token grid: {n} positive ints, got {train_size!r}")
        return values, "train_size given"
    if not family.trained:
        raise ValueError(
            f"policy 'auto' needs {family.name}'s training size, which its record does not hold (no source states "
            f"it: axial_rope.conventions.trained_table()); pass train_size=, the trained token grid ({n} ints)"
        )
    grids = [_tokens(family, t.size, f"the record's training size of {t.checkpoint}") for t in family.trained]
    extent = tuple(max(g[a] for g in grids) for a in range(n))
    return extent, "largest of " + ", ".join(t.checkpoint for t in family.trained)


def plan_family(family: DiffusersFamily, rope, *, policy, size=None, train_size=None, explicit: bool = False,
                columns: int | None = None, units: PipelineUnits | None = None) -> FamilyPlan:  # fmt: skip
    """The plan of ``policy`` for ``family`` (whose unscaled rope is ``rope``; ``columns`` position columns where some
    have no channels, else the rope's axes) at the pipeline ``size`` (in ``units``: default the record's).

    Raises:
        ValueError: an unknown policy; a family whose positions are not a token grid (nothing to size); no training
            size known and no ``train_size``; a malformed ``size``; a factor past the decision table's limit.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be None or one of {POLICIES}, got {policy!r}")
    if not family.grid_axes:
        raise ValueError(
            f"{family.name}'s positions are coordinates its pipeline computes, not a token grid the policy could "
            "plan: pass scaling= (one method per axis) yourself"
        )
    trained, source = _trained(family, train_size)
    target = None if size is None else _tokens(family, size, "size", units)
    kinds, names = grid_axes(family, rope.n_axes if columns is None else columns)
    spectrum = family.spectrum and rope.spectrum == "per_axis"
    planned = plan(kinds, trained, target, names=names, spectrum=spectrum, policy=policy)
    scaling = None
    if "riflex" in planned.modes or any(a.choice == "riflex" for a in planned.axes):
        t = family.time_axis
        try:
            riflex = planned.riflex(rope.axes_dim[t], rope.theta[t])
        except ValueError:  # every time plane turns within the trained frames: no unseen angle to rein in
            axes = tuple(_turns_within(a) if a.choice == "riflex" else a for a in planned.axes)
            planned, riflex = Plan(axes), None
        if riflex is not None:
            scaling = tuple(riflex if a == t else None for a in range(rope.n_axes))
    return FamilyPlan(family.name, planned, trained, scaling, applied=not explicit, source=source)


def _turns_within(axis: AxisPlan) -> AxisPlan:
    why = ("every time plane completes a turn within the trained frames, so longer clips see no unseen angle and "
           "RIFLEx has no intrinsic frequency to rein in: the trained positions")  # fmt: skip
    return replace(axis, choice="none", reason=why, evidence=axis.evidence[:1])


def grid_axes(family: DiffusersFamily, n_columns: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The kind (``"space"``, ``"time"``, ``"sequence"``: a one-axis audio latent) and name of each grid axis."""
    names = axis_names(family, n_columns)
    audio = family.units.pixels is None
    kinds = tuple("sequence" if audio else "time" if g == family.time_axis else "space" for g in family.grid_axes)
    return kinds, tuple(names[g] for g in family.grid_axes)


def _targets(kinds: tuple[str, ...], extent: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The token grids the docs table plans for: every spatial axis doubled, the last one alone doubled (a 1:2 canvas
    of the trained height), time doubled; a one-axis latent: its length doubled."""
    grow = lambda axes: tuple(2 * n if a in axes else n for a, n in enumerate(extent))  # noqa: E731
    space = [a for a, k in enumerate(kinds) if k == "space"]
    out = {"2x sides": grow(space or [0])}
    if len(space) > 1:
        out["1:2 wider"] = grow(space[-1:])
    if "time" in kinds:
        out["2x frames"] = grow([kinds.index("time")])
    return out


def _cell(kinds, names, extent, target, spectrum: bool) -> str:
    try:
        planned = plan(kinds, extent, target, names=names, spectrum=spectrum)
    except ValueError:
        return "refused (no evidence)"
    moved = [a for a in planned.axes if a.target != a.trained]
    return ", ".join(f"{a.axis} {a.choice}" for a in moved)


def policy_table() -> str:
    """The markdown table of what ``policy="auto"`` plans per family (``docs/integrations.md``), from the records
    and the decision table: the trained token grid (largest extent per axis over the recorded checkpoints) and, for
    three targets in tokens, each grown axis' choice (``content``: interpolated by the growth the spatial axes
    share, unit spacing beyond it; ``riflex``: RIFLEx on time where the axis has an intrinsic frequency)."""
    import warnings

    from ..conventions import DIFFUSERS
    from ..policy import PolicyWarning

    rows = ["| family | trained grid (tokens) | 2x sides | 1:2 wider | 2x frames |", "|---|---|---|---|---|"]
    for name in sorted({f.name for f in DIFFUSERS.values()}):
        family = next(f for f in DIFFUSERS.values() if f.name == name)
        if not family.scalable:
            rows.append(f"| {name} | served unscaled only (its fixed tables) | - | - | - |")
            continue
        if not family.grid_axes or not family.trained:
            why = "no token grid: pass scaling=" if not family.grid_axes else "not recorded: pass train_size="
            rows.append(f"| {name} | {why} | - | - | - |")
            continue
        extent, _ = _trained(family, None)
        kinds, names = grid_axes(family, max(family.grid_axes) + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PolicyWarning)
            cells = {what: _cell(kinds, names, extent, t, family.spectrum) for what, t in _targets(kinds, extent).items()}
        rows.append(f"| {name} | {extent} | {cells.get('2x sides', '-')} | {cells.get('1:2 wider', '-')} | "
                    f"{cells.get('2x frames', '-')} |")  # fmt: skip
    return "\n".join(rows) + "\n"
