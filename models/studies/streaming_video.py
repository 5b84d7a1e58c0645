"""Streaming video: a frame-causal video DiT sampled a frame at a time with rolling frame caches, against the
bidirectional one sampled whole (``python -m scripts.experiments streaming-video``).

Two video DiTs of the frame-count study's design (preset ``tiny-hunyuan``: HunyuanVideo's temporal rope, the slow
motion of :data:`models.training.tasks.VIDEO_MOTION`; docs/experiments/frames.md) see the same 8-frame clips, seeds
and steps: *bidirectional* (one noise level per clip): the frame-count study's own runs (:mod:`.vision.frames`;
trained there, or here into its folders when missing), and *causal* (frame-causal attention, one noise level per
frame: diffusion forcing, ``--causal``), the same run but for that flag. Each is sampled at the training length
and at 2x and 4x it, with the same labels and initial noise for every arm:

- ``bidirectional``: every frame at once, plain positions (the frames study's ``none``);
- ``bidirectional + RIFLEx``: the same with RIFLEx on the time axis (the frames study's best loss);
- ``causal (all at once)``: the causal model denoising every frame together at plain positions (what its
  training alone does, without the cache);
- ``causal (streaming)``: :func:`models.video_streaming.sample_streaming`, a frame at a time with a rolling
  frame cache of the training length (positions re-indexed, never past 7).

Scored with the frames study's video metrics (:func:`models.studies.vision.metrics.video_metrics`, read by its
shape classifier) and the share of clips showing an object per frame (does a stream fade as it goes on?).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch

from ..training.config import TrainConfig
from ..training.tasks import VideoTask
from ..training.trainer import load_trained
from ..video_streaming import sample_streaming
from .jobs import Job, checkpoint_hash, ensure_trained, read_result, write_result
from .vision import classifier as shape_classifier
from .vision import frames as frames_study
from .vision.classifier import ClassifierConfig
from .vision.frames import FramesStudy, _presence_by_frame, arm_scaling, intrinsic, sample_videos, video_inputs
from .vision.metrics import reference, video_metrics

__all__ = ["ARMS", "FULL", "QUICK", "StreamingVideoStudy", "all_runs", "execute", "sample_path", "study_jobs"]

ARMS = ("bidirectional", "bidirectional + RIFLEx", "causal (all at once)", "causal (streaming)")
TRAINED_ARMS = ("bidirectional", "causal (all at once)", "causal (streaming)")  # at the training length


@dataclass(frozen=True)
class StreamingVideoStudy:
    """The sizes of one run of the study (``FULL``: the designed run, docs/experiments.md "Re-running"; the
    published page predates it and records its own settings; ``QUICK``: seconds, plumbing only).

    ``base`` is the frame-count study whose runs are the bidirectional arm and whose training settings, shape
    classifier and clip inputs every arm here uses; ``base_root`` is where its runs live."""

    base: FramesStudy = frames_study.FULL
    base_root: str = "runs/frames"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    lengths: tuple[int, ...] = (16, 32)  # 2x and 4x the training length
    per_class: int = 4  # clips per class, length, arm and seed
    euler_steps: int = 20  # per clip (bidirectional) or per frame (streaming)
    cfg_scale: float = 3.0
    draws: int = 2000
    workers: int = 2
    quick: bool = False

    # the training settings are the frame-count study's
    preset = property(lambda self: self.base.preset)
    resolution = property(lambda self: self.base.resolution)
    frames = property(lambda self: self.base.frames)  # the training length = the streaming window
    steps = property(lambda self: self.base.steps)
    batch_size = property(lambda self: self.base.batch_size)

    @property
    def classifier(self) -> ClassifierConfig:
        return self.base.classifier

    @property
    def classifier_path(self) -> Path:
        return Path(self.base_root) / "classifier.pt"  # the frame-count study's shape classifier


FULL = StreamingVideoStudy()
QUICK = StreamingVideoStudy(
    base=frames_study.QUICK, base_root="runs/frames_quick", seeds=(0, 1), lengths=(8,), per_class=1, euler_steps=2,
    draws=200, workers=0, quick=True,
)  # fmt: skip


def all_runs(study: StreamingVideoStudy, root: Path) -> dict[str, TrainConfig]:
    """``s<seed>-bidirectional`` (the frame-count study's run of that seed, in its folder) and ``s<seed>-causal``
    (the same settings, data, seed and steps but ``causal``, under ``root``)."""
    base = frames_study.all_runs(replace(study.base, seeds=study.seeds, diagnosis=False), Path(study.base_root))
    runs = {}
    for seed in study.seeds:
        bidirectional = base[f"s{seed}"]
        runs[f"s{seed}-bidirectional"] = bidirectional
        runs[f"s{seed}-causal"] = replace(bidirectional, causal=True, out=str(root / "train" / f"s{seed}-causal"))
    return runs


def study_jobs(study: StreamingVideoStudy) -> list[Job]:
    """Every job in an order that respects ``needs`` (as ``workers=0`` runs them)."""
    jobs = [Job("classifier"), Job("validate", ("classifier",))]
    jobs += [Job(f"train/{name}") for name in all_runs(study, Path("."))]
    for length in (study.frames, *study.lengths):
        needs = lambda s: ("classifier", f"train/s{s}-bidirectional", f"train/s{s}-causal")  # noqa: E731
        jobs += [Job(f"eval/s{seed}/{length}", needs(seed)) for seed in study.seeds]
    return jobs


def execute(study: StreamingVideoStudy, root: Path, job: Job) -> str:
    """Run one job of :func:`study_jobs`; returns what happened."""
    kind, *rest = job.key.split("/")
    if kind == "classifier":
        shape_classifier.load_or_train(study.classifier_path, study.classifier)
        return "ready"
    if kind == "validate":
        return validate(study, root)
    if kind == "train":
        return ensure_trained(all_runs(study, root)[rest[0]])
    return evaluate(study, root, int(rest[0][1:]), int(rest[1]))


def executor(study: StreamingVideoStudy, root: Path):
    return partial(execute, study, root)


def settings(study: StreamingVideoStudy) -> dict:
    return {k: v for k, v in asdict(study).items() if k not in ("workers", "draws", "quick")}


def sample_path(root: Path, length: int, arm: str) -> Path:
    """Where seed ``seeds[0]``'s clips of ``arm`` at ``length`` frames are kept (uint8, for the page's GIFs)."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in arm).strip("-")
    return root / "samples" / f"{length}_{slug}.pt"


