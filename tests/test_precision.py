"""Angles are never computed in the input dtype: relative invariance holds a million positions out."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import axial_rope as ar
from scripts.rope_check import PAIRS, invariance_table

NEAR, FAR, CONTROL = PAIRS


@pytest.fixture(scope="module")
def table():
    return invariance_table(seed=0)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-9), ("float32", 1e-4), ("bfloat16", 0.1)])
def test_far_score_matches_near_score(table, dtype, tol):
    scores = table["axial_rope"][dtype]
    assert abs(scores[FAR] - scores[NEAR]) < tol
    assert abs(scores[CONTROL] - scores[NEAR]) > 0.5  # 100 positions apart: a different score


@pytest.mark.parametrize("dtype,at_least", [("float32", 1e-2), ("bfloat16", 0.5)])
def test_naive_low_precision_angles_break_invariance(table, dtype, at_least):
    # the failure axial_rope avoids: without it the check above would pass vacuously
    scores = table["naive"][dtype]
    assert abs(scores[FAR] - scores[NEAR]) > at_least


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_float32_invariance_several_draws(seed):
    scores = invariance_table(seed=seed)["axial_rope"]
    assert abs(scores["float32"][FAR] - scores["float32"][NEAR]) < 1e-4
    assert abs(scores["bfloat16"][FAR] - scores["bfloat16"][NEAR]) < 0.1


def test_cos_sin_at_large_positions_match_float64_math():
    rope = ar.AxialRoPE(64)
    pos = torch.tensor([1_000_003.0, 1_000_007.0])
    cos, sin = rope.cos_sin(pos)
    angle = pos.double()[:, None] * ar.inv_freq(64)[0]
    torch.testing.assert_close(cos[:, 0::2], angle.cos().float(), atol=2e-7, rtol=0)
    torch.testing.assert_close(sin[:, 0::2], angle.sin().float(), atol=2e-7, rtol=0)


def test_rope_check_script_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "scripts.rope_check"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| naive") or line.startswith("| axial_rope")]
    assert len(rows) == 6 and "control (107; 3)" in out
