"""Seed-level intervals for a paired difference between two arms, and corrections over a page's family.

A study measures every arm with models of the same training seeds on the same test samples, so an
arm's metric is an array ``[S, N]`` (seeds, samples) and two arms pair cell by cell. A claim about a
method is a claim over training seeds and over test samples drawn from the same source; two
intervals here say how far it reaches:

- ``paired_t``: the per-seed paired differences ``d_s`` (mean over the samples defined in both
  arms) and a t interval with ``S - 1`` degrees of freedom. It is the textbook interval over
  seeds for *this* test set: a sample effect shared by every seed is part of its target.
- ``SeedBootstrap``: one draw resamples seeds and, once, the samples (or clusters of samples, e.g.
  windows grouped by the file they were cut from); the same sample draw is applied to every
  seed and both arms, so a sample effect shared across seeds enters the interval as it enters
  the estimate. The interval is the estimate +- ``t[S' - 1] * sqrt(S' / (S' - 1)) * se``: ``se``
  is the standard deviation of the bootstrap means, ``sqrt(S'/(S'-1))`` undoes the bootstrap's
  plug-in variance (it divides by ``S'``) and the t quantile accounts for a variance estimated
  from ``S'`` units, ``S' = min(seeds, clusters)``, the scarcer of the two crossed factors. This is
  the "bootstrap t with a small-sample factor" of Hesterberg, "What Teachers Should Know about
  the Bootstrap" (The American Statistician 69, 2015, section 4). Resampling both crossed
  factors counts the cell noise twice (McCullagh, "Resampling and exchangeable arrays",
  Bernoulli 6, 2000), so the interval errs wide, never narrow.

- ``crossed_t``: the same two crossed random factors (seeds, and samples or their clusters) by the
  two-way random-effects analysis of variance: the variance of the mean difference is
  ``var_seed / S + var_sample / N + var_cell / (S N)`` from the three mean squares (each component
  clamped at 0), with Satterthwaite's degrees of freedom (Biometrics Bulletin 2, 1946). Where the
  seeds dominate it is the t over seeds; where the samples dominate it has their many degrees of
  freedom, so it is not as wide as the bootstrap's ``S' - 1`` makes it with few seeds. The studies'
  tables use it.

``holm`` and ``benjamini_hochberg`` adjust a page's p-values (one family per page); a page names
the method it used with ``correction_note``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .bootstrap import Interval

__all__ = [
    "CORRECTIONS",
    "PairedTest",
    "SeedBootstrap",
    "benjamini_hochberg",
    "correct",
    "correction_note",
    "crossed_t",
    "holm",
    "paired_t",
    "per_seed_differences",
    "satterthwaite_floor",
    "t_cdf",
    "t_quantile",
]


@dataclass(frozen=True)
class PairedTest:
    """A paired difference ``a - b``: its interval, two-sided p-value and per-seed differences.

    ``method`` names the interval on a page; ``units`` is the number of independent units its
    degrees of freedom come from (seeds, or the clusters when fewer).
    """

    interval: Interval
    p_value: float
    per_seed: tuple[float, ...]
    units: int
    method: str

    def to_dict(self) -> dict:
        return {
            "difference": list(self.interval),
            "p_value": self.p_value,
            "per_seed": list(self.per_seed),
            "units": self.units,
            "method": self.method,
        }


# ---- Student's t distribution for integer degrees of freedom (no scipy in the dependencies) -------------


def t_cdf(x: float, df: int) -> float:
    """``P(T <= x)`` for Student's t with integer ``df >= 1``: the closed forms of Abramowitz and
    Stegun 26.7.3 (odd ``df``) and 26.7.4 (even ``df``) for ``A = P(|T| < |x|)``."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be an integer >= 1, got {df}")
    theta = math.atan(abs(x) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:  # A = (2/pi) (theta + sin cos (1 + 2/3 cos^2 + (2 4)/(3 5) cos^4 + ...)), df - 2 terms of cos
        term, total = 1.0, 0.0
        for j in range(1, (df - 1) // 2 + 1):  # terms cos^(2j-1), coefficients (2 4 ... 2j-2)/(1 3 ... 2j-1)
            total += term
            term *= (2 * j) / (2 * j + 1) * c2
        a = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total) if df > 1 else 2 * theta / math.pi
    else:  # A = sin (1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ...), up to cos^(df-2)
        term, total = 1.0, 0.0
        for j in range(1, df // 2 + 1):
            total += term
            term *= (2 * j - 1) / (2 * j) * c2
        a = math.sin(theta) * total
    return 0.5 + 0.5 * a if x >= 0 else 0.5 - 0.5 * a


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with integer ``df`` (bisection on ``t_cdf``, to 1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-12:
            break
    return (low + high) / 2


def _two_sided_p(statistic: float, df: int) -> float:
    if math.isnan(statistic):
        return math.nan
    return min(1.0, 2 * (1 - t_cdf(abs(statistic), df)))


# ---- the intervals -------------------------------------------------------------------------------------


def _paired_cells(a, b) -> np.ndarray:
    """``a - b`` as float64 ``[S, N]``, NaN where either arm is undefined (a cell counts in both or neither)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"a and b must be [seeds, samples] arrays of one shape, got {a.shape} and {b.shape}")
    return a - b


def per_seed_differences(a, b) -> np.ndarray:
    """``[S]``: per seed, the mean of ``a - b`` over the samples defined in both (NaN if none)."""
    d = _paired_cells(a, b)
    defined = ~np.isnan(d)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(defined, d, 0.0).sum(1) / defined.sum(1)


def paired_t(a, b, level: float = 0.95) -> PairedTest:
    """The t interval over seeds of ``a - b`` (arrays ``[S, N]``, paired cell by cell), ``S >= 2``."""
    d = per_seed_differences(a, b)
    d = d[~np.isnan(d)]
    n = len(d)
    if n < 2:
        raise ValueError(f"paired_t needs at least 2 seeds with a defined difference, got {n}")
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    half = t_quantile((1 + level) / 2, n - 1) * se
    with np.errstate(invalid="ignore", divide="ignore"):
        statistic = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    p = _two_sided_p(statistic, n - 1)
    return PairedTest(Interval(mean, mean - half, mean + half), p, tuple(map(float, d)), n, "t over seeds")


def _cluster_means(d: np.ndarray, clusters) -> np.ndarray:
    """``[S, C]``: per seed, the mean of ``d [S, N]`` over each cluster's defined cells (``None``: ``d`` itself)."""
    if clusters is None:
        return d
    labels = np.asarray(clusters)
    if labels.shape != (d.shape[1],):
        raise ValueError(f"clusters must be [n_samples] = [{d.shape[1]}], got shape {labels.shape}")
    _, index = np.unique(labels, return_inverse=True)
    defined = ~np.isnan(d)
    total, count = np.zeros((d.shape[0], index.max() + 1)), np.zeros((d.shape[0], index.max() + 1))
    np.add.at(total.T, index, np.where(defined, d, 0.0).T)
    np.add.at(count.T, index, defined.T.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def satterthwaite_floor(df: float) -> int:
    """Satterthwaite's degrees of freedom ``df`` (a float) rounded down, an integer up to float rounding kept.

    Why rounded down rather than used as a fraction: the approximation is conservative that way (the t quantile
    of fewer degrees is larger, so the interval errs wide, as the bootstrap's does), and :func:`t_cdf` is exact
    for integer ``df`` only. Why the tolerance: where one mean square carries the whole variance the exact
    ``df`` is an integer (``S - 1``, ``C - 1`` or ``(S - 1)(C - 1)``), and the float ratio lands a few ulps on
    either side of it (``14.999999999999998``); floored raw, it loses a whole degree of freedom and widens the
    interval for nothing. Values within ``1e-9`` (relative) of an integer are taken as that integer: the float
    error of the ratio of sums of squares is about ``1e-15``, and the t quantile is continuous in ``df``, so
    even a truly fractional ``df`` that close to ``n`` has the quantile of ``n`` to about ``1e-9``."""
    nearest = round(df)
    return int(nearest) if abs(df - nearest) <= 1e-9 * max(1.0, abs(df)) else math.floor(df)


def crossed_t(a, b, level: float = 0.95, *, clusters=None) -> PairedTest:
    """``a - b`` (arrays ``[S, N]``, paired cell by cell) with seeds and samples (or ``clusters [N]`` of them)
    as crossed random factors: the two-way random-effects interval with Satterthwaite's degrees of freedom.

    Samples (or clusters) undefined in any seed are left out, so the design is balanced: ``d [S, C]``
    (fewer than 2 left: a NaN interval and p-value). Mean
    squares ``MS_S = C sum_s (r_s - m)^2 / (S - 1)``, ``MS_C = S sum_c (c_c - m)^2 / (C - 1)`` and the residual
    ``MS_E``; ``Var(m) = v_S / S + v_C / C + MS_E / (S C)`` with ``v_S = max(0, (MS_S - MS_E) / C)`` and
    ``v_C = max(0, (MS_C - MS_E) / S)``; the degrees of freedom those mean squares carry, by Satterthwaite,
    rounded down (the interval errs wide; an integer up to float rounding stays that integer:
    :func:`satterthwaite_floor`)."""
    cells = _cluster_means(_paired_cells(a, b), clusters)
    per_seed = per_seed_differences(a, b)
    d = cells[:, ~np.isnan(cells).any(0)]  # [S, C]: the units defined in every seed
    S, C = d.shape
    units = min(S, C)
    method = f"crossed t ({S} seeds x {C} {'clusters' if clusters is not None else 'samples'}, Satterthwaite)"
    if S < 2:
        raise ValueError(f"crossed_t needs at least 2 seeds, got {S}")
    if C < 2:  # a metric undefined (or defined once) in every seed: no interval (a page prints "-")
        nan = Interval(math.nan, math.nan, math.nan)
        return PairedTest(nan, math.nan, tuple(map(float, per_seed)), units, method)
    m = float(d.mean())
    rows, cols = d.mean(1), d.mean(0)
    ms_s = C * float(((rows - m) ** 2).sum()) / (S - 1)
    ms_c = S * float(((cols - m) ** 2).sum()) / (C - 1)
    ms_e = float(((d - rows[:, None] - cols[None, :] + m) ** 2).sum()) / ((S - 1) * (C - 1))
    seed_part, sample_part = ms_s > ms_e, ms_c > ms_e  # components estimated above 0
    # Var(m) * S * C as a combination of the mean squares: sum_k coef_k MS_k
    terms = [(float(seed_part), ms_s, S - 1), (float(sample_part), ms_c, C - 1)]
    terms.append((1.0 - seed_part - sample_part, ms_e, (S - 1) * (C - 1)))
    var = sum(k * ms for k, ms, _ in terms) / (S * C)
    if var <= 0:  # every cell equal: no spread to estimate
        return PairedTest(Interval(m, m, m), 0.0 if m else 1.0, tuple(map(float, per_seed)), units, method)
    denominator = sum((k * ms) ** 2 / df for k, ms, df in terms if k)
    df = max(1, satterthwaite_floor((var * S * C) ** 2 / denominator))
    se = math.sqrt(var)
    half = t_quantile((1 + level) / 2, df) * se
    interval = Interval(m, m - half, m + half)
    return PairedTest(interval, _two_sided_p(m / se, df), tuple(map(float, per_seed)), units, method)


class SeedBootstrap:
    """Bootstrap draws over seeds and shared samples (optionally clustered) for arrays ``[S, N]``.

    Args:
        n_seeds, n_samples: the shape ``[S, N]`` of every array it takes.
        clusters: ``[N]`` labels; samples with one label are resampled together (e.g. the source
            file of each window). ``None``: every sample is its own cluster.
        draws: bootstrap replicates; seed: of the draws (fixed: a page is reproducible).

    Every draw resamples the seeds (``seed_weights [R, S]``, counts) and once the clusters
    (``sample_weights [R, N]``, the count of the sample's cluster): every seed and every arm sees the
    same resampled samples.
    """

    def __init__(self, n_seeds: int, n_samples: int, *, clusters=None, draws: int = 2000, seed: int = 0):
        if n_seeds < 2:
            raise ValueError(f"n_seeds must be >= 2 for a seed-level interval, got {n_seeds}")
        if clusters is None:
            labels = np.arange(n_samples)
        else:
            labels = np.asarray(clusters)
            if labels.shape != (n_samples,):
                raise ValueError(f"clusters must be [n_samples] = [{n_samples}], got shape {labels.shape}")
        _, index = np.unique(labels, return_inverse=True)  # [N] cluster of each sample, 0..C-1
        n_clusters = int(index.max()) + 1
        rng = np.random.default_rng(seed)
        seed_picks = rng.integers(0, n_seeds, size=(draws, n_seeds))  # [R, S]
        cluster_picks = rng.integers(0, n_clusters, size=(draws, n_clusters))  # [R, C]
        rows = np.arange(draws)[:, None]
        self.seed_weights = np.zeros((draws, n_seeds))
        np.add.at(self.seed_weights, (rows, seed_picks), 1.0)
        cluster_weights = np.zeros((draws, n_clusters))
        np.add.at(cluster_weights, (rows, cluster_picks), 1.0)
        self.sample_weights = cluster_weights[:, index]  # [R, N]
        self.shape, self.n_clusters = (n_seeds, n_samples), n_clusters
        self.units = min(n_seeds, n_clusters)

    def _check(self, values) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != self.shape:
            raise ValueError(f"values must be [seeds, samples] = {self.shape}, got {values.shape}")
        return values

    def means(self, values) -> np.ndarray:
        """``[R]``: the weighted mean of each draw over the defined cells of ``values [S, N]``."""
        values = self._check(values)
        defined = ~np.isnan(values)
        total = ((self.seed_weights @ np.where(defined, values, 0.0)) * self.sample_weights).sum(1)
        count = ((self.seed_weights @ defined.astype(np.float64)) * self.sample_weights).sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / count

    def _test(self, cells: np.ndarray, level: float, per_seed: np.ndarray) -> PairedTest:
        method = f"seed bootstrap ({self.shape[0]} seeds, {self.n_clusters} sample clusters, bootstrap t)"
        if np.isnan(cells).all():
            return PairedTest(Interval(math.nan, math.nan, math.nan), math.nan, tuple(per_seed), self.units, method)
        estimate = float(np.nanmean(cells))
        draws = self.means(cells)
        draws = draws[~np.isnan(draws)]
        u = self.units
        se = float(draws.std()) * math.sqrt(u / (u - 1))
        half = t_quantile((1 + level) / 2, u - 1) * se
        statistic = estimate / se if se > 0 else (0.0 if estimate == 0 else math.copysign(math.inf, estimate))
        interval = Interval(estimate, estimate - half, estimate + half)
        return PairedTest(interval, _two_sided_p(statistic, u - 1), tuple(map(float, per_seed)), u, method)

    def difference(self, a, b, level: float = 0.95) -> PairedTest:
        """``a - b`` over the cells defined in both arms, its interval and p-value."""
        cells = self._check(_paired_cells(a, b))
        return self._test(cells, level, per_seed_differences(a, b))

    def interval(self, values, level: float = 0.95) -> Interval:
        """The mean of one arm's ``values [S, N]`` (defined cells) and its interval."""
        values = self._check(values)
        return self._test(values, level, np.nanmean(values, 1)).interval


# ---- corrections over a page's family of tests --------------------------------------------------------


def _p_array(p_values) -> np.ndarray:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or ((p < 0) | (p > 1)).any():
        raise ValueError(f"p_values must be a 1-d sequence of numbers in [0, 1], got {p_values!r}")
    return p


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error; Holm, Scand. J. Statistics 6, 1979)."""
    p = _p_array(p_values)
    m, order = len(p), np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])  # the k-th smallest times m - k + 1
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def benjamini_hochberg(p_values) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false discovery rate; JRSS B 57, 1995)."""
    p = _p_array(p_values)
    m, order = len(p), np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)  # the k-th smallest times m / k
    stepped = np.minimum.accumulate(scaled[::-1])[::-1]
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


CORRECTIONS = {
    "holm": (holm, "Holm's step-down correction (family-wise error rate)"),
    "bh": (benjamini_hochberg, "the Benjamini-Hochberg correction (false discovery rate)"),
}


def correct(family: Mapping[str, PairedTest] | Sequence[float], method: str = "holm") -> dict | np.ndarray:
    """Adjusted p-values of a page's family: ``{name: p}`` for ``{name: PairedTest}``, else an array."""
    if method not in CORRECTIONS:
        raise ValueError(f"method must be one of {sorted(CORRECTIONS)}, got {method!r}")
    adjust = CORRECTIONS[method][0]
    if isinstance(family, Mapping):
        names = list(family)
        return dict(zip(names, map(float, adjust([family[n].p_value for n in names])), strict=True))
    return adjust(family)


def correction_note(method: str, count: int, alpha: float = 0.05) -> str:
    """The sentence a page prints under its table: which correction, over how many comparisons."""
    if method not in CORRECTIONS:
        raise ValueError(f"method must be one of {sorted(CORRECTIONS)}, got {method!r}")
    return (
        f"Marks are significant at {alpha:g} after {CORRECTIONS[method][1]} over the page's {count} "
        f"comparisons; the intervals shown are seed-level {1 - alpha:.0%} intervals, uncorrected."
    )
