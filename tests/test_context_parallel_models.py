"""Context parallel in the video DiT, its trainer and its samplers, on 2 and 4 gloo CPU processes.

A spawn costs seconds on a CPU, so each test spawns its processes once and runs several
checks in them: the sharded forward equals the unsharded one (ring, Ulysses, zigzag, a
length that needs padding, RIFLEx); one trainer step's loss and gradients under context
parallel (alone; 2 x 2 with DDP or FSDP2) equal one process'; sharded samples
(``VideoTask.sample``, the diffusers pipeline, ``scripts.sample``) equal unsharded ones.
Losses over several steps through ``torchrun`` are in tests/test_distributed.py.

The claims are equalities, so every process computes in float64 (the default dtype, set in each
worker and around the checks in this process). The sharded and the single-process computations
differ in summation order (ring and Ulysses attention, the gradients' all-reduce, the loss' mean
over ranks) and in nothing else: each output, loss and gradient is a chain of sums of at most 256
terms over some 30 stages (blocks, Euler steps, the backward), within ``helpers.chain_bound(U64,
256, 30)`` = 7e-12 of its scale; ``TOL = 1e-10`` of ``max(1, scale)``. (In float32 the same bound is
4e-3, above the 1e-5 this module once used.) A shard attending to the wrong keys is off by O(1).

The flow losses stay float32 (models/flow.py casts the residuals): a loss is a float32 mean of
``N <= 2304`` squares, within ``8 sqrt(N) u = 2.3e-5`` of itself on each side (helpers.chain_bound's
probabilistic model, positive terms; u = 2**-24): ``LOSS_TOL = 5e-5`` relative. The residuals'
float32 rounding is the same on both sides except where float64 values 1e-15 apart straddle a
rounding point, each such element moving its gradient terms by 2 u; over the ``<= 192`` tokens a
gradient sums: ``GRAD_TOL = 192 * 2 u = 2.3e-5``, rounded up to 3e-5, of ``max(1, scale)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import axial_rope as ar
from axial_rope.layers import unpatchify
from axial_rope.parallel import ContextParallel
from models import video_dit
from models.training import tasks
from models.training.config import TrainConfig

# a tiny step: 4 videos of 3 frames of 8 x 8 pixels (48 tokens); no clipping, so gradients compare as computed
RUN = TrainConfig(
    model="video_dit",
    batch_size=4,
    resolution=8,
    frames=3,
    grad_clip=0.0,
    lr=1e-2,
    sample_steps=2,
    progress=False,
    report=False,
)
_BUILD = tasks.VideoTask.build
TOL = 1e-10  # float64 error bound, relative to max(1, scale) (module docstring)
LOSS_TOL, GRAD_TOL = 5e-5, 3e-5  # the float32 losses' bounds (module docstring)


def _perturbed_build(task) -> torch.nn.Module:
    """The task's model with every weight moved off DiT's init: adaLN-Zero would make the blocks the
    identity and the output zero, and leave attention without a gradient."""
    model = _BUILD(task)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


_RESET = video_dit.VideoDiT.reset_parameters


def _perturbed_reset(model) -> None:
    """DiT's init, then every weight moved off it (as :func:`_perturbed_build`), drawn by ``torch.nn.init``: under
    FSDP2 the trainer builds on the meta device and initialises shard by shard with ``reset_parameters``, which
    draws each parameter whole (models/training/distributed.py), so both sides get these weights."""
    _RESET(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            delta = torch.empty_like(p)
            torch.nn.init.normal_(delta, std=0.05, generator=gen)
            p.add_(delta)


def _worker(rank: int, world: int, tmp: str, job: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))  # what the trainer and scripts.sample read
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # models, data and noise: the equalities are checked in float64
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init_{job}", rank=rank, world_size=world)
    try:
        torch.save(JOBS[job](rank, Path(tmp)), Path(tmp) / f"{job}_{rank}.pt")
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path: Path, world: int, job: str) -> list[dict]:
    mp.spawn(_worker, args=(world, str(tmp_path), job), nprocs=world, join=True)
    return [torch.load(tmp_path / f"{job}_{r}.pt") for r in range(world)]


# -- in the spawned processes ------------------------------------------------------------


def _forward_errors() -> dict[str, float]:
    """Sharded minus unsharded outputs; 27 tokens (3 x 3 x 3) do not divide by 2 ranks: padding."""
    torch.manual_seed(0)
    model = _perturbed_build(tasks.VideoTask("tiny", 6, 3, seed=0)).eval()
    x, t, y = torch.randn(2, 3, 3, 6, 6), torch.tensor([100.0, 700.0]), torch.tensor([0, 3])
    riflex = ar.scaling.RIFLEx(2, test_length=3)
    dynamic = ar.scaling.DynamicNTK(2.0, 2)  # length-dependent: each rank must be told the whole grid
    errors = {}
    for method, layout, scaling in (
        ("ring", "contiguous", None),
        ("ulysses", "contiguous", dynamic),
        ("ring", "zigzag", riflex),
        ("ulysses", "zigzag", None),
    ):
        cp = ContextParallel(None, method, layout)
        out = model(x, t, y, temporal_scaling=scaling, context_parallel=cp)  # [2, 3, 3, 6, 6], gathered
        errors[f"forward {method} {layout}"] = (out - model(x, t, y, temporal_scaling=scaling)).abs().max()
    cp = ContextParallel(None, "ring").for_length(27)
    tokens = model(x, t, y, context_parallel=cp, gather=False)  # [2, L=14, 12]: this rank's, padding included
    whole = cp.shard(model(x, t, y, gather=False))
    errors["tokens"] = (tokens - whole)[:, cp.valid()].abs().max()
    return {k: float(v) for k, v in errors.items()}


def _sample_errors(rank: int) -> dict[str, float]:
    """VideoTask.sample and the diffusers pipeline, sharded (2 Euler steps) minus unsharded."""
    from models.diffusers_models import AxialDiT3DModel
    from models.pipeline import AxialVideoDiTPipeline

    torch.manual_seed(0)
    task = tasks.VideoTask("tiny", 8, 3, seed=0)
    model = _perturbed_build(task).eval()
    cp = ContextParallel(None, "ulysses")
    errors = {"task.sample": task.sample(model, 1, steps=2, context_parallel=cp) - task.sample(model, 1, steps=2)}
    pipe = AxialVideoDiTPipeline(AxialDiT3DModel.from_reference(model))
    pipe.set_progress_bar_config(disable=True)
    kw = {"class_labels": [0, 3], "num_frames": 3, "height": 8, "width": 8, "num_inference_steps": 2}
    # each rank its own generator: the group's first rank's noise is the one sampled
    sharded = pipe(**kw, generator=torch.Generator().manual_seed(rank), output_type="pt", context_parallel=cp)
    whole = pipe(**kw, generator=torch.Generator().manual_seed(0), output_type="pt")
    errors["pipeline"] = sharded.frames - whole.frames
    return {k: float(v.abs().max()) for k, v in errors.items()}


def _trainer_step(name: str, tmp: Path, **settings) -> tuple[dict, object]:
    """One trainer step under context parallel against one process on the whole batch."""
    from models.training.trainer import Run

    video_dit.VideoDiT.reset_parameters = _perturbed_reset  # this process only
    cfg = replace(RUN, out=str(tmp / name), context_parallel=2, **settings)
    run = Run(cfg)
    loss = run.train_step()  # the world average of each rank's share times P: the global mean loss
    grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in (p.grad for p in run.model.parameters())]
    torch.manual_seed(cfg.seed)
    ref = run.task.build()
    ref_loss = run.task.loss(ref, 0, cfg.batch_size)  # one process, the whole batch
    ref_loss.backward()
    err = max(float((g - p.grad).abs().max()) for g, p in zip(grads, ref.parameters()))
    scale = max(float(p.grad.abs().max()) for p in ref.parameters())
    attn = float(ref.blocks[0].attn.qkv.weight.grad.abs().max())  # attention's backward crossed the ranks
    return {"loss": loss, "ref_loss": float(ref_loss), "grad_err": err, "grad_scale": scale, "attn_grad": attn}, run


def _sample_script(tmp: Path, run) -> dict:
    """The trainer's report (validation and samples sharded over rank 0's group), then scripts.sample
    under torchrun's variables: every rank samples sharded, rank 0 alone writes."""
    import scripts.sample

    run.out.mkdir(parents=True, exist_ok=True)
    run.save()  # rank 0 writes the checkpoint
    run.report(final=True)  # rank 0 logs val_loss and writes samples.gif
    dist.barrier()
    written = []
    scripts.sample.save_gif = lambda videos, out: written.append(videos) or out
    scripts.sample.main(["--checkpoint", str(run.out), "--steps", "2", "--per-class", "1", "--cfg", "2"])
    return {"script": written}


