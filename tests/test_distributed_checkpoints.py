"""Checkpoints that reshard: a run saved on one world size resumes on another as if never stopped.

FSDP2 runs save with DCP (models/training/sharded_checkpoint.py), one-process runs a safetensors
file; a resume reads either on any world size. The image DiT trains 6 steps as 4 (FSDP2) -> 2
(FSDP2) -> 1 process, the language model (tied weights) 1 -> 4 (FSDP2); the logged loss of every
step must be the uninterrupted one-process run's, and the DCP checkpoint read whole in one process
(the export ``scripts.sample`` uses) must hold that run's weights.

As in tests/test_distributed_composition.py, everything computes in float64 and the logged losses
are float32 means: ``LOSS_RTOL = 5e-5`` (that module's docstring). The language model's cross-entropy
runs in float32, so its gradients differ between world sizes where float64 logits 1e-15 apart
straddle a float32 rounding point: by 2 u per such term, over the ``N = 128`` tokens a gradient sums,
``N * 2 u`` of the gradient's scale (u = 2**-24). AdamW's step ``lr * m / sqrt(v)`` carries a relative
error of the gradients at most twice, so 4 steps at lr 1e-2 move a weight by at most ``4 * 1e-2 * 2 *
N * 2 u = 1.2e-6`` (an element whose gradient is smaller than its own error could flip its first
step's sign: a 2 lr jump, 1e4 times above this, which is how this test fails for a real error too):
``WEIGHT_TOL``. A resume that lost the optimizer state, the EMA or the data position moves the next
losses by 1e-2 or more.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import scripts.train
from models.training import rundir, sharded_checkpoint
from models.training.checkpoint import CheckpointError
from models.training.config import run_config
from models.training.rundir import RunFolderError
from models.training.trainer import Run, load_trained, trained_weights

LOSS_RTOL = 5e-5  # module docstring
WEIGHT_TOL = 4 * 1e-2 * 2 * 128 * 2 * 2.0**-24  # steps * lr * 2 * N * 2 u (module docstring)
COMMON = {"preset": "tiny", "batch_size": 4, "lr": 1e-2, "warmup": 0, "log_every": 1, "ckpt_every": 2}
QUIET = {"progress": False, "report": False}
DIT = run_config("dit", **COMMON, **QUIET, resolution=8, ema=0.9)
# constant lr: a cosine schedule depends on steps, which each stage of a resumed run sets to its own end
GPT = run_config("gpt", **COMMON, **QUIET, context=32, ema=0.9, schedule="constant")


def _losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _worker(rank: int, world: int, tmp: str, cfg) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init_{world}_{cfg.steps}", rank=rank, world_size=world)
    try:
        Run(cfg).train()
    finally:
        dist.destroy_process_group()


def _train(cfg, world: int, tmp: Path) -> None:
    if world > 1:
        mp.spawn(_worker, args=(world, str(tmp), cfg), nprocs=world, join=True)
        return
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as in the workers
    try:
        Run(cfg).train()
    finally:
        torch.set_default_dtype(default)


def test_image_dit_resumes_from_four_to_two_to_one_process(tmp_path):
    _train(replace(DIT, steps=6, out=str(tmp_path / "one")), 1, tmp_path)
    out = str(tmp_path / "resharded")
    _train(replace(DIT, steps=2, fsdp=True, out=out), 4, tmp_path)
    assert sharded_checkpoint.exists(out)
    _train(replace(DIT, steps=4, fsdp=True, resume=True, out=out), 2, tmp_path)
    _train(replace(DIT, steps=6, resume=True, out=out), 1, tmp_path)
    assert not sharded_checkpoint.exists(out) and (Path(out) / "checkpoint.safetensors").is_file()  # superseded
    want, got = _losses(tmp_path / "one"), _losses(Path(out))
    assert len(want) == len(got) == 6 and abs(want[0] - want[-1]) > 0.05
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=LOSS_RTOL, atol=0)


def test_language_model_resumes_from_one_to_four_processes_and_exports_whole(tmp_path):
    _train(replace(GPT, steps=4, out=str(tmp_path / "one")), 1, tmp_path)
    out = str(tmp_path / "resharded")
    _train(replace(GPT, steps=2, out=out), 1, tmp_path)
    _train(replace(GPT, steps=4, fsdp=True, resume=True, out=out), 4, tmp_path)
    assert sharded_checkpoint.exists(out) and not (Path(out) / "checkpoint.safetensors").exists()
    want, got = _losses(tmp_path / "one"), _losses(Path(out))
    assert len(want) == len(got) == 4 and abs(want[0] - want[-1]) > 0.05
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=LOSS_RTOL, atol=0)
    for use_ema in (True, False):  # the DCP checkpoint read whole equals the one-process run's
        run, weights = trained_weights(out, use_ema=use_ema)
        _, expected = trained_weights(tmp_path / "one" / "checkpoint.safetensors", use_ema=use_ema)
        assert run["steps"] == 4 and set(weights) == set(expected)
        for name, value in expected.items():
            torch.testing.assert_close(weights[name].double(), value.double(), atol=WEIGHT_TOL, rtol=0, msg=name)
    exported = tmp_path / "gpt.safetensors"  # one file, for inference: a copy, exact
    scripts.train.main(["--model", "gpt", "--out", out, "--export", str(exported)])  # export_weights
    _, model = load_trained(exported)
    _, weights = trained_weights(out)
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())


def _dcp_run(tmp_path: Path) -> Run:
    """A one-process image DiT run with a DCP checkpoint of step 1 (DCP saves in one process too)."""
    run = Run(replace(DIT, steps=1, out=str(tmp_path)))
    run.train_step()
    run.out.mkdir(parents=True, exist_ok=True)
    kw = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema}
    sharded_checkpoint.save(run.out, **kw, step=1, run=asdict(run.cfg), extra={})
    return run


def test_a_killed_dcp_save_leaves_the_last_checkpoint_and_its_leftovers_are_removed(tmp_path):
    run = _dcp_run(tmp_path)
    (tmp_path / ".checkpoint-dcp-000002-deadbeef").mkdir()  # a save killed before its link swap
    (tmp_path / ".checkpoint-dcp-000002-deadbeef" / "__0_0.distcp").write_bytes(b"half")
    os.symlink(".checkpoint-dcp-000002-deadbeef", tmp_path / ".checkpoint.dcp.deadbeef")
    assert sharded_checkpoint.metadata(tmp_path)["step"] == 1
    assert len(sharded_checkpoint.remove_temporaries(tmp_path)) == 2
    left = {p.name for p in tmp_path.iterdir() if p.name.startswith((".check", "check"))}
    assert left == {"checkpoint.dcp", os.readlink(tmp_path / "checkpoint.dcp")}
    kw = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema}
    assert sharded_checkpoint.load(tmp_path, **kw, run=asdict(run.cfg), keys=("model",))["step"] == 1


def test_a_corrupt_or_foreign_dcp_checkpoint_is_refused(tmp_path):
    run = _dcp_run(tmp_path)
    kw = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema}
    with pytest.raises(CheckpointError, match="belongs to another run"):
        sharded_checkpoint.load(tmp_path, **kw, run=asdict(run.cfg) | {"seed": 1}, keys=("seed",))
    shard = next((tmp_path / "checkpoint.dcp").resolve().glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="fail their checksums"):
        sharded_checkpoint.load(tmp_path, **kw, run=asdict(run.cfg), keys=())
    with pytest.raises(RunFolderError, match="holds a run"):  # a fresh run never replaces it
        rundir.start_fresh(tmp_path, overwrite=False)


def test_scripts_sample_reads_a_dcp_run_folder_and_its_ema_weights(tmp_path):
    import scripts.sample

    run = _dcp_run(tmp_path)
    _, weights = trained_weights(tmp_path)  # the EMA parameters, read whole from the shards
    for (name, _), ema in zip(run.model.named_parameters(), run.ema):
        assert torch.equal(weights[name], ema), name
    scripts.sample.main(
        ["--checkpoint", str(tmp_path), "--steps", "1", "--per-class", "1", "--out", str(tmp_path / "s.png")]
    )
    assert (tmp_path / "s.png").is_file()


def test_a_dcp_resume_with_other_settings_is_refused_unless_allowed(tmp_path):
    _dcp_run(tmp_path)
    changed = replace(DIT, steps=2, lr=2e-2, resume=True, out=str(tmp_path))
    with pytest.raises(CheckpointError, match="trained with other settings"):
        Run(changed).restore()
    run = Run(replace(changed, allow_changes=True))
    run.restore()
    assert run.step == 1 and run.history == [{"step": 1, "changed": {"lr": [1e-2, 2e-2]}}]
