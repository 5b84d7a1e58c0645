"""The extrapolation map: per axis, the planes a planned size turns further than training did, and what each
scaling does to them.

For a plane of frequency ``F`` on an axis trained over ``N`` tokens (``N * step`` in position units), relative
positions in training reach angle ``F * N * step``. A plane whose wavelength ``2 pi / F`` exceeds that extent
never completed a turn in training (YaRN, arXiv:2309.00071, sec. 3.2: the dimensions beyond the context "have
not seen" every rotation); at a planned extent ``M`` it reaches ``F * M * step``: angles no training step showed
it. Each method of :mod:`axial_rope.scaling` (and ``policy="auto"`` of :mod:`axial_rope.policy` where the axis
has a kind) changes ``F`` or the positions; the map counts, per method, the planes still turning past their
trained angle. Where q and k were captured, it adds the attention entropy at the planned length
(:mod:`axial_rope.doctor.attention`), and with ``sinks`` the per-head phase concentration against them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..policy import plan as policy_plan
from ..rope import AxialRoPE
from ..scaling import NTK, Linear, Scaling, YaRN
from .findings import Finding
from .observe import Observation, unit_roundoff

__all__ = ["ANGLE_TOLERANCE", "AxisMap", "ExtrapolationMap", "MapAxes", "build_map"]

# the angle error (rad) above which the doctor calls angles at the planned length imprecise: cos(0.1) = 0.995, a
# half-percent change of each plane's share of a logit, the size of the effects position scalings are judged by
ANGLE_TOLERANCE = 0.1


@dataclass(frozen=True)
class MapAxes:
    """What a site knows of its rope's axes: names, trained extent in tokens (``None``: unknown or not a sized
    axis), the policy's kind of each (``None``: no policy for it)."""

    names: tuple[str, ...]
    trained: tuple[int | None, ...]
    kinds: tuple[str | None, ...]
    spectrum: bool = True


