"""Sample a trained DiT at any resolution with any position scaling.

``python -m scripts.sample --checkpoint runs/dit --resolution 64 --scaling interpolate``
writes a grid of one row per class. ``--scaling`` is the DiT's position mode (one of
``ar.POSITION_MODES``: none, interpolate, ntk, yarn, normalize); for a video DiT, ``--frames`` and
``--scaling riflex`` (RIFLEx on the time axis). ``--pipeline`` samples through the
diffusers pipeline (image or video) instead of the project's own Euler loop (same samples).
A value the model cannot take (a zero or negative count, ``--cfg nan``, a side the patch does
not divide, an output it cannot write) is one line on stderr and exit status 2, before any work.

A video DiT samples sharded under ``torchrun --nproc_per_node P -m scripts.sample ...``:
each video's tokens over all P ranks (``--cp-method ring|ulysses``), every rank computes
its share of every step, and rank 0 writes the file (docs/distributed.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

import axial_rope as ar
from axial_rope.parallel import LAYOUTS, METHODS, ContextParallel
from models.training.checkpoint import CheckpointError
from models.training.pictures import ANIMATION_SUFFIXES, GRID_SUFFIXES, save_gif, save_grid
from models.training.trainer import load_trained

from . import cli
from .cli import finite_float, positive_int


def main(argv: list[str] | None = None) -> None:
    parser = cli.Parser(prog="scripts.sample", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a run folder or its checkpoint.safetensors")
    parser.add_argument("--resolution", type=positive_int, default=None, help="default: the training resolution")
    parser.add_argument("--frames", type=positive_int, default=None, help="video: default the training frame count")
    parser.add_argument("--scaling", default="none", choices=[*ar.POSITION_MODES, "riflex"])
    parser.add_argument("--per-class", type=positive_int, default=8)
    parser.add_argument("--cfg", type=finite_float, default=3.0, help="classifier-free guidance scale")
    parser.add_argument("--steps", type=positive_int, default=40, help="Euler steps")
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
        cli.fail(parser.prog, err)
    run_dir = Path(args.checkpoint) if Path(args.checkpoint).is_dir() else Path(args.checkpoint).parent
    if task.name == "gpt":
        parser.error("scripts.sample samples the DiTs; use GPT.generate for the language model")
    if cp is not None and task.name != "video_dit":
        parser.error("sampling under torchrun (sharded) is for the video DiT")
    video = task.name == "video_dit"
    resolution, frames = args.resolution or task.resolution, args.frames or getattr(task, "frames", None)
    _check_sizes(parser, args, task.config.patch_size, resolution, frames, video)
    if video:
        default = run_dir / f"sample_{frames}f_{args.scaling}.gif"
    else:
        default = run_dir / f"sample_{resolution}px_{args.scaling}.png"
    out = cli.out_file(parser, "--out", args.out or default, ANIMATION_SUFFIXES if video else GRID_SUFFIXES)
    try:
        if video:
            _videos(args, task, model, cp, resolution, frames, out)
        else:
            print(save_grid(_images(args, task, model, resolution), out, nrow=args.per_class))
    except OSError as err:  # the sample was drawn; the file could not be written (no such folder, disk full)
        cli.fail(parser.prog, f"cannot write {out}: {err}")
    finally:
        if created:
            dist.destroy_process_group()


def _check_sizes(parser, args, patch, resolution: int, frames: int | None, video: bool) -> None:
    """Usage errors for sizes the model cannot take: sides (and frames) the patch does not divide, flags
    of the other kind of model."""
    patch = (patch,) * 2 if isinstance(patch, int) else tuple(patch)  # image (y, x); video (t, y, x)
    if video and args.scaling not in ("none", "riflex"):
        parser.error("a video DiT takes --scaling none or riflex")
    if not video:
        if args.frames is not None:
            parser.error("--frames is for a video DiT; this checkpoint holds an image DiT")
        if args.scaling == "riflex":
            parser.error("riflex applies to video DiTs")
    if resolution % patch[-1]:
        parser.error(f"--resolution {resolution} is not a multiple of the model's patch {patch[-1]}")
    if video and frames % patch[0]:
        parser.error(f"--frames {frames} is not a multiple of the model's temporal patch {patch[0]}")


def _images(args, task, model, resolution: int) -> torch.Tensor:
    if args.pipeline:
        return _pipeline_images(args, resolution)
    return task.sample(
        model,
        per_class=args.per_class,
        resolution=resolution,
        cfg_scale=args.cfg,
        steps=args.steps,
        seed=args.seed,
        pos_mode=args.scaling,
    )


def _videos(args, task, model, cp: ContextParallel | None, resolution: int, frames: int, out: Path) -> None:
    """Sample the video grid and write its GIF; sharded over ``cp.group`` when given (rank 0 writes)."""
    temporal = ar.scaling.RIFLEx(4, frames) if args.scaling == "riflex" else None
    if args.pipeline:
        videos = _pipeline_videos(args, resolution, frames, temporal, cp, next(model.parameters()).device)
    else:
        kwargs = {} if temporal is None else {"temporal_scaling": temporal}
        if cp is not None:
            kwargs["context_parallel"] = cp
        videos = task.sample(
            model,
            per_class=args.per_class,
            frames=frames,
            resolution=resolution,
            cfg_scale=args.cfg,
            steps=args.steps,
            seed=args.seed,
            **kwargs,
        )
    if cp is None or dist.get_rank() == 0:  # sharded: every rank holds the whole videos, one writes them
        print(save_gif(videos, out))


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


def _pipeline_videos(args, resolution: int, frames: int, temporal, cp, device) -> torch.Tensor:
    """The videos ``[N, 3, T, H, W]`` in [-1, 1] of the diffusers video pipeline (the Euler loop's, as for images)."""
    from models.pipeline import AxialVideoDiTPipeline
    from models.training.data import CLASSES
    from models.training.export import video_dit_from_checkpoint

    pipe = AxialVideoDiTPipeline(transformer=video_dit_from_checkpoint(args.checkpoint).to(device))
    pipe.set_progress_bar_config(disable=True)
    labels = torch.arange(len(CLASSES)).repeat_interleave(args.per_class).tolist()
    out = pipe(
        labels,
        num_frames=frames,
        height=resolution,
        width=resolution,
        guidance_scale=args.cfg,
        num_inference_steps=args.steps,
        temporal_scaling=temporal,
        generator=torch.Generator().manual_seed(args.seed),
        output_type="pt",
        context_parallel=cp,
    )
    return out.frames.permute(0, 2, 1, 3, 4).cpu() * 2 - 1  # [N, T, 3, H, W] in [0, 1] -> [N, 3, T, H, W]


if __name__ == "__main__":
    main()
