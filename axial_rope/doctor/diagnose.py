"""From observations to findings: does the site rotate as the records prescribe, and if not, what explains it.

Each observation is compared with its prescribed rotation in the site's own structure (``render``), against the
float32 bound of a healthy table (:func:`~axial_rope.doctor.observe.table_bound`). A site that differs is
explained by the first alternative rotation that reproduces it to the same bound, each alternative one of the
incidents the doctor knows (:data:`~axial_rope.doctor.findings.CLASSES`): the unscaled spectrum, the positions
without their offsets, another theta, other M-RoPE sections, ... Nothing reproducing it, angles on a
low-precision grid name the precision; else the finding is an unexplained layout with the nearest alternative.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..ops.rotation import Rotation
from ..rope import AxialRoPE
from .findings import Finding
from .observe import Observation, fit_frequencies, table_bound, unit_roundoff

__all__ = ["Candidate", "SiteSummary", "candidates", "diagnose", "fitted_theta", "grid_dtype"]


@dataclass
class Candidate:
    """An alternative rotation: the finding it would mean, in words, and the rotation."""

    kind: str
    label: str
    rotation: Rotation
    evidence: dict


@dataclass
class SiteSummary:
    """What one site did over its calls in one pass (a line of the report)."""

    site: str
    calls: int
    layout: str
    width: int | None
    dtype: str
    error: float  # the largest difference from the prescribed rotation (the structure's units: cos/sin)
    bound: float  # a healthy float32 table's bound at these positions
    pairing: str | None  # read off q and k (None: not captured or no angle)
    autocast: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _rope_like(rope: AxialRoPE, **changes) -> AxialRoPE:
    """A rope of ``rope``'s description with some fields changed (``theta``, ``axes_dim``, ``spectrum``)."""
    shared = rope.spectrum != "per_axis"
    args = dict(axes_dim=rope.axes_dim, theta=rope.theta[0] if shared else rope.theta,
                scaling=rope.scaling[0] if shared else rope.scaling, pairing=rope.pairing, spectrum=rope.spectrum,
                plane_order=rope.plane_order)  # fmt: skip
    args.update(changes)
    if args["spectrum"] != "per_axis" and isinstance(args["theta"], tuple):
        args["theta"] = args["theta"][0]
    return AxialRoPE(**args)


def _rotate(obs: Observation, rope: AxialRoPE, pos: torch.Tensor) -> Rotation:
    """``rope``'s rotation at ``pos``, with this call's scaling (where the records size it)."""
    if obs.scaling is None:
        return rope.rotation(pos)
    return rope.rotation(pos, scaling=obs.scaling)