def _two(rank: int, tmp: Path) -> dict:
    out = _forward_errors() | _sample_errors(rank)
    step, run = _trainer_step("ring", tmp)
    return out | {"step ring": step} | _sample_script(tmp, run)


def _four(rank: int, tmp: Path) -> dict:
    ddp, _ = _trainer_step("ulysses_ddp", tmp, cp_method="ulysses")
    fsdp, _ = _trainer_step("zigzag_fsdp", tmp, cp_layout="zigzag", fsdp=True)
    return {"step 2x2 ulysses ddp": ddp, "step 2x2 ring zigzag fsdp2": fsdp}


JOBS = {"two": _two, "four": _four}


# -- the tests ---------------------------------------------------------------------------


def _check_step(name: str, step: dict) -> None:
    assert step["attn_grad"] > 1e-4, name
    assert abs(step["loss"] - step["ref_loss"]) < LOSS_TOL * abs(step["ref_loss"]), (name, step)
    assert step["grad_err"] < GRAD_TOL * max(1.0, step["grad_scale"]), (name, step)


def test_two_ranks_forward_step_and_samples_equal_one_process(tmp_path, monkeypatch):
    results = _spawn(tmp_path, 2, "two")
    for rank, res in enumerate(results):
        for key in (*(k for k in res if k.startswith("forward")), "tokens", "task.sample", "pipeline"):
            assert res[key] < TOL, (rank, key, res[key])  # outputs and samples of scale < 3
        _check_step(f"rank {rank}", res["step ring"])
    assert len(results[0]["script"]) == 1 and results[1]["script"] == []  # rank 0 alone writes
    import scripts.sample
    from models.training.trainer import load_trained

    written = []
    monkeypatch.setattr(scripts.sample, "save_gif", lambda videos, out: written.append(videos) or out)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as in the workers
    try:
        scripts.sample.main(["--checkpoint", str(tmp_path / "ring"), "--steps", "2", "--per-class", "1", "--cfg", "2"])
        task, model = load_trained(tmp_path / "ring")  # the EMA weights the report used
        val = task.val_loss(model)
    finally:
        torch.set_default_dtype(default)
    torch.testing.assert_close(results[0]["script"][0], written[0], atol=TOL, rtol=0)
    logged = [json.loads(line) for line in (tmp_path / "ring" / "log.jsonl").read_text().splitlines()]
    expected = sum(val.values()) / len(val)
    assert abs(logged[-1]["val_loss"] - expected) < LOSS_TOL * abs(expected), logged
    assert (tmp_path / "ring" / "samples.gif").is_file()


