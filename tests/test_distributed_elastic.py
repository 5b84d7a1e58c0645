"""Elastic restarts: under ``torchrun --max-restarts 1`` a rank killed with SIGKILL mid-run restarts the group,
which resumes from the last checkpoint (an FSDP2 run's DCP one) and finishes with the uninterrupted losses.

The restarted workers run the same command, without ``--resume``: the trainer resumes by itself when
torchrun says it restarted (``TORCHELASTIC_RESTART_COUNT``) and the folder holds a checkpoint. The
runs compute in float64 (tests/run_float64.py) and the logged losses are float32 means:
``LOSS_RTOL = 5e-5`` as in tests/test_distributed.py, whose docstring has the bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LOSS_RTOL = 5e-5  # module docstring
STEPS, KILL_AT = 12, 5
ARGS = ["--model", "video_dit", "--frames", "8", "--resolution", "8", "--batch-size", "4", "--lr", "0.01"]
ARGS += [
    "--warmup",
    "0",
    "--steps",
    str(STEPS),
    "--ckpt-every",
    "4",
    "--log-every",
    "1",
    "--no-progress",
    "--no-report",
]


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _logged_step(out: Path) -> int:
    try:
        return max(_losses(out), default=0)
    except (OSError, ValueError):  # not written yet, or a line half written
        return 0


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def test_a_rank_killed_mid_run_restarts_the_group_which_resumes_to_the_same_losses(tmp_path):
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "tests.run_float64", "scripts.train", *ARGS, "--out", str(tmp_path / "one")]
    done = subprocess.run(one, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "elastic"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    cmd = [*launcher, "-m", "tests.run_float64", "scripts.train", *ARGS, "--fsdp", "--out", str(out)]
    log = open(tmp_path / "torchrun.txt", "w")
    agent = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while _logged_step(out) < KILL_AT and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_at = _logged_step(out)
        assert KILL_AT <= killed_at < STEPS, f"the run was at step {killed_at} when the kill was due"
        os.kill(max(_children(agent.pid)), signal.SIGKILL)  # one worker (the later-started rank), mid-run
        assert agent.wait(timeout=240) == 0, (tmp_path / "torchrun.txt").read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
        log.close()
    text = (tmp_path / "torchrun.txt").read_text()
    # torchrun saw the killed worker, and the group it then restarted finished: exit status 0 above
    assert "exitcode: -9" in text and text.count(f"done at step {STEPS}") == 2, text[-3000:]
    want, got = _losses(tmp_path / "one"), _losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))  # each step logged once: the log was cut back to the checkpoint
    assert abs(want[1] - want[STEPS]) > 0.05
    steps = sorted(want)
    torch.testing.assert_close(
        torch.tensor([got[s] for s in steps]), torch.tensor([want[s] for s in steps]), rtol=LOSS_RTOL, atol=0
    )
