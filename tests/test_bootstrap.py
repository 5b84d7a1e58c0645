"""The studies' paired bootstrap (models/studies/bootstrap.py), on data with a known answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.studies.bootstrap import Bootstrap, Interval, overlap, verdict


def test_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered, trials = 0, 200
    for _ in range(trials):  # seeds shift every sample alike; samples add their own noise
        values = 2.0 + rng.normal(0, 0.05, (3, 1)) + rng.normal(0, 0.3, (3, 100))
        covered += Bootstrap(3, 100, draws=400, seed=1).interval(values).low <= 2.0
    # the 2.5% lower tail: the interval's low end lies below the true mean in about 97.5% of samples
    assert 0.9 <= covered / trials <= 1.0


def test_paired_difference_resolves_what_the_separate_intervals_cannot():
    rng = np.random.default_rng(1)
    shared = rng.normal(0, 1.0, (3, 200))  # a large per-sample effect that both arms share
    a, b = 3.0 + shared, 3.05 + shared + rng.normal(0, 0.01, (3, 200))
    boot = Bootstrap(3, 200, draws=1000, seed=0)
    ia, ib, diff = boot.interval(a), boot.interval(b), boot.difference(a, b)
    assert overlap(ia, ib)  # side by side, the arms look the same ...
    assert diff.high < 0 and diff.low == pytest.approx(-0.05, abs=0.01)  # ... paired, b is higher by 0.05
    assert verdict(diff) == "lower"
    same = boot.difference(a, a)
    assert same == (0.0, 0.0, 0.0) and verdict(same) == "no difference shown"


def test_shifted_cells_differ_exactly_and_undefined_cells_are_left_out():
    rng = np.random.default_rng(0)
    values = rng.normal(0.5, 1.0, size=(3, 400))
    boot = Bootstrap(3, 400, draws=1000)
    interval = boot.interval(values)
    assert interval.low < 0.5 < interval.high and interval.high - interval.low < 0.4
    diff = boot.difference(values + 0.1, values)  # the same cells moved: the paired difference is exactly 0.1
    assert diff.mean == pytest.approx(0.1) and diff.high - diff.low < 1e-9 and verdict(diff) == "higher"
    holes = values.copy()
    holes[:, ::2] = np.nan  # undefined cells are left out, not zero
    assert boot.interval(holes).mean == pytest.approx(np.nanmean(holes))
    assert math.isnan(boot.interval(np.full((3, 400), np.nan)).mean)
    assert str(boot.interval(np.full((3, 400), np.nan))) == "-"


def test_identical_draws_for_every_arm_ratios_and_shapes_checked():
    one, two = Bootstrap(2, 5, draws=50, seed=3), Bootstrap(2, 5, draws=50, seed=3)
    values = np.arange(10.0).reshape(2, 5)
    assert np.array_equal(one.means(values), two.means(values))
    with pytest.raises(ValueError, match=r"\[seeds, samples\] = \(2, 5\)"):
        one.interval(np.zeros((3, 5)))
    assert one.ratio(np.full((2, 5), 3.0), np.full((2, 5), 2.0)) == (1.5, 1.5, 1.5)
    assert str(Interval(1.0, 0.5, 1.25)) == "1.000 [0.500, 1.250]"
    assert not overlap(Interval(1.0, 0.9, 1.1), Interval(2.0, 1.2, 2.5))
