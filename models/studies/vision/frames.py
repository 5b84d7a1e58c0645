"""The frame-count study's design, jobs and evaluation (``python -m scripts.experiments frames``).

A video DiT whose temporal rope is HunyuanVideo's (16 channels, theta 256: pair periods 6.3, 12.6,
25, 50 ... frames; preset ``tiny-hunyuan``) is trained on 8-frame clips of slowly moving shapes
(no bounce back and no turn onto itself within 24 frames: a repetition is the model's) with several
seeds, then sampled at 16 and 24 frames with each arm on the time axis: ``none``, ``RIFLEx`` (pair
``k`` of :meth:`axial_rope.scaling.RIFLEx.intrinsic_k`: the first whose period exceeds the training
length, 12.6 frames here), ``interpolate`` (``Linear(T / 8)``) and ``NTK(T / 8)``; and at the training
length as the reference. Per clip: the denoising loss and the video metrics of :mod:`.metrics`
(presence, class, motion, repetition at RIFLEx's period).

Diagnosis of the default video run (``diagnosis``: the question of the 2026-11-30 page, whose 16-frame
samples showed objects absent for half the frames; off in ``FULL``, whose runs keep objects in 0.98 of the
frames): the same run and one trained twice as long, sampled at the training length with 20 and 40 Euler
steps and at 16 frames with none, RIFLEx (the paper's k and the old rule's k = 1) and interpolation:
which of training length, training time or sampling it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

import axial_rope as ar

from ...flow import classifier_free_guidance, sample_euler
from ...training.config import RUN_DEFAULTS, TrainConfig
from ...training.data import CLASSES
from ...training.tasks import VideoTask
from ...training.trainer import load_trained
from ..jobs import Job, checkpoint_hash, ensure_trained, read_result, write_result
from . import classifier as shape_classifier
from .classifier import ClassifierConfig
from .metrics import reference, video_metrics
from .resolution import per_image_loss

__all__ = ["FULL", "QUICK", "FramesStudy", "all_runs", "arm_scaling", "execute", "intrinsic", "study_jobs"]


@dataclass(frozen=True)
class FramesStudy:
    """The sizes of one run of the study (``FULL``: the published one; ``QUICK``: seconds, plumbing only)."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    preset: str = "tiny-hunyuan"
    resolution: int = 16  # the pilot's: objects in 0.98 of the frames after 3000 steps (docs/experiments.md)
    frames: int = 8  # training length
    steps: int = 3000
    batch_size: int = 16
    lr: float = 2e-3
    lengths: tuple[int, ...] = (16, 24)  # evaluated besides the training length
    arms: tuple[str, ...] = ("none", "RIFLEx", "interpolate", "NTK")
    per_class: int = 4  # videos per class, length, arm and seed
    loss_videos: int = 16  # held-out clips per length, arm and seed
    ts: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    euler_steps: int = 20
    cfg_scale: float = 3.0
    diagnosis: bool = False  # the default video run (and twice its steps), seed 0: the 2026-11-30 page's question
    # objects rendered at 16 and 24 px: it reads 0.97 of 64 real 16 px clips (0.64 when trained at 32-96 px)
    classifier: ClassifierConfig = field(default_factory=lambda: ClassifierConfig(steps=400, resolutions=(16, 24)))
    draws: int = 2000
    workers: int = 2
    quick: bool = False


FULL = FramesStudy()
# QUICK runs the diagnosis too: its code path stays tested while FULL leaves it off
QUICK = FramesStudy(
    seeds=(0,), resolution=16, frames=4, steps=3, batch_size=2, lengths=(8,), per_class=1, loss_videos=2, ts=(0.5,),
    euler_steps=2, diagnosis=True, classifier=ClassifierConfig(steps=4, batch_size=8, resolutions=(16, 32)), draws=200,
    workers=0, quick=True,
)  # fmt: skip
REFERENCE = "trained length"


