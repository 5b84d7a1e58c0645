"""Train a reference model: ``python -m scripts.train [--model dit|video_dit|gpt] [--preset ...]``.

With no arguments it trains the tiny class-conditional image DiT on procedural shapes
(CPU, minutes) and writes a sample grid, a loss curve, a JSONL log and a checkpoint
into ``runs/dit``. ``--resume`` continues a run; Ctrl-C saves and exits. Runs under
``torchrun --nproc_per_node N`` unchanged (DDP; ``--fsdp`` for FSDP2).
"""

from __future__ import annotations

import argparse
import dataclasses

from models.train import TrainConfig, train

# per-model defaults that differ from TrainConfig's (which are the image DiT's)
MODEL_DEFAULTS = {
    "dit": {},
    "video_dit": {"batch_size": 16, "steps": 600, "out": "runs/video_dit", "resolution": 32},
    "gpt": {"batch_size": 32, "lr": 2e-3, "steps": 200, "schedule": "cosine", "out": "runs/gpt", "ema": 0.0},
}


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODEL_DEFAULTS), default="dit")
    for field in dataclasses.fields(TrainConfig):
        if field.name in ("model", "resume", "fsdp", "progress", "report"):
            continue
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=None, help=f"default: {field.default}")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.safetensors")
    parser.add_argument("--fsdp", action="store_true", help="shard with FSDP2 under torchrun")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-report", action="store_true", help="no validation, samples or loss curve")
    args = parser.parse_args(argv)
    values = dict(MODEL_DEFAULTS[args.model])
    values |= {k: v for k, v in vars(args).items() if v is not None and k in TrainConfig.__dataclass_fields__}
    values["progress"] = not args.no_progress
    values["report"] = not args.no_report
    return TrainConfig(**values)


def main(argv: list[str] | None = None) -> None:
    result = train(parse_args(argv))
    state = "interrupted, saved" if result["interrupted"] else "done"
    print(f"{state} at step {result['step']}: {result['out']}")


if __name__ == "__main__":
    main()
