"""Training: the loss falls, resuming reproduces the uninterrupted run, checkpoints fail loudly."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from models.training import checkpoint, sharded_checkpoint
from models.training.config import RUN_DEFAULTS
from models.training.trainer import Run, TrainConfig, train
from scripts.train import parse_args

TINY = TrainConfig(
    steps=6, batch_size=4, resolution=16, log_every=1, val_every=10**6, ckpt_every=10**6, progress=False, report=False
)


def losses(out: str | Path) -> list[float]:
    lines = Path(out, "log.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


def test_a_few_steps_lower_the_loss(tmp_path):
    cfg = replace(TINY, steps=40, batch_size=8, lr=2e-3, warmup=5, out=str(tmp_path), report=True, sample_steps=2)
    train(cfg)
    curve = losses(tmp_path)
    assert len(curve) == 40
    assert sum(curve[-5:]) / 5 < 0.8 * sum(curve[:5]) / 5
    for name in ("checkpoint.safetensors", "loss.png", "samples.png", "config.json"):
        assert (tmp_path / name).is_file(), name


def test_resume_reproduces_the_uninterrupted_loss_curve(tmp_path):
    full = replace(TINY, out=str(tmp_path / "full"))
    train(full)
    half = replace(TINY, steps=3, out=str(tmp_path / "half"))
    train(half)
    train(replace(half, steps=6, resume=True))
    assert losses(tmp_path / "half") == losses(tmp_path / "full")  # bit for bit, data and noise included
    a = checkpoint.load(tmp_path / "full" / "checkpoint.safetensors", run={}, keys=())
    b = checkpoint.load(tmp_path / "half" / "checkpoint.safetensors", run={}, keys=())
    assert a["step"] == b["step"] == 6
    for key in a["ema"]:
        assert torch.equal(a["ema"][key], b["ema"][key]), key


def test_ctrl_c_saves_and_exits_cleanly(tmp_path, monkeypatch):
    cfg = replace(TINY, out=str(tmp_path))
    original = Run.train_step

    def interrupt_at_4(self):
        if self.step == 4:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Run, "train_step", interrupt_at_4)
    result = train(cfg)
    assert result == {"step": 4, "interrupted": True, "out": str(tmp_path)}
    saved = checkpoint.load(tmp_path / "checkpoint.safetensors", run={}, keys=())
    assert saved["step"] == 4


def test_resume_errors_are_clear(tmp_path):
    cfg = replace(TINY, steps=2, out=str(tmp_path))
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
        train(replace(cfg, resume=True))
    train(cfg)
    with pytest.raises(checkpoint.CheckpointError, match="another run.*resolution: checkpoint 16 vs now 32"):
        train(replace(cfg, resolution=32, steps=4, resume=True))
    path = tmp_path / "checkpoint.safetensors"
    path.write_bytes(path.read_bytes()[:100])  # truncated: corrupt
    with pytest.raises(checkpoint.CheckpointError, match="not a readable safetensors"):
        train(replace(cfg, steps=4, resume=True))


def test_checkpoint_is_written_atomically(tmp_path):
    train(replace(TINY, steps=2, out=str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(model="gpt", steps=3, batch_size=2, context=32, log_every=1, ema=0.0),
        TrainConfig(model="video_dit", steps=3, batch_size=2, resolution=16, frames=3, log_every=1),
    ],
    ids=["gpt", "video_dit"],
)
def test_other_models_train_and_report(cfg, tmp_path):
    result = train(replace(cfg, out=str(tmp_path), progress=False, val_every=10**6, ckpt_every=10**6, sample_steps=2))
    assert result["step"] == 3 and len(losses(tmp_path)) == 3
    sample = {"gpt": "samples.txt", "video_dit": "samples.gif"}[cfg.model]
    assert (tmp_path / sample).is_file()


def test_cli_defaults_and_unknown_names():
    cfg = parse_args([])
    assert (cfg.model, cfg.preset, cfg.resolution, cfg.out) == ("dit", "tiny", 32, "runs/dit")
    gpt = parse_args(["--model", "gpt", "--steps", "7"])
    assert (gpt.steps, gpt.batch_size, gpt.schedule, gpt.out) == (7, 32, "cosine", "runs/gpt")
    video = parse_args(["--model", "video_dit", "--no-report"])  # the experiments' run: 16 px, 8 frames
    assert (video.resolution, video.frames, video.steps, video.out) == (16, 8, 600, "runs/video_dit")
    assert not video.report
    for model, default in RUN_DEFAULTS.items():  # scripts.train starts from the one table of run defaults
        assert parse_args(["--model", model]) == default
    with pytest.raises(ValueError, match="preset"):
        Run(replace(TINY, preset="DiT-H/2"))


def test_a_dcp_save_that_fails_after_its_writes_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """The last step of a DCP save (rank 0: checksums, meta.json, the link's swap) failing, as on a full disk:
    a CheckpointError (every rank's, models/training/distributed.py: on_rank0), the step-1 checkpoint kept whole."""
    run = Run(replace(TINY, steps=2, out=str(tmp_path)))
    state = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema, "run": asdict(run.cfg), "extra": {}}
    run.train_step()
    sharded_checkpoint.save(tmp_path, **state, step=1)
    kept = sorted(p.name for p in tmp_path.iterdir())
    run.train_step()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "symlink", disk_full)
    with pytest.raises(checkpoint.CheckpointError, match="step 2 .*No space left on device.*is unchanged"):
        sharded_checkpoint.save(tmp_path, **state, step=2)
    assert sharded_checkpoint.metadata(tmp_path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == kept  # the failed save's folder removed
