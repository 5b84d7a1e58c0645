"""Training runs and checkpoints under faults: interrupts, kills, divergence, corruption, nonsense settings.

Each test reproduces a fault that once lost progress or went silently wrong (docs/training.md,
"What is guaranteed"). Interrupts are simulated in the process: a tracer counts the lines the
trainer runs inside its steps and, at a chosen one, sends SIGINT or SIGTERM to the process (the
deferred stop a person or a scheduler causes) or raises ``KeyboardInterrupt`` there (a second
Ctrl-C: a stop that cannot wait). The slow variants interrupt many more points, and real
subprocesses at random times.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import one_torch_thread

from models.training import checkpoint, rundir, trainer
from models.training.checkpoint import CheckpointError
from models.training.config import TrainConfig
from models.training.pictures import plot_loss
from models.training.rundir import RunFolderError, RunLock
from models.training.tasks import ImageTask
from models.training.trainer import Run, TrainingDiverged, train
from scripts import train as cli

ROOT = Path(__file__).resolve().parents[1]
# log_every 2: a resume must continue the log window it was in; ckpt_every 2: kills find older checkpoints
TINY = TrainConfig(
    steps=5, batch_size=4, resolution=16, log_every=2, val_every=10**6, ckpt_every=2, progress=False, report=False
)


_one_thread = one_torch_thread()


def records(out: Path) -> list[tuple]:
    return [(r["step"], r["loss"], r["lr"]) for r in rundir.read_log(out / "log.jsonl") if "loss" in r]


def assert_same_run(out: Path, reference: Path) -> None:
    """The logs' loss records and the final checkpoints' tensors are equal bit for bit."""
    assert records(out) == records(reference)
    a, b = checkpoint.load(out), checkpoint.load(reference)
    assert a["step"] == b["step"]
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)
    for index, entry in a["optimizer"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), (index, key)


class Interrupt:
    """A tracer that, at the ``at``-th line the trainer runs inside a step, sends a signal or raises."""

    FUNCTIONS = {"train_step", "_after_step", "save", "state", "log", "learning_rate"}

    def __init__(self, at: float, action: str):
        self.at, self.action, self.count = at, action, 0

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if code.co_filename == trainer.__file__ and code.co_name in self.FUNCTIONS:
            return self.line
        return None

    def line(self, frame, event, arg):
        if event == "line":
            self.count += 1
            if self.count == self.at:
                if self.action == "raise":
                    raise KeyboardInterrupt  # a stop that cannot wait for the step to end
                signal.raise_signal(getattr(signal, self.action))
        return self.line

    def run(self, cfg: TrainConfig) -> dict | None:
        """``train(cfg)`` under this tracer; ``None`` when the interrupt escaped ``train`` (a killed process)."""
        previous, grad = sys.gettrace(), torch.is_grad_enabled()  # a coverage tool's tracer comes back afterwards
        sys.settrace(self)
        try:
            return train(cfg)
        except KeyboardInterrupt:
            return None
        finally:
            sys.settrace(previous)
            # raised at the line event CPython emits as a `with torch.no_grad()` block ends, the interrupt skips
            # __exit__: a real process ends there, this one goes on testing, so its grad mode is restored
            torch.set_grad_enabled(grad)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, int]:
    """The uninterrupted run, and how many lines the trainer runs inside its steps."""
    out = tmp_path_factory.mktemp("reference")
    counter = Interrupt(float("inf"), "raise")
    counter.run(replace(TINY, out=str(out)))
    return out, counter.count


def _interrupt_and_resume(tmp_path: Path, at: int, action: str) -> None:
    cfg = replace(TINY, out=str(tmp_path))
    result = Interrupt(at, action).run(cfg)
    if action != "raise":  # saved where it says it stopped (a signal in the final save: the run is done)
        assert checkpoint.metadata(tmp_path)["step"] == result["step"]
        assert result["interrupted"] or result["step"] == cfg.steps
    if (tmp_path / "checkpoint.safetensors").is_file():
        train(replace(cfg, resume=True))
    else:  # stopped at once before the first checkpoint: nothing to resume, start over
        train(replace(cfg, overwrite=True))


def _points(count: int, n: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(1, count + 1), min(n, count)))


@pytest.mark.parametrize("action", ["SIGINT", "SIGTERM", "raise"])
def test_resume_after_random_interrupts_equals_the_uninterrupted_run(action, reference, tmp_path):
    out, count = reference
    for at in _points(count, 4, seed=len(action)):
        _interrupt_and_resume(tmp_path / str(at), at, action)
        assert_same_run(tmp_path / str(at), out)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["SIGINT", "SIGTERM", "raise"])
def test_resume_after_many_interrupts_equals_the_uninterrupted_run(action, reference, tmp_path):
    out, count = reference
    for at in range(1, count + 1, 5):
        _interrupt_and_resume(tmp_path / str(at), at, action)
        assert_same_run(tmp_path / str(at), out)


def test_a_signal_inside_the_optimizer_step_saves_the_whole_step(tmp_path, monkeypatch):
    # before: Ctrl-C inside optimizer.step saved a state whose AdamW step counts disagreed with its metadata
    step = torch.optim.AdamW.step

    def step_then_signal(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        if self.state[self.param_groups[0]["params"][0]]["step"] == 3:
            signal.raise_signal(signal.SIGTERM)  # what a scheduler sends; lands between the update and the counter
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step_then_signal)
    before = signal.getsignal(signal.SIGTERM)
    result = train(replace(TINY, out=str(tmp_path)))
    assert result == {"step": 3, "interrupted": True, "out": str(tmp_path)}
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
    saved = checkpoint.load(tmp_path)
    assert saved["step"] == 3
    assert {float(e["step"]) for e in saved["optimizer"]["state"].values()} == {3.0}


def test_a_forced_stop_mid_step_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    step = torch.optim.AdamW.step

    def step_then_raise(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        if self.state[self.param_groups[0]["params"][0]]["step"] == 3:
            raise KeyboardInterrupt  # a second Ctrl-C, after the update, before the step counter
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step_then_raise)
    result = train(replace(TINY, out=str(tmp_path)))
    assert result == {"step": 2, "unsaved": True, "interrupted": True, "out": str(tmp_path)}
    assert checkpoint.metadata(tmp_path)["step"] == 2  # not the half-applied step 3


def test_a_checkpoint_saved_mid_step_is_refused(tmp_path):
    run = Run(replace(TINY, out=str(tmp_path)))
    run.train_step()
    run.step = 0  # what an interrupt between the update and the counter used to save
    run.save()
    with pytest.raises(CheckpointError, match="middle of a step"):
        train(replace(TINY, out=str(tmp_path), resume=True))


@pytest.mark.slow
def test_cli_sigterm_saves_and_resume_matches(tmp_path):
    args = ["--steps", "40", "--batch-size", "4", "--resolution", "16", "--log-every", "1", "--no-progress"]
    args += ["--no-report", "--ckpt-every", "1000"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "scripts.train", *args]
    proc = subprocess.Popen(
        [*run, "--out", str(tmp_path / "run")], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    log = tmp_path / "run" / "log.jsonl"
    deadline = time.monotonic() + 120
    while not (log.is_file() and log.read_text().count("\n") >= 2) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "SIGTERM: stopping after this step" in err
    step = checkpoint.metadata(tmp_path / "run")["step"]
    assert 2 <= step < 40  # saved, not lost (before: killed, nothing since the last checkpoint)
    done = subprocess.run([*run, "--out", str(tmp_path / "run"), "--resume"], cwd=ROOT, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    full = subprocess.run([*run, "--out", str(tmp_path / "full")], cwd=ROOT, env=env, capture_output=True)
    assert full.returncode == 0
    assert_same_run(tmp_path / "run", tmp_path / "full")


# -- the run folder -------------------------------------------------------------------------


def test_a_fresh_run_into_a_run_folder_is_refused(tmp_path, capsys):
    cfg = replace(TINY, steps=2, out=str(tmp_path))
    train(cfg)
    before = {n: (tmp_path / n).read_bytes() for n in ("log.jsonl", "checkpoint.safetensors")}
    with pytest.raises(RunFolderError, match="holds a run.*--resume to continue it, --overwrite"):
        train(cfg)
    assert {n: (tmp_path / n).read_bytes() for n in before} == before  # log and checkpoint untouched
    with pytest.raises(SystemExit) as stop:
        cli.main(["--steps", "2", "--batch-size", "4", "--resolution", "16", "--no-progress", "--out", str(tmp_path)])
    assert stop.value.code == 1 and "--resume" in capsys.readouterr().err
    train(replace(cfg, steps=1, overwrite=True))  # explicit: replaced
    assert checkpoint.metadata(tmp_path)["step"] == 1 and [r[0] for r in records(tmp_path)] == [1]


def test_a_second_run_into_a_locked_folder_is_refused(tmp_path):
    cfg = replace(TINY, steps=2, out=str(tmp_path))
    with RunLock(tmp_path):  # another run holds the folder (flock: separate open files conflict)
        with pytest.raises(RunFolderError, match=f"another run is training into {tmp_path} \\(pid {os.getpid()}\\)"):
            train(cfg)
        assert not (tmp_path / "log.jsonl").exists()
    train(cfg)
    assert not (tmp_path / ".lock").exists()  # released and removed


def test_a_killed_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    cfg = replace(TINY, steps=2, out=str(tmp_path))
    train(cfg)
    good = (tmp_path / "checkpoint.safetensors").read_bytes()
    import safetensors.torch

    def killed(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(safetensors.torch, "save_file", killed)
        result = train(replace(cfg, steps=4, ckpt_every=10**6, resume=True))  # the final save, cut off
    assert result == {"step": 2, "unsaved": True, "interrupted": True, "out": str(tmp_path)}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert (tmp_path / "checkpoint.safetensors").read_bytes() == good
    stale = tmp_path / ".checkpoint.safetensors.tmp4242"  # what SIGKILL mid-save leaves
    stale.write_bytes(b"half")
    train(replace(cfg, steps=3, resume=True))
    assert not stale.exists()


CLI_RUN = ["--batch-size", "4", "--resolution", "16", "--no-progress", "--no-report"]


def test_a_second_ctrl_c_in_the_final_save_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """Before: a traceback (the KeyboardInterrupt left ``train``). Now one line, status 130, the checkpoint of
    step 2 whole and no temporary file: the save is abandoned before its rename."""
    fsync, calls = os.fsync, []

    def ctrl_c_twice_in_the_second_save(fd):  # the final save's temporary file is written, not yet renamed
        calls.append(fd)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # the first: stop after this step (the step is done: saving)
            signal.raise_signal(signal.SIGINT)  # the second: stop at once, inside the save
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", ctrl_c_twice_in_the_second_save)
    with pytest.raises(SystemExit) as stop:
        cli.main([*CLI_RUN, "--steps", "3", "--ckpt-every", "2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 130 and "Traceback" not in err
    assert "checkpoint of step 2 kept" in err.strip().splitlines()[-1]
    assert checkpoint.load(tmp_path)["step"] == 2  # whole: its checksums hold
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint")] == []


def test_a_save_past_the_file_size_limit_is_one_line_and_keeps_the_checkpoint(tmp_path, capsys):
    """``ulimit -f``: Python ignores SIGXFSZ, so the write fails with EFBIG (before: a traceback)."""
    import resource

    cli.main([*CLI_RUN, "--steps", "2", "--out", str(tmp_path)])
    good = (tmp_path / "checkpoint.safetensors").read_bytes()
    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))  # the log and config fit, the checkpoint not
    try:
        with pytest.raises(SystemExit) as stop:
            cli.main([*CLI_RUN, "--steps", "3", "--resume", "--out", str(tmp_path)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and len(err) == 1 and "File too large" in err[0] and "unchanged" in err[0], err
    assert (tmp_path / "checkpoint.safetensors").read_bytes() == good
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint")] == []


def test_resume_truncates_the_log_to_the_checkpoint(tmp_path, reference, monkeypatch):
    out, _ = reference
    cfg = replace(TINY, out=str(tmp_path))
    step = torch.optim.AdamW.step

    def killed_at_5(self, *args, **kwargs):
        if self.state[self.param_groups[0]["params"][0]].get("step") == 4:
            raise KeyboardInterrupt  # dies in step 5: the log holds step 4, the checkpoint step 4
        return step(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.optim.AdamW, "step", killed_at_5)
        train(replace(cfg, ckpt_every=3))  # checkpoint at 3; steps 4 logged (window of 3-4), then killed
    assert checkpoint.metadata(tmp_path)["step"] == 3 and records(tmp_path)[-1][0] == 4
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 0.')  # a line cut off by the kill
    plot_loss(tmp_path / "log.jsonl", tmp_path / "loss.png")  # before: JSONDecodeError
    train(replace(cfg, ckpt_every=3, resume=True))
    assert [r[0] for r in records(tmp_path)] == [2, 4, 5]  # each step once, the curve never doubles back
    assert records(tmp_path) == records(out)
    assert all(line.endswith("}") for line in (tmp_path / "log.jsonl").read_text().splitlines())


# -- divergence -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["loss", "gradient"])
def test_divergence_stops_and_keeps_the_last_finite_checkpoint(where, tmp_path, monkeypatch):
    loss = ImageTask.loss

    def diverging(self, model, step, *args, **kwargs):
        value = loss(self, model, step, *args, **kwargs)
        if step >= 3 and where == "loss":
            return value * float("nan")
        if step >= 3:  # finite loss, infinite gradient: clipping alone would write NaN weights
            model.final_layer.linear.weight.register_hook(lambda g: g * float("inf"))
        return value

    monkeypatch.setattr(ImageTask, "loss", diverging)
    with pytest.raises(TrainingDiverged, match="diverged at step 4 .*checkpoint of step 2 is kept"):
        train(replace(TINY, out=str(tmp_path), grad_clip=0.0))
    saved = checkpoint.load(tmp_path)  # loads: finite
    assert saved["step"] == 2 and not (tmp_path / ".lock").exists()


def test_non_finite_weights_are_never_saved(tmp_path):
    run = Run(replace(TINY, out=str(tmp_path)))
    with torch.no_grad(), pytest.raises(CheckpointError, match="non-finite"):
        next(run.model.parameters()).view(-1)[0] = float("nan")
        run.save()
    assert not (tmp_path / "checkpoint.safetensors").exists()


# -- corrupted checkpoints -------------------------------------------------------------------


def _rewrite(path: Path, edit, tensors_edit=None) -> None:
    """Rewrite a checkpoint with edited metadata (and tensors); its metadata checksum is recomputed unless edited."""
    from safetensors.torch import load_file, safe_open, save_file

    with safe_open(path, framework="pt") as f:
        meta = dict(f.metadata())
    tensors, checksum = load_file(path), meta["meta_checksum"]
    edit(meta)
    if tensors_edit:
        tensors_edit(tensors)
    if meta.get("meta_checksum") == checksum:  # a consistent edit: what the other checks must catch
        meta["meta_checksum"] = checkpoint._meta_checksum(meta)
    save_file(tensors, path, metadata=meta)


@pytest.fixture
def saved_run(tmp_path) -> Path:
    train(replace(TINY, steps=2, out=str(tmp_path)))
    return tmp_path / "checkpoint.safetensors"


def test_flipped_bytes_fail_the_checksum(saved_run):
    data = bytearray(saved_run.read_bytes())
    data[-100] ^= 0x10  # inside the last tensor's bytes: still a valid safetensors file
    saved_run.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="fail their checksum"):
        checkpoint.load(saved_run)


def test_nan_weights_are_refused_on_load(saved_run):
    def nan(tensors):
        key = next(k for k in tensors if k.startswith("ema."))
        tensors[key] = torch.full_like(tensors[key], float("nan"))

    # an older checkpoint (no checksums) or one whose checksums were recomputed: NaN is still refused
    _rewrite(saved_run, lambda m: (m.update(format="axial_rope-train-1"), m.pop("checksums")), nan)
    with pytest.raises(CheckpointError, match="non-finite"):
        checkpoint.load(saved_run)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.update(step="seven"), "broken metadata"),
        (lambda m: m.update(step="-1"), "broken metadata"),
        (lambda m: m.update(run="{not json"), "broken metadata"),
        (lambda m: m.update(run="[1, 2]"), "broken metadata"),
        (lambda m: m.pop("optimizer"), "no optimizer entry"),
        (lambda m: m.update(optimizer='{"param_groups": []}'), "broken optimizer metadata"),
        (lambda m: m.pop("step"), "broken metadata"),
        (lambda m: m.update(checksums="{}"), "disagree"),
        (lambda m: m.update(step="1", meta_checksum="0"), "metadata .* fails its checksum"),  # edited by hand
    ],
    ids=[
        "step",
        "negative-step",
        "run-json",
        "run-type",
        "no-optimizer",
        "optimizer-keys",
        "no-step",
        "checksums",
        "edited",
    ],  # fmt: skip
)
def test_broken_metadata_is_a_checkpoint_error(saved_run, edit, match):
    _rewrite(saved_run, edit)
    with pytest.raises(CheckpointError, match=match):  # before: ValueError, KeyError or JSONDecodeError
        checkpoint.load(saved_run)
    with pytest.raises(CheckpointError):
        train(replace(TINY, steps=3, out=str(saved_run.parent), resume=True))


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("grad_clip", -1.0, "grad_clip must be >= 0"),
        ("ema", 2.0, r"ema must be in \[0, 1\)"),
        ("ema", 1.0, r"ema must be in \[0, 1\)"),
        ("schedule", "linear", "schedule must be one of"),
        ("precision", "fp16", "precision must be one of"),
        ("ckpt_every", 0, "ckpt_every must be >= 1"),
        ("batch_size", 0, "batch_size must be >= 1"),
        ("resolution", 0, "resolution must be >= 1"),
        ("steps", 0, "steps must be >= 1"),
        ("lr", 0.0, "lr must be > 0"),
        ("lr", float("nan"), "lr must be finite"),
        ("steps", 2.5, "steps must be a int"),
        ("log_every", True, "log_every must be a int"),
        ("context", 1, "context must be >= 2"),
    ],
)
def test_nonsense_settings_are_refused_at_start(field, value, match, capsys):
    with pytest.raises(ValueError, match=match):
        replace(TINY, **{field: value})
    if isinstance(value, (float, str)) and not isinstance(value, bool) and value == value:
        with pytest.raises(SystemExit) as stop:
            cli.parse_args(["--" + field.replace("_", "-"), str(value)])
        assert stop.value.code == 2 and match.split(" must")[0] in capsys.readouterr().err


def test_settings_the_model_cannot_take_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match="input_size 18 must be divisible by patch_size 4"):
        Run(replace(TINY, resolution=18, out=str(tmp_path)))
    cfg = replace(TINY, out=str(tmp_path))
    cfg.ema = 1.5  # set after construction: the run checks again
    with pytest.raises(ValueError, match="ema"):
        Run(cfg)


def test_resume_refuses_or_records_changed_hyperparameters(tmp_path):
    cfg = replace(TINY, steps=2, out=str(tmp_path))
    train(cfg)
    with pytest.raises(CheckpointError, match="lr: checkpoint 0.002 vs now 0.001.*--allow-changes"):
        train(replace(cfg, steps=3, lr=1e-3, resume=True))
    with pytest.raises(CheckpointError, match="schedule: checkpoint 'constant' vs now 'cosine', ema"):
        train(replace(cfg, steps=3, schedule="cosine", ema=0.5, resume=True))
    train(replace(cfg, steps=3, resume=True))  # more steps: always allowed
    train(replace(cfg, steps=4, lr=1e-3, resume=True, allow_changes=True))
    change = {"step": 3, "changed": {"lr": [0.002, 0.001]}}
    assert change in rundir.read_log(tmp_path / "log.jsonl")
    assert json.loads((tmp_path / "config.json").read_text())["history"] == [change]
    assert checkpoint.load(tmp_path)["extra"]["history"] == [change]
    assert checkpoint.metadata(tmp_path)["run"]["lr"] == 1e-3
