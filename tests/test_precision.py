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


def invariance_bound(dtype: str, seed: int = 0, dim: int = 64) -> float:
    """How far the far score may sit from the near one, for the q, k that invariance_table(seed) draws.

    Scores are float64 dot products of the rotated vectors. float64: each plane's angle near 1e6 is
    rounded (``|theta| 2**-53``) on each side, moving the score by ``sum_p |q_p| |k_p| (|theta_m| +
    |theta_n|) u``, plus the rotations' arithmetic (``17 u |q| |k|``, helpers.TOL, both pairs). float32:
    float64 angles, tables rounded once, float32 rotations: ``17 u |q| |k|`` with u = 2**-24. bfloat16:
    each rotated channel is rounded once (2**-8 relative), independently: a random-sign sum, within
    ``2 lam 2**-8 sqrt(2 sum_p |q_p|^2 |k_p|^2)`` with lam = 1.5 -- an estimate, not a bound (the
    deterministic bound, 2**-7 |q| |k| ~ 0.5, would not tell invariance from its failure).
    """
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, dim, generator=gen, dtype=torch.float64)
    qk = float(q.norm() * k.norm())
    planes = q.view(-1, 2).norm(dim=-1) * k.view(-1, 2).norm(dim=-1)  # |q_p| |k_p|
    if dtype == "float64":
        inv = ar.inv_freq(dim)[0]
        return float((planes * 2.0e6 * inv).sum()) * 2.0**-53 * 2 + 17 * 2.0**-53 * qk
    if dtype == "float32":
        return 17 * 2.0**-24 * qk
    return 2 * 1.5 * 2.0**-8 * float((2 * planes.square().sum()).sqrt())


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_far_score_matches_near_score(table, dtype):
    scores = table["axial_rope"][dtype]
    assert abs(scores[FAR] - scores[NEAR]) < invariance_bound(dtype)
    assert abs(scores[CONTROL] - scores[NEAR]) > 0.5  # 100 positions apart: a different score


@pytest.mark.parametrize("dtype,at_least", [("float32", 1e-2), ("bfloat16", 0.5)])
def test_naive_low_precision_angles_break_invariance(table, dtype, at_least):
    # the failure axial_rope avoids: without it the check above would pass vacuously
    scores = table["naive"][dtype]
    assert abs(scores[FAR] - scores[NEAR]) > at_least


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_float32_invariance_several_draws(seed):
    scores = invariance_table(seed=seed)["axial_rope"]
    assert abs(scores["float32"][FAR] - scores["float32"][NEAR]) < invariance_bound("float32", seed)
    assert abs(scores["bfloat16"][FAR] - scores["bfloat16"][NEAR]) < invariance_bound("bfloat16", seed)


def test_cos_sin_at_large_positions_match_float64_math():
    rope = ar.AxialRoPE(64)
    pos = torch.tensor([1_000_003.0, 1_000_007.0])
    cos, sin = rope.cos_sin(pos)
    angle = pos.double()[:, None] * ar.inv_freq(64)[0]
    # float64 angles on both sides, rounded once to float32: 2**-24 apart at most
    torch.testing.assert_close(cos[:, 0::2], angle.cos().float(), atol=2e-7, rtol=0)
    torch.testing.assert_close(sin[:, 0::2], angle.sin().float(), atol=2e-7, rtol=0)


def test_rope_check_script_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "scripts.rope_check"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| naive") or line.startswith("| axial_rope")]
    assert len(rows) == 8 and "control (107; 3)" in out  # naive and float64 angles x 3 dtypes, turns x 2
