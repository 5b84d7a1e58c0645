"""Extrapolation experiments behind ``python -m scripts.experiments NAME``.

Each experiment trains its model once (the default run of :data:`~models.training.config.RUN_DEFAULTS`,
the one ``python -m scripts.train --model MODEL`` trains), then evaluates it, training-free,
beyond what it was trained on:

- ``resolution``: an image DiT trained at 8 x 8 tokens over 5 seeds, at 1.5x, 2x, 3x and 1:2 with
  each position mode of ``ar.positions_for_size``, Dy-YaRN (time-dependent) and a fine-tuned arm:
  loss on two test sets and sample metrics with intervals (:mod:`models.studies.vision`;
  it trains its own runs under ``runs/resolution``);
- ``length``: every position scheme of the byte-level language model trained at one context
  (several seeds), RoPE's scaling methods training-free and fine-tuned, held-out loss at
  1x-8x that context with intervals, per-position curves and a retrieval probe
  (:mod:`models.studies.length`; it trains its own runs under ``runs/length``);
- ``frames``: a video DiT with HunyuanVideo's temporal rope trained on 8 frames over 5 seeds, at 16
  and 24 frames with none, RIFLEx, interpolation and NTK on the time axis, sample metrics (presence,
  motion, repetition) with intervals (:mod:`models.studies.vision`, runs under ``runs/frames``);
- ``streaming``: the length study's RoPE model over 4x its context, full attention against rolling KV
  caches with and without attention sinks (:mod:`models.studies.length.streaming`);
- ``streaming-video``: a frame-causal video DiT (``--causal``) sampled a frame at a time with rolling frame caches
  against the bidirectional one at 2x and 4x its training frames (:mod:`models.studies.streaming_video`);
- ``pilot``: one seed of each study's base model (image, video, language) at its own training size: is it
  competent enough to judge (:mod:`models.studies.pilot`; runs under ``runs/pilot``; writes ``OUT/pilot.json``)?
- ``packing``: the image DiT trained packed on mixed sizes against the resolution study's one-size runs,
  at sizes inside and beyond the packed range, with and without scaling (runs under ``runs/packing``);
- ``grid``: the pre-registered study at 16 x 16 tokens where the scalings differ (docs/experiments/design.md;
  runs under ``runs/grid``, one resumable job per seed, size and arm; ``--stage pilot`` first).

Results go to ``OUT/NAME.md`` (a table and pictures) and ``OUT/NAME.json``. Reuse rule
(:func:`trained_run`): a run folder's model is reused only when the folder's whole saved
configuration (``config.json``) equals the requested one, the fields that do not change
the weights aside (``WEIGHT_NEUTRAL``); a folder holding any other run is an error.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..training import checkpoint
from ..training.config import RUN_DEFAULTS, TrainConfig, config_differences
from ..training.trainer import load_trained, train

# the run (a model of RUN_DEFAULTS) and the evaluation sizes of each experiment; --smoke shrinks both
SETUP = {
    "resolution": {"model": "dit"},
    "length": {"model": "gpt"},
    "frames": {"model": "video_dit"},
    "packing": {"model": "dit"},
}
# (length, resolution and frames: each study trains its own runs, models.studies.length and
# models.studies.vision; run_for(name) stays the model's default run, the one scripts.train trains;
# the frame study's diagnosis trains that run of the video DiT in its own root)


def run_for(name: str, smoke: bool = False, run_dir: str | Path | None = None) -> TrainConfig:
    """The training run of experiment ``name``: its model's default run; ``--smoke``: 2 steps into ``OUT_smoke``."""
    cfg = replace(RUN_DEFAULTS[SETUP[name]["model"]], progress=not smoke, report=not smoke)
    if smoke:
        cfg = replace(cfg, steps=2, batch_size=4, out=cfg.out + "_smoke")
    return cfg if run_dir is None else replace(cfg, out=str(run_dir))


def trained_run(cfg: TrainConfig):
    """``(task, model)`` of the run ``cfg``, trained into ``cfg.out`` unless that folder holds it already.

    The folder's run is reused when its ``config.json`` equals ``cfg`` in every field but the
    ``WEIGHT_NEUTRAL`` ones (a run of those settings stopped early, e.g. by Ctrl-C, is resumed
    to ``cfg.steps``). A folder with a checkpoint of any other settings raises
    :class:`~models.training.checkpoint.CheckpointError` naming the differences: it is never
    overwritten; remove it or train elsewhere (``--run-dir`` of ``scripts.experiments``).
    """
    out = Path(cfg.out)
    if not (out / "checkpoint.safetensors").is_file():
        # no checkpoint, no weights to lose: what a run killed before its first save left is replaced
        train(replace(cfg, overwrite=True))
        return load_trained(out)
    hint = f"remove {out} or pass another --run-dir"
    if not (out / "config.json").is_file():
        raise checkpoint.CheckpointError(f"{out} holds a checkpoint without config.json (settings unknown): {hint}")
    diff = config_differences(json.loads((out / "config.json").read_text()), cfg)
    if diff:
        detail = ", ".join(f"{k}: saved {a!r} vs wanted {b!r}" for k, (a, b) in diff.items())
        raise checkpoint.CheckpointError(f"{out} holds another run ({detail}): {hint}")
    if checkpoint.metadata(out)["step"] < cfg.steps:
        train(replace(cfg, resume=True))
    return load_trained(out)