def arms_at(study: StreamingVideoStudy, length: int) -> tuple[str, ...]:
    return TRAINED_ARMS if length == study.frames else ARMS


def sample_arm(arm: str, models: dict, study: StreamingVideoStudy, labels, noise) -> torch.Tensor:
    """Videos ``[N, 3, T, H, W]`` in [-1, 1] of ``arm`` from the same labels and noise."""
    length, (k, _) = noise.shape[2], intrinsic(study.preset, study.frames)
    if arm == "causal (streaming)":
        return sample_streaming(
            models["causal"], noise, labels, window=study.frames, steps=study.euler_steps, cfg_scale=study.cfg_scale
        )
    scaling = arm_scaling("RIFLEx", k, study.frames, length) if arm.endswith("RIFLEx") else None
    model = models["causal" if arm.startswith("causal") else "bidirectional"]
    return sample_videos(model, labels, noise, study.cfg_scale, study.euler_steps, scaling)


def distance_to_sinks(videos: torch.Tensor, sinks: int = 1) -> torch.Tensor:
    """Each frame's normalised distance to the sink frames, LoL's collapse diagnostic (arXiv 2601.16914).

    ``d_t = min_s ||x_t - x_s|| / ||x_s - mean(x_s)||`` over the first ``sinks`` frames ``s`` (the nearest one's spread
    in the denominator, so the scale is the picture's contrast): 0 for a frame that is a copy of a sink (a stream
    snapped back to its start), about ``sqrt(2)`` for an uncorrelated frame of the same mean and contrast.

    Args:
        videos: ``[N, C, T, H, W]``.
        sinks: how many leading frames the stream keeps as sinks (``1 <= sinks < T``).

    Returns:
        float64 ``[N, T]`` (the sink frames themselves at 0).
    """
    if videos.ndim != 5:
        raise ValueError(f"videos must be [N, C, T, H, W], got {tuple(videos.shape)}")
    frames = videos.shape[2]
    if isinstance(sinks, bool) or not isinstance(sinks, int) or not 1 <= sinks < frames:
        raise ValueError(f"sinks must be an int in [1, {frames}) for {frames} frames, got {sinks!r}")
    x = videos.detach().double().transpose(1, 2).flatten(2)  # [N, T, C H W]
    sink = x[:, :sinks]  # [N, S, P]
    apart = torch.cdist(x, sink)  # [N, T, S]
    spread = (sink - sink.mean(-1, keepdim=True)).norm(dim=-1).clamp_min(1e-12)  # [N, S]
    return (apart / spread[:, None]).amin(-1)


