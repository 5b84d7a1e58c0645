"""The vision metrics that see (models/studies/vision/metrics.py, validation.py, report.py): the empty rate,
the aspect measure, per-class accuracy, the validation table on known renders, and arms averaged over the
same cells. Tiny shapes: a 2-step classifier (its answers are not the point; the renders' facts are)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from models.studies.vision.classifier import ClassifierConfig, train
from models.studies.vision.metrics import image_metrics, per_class_accuracy, reference
from models.studies.vision.report import Metric, Table, common_cells, interval_table
from models.studies.vision.validation import (
    CONDITIONS,
    render_condition,
    validation_markdown,
    validation_section,
    validation_table,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    classifier, _ = train(ClassifierConfig(steps=2, batch_size=8, resolutions=(32,)))
    return classifier, reference(32, n=32)


def test_validation_table_measures_what_each_render_is(tiny):
    classifier, ref = tiny
    table = validation_table(classifier, ref, n=12)
    assert list(table) == list(CONDITIONS)
    clean, stretched, fragmented, empty = (table[c] for c in ("clean", "stretched 2:1", "fragmented", "empty"))
    assert clean["empty"] == 0.0 and clean["objects"] == 1.0 and abs(clean["aspect"]) < 0.25
    # twice as wide: log2(w / h) one more than the clean shapes' (box sides rounded to pixels: within 0.25)
    assert stretched["aspect"] == pytest.approx(clean["aspect"] + 1.0, abs=0.25)
    assert fragmented["objects"] > 2.0  # pieces, not one object
    assert empty == {
        "accuracy": 0.0, "empty": 1.0, "objects": 0.0, "aspect": empty["aspect"], "answer": "-",
        "answer_share": empty["answer_share"], "samples": 12,
    } and math.isnan(empty["aspect"])  # fmt: skip
    assert all(0 <= row["accuracy"] <= 1 and row["samples"] == 12 for row in table.values())
    lines = validation_markdown(table).splitlines()
    assert len(lines) == 2 + len(CONDITIONS)
    assert lines[2].startswith(f"| clean | {clean['accuracy']:.2f} | 0.00 | 1.00 | {clean['aspect']:+.2f} |")
    assert lines[-1] == "| empty | 0.00 | 1.00 | 0.00 | - | - |"
    with pytest.raises(ValueError, match="condition must be one of"):
        render_condition("rotated", 2, 32)


def test_empty_aspect_and_per_class_accuracy_per_sample(tiny):
    classifier, ref = tiny
    clean, labels = render_condition("clean", 4, 32)
    images = torch.cat(
        [clean[:2], render_condition("empty", 1, 32)[0], render_condition("stretched 2:1", 4, 32)[0][:1, :, :, 16:48]]
    )
    m = image_metrics(images, labels, classifier, ref)
    assert m["empty"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert math.isnan(m["aspect"][2]) and m["objects"][2] == 0 and m["correct"][2] == 0
    correct, classes = np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 2, 2])
    assert per_class_accuracy(correct, classes)[[0, 2]].tolist() == [0.5, 1.0]
    assert np.isnan(per_class_accuracy(correct, classes)[[1, 3]]).all()
    with pytest.raises(ValueError, match="agree on B"):
        per_class_accuracy(correct, classes[:3])


def test_every_arm_is_averaged_over_the_same_cells():
    a = np.array([[1.0, np.nan, 3.0, 4.0]])
    b = np.array([[2.0, 2.0, np.nan, 6.0]])
    values, undefined = common_cells({("g", "a", "size"): a, ("g", "b", "size"): b, ("g", "a", "loss"): a[:, :1]})
    assert np.array_equal(values[("g", "a", "size")], [[1.0, np.nan, np.nan, 4.0]], equal_nan=True)
    assert np.array_equal(values[("g", "b", "size")], [[2.0, np.nan, np.nan, 6.0]], equal_nan=True)
    assert undefined == {("g", "size"): (2, 4), ("g", "loss"): (0, 1)}
    table = Table({("g", "a", "size"): np.vstack([a, a]), ("g", "b", "size"): np.vstack([b, b])}, draws=50)
    assert table.interval("g", "a", "size").mean == 2.5 and table.interval("g", "b", "size").mean == 4.0
    lines = interval_table(table, "g", ["a", "b"], [Metric("size", "size", None, 2)])
    assert lines[-1] == "Cells undefined in some arm, left out of every arm's mean: size 4 of 8."


def test_the_resolution_page_shows_the_validation_json():
    record = json.loads((ROOT / "docs/experiments/metric_validation.json").read_text())
    page = (ROOT / "docs/experiments/resolution.md").read_text()
    assert page.endswith("\n\n" + validation_section(record))  # the section regenerates from its json


def test_paired_differences_are_seed_level_and_the_page_corrects_them_together():
    from models.studies.seed_intervals import SeedBootstrap
    from models.studies.vision.report import correction_lines

    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, (3, 20))
    values = {("g", "a", "m"): base + 0.5, ("g", "b", "m"): base, ("g", "c", "m"): base + rng.normal(0, 1, (3, 20))}
    table = Table(values, draws=200)
    shifted, noisy = table.difference("g", "a", "b", "m"), table.difference("g", "c", "b", "m")
    assert shifted == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5))  # the same cells moved
    assert noisy == SeedBootstrap(3, 20, draws=200, seed=0).difference(values[("g", "c", "m")], base).interval
    lines = correction_lines(table)
    assert lines[0] == "## Multiple comparisons" and "Holm" in lines[2] and "2 comparisons" in lines[2]
    assert "a - b (m, g)" in lines[4] and ("c - b (m, g)" in lines[4]) == (
        table.tests[("g", "c", "b", "m")].p_value < 0.025
    )
    one_seed = Table({("g", "a", "m"): base[:1] + 0.5, ("g", "b", "m"): base[:1]}, draws=50)
    assert one_seed.difference("g", "a", "b", "m").mean == pytest.approx(0.5) and correction_lines(one_seed) == []