def _position_variants(pos: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The positions a path that loses them would use instead: ``arange`` on every axis, the offsets dropped,
    every sample given the first one's. Only those that differ from ``pos`` ``[B|1, S, A]``."""
    batch, seq, axes = pos.shape
    variants = [
        ("0 .. S-1 on every axis (the values passed ignored)",
         torch.arange(seq, dtype=pos.dtype)[None, :, None].expand(batch, seq, axes)),
        ("offsets dropped (each sample from 0)", pos - pos.amin(1, keepdim=True)),
        ("the first sample's positions for every sample", pos[:1].expand(batch, -1, -1)),
    ]  # fmt: skip
    return [(label, p) for label, p in variants if not torch.equal(p, pos)]


def _section_variants(obs: Observation) -> list[tuple[str, AxialRoPE, torch.Tensor, dict]]:
    """M-RoPE alternatives: the sections' widths permuted, read from other position columns, laid out by the other
    spectrum, or every plane on the first axis (sections ignored)."""
    rope, pos = obs.rope, obs.pos
    out = []
    spectra = ("split", "cycled")
    for widths in dict.fromkeys(itertools.permutations(rope.axes_dim)):
        for columns in itertools.permutations(range(rope.n_axes)):
            for spectrum in spectra:
                if widths == rope.axes_dim and columns == tuple(range(rope.n_axes)) and spectrum == rope.spectrum:
                    continue
                label = f"sections {[w // 2 for w in widths]} ({spectrum}) on position columns {list(columns)}"
                found = {"sections": [w // 2 for w in widths], "columns": list(columns), "layout": spectrum}
                out.append(
                    (
                        label,
                        _rope_like(rope, axes_dim=widths, spectrum=spectrum, plane_order=None),
                        pos[..., list(columns)],
                        found,
                    )  # fmt: skip
                )
    one = _rope_like(rope, axes_dim=(rope.rot_dim,), spectrum="per_axis", plane_order=None)
    out.append(("every plane on the first position column (sections ignored)", one, pos[..., :1],
                {"sections": [rope.rot_dim // 2], "columns": [0], "layout": "1-D"}))  # fmt: skip
    return out


def fitted_theta(freqs: torch.Tensor, axes_dim: tuple[int, ...], plane_axis: list[int]) -> float | None:
    """The base ``theta`` whose spectrum ``theta ** (-2j / d)`` is nearest to fitted frequencies (least squares on
    ``log F`` over the planes of each axis, ``j >= 1``), or ``None`` where no plane is usable."""
    rows, targets = [], []
    for a, d in enumerate(axes_dim):
        planes = [j for j, ax in enumerate(plane_axis) if ax == a]
        for i, j in enumerate(planes):
            value = float(freqs[a, j].abs())
            if i >= 1 and value > 0:
                rows.append(2 * i / d)
                targets.append(-math.log(value))
    if not rows:
        return None
    x, y = torch.tensor(rows, dtype=torch.float64), torch.tensor(targets, dtype=torch.float64)
    return math.exp(float((x * y).sum() / (x * x).sum()))


def _theta_candidate(obs: Observation, start: float | None) -> Candidate | None:
    """The base that best reproduces the site: golden-section search on ``log theta`` near ``start`` (the fit of
    the planes' frequencies), or over a scan of ``[theta / 1e3, theta * 1e3]`` without one."""
    rope = obs.rope
    if rope.spectrum is None or obs.learned:
        return None
    theta0 = rope.theta[0]

    def cost(log_c: float) -> float:
        c = math.exp(log_c)
        theta = tuple(t * c for t in rope.theta)
        try:
            rotation = _rotate(obs, _rope_like(rope, theta=theta), obs.pos)
        except ValueError:  # a base the scaling refuses (NTK needs theta > 1)
            return float("inf")
        return obs.error(rotation)

    if start is not None and start > 0:
        lo, hi = math.log(start / theta0) - 0.05, math.log(start / theta0) + 0.05
    else:
        grid = [math.log(1e-3) + i * math.log(1e6) / 240 for i in range(241)]
        best = min(range(len(grid)), key=lambda i: cost(grid[i]))
        lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = cost(a), cost(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = cost(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = cost(b)
    c = math.exp((lo + hi) / 2)
    if abs(c - 1) < 1e-6:
        return None
    theta = tuple(t * c for t in rope.theta)
    rotation = _rotate(obs, _rope_like(rope, theta=theta), obs.pos)
    return Candidate("wrong_theta", f"rope_theta {_g(theta[0])} instead of {_g(theta0)}", rotation,
                     {"theta_config": theta0, "theta_found": theta[0]})  # fmt: skip


def _g(x: float) -> str:
    return f"{x:.6g}"


def candidates(obs: Observation) -> list[Candidate]:
    """The alternative rotations the doctor tries on a site that differs from its records, in order."""
    rope, rot = obs.rope, obs.prescribed
    out = []
    spectral = rope.spectrum is not None and not obs.learned
    if spectral and any(s is not None for s in rope.scaling):
        names = sorted({type(s).__name__ for s in rope.scaling if s is not None})
        unscaled = rope.rotation(obs.pos, scaling=None)
        out.append(Candidate("scaling_not_applied", f"the unscaled spectrum ({', '.join(names)} not applied)",
                             unscaled, {"scaling": [s.to_dict() if s else None for s in rope.scaling]}))  # fmt: skip
    if rot.attention_factor is not None:
        factor = float(rot.attention_factor.abs().max())
        out.append(Candidate("attention_factor", f"the attention factor {factor:.4g} left out",
                             rot._replace(attention_factor=None), {"attention_factor": factor}))  # fmt: skip
    for label, pos in _position_variants(obs.pos):
        # a length-dependent spectrum follows the positions' length; else the call's own F at other positions
        moved = _rotate(obs, rope, pos) if rope.length_dependent and spectral else rot._replace(pos=rope.positions(pos))
        out.append(Candidate("positions_ignored", label, moved, {"positions_used": label}))
    if spectral and rope.spectrum in ("split", "cycled") and rope.n_axes > 1:
        for label, other, pos, found in _section_variants(obs):
            out.append(Candidate("mrope_sections", label, _rotate(obs, other, pos),
                                 {"sections_config": [d // 2 for d in rope.axes_dim], "found": found}))  # fmt: skip
    if obs.planes is None:  # a structure in channel layout: the pairing shows in it
        other = "half" if rot.pairing == "interleaved" else "interleaved"
        out.append(Candidate("wrong_pairing", f"{other} pairing", rot._replace(pairing=other),
                             {"pairing_config": rot.pairing, "pairing_found": other}))  # fmt: skip
    out.append(Candidate("unexplained_layout", "angles negated (turning the other way)",
                         rot._replace(freqs=-rot.freqs), {}))  # fmt: skip
    return out


def grid_dtype(obs: Observation) -> tuple[torch.dtype, float] | None:
    """The low precision whose grid the observed angles lie on (``bfloat16`` or ``float16``) and the share of
    them on it, or ``None``: angles computed in that dtype are multiples of its spacing at their size, which
    float32 or float64 angles are not. Needs plane tables; angles whose spacing is below 16 times the tables'
    rounding are left out (too fine to tell)."""
    if obs.planes is None or obs.prescribed.freqs.ndim != 2:
        return None
    cos, sin = obs.planes
    expected = obs.angles
    if expected.shape[-1] != cos.shape[-1]:
        return None
    seen = torch.atan2(sin, cos)
    phi = expected + torch.remainder(seen - expected + torch.pi, 2 * torch.pi) - torch.pi  # unwrapped near phi
    noise = 4 * unit_roundoff(obs.dtype)
    for dtype in (torch.bfloat16, torch.float16):
        exponent = torch.floor(torch.log2(phi.abs().clamp_min(1e-30)))
        spacing = torch.exp2(exponent) * torch.finfo(dtype).eps
        usable = (spacing > 16 * noise) & (phi.abs() < torch.finfo(dtype).max)
        if int(usable.sum()) < 8:
            continue
        off = (phi - phi.to(dtype).double()).abs()
        on = (off <= torch.maximum(0.05 * spacing, torch.full_like(spacing, 4 * noise)))[usable]
        share = float(on.double().mean())
        if share > 0.9:
            return dtype, share
    return None


def _theta_start(obs: Observation) -> float | None:
    if obs.planes is None or obs.rope.spectrum != "per_axis" or obs.prescribed.freqs.ndim != 2:
        return None
    cos, sin = obs.planes
    if cos.shape[-1] != obs.rope.n_pairs:
        return None
    freqs = fit_frequencies(torch.atan2(sin, cos), obs.prescribed.pos) * obs.sign
    return fitted_theta(freqs, obs.rope.axes_dim, obs.rope.plane_axis)


def _mismatch(obs: Observation, error: float, bound: float) -> Finding:
    """The finding of a site that differs from its records: the first alternative that reproduces it."""
    evidence = {"error": error, "bound": bound, "max_position": float(obs.pos.abs().max())}
    tried = candidates(obs)
    theta = _theta_candidate(obs, _theta_start(obs))
    if theta is not None:
        tried.insert(1 if tried and tried[0].kind == "scaling_not_applied" else 0, theta)
    scored = []
    for cand in tried:
        err = obs.error(cand.rotation)
        scored.append((err, cand))
        if err <= bound and cand.kind != "unexplained_layout":
            return Finding(cand.kind, obs.site, f"the tables are {cand.label}", evidence | cand.evidence | {
                "error_of_explanation": err})  # fmt: skip
    low = grid_dtype(obs)
    if low is not None:
        dtype, share = low
        name = str(dtype).removeprefix("torch.")
        return Finding("low_precision_angles", obs.site, f"the angles are computed in {name}",
                       evidence | {"angle_dtype": name, "share_on_grid": share})  # fmt: skip
    err, nearest = min(scored, key=lambda s: s[0])
    label = "the prescribed rotation" if err >= error else nearest.label
    return Finding("unexplained_layout", obs.site, f"no known convention reproduces the tables; nearest: {label}",
                   evidence | {"nearest": label, "error_of_nearest": min(err, error)})  # fmt: skip


def _collapse(obs: Observation, error: float, bound: float) -> Finding:
    """The finding of a site that agrees with its records in the plain pass and not under autocast."""
    evidence = {"error": error, "bound": bound, "max_position": float(obs.pos.abs().max())}
    low = grid_dtype(obs)
    if low is not None:
        evidence |= {"angle_dtype": str(low[0]).removeprefix("torch."), "share_on_grid": low[1]}
    return Finding("autocast_collapse", obs.site, "the tables differ from the records under torch.autocast only",
                   evidence)  # fmt: skip


def _checks(obs: Observation) -> list[Finding]:
    """Width and pairing first (they make every angle comparison moot), then the angles."""
    rope = obs.rope
    if obs.width is not None and obs.width != rope.rot_dim:
        return [Finding("partial_rotary_width", obs.site,
                        f"{obs.width} channels rotate; the config's rotary width is {rope.rot_dim}",
                        {"width_found": obs.width, "width_config": rope.rot_dim})]  # fmt: skip
    found = []
    qk = obs.qk
    if qk is not None and qk.pairing is not None and qk.pairing != rope.pairing:
        found.append(Finding("wrong_pairing", obs.site,
                             f"q and k rotate over {qk.pairing} pairs; the model type pairs {rope.pairing!r}",
                             {"pairing_found": qk.pairing, "pairing_config": rope.pairing,
                              "norm_spread": {k: float(v) for k, v in qk.spread.items()}}))  # fmt: skip
    elif qk is not None and qk.pairing is None and min(qk.spread.values()) > 0.05:
        found.append(Finding("unexplained_layout", obs.site, "q and k change norm under either pairing",
                             {"norm_spread": {k: float(v) for k, v in qk.spread.items()}}))  # fmt: skip
    return found


def diagnose(observations: list[Observation]) -> tuple[list[Finding], list[SiteSummary]]:
    """Findings (one per class and site) and per-site summaries of a doctor's observations.

    An autocast-pass site that differs where its plain pass agreed is an autocast collapse; one that differs in
    both passes is reported from the plain pass only.
    """
    findings, seen, summaries = [], set(), {}
    healthy_plain, diagnosed = {}, set()  # a site's later calls that differ are not diagnosed again
    for obs in sorted(observations, key=lambda o: o.autocast):  # plain pass first
        bound = table_bound(obs)
        error = obs.error(obs.prescribed)
        key = (obs.site, obs.autocast)
        summary = summaries.get(key)
        pairing = obs.qk.pairing if obs.qk is not None else None
        if summary is None:
            summaries[key] = SiteSummary(obs.site, 1, obs.layout, obs.width, str(obs.dtype).removeprefix("torch."),
                                         error, bound, pairing, obs.autocast)  # fmt: skip
        else:
            summary.calls += 1
            summary.error, summary.bound = max(summary.error, error), max(summary.bound, bound)
            summary.pairing = summary.pairing or pairing
        if not obs.autocast:
            healthy_plain[obs.site] = healthy_plain.get(obs.site, True) and error <= bound
        new = _checks(obs)
        if not new and error > bound:
            if (obs.autocast and not healthy_plain.get(obs.site, True)) or (obs.site, obs.autocast) in diagnosed:
                continue
            diagnosed.add((obs.site, obs.autocast))
            if obs.autocast:  # the plain pass agreed: the autocast dtype is the cause, whatever the tables became
                new = [_collapse(obs, error, bound)]
            else:
                new = [_mismatch(obs, error, bound)]
        for finding in new:
            if (finding.kind, finding.site) not in seen:
                seen.add((finding.kind, finding.site))
                findings.append(finding)
    return findings, list(summaries.values())
