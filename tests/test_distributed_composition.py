"""FSDP2 x context parallel x data parallel x activation checkpointing x compile, on 2 and 4 gloo processes.

Each test spawns its processes once and trains several configurations in them one after the other
(models/training/distributed.py): the image DiT, the video DiT and the language model, tiny presets,
a global batch of 4 for 4 steps. Every configuration must give, step by step, the losses of one
process with the same global batch and data order; its initial weights (built on the meta device,
sharded, materialised shard by shard under FSDP2) must be one process' exactly; and no warning may
be emitted (FSDP2 warned once that the video DiT "returned a view tensor").

The claims are equalities, so models, data and noise compute in float64 (the default dtype in every
process), as in tests/test_distributed.py: one process and several differ in summation order only
(the gradients' reduce-scatter or all-reduce, ring and Ulysses attention, the loss' mean over
ranks), within ``helpers.chain_bound(U64, 256, 30)`` = 7e-12 of each value's scale; checkpointing
recomputes the same float64 values, and compiling with ``aot_eager`` traces the same operations.
The logged losses are float32 means (models/flow.py casts the residuals; the language model's
cross-entropy runs in float32) of ``N <= 3072`` positive terms, each side within ``8 sqrt(N) u =
2.3e-5`` of the exact mean (helpers.chain_bound's probabilistic model, u = 2**-24): ``LOSS_RTOL =
5e-5``. A wrong shard, a gradient averaged over the wrong ranks or an init drawn per shard moves the
losses by 1e-2 or more.

``torch.compile`` runs with the ``aot_eager`` backend here: dynamo's capture and AOT autograd, the
parts that meet FSDP2's hooks and the checkpointing, in seconds on a CPU; inductor compiles C++ for
a minute per run on 2 shared cores and is the GPU smoke's (scripts/gpu_check.sh).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from models.training.config import run_config
from models.training.trainer import Run

LOSS_RTOL = 5e-5  # the float32 losses' bound (module docstring)
STEPS = 4
COMMON = {
    "preset": "tiny",
    "steps": STEPS,
    "batch_size": 4,
    "lr": 1e-2,
    "warmup": 0,
    "progress": False,
    "report": False,
}
MODELS = {
    "dit": {"resolution": 8},
    "video_dit": {"resolution": 8, "frames": 4},  # 4 x 4 x 4 = 64 tokens (patch (1, 2, 2))
    "gpt": {"context": 32},
}
COMPILED = {"compile": True, "compile_backend": "aot_eager"}  # module docstring

# (model, settings) trained in one spawn of 2 and one of 4 processes
TWO = [
    ("dit", {"fsdp": True}),
    ("dit", {"fsdp": True, "checkpointing": True}),
    ("dit", {"fsdp": True, "checkpointing": True, **COMPILED}),
    ("video_dit", {"fsdp": True}),
    ("video_dit", {"checkpointing": True}),  # DDP
    ("video_dit", {"fsdp": True, "context_parallel": 2, "checkpointing": True}),
    ("gpt", {"fsdp": True, "checkpointing": True}),
    ("gpt", {"fsdp": True, **COMPILED}),
]
FOUR = [
    ("dit", {"fsdp": True}),
    ("video_dit", {"fsdp": True, "context_parallel": 2}),  # FSDP over 4 x CP 2
    ("video_dit", {"context_parallel": 2, "cp_method": "ulysses"}),  # DP 2 x CP 2 (DDP)
    ("video_dit", {"fsdp": True, "context_parallel": 2, "checkpointing": True, **COMPILED}),
    ("gpt", {"fsdp": True}),
]


def _config(model: str, settings: dict, out: Path):
    return run_config(model, **COMMON, **MODELS[model], **settings, out=str(out))


def _train(cfg) -> dict:
    """The run's initial weights (whole, gathered), its losses and the warnings it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = Run(cfg)
        init = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in run.model.named_parameters()}  # fmt: skip
        losses = [run.train_step() for _ in range(STEPS)]
    return {"init": init, "losses": losses, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}


def _worker(rank: int, world: int, tmp: str, jobs: list) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))  # what the trainer reads
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # module docstring
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    try:
        results = [_train(_config(model, settings, Path(tmp) / "run")) for model, settings in jobs]
        if rank == 0:
            torch.save(results, Path(tmp) / "results.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    """Each model's run in this process: the reference (no checkpointing, no compile)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as in the workers
    try:
        out = tmp_path_factory.mktemp("one")
        return {model: _train(_config(model, {}, out)) for model in MODELS}
    finally:
        torch.set_default_dtype(default)


def _check(results: list[dict], jobs: list, reference: dict) -> None:
    assert len(results) == len(jobs)
    for (model, settings), got in zip(jobs, results):
        want = reference[model]
        assert got["warnings"] == [], (model, settings, got["warnings"])
        assert set(got["init"]) == set(want["init"])
        for name, value in want["init"].items():  # the same draws, cut into shards: equal bit for bit
            assert torch.equal(got["init"][name], value), (model, settings, name)
        assert abs(want["losses"][0] - want["losses"][-1]) > 0.05  # the steps did move the weights
        torch.testing.assert_close(
            torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=LOSS_RTOL, atol=0, msg=f"{model} {settings}"
        )


def _spawn(tmp_path: Path, world: int, jobs: list) -> list[dict]:
    mp.spawn(_worker, args=(world, str(tmp_path), jobs), nprocs=world, join=True)
    return torch.load(tmp_path / "results.pt")


def test_one_process_with_checkpointing_and_compile_equals_one_process(one_process, tmp_path):
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = [_train(_config("dit", {"checkpointing": True, **COMPILED}, tmp_path))]
    finally:
        torch.set_default_dtype(default)
    _check(got, [("dit", {})], one_process)


def test_two_processes_fsdp_ddp_context_parallel_checkpointing_compile_equal_one_process(one_process, tmp_path):
    _check(_spawn(tmp_path, 2, TWO), TWO, one_process)


def test_four_processes_fsdp_and_data_parallel_by_context_parallel_equal_one_process(one_process, tmp_path):
    _check(_spawn(tmp_path, 4, FOUR), FOUR, one_process)
