"""Distributed training on CPU: DDP, FSDP2 and context parallel over 2 or 4 processes equal one process.

Context parallel's single-step gradients, samples and forward are checked in
tests/test_context_parallel_models.py; here, the losses of whole runs through torchrun.

The claims are equalities, so the runs compute in float64 (torch's default dtype, set by
tests/run_float64.py): one process and several differ in summation order only, within
``helpers.chain_bound(U64, 256, 30)`` = 7e-12 of each value's scale, and Adam's step divides the
gradients by their root mean square plus 1e-8, so it carries their relative error on at most
unchanged. The logged losses stay float32 means (models/flow.py casts the residuals: within
``8 sqrt(N) u = 2.3e-5`` of themselves for the ``N <= 3072`` squares, u = 2**-24; see
tests/test_context_parallel_models.py): ``LOSS_RTOL = 5e-5``. (Whole float32 runs had no bound
below the 1e-5 this module once used.) A wrong shard or gradient average moves the losses by O(1e-2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import axial_rope as ar

ROOT = Path(__file__).resolve().parents[1]
LOSS_RTOL = 5e-5  # the float32 loss' bound (module docstring)
ARGS = ["--steps", "3", "--batch-size", "4", "--resolution", "16", "--log-every", "1", "--no-progress", "--no-report"]


def _losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _train(out: Path, nproc: int, *extra: str) -> list[float]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = ([*launcher, "-m"] if nproc > 1 else [sys.executable, "-m"]) + ["tests.run_float64", "scripts.train"]
    cmd += [*ARGS, "--out", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([*cmd, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return _losses(out)


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    single = _train(tmp_path / "single", 1)
    ddp = _train(tmp_path / "ddp", 2)
    assert len(single) == len(ddp) == 3
    torch.testing.assert_close(torch.tensor(ddp), torch.tensor(single), rtol=LOSS_RTOL, atol=0)


@pytest.mark.slow
def test_fsdp2_two_processes_with_a_resume_match_one_process(tmp_path):
    single = _train(tmp_path / "single", 1)
    _train(tmp_path / "fsdp", 2, "--fsdp", "--steps", "2")  # sharded checkpoint gathered at step 2
    fsdp = _train(tmp_path / "fsdp", 2, "--fsdp", "--resume")
    torch.testing.assert_close(torch.tensor(fsdp), torch.tensor(single), rtol=LOSS_RTOL, atol=0)


# the tiny video DiT, 4 frames of 16 x 16 (256 tokens); a large lr so 3 steps move the weights
VIDEO = ("--model", "video_dit", "--frames", "4", "--lr", "0.01", "--warmup", "0")


@pytest.mark.slow
def test_video_dit_under_context_parallel_alone_and_with_data_parallel_matches_one_process(tmp_path):
    single = _train(tmp_path / "single", 1, *VIDEO)
    context = _train(tmp_path / "cp2", 2, *VIDEO, "--context-parallel", "2", "--cp-layout", "zigzag")
    both = _train(tmp_path / "cp2x2", 4, *VIDEO, "--context-parallel", "2", "--cp-method", "ulysses")
    assert len(single) == len(context) == len(both) == 3
    assert single[0] > single[-1] + 0.1  # the steps did move the weights
    for losses in (context, both):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(single), rtol=LOSS_RTOL, atol=0)


def _context_parallel_worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)  # every rank builds the same full sequence, then keeps its slice
    rope = ar.AxialRoPE((8, 12, 12), theta=256.0)
    pos = ar.grid(4, 6, 6)  # [S=144, 3] global coordinates
    q, k = torch.randn(1, 144, 3, 32), torch.randn(1, 144, 1, 32)  # [B, S, H, D], GQA k
    mine = slice(rank * 144 // world, (rank + 1) * 144 // world)
    q_local, k_local = rope(q[:, mine], k[:, mine], pos[mine])  # each rank rotates its own tokens
    q_parts, k_parts = (
        [torch.empty_like(q_local) for _ in range(world)],
        [torch.empty_like(k_local) for _ in range(world)],
    )
    dist.all_gather(q_parts, q_local)
    dist.all_gather(k_parts, k_local)
    if rank == 0:
        q_full, k_full = rope(q, k, pos)
        torch.save(
            {"equal": torch.equal(torch.cat(q_parts, 1), q_full) and torch.equal(torch.cat(k_parts, 1), k_full)},
            result_file,
        )
    dist.destroy_process_group()


def test_context_parallel_slices_rotated_with_global_positions_equal_the_whole(tmp_path):
    result = tmp_path / "result.pt"
    mp.spawn(_context_parallel_worker, args=(2, str(tmp_path / "init"), str(result)), nprocs=2, join=True)
    assert torch.load(result)["equal"]
