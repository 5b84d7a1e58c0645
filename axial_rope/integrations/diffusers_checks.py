"""The checks of ``set_rope_processors``' arguments against a family record: a scaling that fits the model's axes
(and can act on them), a mode and ``train_size`` the family can size by. Each refusal names the argument, the family
and why."""

from __future__ import annotations

from ..conventions import DiffusersFamily
from ..conventions.tables import Sizing
from ..positions import POSITION_MODES
from ..scaling import RIFLEx
from .diffusers_policy import axis_names

__all__ = ["checked_scaling", "checked_sizing"]


def checked_scaling(family: DiffusersFamily, rope, scaling, name: str, widths: tuple[int, ...] | None = None):
    """``rope`` with ``scaling`` (one method, or one per axis), or a ``ValueError`` naming the family and the axis.

    ``widths``: the channels of each position column where one may have none (the rope then turns by the others
    only): a per-axis ``scaling`` names every column, and one of width 0 must be ``None`` (nothing turns by it)."""
    words = axis_names(family, rope.n_axes if widths is None else len(widths))
    kept = tuple(range(len(words))) if widths is None else tuple(a for a, d in enumerate(widths) if d)
    if widths is not None and isinstance(scaling, (list, tuple)):
        if len(scaling) != len(widths):
            raise ValueError(f"{name} ({family.name}: axes {words}): scaling needs one method (or None) per axis "
                             f"({len(widths)}), got {len(scaling)}")  # fmt: skip
        for a, d in enumerate(widths):
            if not d and scaling[a] is not None:
                raise ValueError(
                    f"{name} ({family.name}): axis {a} ({words[a]}) has no channels (widths {widths}): nothing turns "
                    f"by it, so the scaling {scaling[a]!r} cannot act there; pass None for it"
                )
        scaling = tuple(scaling[a] for a in kept)
    try:
        methods = rope.per_axis_scaling(scaling)
    except ValueError as err:
        raise ValueError(f"{name} ({family.name}: axes {words}): {err}") from err
    for a, method in zip(kept, methods):
        if isinstance(method, RIFLEx) and family.time_axis != a:
            what = "has no time axis" if family.time_axis is None else f"has its time on axis {family.time_axis}"
            raise ValueError(
                f"{name} ({family.name}) {what}: RIFLEx (a temporal method) cannot scale its axis {a} ({words[a]})"
            )
    try:
        return rope.with_scaling(scaling)
    except ValueError as err:
        raise ValueError(f"{name} ({family.name}: axes {words}): {err}") from err


def checked_sizing(family: DiffusersFamily, mode, train_size, scaling) -> Sizing | None:
    """The per-forward sizing of ``mode`` and ``train_size``, checked; ``None`` without ``mode``."""
    if mode is None:
        if train_size is not None:
            raise ValueError("train_size goes with mode (how to size positions against it)")
        return None
    if scaling is not None:
        raise ValueError("pass either scaling (fixed per-axis methods) or mode (sized per forward), not both")
    n_axes = len(family.grid_axes)
    if not n_axes:
        raise ValueError(
            f"{family.name}'s positions are coordinates its pipeline computes, not a token grid that mode could size: "
            "pass scaling (per-axis methods) instead"
        )
    modes = (mode,) * n_axes if isinstance(mode, str) else tuple(mode)
    if len(modes) != n_axes or any(m not in POSITION_MODES for m in modes):
        raise ValueError(f"mode must be one of {POSITION_MODES} or one per grid axis ({n_axes}), got {mode!r}")
    for m in modes:
        why = dict(family.refused_modes).get(m)
        if why is not None:
            raise ValueError(f"{family.name} refuses mode {m!r}: {why}")
    if family.grid_axes != tuple(range(n_axes)) and "normalize" in modes:  # an id axis (text, index) stays
        raise ValueError(
            f"{family.name} refuses mode 'normalize': it would centre the image grid while the rows outside it "
            "(text, other images) keep their ids on the same axes; use 'interpolate', 'ntk' or 'yarn'"
        )
    refused = ("ntk", "yarn") if not family.spectrum else ("yarn",) if not family.amplitude else ()
    if set(modes) & set(refused):
        why = "has no per-axis spectrum to scale" if not family.spectrum else "takes angles (no attention factor)"
        raise ValueError(f"{family.name} {why}: mode {mode!r} is refused; use 'interpolate', 'none' or 'normalize'")
    axes = {3: "(t, y, x)", 2: "(y, x)"}.get(n_axes, "(t)" if family.time_axis in family.grid_axes else "(axis)")
    sizes = None if train_size is None or isinstance(train_size, (str, bytes)) else tuple(train_size)
    if (
        sizes is None
        or len(sizes) != n_axes
        or any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in sizes)
    ):
        raise ValueError(
            f"mode needs train_size, the training token grid {axes}: {n_axes} positive ints, got {train_size!r}"
        )
    return Sizing(sizes, modes)
