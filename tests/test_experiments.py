"""Each experiment and the sampling script run end to end in a seconds-long smoke size; the reuse rule of runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from models.studies import experiments
from models.training.checkpoint import CheckpointError, metadata
from models.training.config import RUN_DEFAULTS, WEIGHT_NEUTRAL
from models.training.trainer import Run, TrainConfig, train
from scripts import sample


@pytest.fixture(autouse=True)
def _scratch_runs(tmp_path, monkeypatch):
    # smoke runs train into the working directory's runs/: keep them in a scratch folder
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(experiments.EXPERIMENTS) - {"pilot"}))  # pilot: tests/test_pilot.py
def test_experiment_smoke_writes_table_and_pictures(name, tmp_path):
    page = experiments.EXPERIMENTS[name](tmp_path / "out", smoke=True)
    text = page.read_text()
    assert text.startswith("# ") and f"python -m scripts.experiments {name}" in text
    tables = sum(line.startswith("|---") for line in text.splitlines())
    # each study's tables (tests/test_length_study.py, tests/test_vision_study.py); streaming: loss, differences, seeds
    assert tables >= (3 if name == "streaming" else 4)
    data = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert data and all(isinstance(v, dict) for v in data.values())
    for picture in (tmp_path / "out" / "img").iterdir():
        assert picture.stat().st_size > 100
    assert any((tmp_path / "out" / "img").iterdir())


def test_sample_script_any_resolution_and_scaling(tmp_path):
    cfg = TrainConfig(steps=1, batch_size=4, resolution=16, progress=False, report=False, out=str(tmp_path / "run"))
    train(cfg)
    sample.main(
        ["--checkpoint", cfg.out, "--resolution", "24", "--scaling", "interpolate", "--steps", "2", "--per-class", "2"]
    )
    assert (tmp_path / "run" / "sample_24px_interpolate.png").is_file()
    with pytest.raises(SystemExit):
        sample.main(["--checkpoint", cfg.out, "--scaling", "riflex"])
    video = replace(cfg, model="video_dit", frames=2, out=str(tmp_path / "video"))
    train(video)
    sample.main(["--checkpoint", video.out, "--frames", "4", "--scaling", "riflex", "--steps", "2", "--per-class", "1"])
    assert (tmp_path / "video" / "sample_4f_riflex.gif").is_file()


def test_experiments_train_the_default_runs_of_scripts_train():
    from scripts.train import parse_args

    for name, setup in experiments.SETUP.items():  # one table: the same run, into the same folder
        assert experiments.run_for(name) == parse_args(["--model", setup["model"]]) == RUN_DEFAULTS[setup["model"]]
    assert experiments.run_for("frames").resolution == 16 and experiments.run_for("frames").out == "runs/video_dit"
    assert experiments.run_for("length", smoke=True).out == "runs/gpt_smoke"
    assert experiments.run_for("resolution", run_dir="elsewhere").out == "elsewhere"


def test_a_run_is_reused_only_when_its_whole_config_matches(tmp_path, monkeypatch):
    cfg = TrainConfig(steps=2, batch_size=4, resolution=16, progress=False, report=False, out=str(tmp_path / "run"))
    trained = []
    monkeypatch.setattr(experiments, "train", lambda c: trained.append(c) or train(c))
    task, model = experiments.trained_run(cfg)  # nothing there: trains
    assert len(trained) == 1 and task.resolution == 16
    # every weight-neutral field may differ: reused, not retrained
    neutral = replace(cfg, progress=True, report=True, log_every=1, val_every=7, ckpt_every=7, sample_steps=3)
    assert set(WEIGHT_NEUTRAL) >= {"out", "resume", "progress", "report", "log_every", "val_every", "ckpt_every"}
    _, again = experiments.trained_run(neutral)
    assert len(trained) == 1
    for p, q in zip(model.parameters(), again.parameters()):
        assert torch.equal(p, q)
    # any other field: an error that names it and says what to do; the folder is left as it was
    before = (tmp_path / "run" / "checkpoint.safetensors").read_bytes()
    for change in ({"lr": 1e-3}, {"steps": 3}, {"seed": 1}, {"precision": "bf16"}):
        with pytest.raises(CheckpointError, match=f"{next(iter(change))}: saved .* vs wanted .*remove .*--run-dir"):
            experiments.trained_run(replace(cfg, **change))
    assert len(trained) == 1 and (tmp_path / "run" / "checkpoint.safetensors").read_bytes() == before
    from scripts import experiments as cli  # the script reports it and exits with status 1

    with pytest.raises(SystemExit) as stop:
        cli.main(["resolution", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert stop.value.code == 1 and len(trained) == 1
    (tmp_path / "run" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="without config.json"):
        experiments.trained_run(cfg)


def test_a_matching_run_stopped_early_is_resumed(tmp_path, monkeypatch):
    cfg = TrainConfig(steps=3, batch_size=4, resolution=16, progress=False, report=False, out=str(tmp_path / "run"))
    original = Run.train_step

    def interrupt_at_1(self):
        if self.step == 1:
            raise KeyboardInterrupt
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(Run, "train_step", interrupt_at_1)
        train(cfg)  # Ctrl-C after one step: saved at step 1
    assert metadata(tmp_path / "run")["step"] == 1
    experiments.trained_run(cfg)
    assert metadata(tmp_path / "run")["step"] == 3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["resume"] is True


def test_the_guides_paper_table_is_what_the_published_json_gives(tmp_path):
    from pathlib import Path

    from models.studies import paper_findings

    docs = Path(__file__).resolve().parents[1] / "docs"  # the autouse fixture moved into a scratch folder
    guide = (docs / "scaling.md").read_text()
    findings = paper_findings.from_published(docs / "experiments")
    assert paper_findings.guide_block(findings) in guide
    # every page with its json is in the table; a page declared before its runs has none until they are published
    assert set(findings) == set(paper_findings.PAGES) - paper_findings.UNPUBLISHED
    copy = tmp_path / "scaling.md"
    copy.write_text(guide)
    assert not paper_findings.update_guide(copy, docs / "experiments")  # regenerating changes nothing


def test_workers_and_stage_are_the_grid_studys_flags_only(tmp_path):
    from scripts import experiments as cli

    for argv in (["resolution", "--workers", "1"], ["length", "--stage", "pilot"]):
        with pytest.raises(SystemExit) as stop:
            cli.main([*argv, "--out", str(tmp_path / "out")])
        assert stop.value.code == 2  # a usage error, before any work
    assert not (tmp_path / "out").exists()
