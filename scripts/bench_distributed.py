"""Memory per rank of the trainer's compositions on CPU: ``python -m scripts.bench_distributed [--out FILE]``.

For the tiny presets at 1, 2 and 4 gloo processes, with DDP, FSDP2, FSDP2 with activation
checkpointing and (video DiT) context parallel, one training step of a global batch of 8 and this
rank's bytes of: parameters (its shards under FSDP2), gradients, AdamW's state, and the activations
autograd keeps for the backward (``torch.autograd.graph.saved_tensors_hooks``, each storage counted
once: under checkpointing only the blocks' inputs are kept). (Peak RSS is no measure here: the
interpreter and torch hold some 700 MB, and Linux keeps a parent's peak across a spawn.) The json goes to docs/bench/distributed_memory.json;
docs/scale.md holds the table and checks its formulas against it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from models.training.config import run_config
from models.training.distributed import parameter_bytes

SIZES = {"dit": {"resolution": 16}, "video_dit": {"resolution": 16, "frames": 8}, "gpt": {"context": 256}}
# (name, settings, worlds)
ARMS = [
    ("ddp", {}, (1, 2, 4)),
    ("fsdp", {"fsdp": True}, (2, 4)),
    ("fsdp+checkpointing", {"fsdp": True, "checkpointing": True}, (1, 2, 4)),
    ("fsdp x cp2", {"fsdp": True, "context_parallel": 2}, (2, 4)),
    ("dp x cp2", {"context_parallel": 2}, (4,)),
]


def _bytes(tensors) -> int:
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def measure(model: str, settings: dict, out: str) -> dict:
    """One step's bytes on this rank (the keys of the module docstring)."""
    from models.training.trainer import Run

    kw = {"preset": "tiny", "batch_size": 8, "progress": False, "report": False, "out": out}
    run = Run(run_config(model, **kw, **SIZES[model], **settings))
    saved: dict[int, int] = {}

    def pack(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run._loss()
    loss.backward()
    run.optimizer.step()
    state = [v for s in run.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim]
    return {
        "parameters": parameter_bytes(run.model),
        "gradients": _bytes(p.grad for p in run.model.parameters() if p.grad is not None),
        "optimizer": _bytes(state),
        "activations": sum(saved.values()),
    }


def _worker(rank: int, world: int, tmp: str, jobs: list) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    try:
        rows = [measure(model, settings, f"{tmp}/run") for model, _, settings in jobs]
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts.bench_distributed", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/bench/distributed_memory.json")
    args = parser.parse_args(argv)
    results = []
    for world in (1, 2, 4):
        jobs = [
            (model, name, settings)
            for name, settings, worlds in ARMS
            for model in SIZES
            if world in worlds and (model == "video_dit" or "context_parallel" not in settings)
        ]
        with tempfile.TemporaryDirectory() as tmp:
            if world == 1:
                rows = [
                    [measure(model, {k: v for k, v in s.items() if k != "fsdp"}, f"{tmp}/run")] for model, _, s in jobs
                ]
                per_rank = [[r[0] for r in rows]]
            else:
                mp.spawn(_worker, args=(world, tmp, jobs), nprocs=world, join=True)
                per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
        for i, (model, name, _) in enumerate(jobs):
            ranks = [per_rank[r][i] for r in range(len(per_rank))]
            results.append({"model": model, "arm": name, "world": world, "per_rank": ranks})
            mib = {k: round(max(r[k] for r in ranks) / 2**20, 3) for k in ranks[0]}
            print(f"{model:10s} {name:20s} W={world}  max per rank (MiB): {mib}")
    meta = {"torch": torch.__version__, "global_batch": 8, "sizes": SIZES, "dtype": "float32", "device": "cpu"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
