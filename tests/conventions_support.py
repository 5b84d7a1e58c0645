"""What the convention tests share: exact float64 tables of a rope, comparisons, the documented bounds.

``exact_planes(rope, pos)`` reads a rope's angles back from its own rotation: rotating the unit
vector of every plane (channel ``a`` = 1, ``b`` = 0) with the float64 reference backend gives
``(cos, sin)`` in channels ``(a, b)``. So the float64 comparisons below check the rotation path
(position map, per-head ``F``, pairing), not a side computation.
"""

from __future__ import annotations

import math
import os

import torch

import axial_rope as ar
from axial_rope.conventions import REGISTRY

EPS32 = 2.0**-24  # float32 unit roundoff

# float32 roundings of an upstream angle, in units of u |angle|: the exponent of base ** (-2j / d) rounded
# (moves the power by ln(base) u at most; 14 covers bases up to 1e6), pow (1 ulp: 2 u), the reciprocal,
# up to three scaling operations (YaRN, Llama 3, LongRoPE) and the product with the position: 14 + 7
UPSTREAM_ULPS = 21.0


def exact_planes(rope: ar.AxialRoPE, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 plane tables ``[S, n]`` (per-head ropes: ``[S, H, n]``) from the rope's reference rotation."""
    heads = rope.frequency_model.num_heads or 1
    n, S = rope.n_pairs, pos.shape[-2] if pos.ndim > 1 else pos.shape[0]
    x = torch.zeros(1, S, heads, 2 * n, dtype=torch.float64)
    a = slice(0, 2 * n, 2) if rope.pairing == "interleaved" else slice(0, n)
    b = slice(1, 2 * n, 2) if rope.pairing == "interleaved" else slice(n, 2 * n)
    x[..., a] = 1.0
    out = rope.rotate(x, pos, backend="reference")[0]  # [S, H, 2n]
    cos, sin = out[..., a], out[..., b]
    return (cos, sin) if rope.frequency_model.num_heads else (cos[:, 0], sin[:, 0])


def channels(planes: torch.Tensor, pairing: str) -> torch.Tensor:
    """Plane table ``[..., n]`` -> the pairing's channel table ``[..., 2n]``."""
    return planes.repeat_interleave(2, -1) if pairing == "interleaved" else torch.cat([planes, planes], -1)


def exact_tables(rope: ar.AxialRoPE, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 channel tables (the form upstream libraries build)."""
    cos, sin = exact_planes(rope, pos)
    return channels(cos, rope.pairing), channels(sin, rope.pairing)


def max_diff(*pairs: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The largest absolute difference over ``(ours, theirs)`` pairs (compared in float64)."""
    return max(float((a.detach().double() - b.detach().double()).abs().max()) for a, b in pairs)


def check_documented(name: str, diff: float, bound: float) -> None:
    """The difference from upstream's tables stays within its error bound (docs/conventions.md records it).

    The documented ``max_diff`` is what one machine measured at the test sizes (the largest over a
    convention's cases): another CPU's float32 libm (upstream's cos/sin, pow) may round differently,
    so the test holds the difference to the bound, never to the measurement.
    """
    assert name in REGISTRY, name
    if os.environ.get("AXIAL_ROPE_MEASURE"):  # prints the measurements that docs/conventions.md records
        print(f"MEASURED {name} {diff:.3g}")
        return
    assert diff <= bound, f"{name}: {diff:.3g} from upstream, above the bound {bound:.3g}"


def angle_terms(rope: ar.AxialRoPE, pos: torch.Tensor) -> torch.Tensor:
    """``sum_a |pos_a F_a|`` per token and plane after the rope's position map (float64 ``[S, (H,) n]``).

    What a float32 implementation rounds: its angle's error is relative to this (an upper bound of |angle|).
    """
    pos = pos.double().reshape(-1, pos.shape[-1]) if pos.ndim > 1 else pos.double()[:, None]
    if rope.transform is not None:
        pos = rope.transform(pos[None])[0]
    freqs = rope.freqs.double().abs()  # [A, n] or per head [H, A, n]
    if freqs.ndim == 2:
        return pos.abs() @ freqs
    return torch.einsum("sa,han->shn", pos.abs(), freqs)


def upstream_table_bound(rope: ar.AxialRoPE, pos: torch.Tensor, ulps: float | None = None) -> float:
    """How far upstream float32 tables may sit from ours (float32, rounded once from float64), per entry.

    Upstream's angle within ``ulps`` roundings of |angle| (a float64 upstream: within that too; by
    default :data:`UPSTREAM_ULPS` with the exponent's ``ln(base)`` of the rope's own bases), its cos/sin
    within 1 ulp and ours rounded once: :func:`float32_angle_bound` of the largest angle, times the
    attention factor. A wrong axis, frequency or pairing is off by O(1).
    """
    if ulps is None:
        bases = [t for t in (getattr(rope, "theta", None) or ()) if t]
        ulps = UPSTREAM_ULPS - 14 + max([14.0, *(math.log(t) for t in bases)])
    m = float(rope.scale.abs().max()) if getattr(rope, "scale", None) is not None else 1.0
    return m * float(float32_angle_bound(angle_terms(rope, pos).amax(), ulps))


def rotation_bound(x: torch.Tensor, table_bound: float) -> float:
    """Two float32 rotations of x by tables ``table_bound`` apart: ``(|a| + |b|) table_bound`` from the
    tables and 6 u |z| from each side's arithmetic (helpers.TOL), ``|a| + |b| <= 2 max |x|``."""
    return float(x.abs().max()) * (2 * table_bound + 12 * 1.5 * EPS32)


def angle_gap(cos: torch.Tensor, sin: torch.Tensor, ref_cos: torch.Tensor, ref_sin: torch.Tensor) -> torch.Tensor:
    """|angle(ours) - angle(theirs)| per entry, wrapped to [0, pi] (float64)."""
    c, s, rc, rs = (t.double() for t in (cos, sin, ref_cos, ref_sin))
    return torch.atan2(s * rc - c * rs, c * rc + s * rs).abs()


def float32_angle_bound(angle: torch.Tensor, ulps: float = UPSTREAM_ULPS) -> torch.Tensor:
    """How far a float32 implementation's angle may sit from the exact one: ``ulps`` roundings of ``|angle|``.

    Upstream float32 code rounds its frequency (pow, reciprocal or product: a few roundings of
    2**-24 relative) and its product with the position (one more): ``|angle| * ulps * 2**-24``,
    plus the float32 rounding of cos/sin themselves (``2**-23``). Callers pass the chain they bound
    (:data:`UPSTREAM_ULPS` for the general one); a wrong axis, frequency or pairing is off by O(1).
    """
    return angle.abs() * ulps * EPS32 + 2 * EPS32


def rotated_unit_bound(angle_bound: torch.Tensor) -> float:
    """A tolerance for rotated q/k of unit-scale entries, from the largest angle bound."""
    return 4 * float(angle_bound.max()) + 1e-6


def far_positions(n_axes: int, count: int = 6, start: float = 1e6) -> torch.Tensor:
    """float64 positions near ``start`` on every axis (different per axis), ``[count, n_axes]``."""
    base = torch.arange(count, dtype=torch.float64)[:, None] * torch.tensor([1.0, 3.0, 7.0][:n_axes])
    return start + base + torch.arange(n_axes, dtype=torch.float64) * 17.0


def seeded(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float = 0.0) -> None:
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


TWO_PI = 2 * math.pi
