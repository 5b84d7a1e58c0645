"""Sample a trained DiT at any resolution with any position scaling.

``python -m scripts.sample --checkpoint runs/dit --resolution 64 --scaling interpolate``
writes a grid of one row per class. ``--scaling`` is the DiT's position mode (one of
``ar.POSITION_MODES``: none, interpolate, ntk, yarn, normalize); for a video DiT, ``--frames`` and
``--scaling riflex`` (RIFLEx on the time axis). ``--pipeline`` samples through the
diffusers pipeline instead of the project's own Euler loop (same images).

A video DiT samples sharded under ``torchrun --nproc_per_node P -m scripts.sample ...``:
each video's tokens over all P ranks (``--cp-method ring|ulysses``), every rank computes
its share of every step, and rank 0 writes the file (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

import axial_rope as ar
from axial_rope.parallel import LAYOUTS, METHODS, ContextParallel
from models.training.checkpoint import CheckpointError
from models.training.pictures import save_gif, save_grid
from models.training.trainer import load_trained


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a run folder or its checkpoint.safetensors")
    parser.add_argument("--resolution", type=int, default=None, help="default: the training resolution")
    parser.add_argument("--frames", type=int, default=None, help="video: default the training frame count")
    parser.add_argument("--scaling", default="none", choices=[*ar.POSITION_MODES, "riflex"])
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--cfg", type=float, default=3.0, help="classifier-free guidance scale")
    parser.add_argument("--steps", type=int, default=40, help="Euler steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pipeline", action="store_true", help="sample through the diffusers pipeline")
    parser.add_argument("--out", default=None, help="default: CHECKPOINT/sample_<resolution>_<scaling>.png")
    parser.add_argument("--cp-method", choices=METHODS, default="ring", help="under torchrun: sharded video sampling")
    parser.add_argument("--cp-layout", choices=LAYOUTS, default="contiguous")
    args = parser.parse_args(argv)

    cp, device, created = _context_parallel(args)
    try:
        task, model = load_trained(args.checkpoint, device=device)
    except CheckpointError as err:  # missing, corrupt (checksums, NaN weights) or broken: say which, no traceback
        parser.exit(1, f"error: {err}\n")
    run_dir = Path(args.checkpoint) if Path(args.checkpoint).is_dir() else Path(args.checkpoint).parent
    if task.name == "gpt":
        parser.error("scripts.sample samples the DiTs; use GPT.generate for the language model")
    if cp is not None and task.name != "video_dit":
        parser.error("sampling under torchrun (sharded) is for the video DiT")
    resolution = args.resolution or task.resolution
    if task.name == "video_dit":
        if args.scaling not in ("none", "riflex"):
            parser.error("a video DiT takes --scaling none or riflex")
        _videos(args, task, model, cp, run_dir)
        if created:
            dist.destroy_process_group()
        return
    if args.scaling == "riflex":
        parser.error("riflex applies to video DiTs")
    if args.pipeline:
        images = _pipeline_images(args, resolution)
    else:
        images = task.sample(
            model,
            per_class=args.per_class,
            resolution=resolution,
            cfg_scale=args.cfg,
            steps=args.steps,
            seed=args.seed,
            pos_mode=args.scaling,
        )
    out = Path(args.out or run_dir / f"sample_{resolution}px_{args.scaling}.png")
    print(save_grid(images, out, nrow=args.per_class))


def _videos(args, task, model, cp: ContextParallel | None, run_dir: Path) -> None:
    """Sample the video grid and write its GIF; sharded over ``cp.group`` when given (rank 0 writes)."""
    frames = args.frames or task.frames
    kwargs = {"temporal_scaling": ar.scaling.RIFLEx(4, frames)} if args.scaling == "riflex" else {}
    if cp is not None:
        kwargs["context_parallel"] = cp
    videos = task.sample(
        model, per_class=args.per_class, frames=frames, cfg_scale=args.cfg, steps=args.steps, seed=args.seed, **kwargs
    )
    if cp is None or dist.get_rank() == 0:  # sharded: every rank holds the whole videos, one writes them
        print(save_gif(videos, Path(args.out or run_dir / f"sample_{frames}f_{args.scaling}.gif")))


def _context_parallel(args) -> tuple[ContextParallel | None, torch.device, bool]:
    """Under torchrun: every rank in one context group over the default group, this rank's device, and
    whether the default group was initialised here (then destroyed when done)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None, torch.device("cpu"), False
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ContextParallel(None, args.cp_method, args.cp_layout), device, created


def _pipeline_images(args, resolution: int):
    from models.pipeline import AxialDiTPipeline
    from models.training.data import CLASSES
    from models.training.export import dit_from_checkpoint

    pipe = AxialDiTPipeline(transformer=dit_from_checkpoint(args.checkpoint))
    labels = torch.arange(len(CLASSES)).repeat_interleave(args.per_class).tolist()
    out = pipe(
        labels,
        height=resolution,
        width=resolution,
        guidance_scale=args.cfg,
        num_inference_steps=args.steps,
        generator=torch.Generator().manual_seed(args.seed),
        pos_mode=args.scaling,
        output_type="pt",
    )
    return out.images * 2 - 1


if __name__ == "__main__":
    main()
