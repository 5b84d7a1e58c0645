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
from .findings import Finding, finite
from .observe import Observation, fit_frequencies, unit_roundoff

__all__ = ["ANGLE_TOLERANCE", "AxisMap", "ExtrapolationMap", "MapAxes", "build_map"]

# a plane counts as unseen when it turns more than this fraction past its trained angle: interpolation by exactly
# the growth ties (reach = trained angle), and frequencies fitted from float32 tables are off by ~1e-7 relative
SLACK = 1e-3
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
        """JSON-able (strict JSON: an infinite wavelength, ``F = 0``, is ``null``)."""
        return finite(dict(self.__dict__))


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


@dataclass
class Method:
    """One way to run at the planned size: its ``F`` ``[A, n]`` and attention factor ``[n]`` there (``freqs``
    ``None``: refused, ``note`` says why), and the positions' divisor per axis (interpolation)."""

    freqs: torch.Tensor | None
    scale: torch.Tensor | None = None
    divisors: dict[int, float] = field(default_factory=dict)
    note: str = ""


def _spectrum(rope: AxialRoPE, scaling: tuple[Scaling | None, ...], planned_len) -> tuple[torch.Tensor, torch.Tensor]:
    """``F`` and the attention factor of ``rope`` with ``scaling`` (one per axis) at the planned length."""
    if rope.spectrum is None:
        return rope.frequencies()
    if rope.spectrum != "per_axis":  # one spectrum shared by the axes (M-RoPE): one method for all
        scaling = next((s for s in scaling if s is not None), None)
    return rope.frequencies(seq_len=planned_len if rope.length_dependent else None, scaling=scaling)


def _method(rope, scaling, planned_len, divisors=None) -> Method:
    try:
        freqs, scale = _spectrum(rope, scaling, planned_len)
    except ValueError as error:  # a method an axis cannot take (NTK on a two-channel axis)
        return Method(None, note=f"refused: {error}")
    return Method(freqs, scale, divisors or {})


def _methods(rope: AxialRoPE, axes: MapAxes, sized: list[int], trained, planned, observed) -> dict[str, Method]:
    """Per method, ``F`` at the planned size: the trained spectrum unscaled (``none``), interpolated, NTK, YaRN, the
    config's scaling, the automatic policy's plan, and the frequencies the model was observed to use."""
    n = rope.n_axes
    factors = {a: max(planned[i] / trained[i], 1.0) for i, a in enumerate(sized)}
    own = tuple(rope.scaling) if rope.spectrum is not None else (None,) * n
    length = max(planned)

    def on_sized(make) -> tuple:
        return tuple(make(factors[a], trained[sized.index(a)]) if a in factors and factors[a] > 1 else None
                     for a in range(n))  # fmt: skip

    out = {"none": _method(rope, (None,) * n, length)}
    out["interpolate"] = _method(rope, (None,) * n, length, {a: f for a, f in factors.items() if f > 1})
    if rope.spectrum is not None and axes.spectrum:
        out["ntk"] = _method(rope, on_sized(lambda s, t: NTK(s)), length)
        out["yarn"] = _method(rope, on_sized(lambda s, t: YaRN(s, t)), length)
    if any(s is not None for s in own):
        out["config"] = _method(rope, own, length)
    kinds = [axes.kinds[a] for a in sized]
    if all(k is not None for k in kinds):
        try:
            plan = policy_plan(tuple(kinds), tuple(trained), tuple(planned), names=tuple(axes.names[a] for a in sized),
                               spectrum=axes.spectrum and rope.spectrum is not None)  # fmt: skip
        except ValueError as error:
            out["auto"] = Method(None, note=f"refused: {error}")
        else:
            scaling = list(plan.scaling())
            for i, a in enumerate(sized):
                if plan.axes[i].choice == "riflex" and rope.spectrum == "per_axis":
                    scaling[i] = plan.riflex(rope.axes_dim[a], rope.theta[a])
            divisors = {a: s.factor for a, s in zip(sized, scaling) if isinstance(s, Linear)}
            per_axis = tuple(None if a not in sized or isinstance(scaling[sized.index(a)], Linear)
                             else scaling[sized.index(a)] for a in range(n))  # fmt: skip
            out["auto"] = _method(rope, per_axis, length, divisors)
    if observed is not None:
        out["observed"] = observed
    return out