def resolution(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """An image DiT trained at 8 x 8 tokens (5 seeds), at 1.5x, 2x, 3x and 1:2 with every position mode,
    Dy-YaRN and a fine-tuned arm, on two test sets, with sample metrics and intervals:
    :mod:`models.studies.vision.resolution` (``smoke``: its quick variant; ``run_dir``: the study's
    root folder, default ``runs/resolution``)."""
    from .vision import run_resolution  # the study imports the trainer; only this experiment needs it

    return run_resolution(out, quick=smoke, root=run_dir)


def length(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """Every position scheme trained at one context (the published run: 5 seeds of RoPE, NoPE and ALiBi), RoPE
    scaling training-free and fine-tuned, evaluated to 8x that context: :mod:`models.studies.length` (``smoke``: its quick variant;
    ``run_dir``: the study's root folder, default ``runs/length``)."""
    from . import length  # the study imports the trainer; only this experiment needs it

    return length.run(out, quick=smoke, root=run_dir)


def frames(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """A video DiT with HunyuanVideo's temporal rope trained on 8 frames (5 seeds), at 16 and 24 frames with
    none, RIFLEx, interpolation and NTK on the time axis, with sample metrics and intervals, and why objects
    vanished from the default run's 16-frame samples: :mod:`models.studies.vision.frames` (``smoke``:
    its quick variant; ``run_dir``: the study's root folder, default ``runs/frames``)."""
    from .vision import run_frames

    return run_frames(out, quick=smoke, root=run_dir)


def packing(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """The image DiT trained packed on mixed sizes and aspects (5 seeds) against the resolution study's
    one-size runs, at sizes inside and beyond the packed range, with and without test-time scaling:
    :mod:`models.studies.vision.packing` (``smoke``: its quick variant; ``run_dir``: the study's
    root folder, default ``runs/packing``; the one-size runs stay under ``runs/resolution``)."""
    from .vision import run_packing

    return run_packing(out, quick=smoke, root=run_dir)


def streaming(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """The length study's RoPE model (its seeds) over 4x its context: full attention against rolling KV caches
    without and with attention sinks: :mod:`models.studies.length.streaming` (``run_dir``: the length
    study's root, default ``runs/length``, whose RoPE runs it reuses)."""
    from .length import streaming as study

    return study.run(out, quick=smoke, root=run_dir)


def streaming_video(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """A frame-causal video DiT (diffusion forcing) sampled a frame at a time with rolling frame caches against the
    bidirectional one sampled whole, at 1x, 2x and 4x the training frames: :mod:`models.studies.streaming_video`
    (``run_dir``: the study's root folder, default ``runs/streaming-video``)."""
    from . import streaming_video_page

    return streaming_video_page.run(out, quick=smoke, root=run_dir)


def pilot(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """One seed of the image DiT, the video DiT and the RoPE language model, each measured at its own training size
    against issue 24's competence criteria: :mod:`models.studies.pilot` (``smoke``: its quick variant; ``run_dir``:
    its root folder, default ``runs/pilot``). Returns ``out/pilot.json``, whose ``table`` is the markdown table."""
    from . import pilot as study

    return study.run(out, quick=smoke, root=run_dir)


def grid(out: Path, smoke: bool = False, run_dir: str | Path | None = None, workers: int | None = None,
         stage: str = "all") -> Path:
    """The pre-registered study at 16 x 16 tokens (docs/experiments/design.md): every scaling arm at FiT's sizes
    and 2x-4x, fine-tuned arms at 2x, one resumable job per cell: :mod:`models.studies.vision.grid` (``stage``:
    ``"pilot"``, ``"all"`` or ``"page"``; ``run_dir``: the study's root, default ``runs/grid``)."""
    from .vision import run_grid

    return run_grid(out, quick=smoke, root=run_dir, workers=workers, stage=stage)


EXPERIMENTS = {
    "resolution": resolution,
    "length": length,
    "frames": frames,
    "packing": packing,
    "streaming": streaming,
    "streaming-video": streaming_video,
    "pilot": pilot,
    "grid": grid,
}
