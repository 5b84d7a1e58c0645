"""The grid study's declared design (docs/experiments/design.md): the grid where the scalings differ, its arms,
the declared family, and the quality score's validation."""

from __future__ import annotations

import math

import pytest
import torch

import axial_rope as ar
from models.studies.vision import grid


def test_on_the_grid_yarn_ramps_ntk_acts_and_dy_yarn_moves_with_time():
    counts = grid.plane_counts(grid.FULL, 2.0)
    assert counts["planes"] == 16 and counts["train_tokens"] == 16 and counts["theta"] == 100.0
    assert counts["yarn"] == {"kept": 1, "ramp": 3, "interpolated": 12}  # the design's numbers
    assert counts["dy_yarn"]["1.0"]["interpolated"] == 15 and counts["dy_yarn"]["0.25"]["ramp"] == 10
    assert counts["partial_turn_planes"] == 12
    assert counts["ntk_ratio"][4] == pytest.approx(2 ** (-8 / 30), abs=0.005)  # the planes near the extent move
    # the 8 x 8 grid of the resolution study at theta 10000: YaRN there is interpolation but for one plane
    base = ar.inv_freq(16, 10000.0)[0]
    yarn = ar.inv_freq(16, 10000.0, ar.scaling.YaRN(2.0, 8))[0]
    assert int(torch.isclose(yarn, ar.inv_freq(16, 10000.0, ar.scaling.Linear(2.0))[0]).sum()) == 7
    assert int(torch.isclose(yarn, base).sum()) == 1


def test_each_arm_rotates_as_declared():
    study, size = grid.FULL, (28, 56)  # 14 x 28 tokens: only x is longer than in training
    assert grid.factors(study, size) == (1.0, 1.75)
    assert grid.arm_kwargs(study, "interpolate", size) == {"pos_mode": "interpolate"}
    no_factor = grid.arm_kwargs(study, "yarn, no attention factor", size)["scaling"]
    assert no_factor[0] is None and no_factor[1].attention_scale() == 1.0
    assert no_factor[1] == ar.scaling.YaRN(1.75, 16, attention_factor=1.0)
    y_axis, x_axis = grid.arm_kwargs(study, "interpolate, YaRN's factor", size)["scaling"]
    inv, factor = ar.inv_freq(32, 100.0, x_axis)
    assert y_axis is None and factor == pytest.approx(0.1 * math.log(1.75) + 1)
    assert torch.allclose(inv, ar.inv_freq(32, 100.0, ar.scaling.Linear(1.75))[0])  # interpolation's frequencies
    assert "normalize" in grid.arms_at(study, size) and "normalize" not in grid.arms_at(study, (64, 64))
    assert grid.arms_at(study, (32, 32)) == ["trained size"]
    assert [a for a in grid.arms_at(study, (64, 64)) if a.startswith("fine-tuned")] == [
        "fine-tuned, none", "fine-tuned, interpolate", "fine-tuned, yarn"
    ]  # fmt: skip


def test_jobs_run_the_pilot_first_and_whole_seeds_before_the_dear_sizes():
    study = grid.FULL
    pilot = [j.key for j in grid.study_jobs(study, "pilot")]
    assert pilot == ["classifier", "train/s0", "eval/s0/32x32/trained size"]
    keys = [j.key for j in grid.study_jobs(study)]
    assert keys[:3] == pilot and len(keys) == len(set(keys))
    assert keys.index("eval/s0/64x64/none") < keys.index("train/s1") < keys.index("eval/s0/128x128/none")
    first_seed = keys[: keys.index("train/s1")]
    declared = [k for k in first_seed if k.startswith("eval/s0/40x40")]
    assert declared[:5] == [f"eval/s0/40x40/{a}" for a in grid.PRIMARY_ARMS]  # the declared arms first
    done = set()
    for job in grid.study_jobs(study):  # every job's needs come before it
        assert set(job.needs) <= done
        done.add(job.key)


