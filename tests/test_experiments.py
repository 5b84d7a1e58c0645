"""Each experiment and the sampling script run end to end in a seconds-long smoke size."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from models import experiments
from models.train import TrainConfig, train
from scripts import sample


@pytest.fixture(autouse=True)
def _scratch_runs(tmp_path, monkeypatch):
    # smoke runs train into the working directory's runs/: keep them in a scratch folder
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(experiments.EXPERIMENTS))
def test_experiment_smoke_writes_table_and_pictures(name, tmp_path):
    page = experiments.EXPERIMENTS[name](tmp_path / "out", smoke=True)
    text = page.read_text()
    assert text.startswith("# ") and f"python -m scripts.experiments {name}" in text
    assert sum(line.startswith("|---") for line in text.splitlines()) == 1  # one table
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
