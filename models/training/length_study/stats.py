"""Paired bootstrap intervals over windows and training seeds.

Every arm of the study is measured on the same held-out windows with models of the same
training seeds (seed ``s`` of every arm shares its data order), so a result is an array
``[seeds, windows]`` and two arms pair cell by cell. One bootstrap draw resamples the
seeds and the windows with replacement (the same draw for every arm: paired) and takes
the mean; the 95% interval is the 2.5 and 97.5 percentiles of those means. Resampling the
seeds carries the training noise into the interval; with 3 seeds that part is coarse,
which the page says.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Interval", "Resampler", "overlap"]


class Interval(tuple):
    """``(mean, low, high)``."""

    __slots__ = ()

    def __new__(cls, mean: float, low: float, high: float):
        return super().__new__(cls, (float(mean), float(low), float(high)))

    mean = property(lambda self: self[0])
    low = property(lambda self: self[1])
    high = property(lambda self: self[2])

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two intervals share any value."""
    return a.low <= b.high and b.low <= a.high


class Resampler:
    """One fixed set of bootstrap draws for arrays ``[n_seeds, n_windows]``: every arm sees the same draws.

    Args:
        n_seeds, n_windows: the shape of every array this resampler takes.
        draws: bootstrap replicates.
        seed: of the draws (fixed: the page's intervals are reproducible).
        level: coverage of the intervals.
    """

    def __init__(self, n_seeds: int, n_windows: int, draws: int = 2000, seed: int = 0, level: float = 0.95):
        rng = np.random.default_rng(seed)
        self.shape = (n_seeds, n_windows)
        self.seeds = rng.integers(0, n_seeds, size=(draws, n_seeds))  # [draws, S]
        self.windows = rng.integers(0, n_windows, size=(draws, n_windows))  # [draws, W]
        self.tails = (100 * (1 - level) / 2, 100 * (1 + level) / 2)

    def means(self, values) -> np.ndarray:
        """``[draws]``: the mean of each resampled ``values [S, W]``."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != self.shape:
            raise ValueError(f"values must be [seeds, windows] = {self.shape}, got {values.shape}")
        # mean over resampled seeds of the mean over resampled windows: [draws, S, W] -> [draws]
        return values[self.seeds[:, :, None], self.windows[:, None, :]].mean(axis=(1, 2))

    def interval(self, values) -> Interval:
        """Mean of ``values [S, W]`` and its percentile interval."""
        low, high = np.percentile(self.means(values), self.tails)
        return Interval(np.mean(values), low, high)

    def difference(self, a, b) -> Interval:
        """``mean(a) - mean(b)`` with the interval of the paired differences (same draws for both)."""
        return self.interval(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))

    def ratio(self, a, b) -> Interval:
        """``mean(a) / mean(b)`` with the interval of the paired ratios of means."""
        draws = self.means(a) / self.means(b)
        low, high = np.percentile(draws, self.tails)
        return Interval(np.mean(a) / np.mean(b), low, high)