def _observed(plain: Sequence[Observation], rope: AxialRoPE) -> Method | None:
    """The frequencies and amplitude the model was seen to use (fitted from its plane tables, where it has them and
    they are as wide as the rope), as a method: what it will do at the planned size as it is."""
    obs = next((o for o in plain if o.planes is not None and o.planes[0].shape[-1] == rope.n_pairs), None)
    if obs is None or obs.prescribed.freqs.ndim != 2:
        return None
    cos, sin = obs.planes
    freqs = fit_frequencies(torch.atan2(sin, cos), obs.prescribed.pos) * obs.sign
    scale = torch.sqrt(cos**2 + sin**2).flatten(0, -2).median(0).values
    return Method(freqs, scale)


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
    base = _spectrum(rope, (None,) * rope.n_axes, None)[0]
    out = ExtrapolationMap([])
    plain = [o for o in observations if not o.autocast]
    steps = {a: _step(plain[0].pos, a) if plain else 1.0 for a in sized}
    methods = _methods(rope, axes, sized, trained, planned, _observed(plain, rope)) if planned is not None else {}
    for i, a in enumerate(sized):
        planes = [j for j in range(base.shape[-1]) if float(base[a, j]) != 0.0]
        extent = trained[i] * steps[a]
        waves = [2 * math.pi / abs(float(base[a, j])) / steps[a] for j in planes]
        axis = AxisMap(axes.names[a], trained[i], None if planned is None else planned[i], steps[a], waves,
                       [k for k, w in enumerate(waves) if w > trained[i]])  # fmt: skip
        for name, method in methods.items():
            if method.freqs is None:
                axis.methods[name] = {"unseen": 0, "wavelengths": [], "note": method.note}
                continue
            divisor = method.divisors.get(a, 1.0)
            rates = [abs(float(method.freqs[a, j])) / divisor for j in planes]  # radians per token at the plan
            seen = [abs(float(base[a, j])) * extent for j in planes]  # a plane past one turn has seen every angle
            unseen = sum(s < 2 * math.pi and r * planned[i] * steps[a] > s * (1 + SLACK) for r, s in zip(rates, seen))
            waves_m = [2 * math.pi / r / steps[a] if r else math.inf for r in rates]
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
    fastest plane's ``F``, about ``3 u M F`` rad (:func:`~axial_rope.doctor.observe.table_bound`'s model), ``M`` the
    planned extent past the largest position the model ran at (its own origin: 65536 for Ideogram 4's images).
    Sites whose tables sit within a float64-angle table's rounding (``8 u_site``) compute exact angles."""
    if not plain:
        return
    exact = all(o.error(o.prescribed) <= 8 * unit_roundoff(o.dtype) * o.amplitude for o in plain)
    if exact:
        return
    u = unit_roundoff(torch.float32)
    fastest = _spectrum(rope, (None,) * rope.n_axes, None)[0].abs().amax(-1)  # [A]
    # the positions at the plan: from the model's own origin (Ideogram's images start at 65536), not the doctor's
    # offsets
    origin = {a: 0.0 if o.positions_passed else float(o.pos[..., a].abs().max()) for o in plain[:1] for a in sized}
    worst = max(3 * u * (origin[a] + planned[i] * steps[a]) * float(fastest[a]) for i, a in enumerate(sized))
    severity = "alarm" if worst > ANGLE_TOLERANCE else "note"
    out.findings.append(Finding(
        "low_precision_angles", "planned size",
        f"the sites compute angles as float32 products: at the planned extent the fastest plane is off by about "
        f"{worst:.2g} rad ({'above' if severity == 'alarm' else 'within'} the doctor's {ANGLE_TOLERANCE} rad)",
        {"angle_error_planned": worst, "tolerance": ANGLE_TOLERANCE, "planned": list(planned)}, severity,
    ))  # fmt: skip