@dataclass
class AxisMap:
    """One axis of the map.

    Attributes:
        name, trained, planned: the axis and its extents in tokens (``planned`` ``None`` without a size).
        step: position units per token along it (read off the positions the model was run at).
        wavelengths: per plane of the axis (in its plane order), ``2 pi / F`` in tokens (``inf`` for ``F = 0``).
        beyond: indices (into ``wavelengths``) of the planes whose wavelength exceeds the trained extent.
        methods: per method (``none``, ``interpolate``, ``ntk``, ``yarn``, the config's, ``auto``): its planes'
            wavelengths at the planned size (tokens, positions interpolation folded in) and ``unseen``, the count
            of planes turning past the largest angle they reached in training.
        entropy: per method, the attention entropy change (nats) from the trained to the planned extent, on the
            captured q and k; ``None``: not measured.
    """

    name: str
    trained: int
    planned: int | None
    step: float
    wavelengths: list[float]
    beyond: list[int]
    methods: dict[str, dict] = field(default_factory=dict)
    entropy: dict[str, float] | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ExtrapolationMap:
    """The map of every sized axis (:class:`AxisMap`), the sink concentration, and the findings it raised."""

    axes: list[AxisMap]
    sinks: dict | None = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"axes": [a.to_dict() for a in self.axes], "sinks": self.sinks, "notes": list(self.notes)}

    def __str__(self) -> str:
        lines = ["extrapolation map (wavelengths in tokens; unseen: planes turning past their trained angle):"]
        for a in self.axes:
            planned = "-" if a.planned is None else str(a.planned)
            lines.append(f"  axis {a.name}: trained {a.trained}, planned {planned}, {len(a.wavelengths)} planes, "
                         f"{len(a.beyond)} with a wavelength beyond the trained extent "
                         f"(longest {_tokens(max(a.wavelengths, default=0.0))})")  # fmt: skip
            for method, info in a.methods.items():
                entropy = "" if not a.entropy or method not in a.entropy else f", entropy {a.entropy[method]:+.3f} nats"
                lines.append(f"    {method:<12} unseen {info['unseen']:>3} / {len(a.wavelengths)}"
                             f"{entropy}{'  ' + info['note'] if info.get('note') else ''}")  # fmt: skip
        if self.sinks is not None:
            s = self.sinks
            lines.append(f"  sinks ({s['sinks']}): phase concentration of the heads against them, beyond the trained "
                         f"extent: mean over heads peaks at {s['peak_mean']:.3f} (distance {s['peak_distance']}); "
                         f"within it at most {s['trained_mean']:.3f}")  # fmt: skip
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _tokens(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


def _sized(name: str, value, n: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = (value,) * n if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(values) != n or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
        raise ValueError(f"{name} must be a positive int or one per sized axis ({n}), got {value!r}")
    return values


def _step(pos: torch.Tensor, axis: int) -> float:
    """The smallest position step along ``axis`` among the positions the model ran at (1 if they never move)."""
    values = torch.unique(pos[..., axis].flatten())
    steps = values.diff()
    steps = steps[steps > 1e-9]
    return float(steps.min()) if steps.numel() else 1.0


def _methods(rope: AxialRoPE, axes: MapAxes, sized: list[int], trained, planned) -> dict[str, tuple]:
    """Per method, the scaling of every rope axis (``None`` unscaled) and the position divisor per sized axis."""
    n = rope.n_axes
    factors = {a: max(planned[i] / trained[i], 1.0) for i, a in enumerate(sized)}
    own = tuple(rope.scaling) if rope.spectrum is not None else (None,) * n

    def on_sized(make) -> tuple:
        return tuple(make(factors[a], trained[sized.index(a)]) if a in factors and factors[a] > 1 else None
                     for a in range(n))  # fmt: skip

    out = {"none": ((None,) * n, {})}
    out["interpolate"] = ((None,) * n, {a: f for a, f in factors.items() if f > 1})
    if rope.spectrum is not None and axes.spectrum:
        out["ntk"] = (on_sized(lambda s, t: NTK(s)), {})
        out["yarn"] = (on_sized(lambda s, t: YaRN(s, t)), {})
    if any(s is not None for s in own):
        out["config"] = (own, {})
    kinds = [axes.kinds[a] for a in sized]
    if all(k is not None for k in kinds):
        try:
            plan = policy_plan(tuple(kinds), tuple(trained), tuple(planned), names=tuple(axes.names[a] for a in sized),
                               spectrum=axes.spectrum and rope.spectrum is not None)  # fmt: skip
        except ValueError as error:
            out["auto"] = (None, str(error))
        else:
            scaling = list(plan.scaling())
            for i, a in enumerate(sized):
                if plan.axes[i].choice == "riflex" and rope.spectrum == "per_axis":
                    scaling[i] = plan.riflex(rope.axes_dim[a], rope.theta[a])
            divisors = {a: s.factor for a, s in zip(sized, scaling) if isinstance(s, Linear)}
            out["auto"] = (tuple(None if a not in sized or isinstance(scaling[sized.index(a)], Linear)
                                 else scaling[sized.index(a)] for a in range(n)), divisors)  # fmt: skip
    return out


def _frequencies(rope: AxialRoPE, scaling: tuple[Scaling | None, ...], planned_len) -> torch.Tensor:
    if rope.spectrum is None:
        return rope.frequencies()[0]
    if rope.spectrum != "per_axis":  # one spectrum shared by the axes (M-RoPE): one method for all
        scaling = next((s for s in scaling if s is not None), None)
    return rope.frequencies(seq_len=planned_len if rope.length_dependent else None, scaling=scaling)[0]


def build_map(rope: AxialRoPE, axes: MapAxes, size, train_size, sinks: int | None = None,
              observations: Sequence[Observation] = ()) -> ExtrapolationMap | None:  # fmt: skip
    """The extrapolation map of ``rope`` over ``axes`` (``None`` where no axis has a trained extent).

    Args:
        rope: the prescribed rope (shared ``F``; per-head frequency models have no map).
        axes: the site's axes (:class:`MapAxes`); the sized ones are those with a trained extent (all, where none).
        size, train_size: the planned and trained extent of each sized axis, tokens (an int: every sized axis).
        sinks: sink tokens of a streaming model (the phase concentration against them).
        observations: the doctor's observations: the position step per axis, q and k, the angles' precision.
    """
    if rope.frequency_model.num_heads is not None:
        return None
    sized = [a for a, t in enumerate(axes.trained) if t is not None] or list(range(rope.n_axes))
    given = _sized("train_size", train_size, len(sized))
    trained = list(given) if given is not None else [axes.trained[a] for a in sized]
    if any(t is None for t in trained):
        return None
    planned = _sized("size", size, len(sized))
    base = _frequencies(rope, (None,) * rope.n_axes, None)
    out = ExtrapolationMap([])
    plain = [o for o in observations if not o.autocast]
    steps = {a: _step(plain[0].pos, a) if plain else 1.0 for a in sized}
    methods = _methods(rope, axes, sized, trained, planned) if planned is not None else {}
    for i, a in enumerate(sized):
        planes = [j for j in range(base.shape[-1]) if float(base[a, j]) != 0.0]
        extent = trained[i] * steps[a]
        waves = [2 * math.pi / abs(float(base[a, j])) / steps[a] for j in planes]
        axis = AxisMap(axes.names[a], trained[i], None if planned is None else planned[i], steps[a], waves,
                       [k for k, w in enumerate(waves) if w > trained[i]])  # fmt: skip
        for name, (scaling, divisors) in methods.items():
            if scaling is None:
                axis.methods[name] = {"unseen": 0, "wavelengths": [], "note": f"refused: {divisors}"}
                continue
            try:
                freqs = _frequencies(rope, scaling, planned[i])
            except ValueError as error:  # a method this axis cannot take (NTK on a two-channel axis)
                axis.methods[name] = {"unseen": 0, "wavelengths": [], "note": f"refused: {error}"}
                continue
            divisor = divisors.get(a, 1.0)
            reach = [abs(float(freqs[a, j])) * planned[i] * steps[a] / divisor for j in planes]
            seen = [abs(float(base[a, j])) * extent for j in planes]  # a plane past one turn has seen every angle
            unseen = sum(s < 2 * math.pi and r > s * (1 + 1e-9) for r, s in zip(reach, seen))
            waves_m = [2 * math.pi * divisor / abs(float(freqs[a, j])) / steps[a] if float(freqs[a, j]) else math.inf
                       for j in planes]  # fmt: skip
            axis.methods[name] = {"unseen": unseen, "wavelengths": waves_m}
        out.axes.append(axis)
    if planned is not None:
        _precision(out, plain, rope, planned, sized, steps)
        from .attention import entropy_changes, sink_concentration

        sample = next((o.sample for o in plain if o.sample is not None), None)
        if sample is None:
            out.notes.append("attention entropy not measured: no q, k captured at this model's sites")
        elif len(sized) == 1:
            a = sized[0]
            out.axes[0].entropy = entropy_changes(rope, sample, methods, a, trained[0], planned[0], steps[a])
            if sinks is not None:
                out.sinks = sink_concentration(rope, sample, a, trained[0], planned[0], steps[a], sinks)
        else:
            out.notes.append("attention entropy measured for one-axis (sequence) models only")
    elif sinks is not None:
        out.notes.append("sinks: the phase concentration needs a planned size (size=)")
    return out


def _precision(out: ExtrapolationMap, plain, rope, planned, sized, steps) -> None:
    """A finding on the angles' precision at the planned extent, where the sites' angles are float32 products.

    Float32 angles (stock transformers and diffusers compute ``pos * inv_freq`` in float32) carry ``|phi| u``
    of error per product (``u = 2**-24``) plus the rounding of the position itself: at ``M`` positions and the
    fastest plane's ``F``, about ``3 u M F`` rad (:func:`~axial_rope.doctor.observe.table_bound`'s model).
    Sites whose tables sit within a float64-angle table's rounding (``8 u_site``) compute exact angles."""
    if not plain:
        return
    exact = all(o.error(o.prescribed) <= 8 * unit_roundoff(o.dtype) * o.amplitude for o in plain)
    if exact:
        return
    u = unit_roundoff(torch.float32)
    worst = max(3 * u * planned[i] * steps[a] * float(rope.frequencies()[0][a].abs().max())
                for i, a in enumerate(sized))  # fmt: skip
    severity = "alarm" if worst > ANGLE_TOLERANCE else "note"
    out.findings.append(Finding(
        "low_precision_angles", "planned size",
        f"the sites compute angles as float32 products: at the planned extent the fastest plane is off by about "
        f"{worst:.2g} rad ({'above' if severity == 'alarm' else 'within'} the doctor's {ANGLE_TOLERANCE} rad)",
        {"angle_error_planned": worst, "tolerance": ANGLE_TOLERANCE, "planned": list(planned)}, severity,
    ))  # fmt: skip