def intrinsic(preset: str, train_length: int) -> tuple[int, float]:
    """RIFLEx's ``k`` for a preset's temporal axis and that pair's period in frames."""
    from ...video_dit import PRESETS, default_axes_dim

    c = PRESETS[preset]
    d_t = (c.axes_dim or default_axes_dim(c.hidden_size // c.num_heads))[0]
    k = ar.scaling.RIFLEx.intrinsic_k(d_t, c.theta, train_length)
    return k, 2 * math.pi * c.theta ** (2 * (k - 1) / d_t)


def arm_scaling(arm: str, k: int, train_length: int, length: int) -> ar.scaling.Scaling | None:
    """The time axis' scaling of ``arm`` at ``length`` frames (RIFLEx with pair ``k``)."""
    factor = length / train_length
    if arm == "RIFLEx":
        return ar.scaling.RIFLEx(k, length)
    if arm.startswith("RIFLEx k="):  # the diagnosis' explicit k
        return ar.scaling.RIFLEx(int(arm.split("=")[1]), length)
    if factor <= 1 or arm in ("none", REFERENCE):
        return None
    return {"interpolate": ar.scaling.Linear, "NTK": ar.scaling.NTK}[arm](factor)


def all_runs(study: FramesStudy, root: Path) -> dict[str, TrainConfig]:
    """Every training run: ``s<seed>`` of the study, and the diagnosis' ``default`` and ``default-x2``."""
    runs = {}
    for seed in study.seeds:
        runs[f"s{seed}"] = TrainConfig(
            model="video_dit", preset=study.preset, resolution=study.resolution, frames=study.frames,
            steps=study.steps, batch_size=study.batch_size, lr=study.lr, seed=seed,
            out=str(root / "train" / f"s{seed}"), progress=False, report=False, ckpt_every=200,
        )  # fmt: skip
    if study.diagnosis:
        default = RUN_DEFAULTS["video_dit"]
        if study.quick:
            default = replace(default, steps=2, batch_size=2, resolution=16, frames=study.frames)
        for name, steps in (("default", default.steps), ("default-x2", 2 * default.steps)):
            runs[name] = replace(default, steps=steps, out=str(root / "train" / name), progress=False, report=False)
    return runs


def study_jobs(study: FramesStudy) -> list[Job]:
    """Every job in an order that respects ``needs`` (as ``workers=0`` runs them)."""
    runs = all_runs(study, Path("."))
    jobs = [Job("classifier"), Job("validate", ("classifier",))]
    jobs += [Job(f"train/{name}") for name in runs if name.startswith("default")]  # the shorter runs first
    jobs += [Job(f"train/{name}") for name in runs if not name.startswith("default")]
    for length in sorted(study.lengths, reverse=True):  # the longest evaluations first
        jobs += [Job(f"eval/s{seed}/{length}", ("classifier", f"train/s{seed}")) for seed in study.seeds]
    jobs += [Job(f"eval/s{seed}/{study.frames}", ("classifier", f"train/s{seed}")) for seed in study.seeds]
    if study.diagnosis:
        needs = ("classifier", "train/default", "train/default-x2")
        jobs.append(Job("diagnose", needs))
    return jobs


def execute(study: FramesStudy, root: Path, job: Job) -> str:
    """Run one job of :func:`study_jobs`; returns what happened."""
    kind, *rest = job.key.split("/")
    if (done := shape_classifier.shared_job(kind, study, root, validate)) is not None:
        return done
    if kind == "train":
        return ensure_trained(all_runs(study, root)[rest[0]])
    if kind == "diagnose":
        return diagnose(study, root)
    return evaluate(study, root, int(rest[0][1:]), int(rest[1]))


def executor(study: FramesStudy, root: Path):
    return partial(execute, study, root)


def _settings(study: FramesStudy) -> dict:
    return {k: v for k, v in asdict(study).items() if k not in ("workers", "draws", "quick")}


def sample_videos(model, labels, noise, cfg_scale: float, steps: int, scaling) -> torch.Tensor:
    """Euler samples ``[N, 3, T, H, W]`` in [-1, 1] with guidance and ``scaling`` on the time axis."""
    null = model.y_embedder.null_label

    def velocity(x, t):
        return classifier_free_guidance(model, x, t, labels, null, cfg_scale, temporal_scaling=scaling)

    return sample_euler(velocity, noise, steps).clamp(-1, 1)


def video_inputs(per_class: int, resolution: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels (classes in order) and initial noise ``[N, 3, T, H, W]``, the same for every arm and seed."""
    labels = torch.arange(len(CLASSES)).repeat_interleave(per_class)
    gen = torch.Generator().manual_seed(15_485_863 + 1009 * length + resolution)
    return labels, torch.randn(len(labels), 3, length, resolution, resolution, generator=gen)


def _arm_row(task, model, arm, scaling, study, length, classifier, ref, lag, held_out) -> tuple[dict, torch.Tensor]:
    """Loss of the held-out clips and metrics of the sampled videos of one arm at ``length`` frames."""
    x0, y = held_out
    gen = torch.Generator().manual_seed(32_452_843 + length)
    loss = per_image_loss(model, x0, y, torch.randn(x0.shape, generator=gen), study.ts, temporal_scaling=scaling)
    labels, noise = video_inputs(study.per_class, task.resolution, length)
    videos = sample_videos(model, labels, noise, study.cfg_scale, study.euler_steps, scaling)
    metrics = video_metrics(videos, labels, classifier, ref, lag)
    return {"loss": loss.tolist()} | {m: v.tolist() for m, v in metrics.items()}, videos


def evaluate(study: FramesStudy, root: Path, seed: int, length: int) -> str:
    """Every arm at ``length`` frames (the reference alone at the training length) with seed ``seed``'s model."""
    run = all_runs(study, root)[f"s{seed}"]
    settings = {"study": _settings(study), "length": length, "checkpoint": checkpoint_hash(run.out)}
    path = root / "eval" / f"s{seed}_{length}.json"
    if read_result(path, settings) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(root / "classifier.pt", study.classifier)
    task, model = load_trained(run.out)
    ref, (k, period) = reference(study.resolution, moving=True), intrinsic(study.preset, study.frames)
    held_out = task.val_inputs(study.loss_videos, study.resolution, frames=length)
    arms = [REFERENCE] if length == study.frames else list(study.arms)
    result = {}
    for arm in arms:
        scaling = arm_scaling(arm, k, study.frames, length)
        row, videos = _arm_row(task, model, arm, scaling, study, length, classifier, ref, round(period), held_out)
        result[arm] = row
        if seed == study.seeds[0]:
            (root / "samples").mkdir(parents=True, exist_ok=True)
            keep = ((videos + 1) * 127.5).round().to(torch.uint8)
            torch.save(keep, root / "samples" / f"{length}_{arm.replace(' ', '-')}.pt")
    write_result(path, settings, result)
    return "evaluated"


def validate(study: FramesStudy, root: Path) -> str:
    """The classifier through the pipeline on held-out clips, and the data's own video metrics, per length."""
    settings = {"study": _settings(study)}
    path = root / "classifier_check.json"
    if read_result(path, settings) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(root / "classifier.pt", study.classifier)
    ref, (_, period) = reference(study.resolution, moving=True), intrinsic(study.preset, study.frames)
    task = VideoTask(study.preset, study.resolution, study.frames, seed=0)
    result = {}
    for length in (study.frames, *study.lengths):
        x, y = task.val_inputs(16 if study.quick else 64, study.resolution, frames=length)  # [N, 3, T, H, W]
        result[str(length)] = {m: v.tolist() for m, v in video_metrics(x, y, classifier, ref, round(period)).items()}
    write_result(path, settings, result)
    return "validated"


def diagnose(study: FramesStudy, root: Path) -> str:
    """Presence and the other video metrics of the default run and its twice-longer twin, per setting."""
    runs = all_runs(study, root)
    settings = {"study": _settings(study), "checkpoints": {n: checkpoint_hash(runs[n].out) for n in runs}}
    path = root / "diagnosis.json"
    if read_result(path, settings) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(root / "classifier.pt", study.classifier)
    result = {}
    for name in ("default", "default-x2"):
        task, model = load_trained(runs[name].out)
        N, (k, period) = task.frames, _intrinsic_of(model, task.frames)
        ref = reference(task.resolution, moving=True)
        settings_rows = [(f"{N} frames, Euler {s}", N, s, None) for s in (study.euler_steps, 2 * study.euler_steps)]
        for arm in dict.fromkeys(("none", f"RIFLEx k={k}", "RIFLEx k=1", "interpolate")):  # k = 1: once
            settings_rows.append((f"{2 * N} frames, {arm}", 2 * N, study.euler_steps, arm))
        for label, length, steps, arm in settings_rows:
            labels, noise = video_inputs(study.per_class, task.resolution, length)
            scaling = None if arm is None else arm_scaling(arm, k, N, length)
            videos = sample_videos(model, labels, noise, study.cfg_scale, steps, scaling)
            metrics = video_metrics(videos, labels, classifier, ref, round(period))
            per_frame = _presence_by_frame(videos, ref.min_area)
            result[f"{name}: {label}"] = {m: v.tolist() for m, v in metrics.items()} | {"by_frame": per_frame}
    write_result(path, settings, result)
    return "diagnosed"


def _intrinsic_of(model, train_length: int) -> tuple[int, float]:
    d_t, theta = model.rope.axes_dim[0], model.config.theta
    k = ar.scaling.RIFLEx.intrinsic_k(d_t, theta, train_length)
    return k, 2 * math.pi * theta ** (2 * (k - 1) / d_t)


def _presence_by_frame(videos: torch.Tensor, min_area: int) -> list[float]:
    """Share of videos showing an object, per frame ``[T]``."""
    from .objects import find_objects

    B, _, T = videos.shape[:3]
    found, _ = find_objects(videos.transpose(1, 2).flatten(0, 1), min_area)
    present = torch.tensor([len(f) > 0 for f in found], dtype=torch.float32).view(B, T)
    return present.mean(0).tolist()
