"""The competence pilot end to end at its quick size: per-sample values in the json, the table rebuilt from it, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.studies import experiments, pilot
from models.studies.bootstrap import Interval
from models.training.checkpoint import metadata
from models.training.data import CLASSES


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pilot")
    path = experiments.EXPERIMENTS["pilot"](tmp / "out", smoke=True, run_dir=tmp / "runs")
    return tmp, path, json.loads(path.read_text())


def test_pilot_json_holds_every_sample_of_the_three_models(quick_run):
    _, path, data = quick_run
    q = pilot.QUICK
    assert path.name == "pilot.json"
    counts = {
        "image": len(CLASSES) * q.image_per_class,
        "video": len(CLASSES) * q.video_per_class,
        "length": len(data["models"]["length"]["depths"]) * q.trials,
    }
    assert list(data["models"]) == ["image", "video", "length", "image-x2", "length-x2"] == list(pilot.run_names(q))
    for name, m in data["models"].items():
        model = name.split("-x")[0]
        samples = np.array(m["samples"], dtype=np.float64)
        assert samples.shape == (counts[model],) and ((samples >= 0) & (samples <= 1)).all()
        assert m["needed"] == {"image": 0.8, "video": 0.9, "length": 0.9}[model]
        assert data["step_seconds"][name] > 0
    assert set(data["models"]["length"]["samples"]) <= {0.0, 1.0}  # a probe passes or fails
    assert (
        len(data["data"]["image"]["correct"]) == counts["image"]
        and len(data["data"]["video"]["presence"]) == counts["video"]
    )
    assert data["environment"]["command"] == "python -m scripts.experiments pilot --quick"
    steps = {name: m["steps"] for name, m in data["models"].items()}
    assert steps == {"image": 3, "video": 3, "length": 3, "image-x2": 6, "length-x2": 6}


def test_pilot_longer_image_run_is_its_base_run_resumed(quick_run):
    tmp, _, _ = quick_run
    # constant learning rate: the base run resumed (its log continues); cosine (the language model): from scratch
    image_log = (tmp / "runs" / "image-x2" / "train" / "s0" / "log.jsonl").read_text().splitlines()
    base_log = (tmp / "runs" / "image" / "train" / "s0" / "log.jsonl").read_text().splitlines()
    assert image_log[: len(base_log)] == base_log and len(image_log) > len(base_log)
    assert metadata(tmp / "runs" / "image-x2" / "train" / "s0")["step"] == 6
    jobs = [json.loads(line) for line in (tmp / "runs" / "jobs.jsonl").read_text().splitlines()]
    what = {j["key"]: j["what"] for j in jobs}
    assert what["train/image-x2"] == "extended" and what["train/length-x2"] == "trained"


def test_pilot_table_regenerates_from_json_and_states_the_sample_mean(quick_run):
    _, _, data = quick_run
    assert pilot.markdown(data) == data["table"]
    criteria, others = data["table"].split("\n\n")  # the criteria's table, then what else was measured
    rows = criteria.splitlines()[2:]
    assert len(rows) == 5 and len(others.splitlines()) == 2 + 5 + 2  # and the data's two rows
    for row, m in zip(rows, data["models"].values()):
        mean = float(np.mean(np.array(m["samples"], dtype=np.float64)))
        assert row.split(" | ")[5].startswith(f"{mean:.2f} [")


def test_pilot_rerun_reuses_runs_and_results(quick_run):
    tmp, _, data = quick_run
    again = json.loads(experiments.EXPERIMENTS["pilot"](tmp / "out2", smoke=True, run_dir=tmp / "runs").read_text())
    assert again["models"] == data["models"]
    assert again["environment"]["checkpoints"] == data["environment"]["checkpoints"]


def test_published_pilot_table_regenerates_from_its_json():
    data = json.loads((Path(__file__).parents[1] / "docs" / "experiments" / "pilot.json").read_text())
    assert pilot.markdown(data) == data["table"]
    assert data["environment"]["command"] == "python -m scripts.experiments pilot"


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        (Interval(0.85, 0.81, 0.90), "yes"),
        (Interval(0.80, 0.80, 0.85), "yes"),  # the criterion is ">= needed"
        (Interval(0.70, 0.60, 0.79), "no"),
        (Interval(0.82, 0.75, 0.90), "yes, interval reaches below"),
        (Interval(0.78, 0.70, 0.85), "no, interval reaches above"),
    ],
)
def test_verdict_says_whether_the_interval_settles_the_criterion(interval, expected):
    assert pilot.verdict(interval, 0.8) == expected
