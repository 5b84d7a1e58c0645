"""Bad distributed settings: one clear error on every rank, and no hang.

The layout (models/training/distributed.py: ``plan``) is checked from the settings and the world
size alone, identically on every rank, before any process group or collective exists; a resume
from another run's folder fails on every rank when each reads the checkpoint, before a step. Each
launch has a timeout, so a rank left waiting in a collective fails the test instead of hanging it.

The ranks are started as torchrun starts them (its environment: ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` ...) but without its agent: the agent stops every other rank as soon as one exits
with an error, so under load a slower rank could be stopped before it printed its own line, and
"every rank said it" would depend on timing. Here each rank runs to its end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--steps", "1", "--batch-size", "4", "--resolution", "8", "--no-progress", "--no-report"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(nproc: int, *args: str, file_limit: int | None = None) -> subprocess.CompletedProcess:
    """``scripts.train`` in ``nproc`` processes with torchrun's per-rank environment (one process: none), each
    run to its end; the exit status is the first non-zero one and stderr every rank's, in rank order.
    ``file_limit``: the largest file a rank may write, in bytes (``ulimit -f``: a full disk, as a write sees it)."""
    cmd = [sys.executable, "-m", "scripts.train", *TINY, *args]
    if file_limit is not None:
        cmd = ["bash", "-c", f'ulimit -f {file_limit // 1024} && exec "$@"', "bash", *cmd]  # bash: 1024-byte units
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    if nproc == 1:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    group = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1"}
    group |= {"MASTER_PORT": str(_free_port()), "GROUP_RANK": "0"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    rank_env = [env | group | {"RANK": str(r), "LOCAL_RANK": str(r)} for r in range(nproc)]
    ranks = [subprocess.Popen(cmd, cwd=ROOT, env=e, **pipes) for e in rank_env]
    try:
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:  # a rank left waiting (the test fails on the timeout) is not left behind
            rank.kill()
    codes = [rank.returncode for rank in ranks]
    code = next((c for c in codes if c != 0), 0)
    return subprocess.CompletedProcess(cmd, code, "".join(o for o, _ in outputs), "".join(e for _, e in outputs))


@pytest.mark.parametrize(
    "args, message",
    [
        (  # 2 x 2 is not 2 processes
            ["--model", "video_dit", "--frames", "2", "--context-parallel", "2", "--data-parallel", "2"],
            "data_parallel 2 x context_parallel 2 must equal the number of processes 2",
        ),
        (["--model", "video_dit", "--frames", "3", "--context-parallel", "3"], "context_parallel 3 must divide"),
        (  # 1 frame of 2 x 2 pixels, patch (1, 2, 2): one token for two ranks
            ["--model", "video_dit", "--frames", "1", "--resolution", "2", "--context-parallel", "2"],
            "shards each video's 1 tokens",
        ),
        (["--fsdp", "--compile", "--compile-backend", "no_such_backend"], "compile_backend must be one of"),
    ],
    ids=["mesh", "context_parallel", "short_sequence", "compile_backend"],
)
def test_a_bad_layout_is_one_error_on_every_rank(tmp_path, args, message):
    done = _launch(2, *args, "--out", str(tmp_path / "run"))
    assert done.returncode != 0
    assert done.stderr.count(message) == 2, done.stderr[-3000:]  # each rank: the same line
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_resuming_another_models_run_is_one_error_on_every_rank(tmp_path):
    out = str(tmp_path / "run")
    assert _launch(1, "--out", out).returncode == 0  # an image DiT run
    done = _launch(2, "--model", "video_dit", "--frames", "2", "--fsdp", "--resume", "--out", out)
    assert done.returncode != 0
    assert done.stderr.count("belongs to another run (model: checkpoint 'dit' vs now 'video_dit'") == 2, done.stderr


def _one_line_per_rank(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("scripts.train: error:")]
    assert len(lines) == 2 and all(word in line for line in lines for word in words), done.stderr[-3000:]


def test_an_out_rank_0_cannot_make_is_one_line_on_every_rank():
    # issue 39, item 11: rank 0 stopped with one line, rank 1 died in a traceback in its next collective
    _one_line_per_rank(_launch(2, "--fsdp", "--out", "/proc/axial_rope_run"), "/proc/axial_rope_run")


def test_a_full_disk_at_a_dcp_save_is_one_line_on_every_rank_and_keeps_the_checkpoint(tmp_path):
    from dataclasses import asdict

    from models.training import sharded_checkpoint
    from models.training.config import run_config
    from models.training.trainer import Run

    out = tmp_path / "run"  # step 1's DCP checkpoint, saved in this process (DCP saves in one process too)
    run = Run(run_config("dit", steps=1, batch_size=4, resolution=8, out=str(out), progress=False, report=False))
    run.train_step()
    out.mkdir()
    kw = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema}
    sharded_checkpoint.save(out, **kw, step=1, run=asdict(run.cfg), extra={})
    # each rank's shard of step 2 (about 10 MB) passes the 1 MB limit: DCP's write fails on both ranks
    done = _launch(2, "--fsdp", "--resume", "--steps", "2", "--out", str(out), file_limit=2**20)
    _one_line_per_rank(done, "could not write the checkpoint of step 2", "is unchanged")
    assert sharded_checkpoint.metadata(out)["step"] == 1  # the earlier checkpoint, whole (checksums verified)
    assert not list(out.glob(".checkpoint-dcp-*"))  # the failed save's folder removed


def test_a_full_disk_at_a_log_write_is_one_line_on_every_rank(tmp_path):
    # issue 39, item 11: the step's log record is rank 0's; its write failing (ENOSPC: log.jsonl links to /dev/full)
    # stopped rank 0 with one line and left rank 1 to die in a traceback in its next collective
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    out = tmp_path / "run"
    out.mkdir()
    (out / "log.jsonl").symlink_to("/dev/full")  # kept by --overwrite (a device, not a run file)
    done = _launch(2, "--fsdp", "--overwrite", "--steps", "2", "--log-every", "1", "--out", str(out))
    _one_line_per_rank(done, "No space left on device")