@pytest.mark.slow
def test_two_by_two_context_and_data_parallel_gradients_equal_one_process(tmp_path):
    for rank, res in enumerate(_spawn(tmp_path, 4, "four")):
        for name, step in res.items():
            _check_step(f"{name}, rank {rank}", step)


def test_flow_loss_shard_on_one_rank_is_the_flow_loss():
    from models.flow import flow_loss

    torch.manual_seed(0)
    model = _perturbed_build(tasks.VideoTask("tiny", 8, 2, seed=0)).eval().double()
    x0, noise = torch.randn(2, 3, 2, 8, 8, dtype=torch.float64), torch.randn(2, 3, 2, 8, 8, dtype=torch.float64)
    t, y = torch.rand(2, dtype=torch.float64), torch.tensor([1, 2])
    share = video_dit.flow_loss_shard(model, x0, t, noise, ContextParallel(), (1, 2, 2), y=y)
    torch.testing.assert_close(share, flow_loss(model, x0, t, noise, y=y), atol=0, rtol=LOSS_TOL)
    patches = video_dit.patchify(x0, (1, 2, 2))  # [2, 2 * 4 * 4, 12]
    assert torch.equal(unpatchify(patches, (2, 4, 4), (1, 2, 2), 3), x0)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"context_parallel": 0}, "context_parallel must be >= 1"),
        ({"context_parallel": 2, "model": "dit"}, "context_parallel must be 1 for model 'dit'"),
        ({"cp_method": "allgather"}, "cp_method must be one of"),
        ({"cp_layout": "striped"}, "cp_layout must be one of"),
    ],
)
def test_context_parallel_settings_are_checked(settings, match):
    with pytest.raises(ValueError, match=match):
        replace(RUN, **settings)


def test_context_parallel_needs_a_multiple_of_its_size_in_processes(tmp_path):
    from models.training.trainer import Run

    with pytest.raises(ValueError, match="context_parallel 2 must divide the number of processes 1"):
        Run(replace(RUN, context_parallel=2, out=str(tmp_path)))