@pytest.mark.parametrize("size", grid.FULL.sizes[1:])
def test_the_automatic_policys_content_positions_are_an_arm_already_run(size):
    # the policy plans "content" for image axes: interpolation on a square upscale, plain positions where the shorter
    # side stays inside the trained extent (FiT's 1:2 and 1:3 here), so its cells are those arms' cells
    tokens = (size[0] // 2, size[1] // 2)
    content = ar.positions_for_size(tokens, 16, "content")
    same = "interpolate" if size[0] == size[1] else "none"
    assert grid.policy_arm(grid.FULL, size) == same
    assert torch.equal(content.pos, ar.positions_for_size(tokens, 16, same).pos)
    assert content.scaling == (None, None)


def test_a_papers_verdict_follows_the_intervals_on_the_predicted_side():
    from models.studies.bootstrap import Interval
    from models.studies.papers import Measurement, verdict_of

    lower, higher, zero = Interval(-1.0, -2.0, -0.5), Interval(1.0, 0.5, 2.0), Interval(0.1, -0.5, 0.7)
    assert verdict_of([Measurement("a", lower, "lower"), Measurement("b", zero, "lower")]) == "agree"
    assert verdict_of([Measurement("a", lower, "higher")]) == "disagree"
    assert verdict_of([Measurement("a", lower, "lower"), Measurement("b", higher, "lower")]) == "mixed"
    assert verdict_of([Measurement("a", zero, "lower")]) == "not shown"
    assert verdict_of([Measurement("a", None, "lower")]) == "not tested"


def test_the_declared_family_is_what_holm_corrects_and_the_rest_is_bh():
    import numpy as np

    from models.studies.bootstrap import Interval
    from models.studies.family import Contrast, correct_declared
    from models.studies.seed_intervals import PairedTest, benjamini_hochberg, holm

    def test(p):
        return PairedTest(Interval(0.0, -1.0, 1.0), p, (0.0,), 5, "t")

    family = [Contrast("64x64", "yarn", "interpolate", "shape_error"), Contrast("64x64", "ntk", "interpolate",
              "shape_error"), Contrast("128x128", "yarn", "interpolate", "shape_error")]  # fmt: skip
    primary = {family[0].key: test(0.01), family[1].key: test(0.02)}  # the third declared contrast was not run
    rest = {("64x64", "yarn", "none", "correct"): test(0.001), ("64x64", "none", "yarn", "correct"): test(0.001),
            ("40x40", "ntk", "none", "loss_grown"): test(0.04)}  # fmt: skip
    corrected = correct_declared(primary | rest, family)
    # Holm over exactly the three declared contrasts, the one not run counting as p = 1
    assert [corrected[c.key].adjusted for c in family] == pytest.approx(list(holm([0.01, 0.02, 1.0])))
    assert all(corrected[c.key].method == "holm" and corrected[c.key].primary for c in family)
    # the exploratory ones: BH over themselves only (a pair tested both ways counts once)
    explored = {k: c for k, c in corrected.items() if not c.primary}
    assert len(explored) == 2 and all(c.method == "bh" for c in explored.values())
    assert sorted(c.adjusted for c in explored.values()) == pytest.approx(sorted(benjamini_hochberg([0.001, 0.04])))
    # more exploratory tests never change the primary family's correction
    more = {("20x60", f"arm{i}", "none", "empty"): test(0.5) for i in range(50)}
    again = correct_declared(primary | rest | more, family)
    assert [again[c.key].adjusted for c in family] == [corrected[c.key].adjusted for c in family]
    # a reversed test of a declared contrast is that contrast, not an exploratory one
    flipped = correct_declared({("64x64", "interpolate", "yarn", "shape_error"): test(0.01)}, family)
    assert set(flipped) == {c.key for c in family} and np.isclose(flipped[family[0].key].p_value, 0.01)
    with pytest.raises(ValueError, match="twice"):
        correct_declared({}, family + family[:1])


def test_the_full_design_declares_24_contrasts_at_the_primary_sizes():
    family = grid.declared_family(grid.FULL)
    assert len(family) == 24 and len({c.key for c in family}) == 24
    assert {c.group for c in family} == {"40x40", "28x56", "20x60", "64x64", "128x128"}  # not 1x, not 3x
    assert {c.metric for c in family} == {"shape_error", "correct"}
    assert [c for c in family if c.metric == "correct"] == [c for c in family if c.question.startswith("Q2")][2:]


@pytest.mark.parametrize("size", [(20, 60), (40, 40), (64, 64)])
def test_the_shape_error_rises_on_every_changed_render(size):
    from models.studies.vision.quality import CORRUPTIONS, corrupt, shape_error

    clean = shape_error(corrupt("clean", 8, size)).mean()
    assert clean < 0.15  # a clean render fits one clean shape
    for condition in CORRUPTIONS[1:]:
        assert shape_error(corrupt(condition, 8, size)).mean() > clean + 0.08, condition


def test_the_canvas_error_reads_clean_tiles_as_clean_and_fragments_as_broken():
    from models.studies.vision.quality import canvas_error, corrupt, shape_error

    tiled = corrupt("tiled 2x2", 4, (48, 48))
    assert canvas_error(tiled).mean() < 0.1 < 0.5 < shape_error(tiled).mean()
    assert canvas_error(corrupt("fragmented", 4, (48, 48))).mean() > canvas_error(tiled).mean() + 0.05


def test_quick_grid_study_runs_end_to_end_reuses_its_cells_and_regenerates(tmp_path, capsys):
    import json

    from models.studies.vision import grid_page, run_grid

    page = run_grid(tmp_path / "out", quick=True, root=tmp_path / "runs").read_text()  # about a minute
    data = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert grid_page.markdown(data) == page  # every figure recomputed from the json's cells
    assert "## Primary contrasts (declared)" in page and "Benjamini-Hochberg" in page
    assert f"over exactly these {len(grid.declared_family(grid.QUICK))} contrasts" in page
    assert data["quality_check"] and data["classifier_check"] and data["cells"]["32x32"]["fine-tuned, none"]
    capsys.readouterr()
    run_grid(tmp_path / "out", quick=True, root=tmp_path / "runs")  # every cell is there: nothing recomputed
    log = capsys.readouterr().out
    assert log.count(": reused") + log.count(": ready") == log.count("] ") > 40
