"""Bootstrap intervals over training seeds and samples, paired across arms: every study's statistics.

Every arm of a study is measured with models of the same training seeds on the same samples
(the same held-out windows or test images, or the same initial noise and labels for generated
samples), so a metric is an array ``[seeds, samples]`` and two arms pair cell by cell. One bootstrap draw
resamples seeds, then samples, with replacement (the same draw for every arm: paired) and
takes the mean, ignoring NaN cells (a metric undefined for a sample, e.g. the size of an object
that was not drawn). The interval is the 2.5 and 97.5 percentiles of those means. Resampling the
seeds carries the training noise into the interval; with 3 seeds that part is coarse.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["Bootstrap", "Interval", "overlap", "verdict"]


class Interval(NamedTuple):
    """``(mean, low, high)`` of a 95% bootstrap interval (NaN when no cell is defined)."""

    mean: float
    low: float
    high: float

    def format(self, digits: int = 3) -> str:
        if math.isnan(self.mean):
            return "-"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def __str__(self) -> str:
        return self.format()

    def excludes(self, value: float = 0.0) -> bool:
        """Whether the interval lies wholly above or below ``value``."""
        return not math.isnan(self.mean) and (self.low > value or self.high < value)


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two intervals share any value."""
    return a.low <= b.high and b.low <= a.high


def verdict(
    difference: Interval, higher: str = "higher", lower: str = "lower", neither: str = "no difference shown"
) -> str:
    """``higher`` / ``lower`` when the paired difference's interval excludes 0, else ``neither``."""
    if not difference.excludes(0.0):
        return neither
    return higher if difference.low > 0 else lower


class Bootstrap:
    """One fixed set of draws for arrays ``[n_seeds, n_samples]``; every arm sees the same draws.

    Args:
        n_seeds, n_samples: the shape of every array it takes.
        draws: bootstrap replicates; seed: of the draws (fixed: reproducible pages); level: coverage.
    """

    def __init__(self, n_seeds: int, n_samples: int, draws: int = 2000, seed: int = 0, level: float = 0.95):
        rng = np.random.default_rng(seed)
        self.shape = (n_seeds, n_samples)
        self.seeds = rng.integers(0, n_seeds, size=(draws, n_seeds))  # [D, S]
        self.samples = rng.integers(0, n_samples, size=(draws, n_seeds, n_samples))  # [D, S, N]: per seed
        self.tails = (100 * (1 - level) / 2, 100 * (1 + level) / 2)

    def _check(self, values) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != self.shape:
            raise ValueError(f"values must be [seeds, samples] = {self.shape}, got {values.shape}")
        return values

    def means(self, values) -> np.ndarray:
        """``[draws]``: the mean of each resampled ``values [S, N]`` (NaN cells left out; NaN if none left)."""
        values = self._check(values)
        picked = values[self.seeds[:, :, None], self.samples]  # [D, S, N]
        defined = ~np.isnan(picked)
        count = defined.sum(axis=(1, 2))
        total = np.where(defined, picked, 0.0).sum(axis=(1, 2))
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / count

    def _interval(self, estimate: float, draws: np.ndarray, level: float | None = None) -> Interval:
        draws = draws[~np.isnan(draws)]
        if math.isnan(estimate) or not len(draws):
            return Interval(math.nan, math.nan, math.nan)
        tails = self.tails if level is None else (100 * (1 - level) / 2, 100 * (1 + level) / 2)
        low, high = np.percentile(draws, tails)
        return Interval(float(estimate), float(low), float(high))

    def interval(self, values) -> Interval:
        """The mean of ``values [S, N]`` (defined cells) and its interval."""
        values = self._check(values)
        estimate = float(np.nanmean(values)) if (~np.isnan(values)).any() else math.nan
        return self._interval(estimate, self.means(values))

    def difference(self, a, b, *, level: float | None = None) -> Interval:
        """``mean(a) - mean(b)`` with the interval of the paired differences (the same draws for both);
        ``level``: another coverage than the one of this bootstrap (e.g. Bonferroni over several tests)."""
        a, b = self._check(a), self._check(b)
        if np.isnan(a).all() or np.isnan(b).all():
            return Interval(math.nan, math.nan, math.nan)
        return self._interval(float(np.nanmean(a) - np.nanmean(b)), self.means(a) - self.means(b), level)

    def ratio(self, a, b) -> Interval:
        """``mean(a) / mean(b)`` with the interval of the paired ratios of means (the same draws for both)."""
        a, b = self._check(a), self._check(b)
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._interval(float(np.nanmean(a) / np.nanmean(b)), self.means(a) / self.means(b))