def evaluate(study: StreamingVideoStudy, root: Path, seed: int, length: int) -> str:
    """Every arm at ``length`` frames with seed ``seed``'s two models: metrics per clip, presence per frame."""
    runs = all_runs(study, root)
    models = {kind: load_trained(runs[f"s{seed}-{kind}"].out)[1] for kind in ("bidirectional", "causal")}
    hashes = {kind: checkpoint_hash(runs[f"s{seed}-{kind}"].out) for kind in models}
    path = root / "eval" / f"s{seed}_{length}.json"
    if read_result(path, {"study": settings(study), "length": length, "checkpoints": hashes}) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(study.classifier_path, study.classifier)
    ref, (_, period) = reference(study.resolution, moving=True), intrinsic(study.preset, study.frames)
    labels, noise = video_inputs(study.per_class, study.resolution, length)  # the same for every arm and seed
    result = {}
    for arm in arms_at(study, length):
        videos = sample_arm(arm, models, study, labels, noise)
        metrics = video_metrics(videos, labels, classifier, ref, round(period))
        result[arm] = {m: v.tolist() for m, v in metrics.items()} | {
            "by_frame": _presence_by_frame(videos, ref.min_area),
            "to_sinks": distance_to_sinks(videos).mean(0).tolist(),  # [T]: a collapse shows as a dip towards 0
        }
        if seed == study.seeds[0]:
            (root / "samples").mkdir(parents=True, exist_ok=True)
            keep = ((videos + 1) * 127.5).round().to(torch.uint8)
            torch.save(keep, sample_path(root, length, arm))
    write_result(path, {"study": settings(study), "length": length, "checkpoints": hashes}, result)
    return "evaluated"


def validate(study: StreamingVideoStudy, root: Path) -> str:
    """The data's own video metrics per length: the classifier through the pipeline on real clips."""
    path = root / "classifier_check.json"
    if read_result(path, {"study": settings(study)}) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(study.classifier_path, study.classifier)
    ref, (_, period) = reference(study.resolution, moving=True), intrinsic(study.preset, study.frames)
    task = VideoTask(study.preset, study.resolution, study.frames, seed=0)
    result = {}
    for length in (study.frames, *study.lengths):
        x, y = task.val_inputs(16 if study.quick else 64, study.resolution, frames=length)  # [N, 3, T, H, W]
        result[str(length)] = {m: v.tolist() for m, v in video_metrics(x, y, classifier, ref, round(period)).items()}
    write_result(path, {"study": settings(study)}, result)
    return "validated"
