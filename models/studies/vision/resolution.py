"""The resolution study's design, jobs and evaluation (``python -m scripts.experiments resolution``).

An image DiT (the tiny preset) is trained at ``R`` = 32 px in 4 px patches (8 x 8 tokens: the size at
which it draws the conditioned class, docs/experiments.md "Pilot") with five training seeds; then,
at 1.5x, 2x, 3x and a 1:2 aspect ratio, every arm (a way to run it at the new size) is measured:

- on two test sets of held-out scenes: the same scenes rendered larger (``Shapes.grown``: objects
  grow with the image) and a larger canvas with objects at their trained pixel size, one to three
  per image (``Canvas``): the per-image denoising loss, mean over ``t`` in 0.1 ... 0.9;
- on samples (the same labels and initial noise for every arm and seed, Euler with guidance):
  class accuracy, object count, size, aspect, colour and the empty rate (:mod:`.metrics`), read by the
  shape classifier.

Arms: the training-free position modes of the DiT (``none``, ``interpolate``, ``ntk``, ``yarn``,
``normalize`` (on non-square sizes only: on a square one it is ``interpolate``'s rotation), ``dype``:
Dy-YaRN, following the sampling time), and at 2x the model fine-tuned there for the same few steps on
the grown scenes under each of ``finetune_modes`` (plain positions: the control; interpolation; YaRN),
EMA off, so each fine-tuned arm is the model its steps made. At 1x every mode is the same model: one
``trained size`` arm. At 8 tokens per axis YaRN's ramp has no room to act (the page counts its pairs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

from ...flow import T_SCALE, noisy, sample_euler, target_velocity
from ...training.config import TrainConfig
from ...training.data import CLASSES, Canvas, Shapes
from ...training.trainer import load_trained
from ..jobs import Job, checkpoint_hash, ensure_trained, read_result, write_result
from . import classifier as shape_classifier
from .classifier import ClassifierConfig
from .metrics import image_metrics, reference

__all__ = ["FULL", "QUICK", "ResolutionStudy", "arms_at", "execute", "finetuned_arm", "study_jobs"]

Size = tuple[int, int]


@dataclass(frozen=True)
class ResolutionStudy:
    """The sizes of one run of the study (``FULL``: the published one; ``QUICK``: seconds, plumbing only)."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    resolution: int = 32  # training side in pixels: 8 x 8 tokens of the tiny preset's 4 px patches
    # the pilot's 6000 steps (class accuracy 0.80 at 32 px; 3000 steps: 0.62) gave 0.76 [0.66, 0.86] over five
    # seeds, below the 0.8 criterion (docs/experiments.md, "After the pilot"): twice as long
    steps: int = 12000
    batch_size: int = 16
    lr: float = 2e-3
    sizes: tuple[Size, ...] = ((32, 32), (48, 48), (64, 64), (96, 96), (32, 64))  # (H, W) evaluated
    modes: tuple[str, ...] = ("none", "interpolate", "ntk", "yarn", "normalize", "dype")
    finetune_size: int = 64  # the fine-tuned arms: this side, grown scenes, one run per mode of finetune_modes
    finetune_modes: tuple[str, ...] = ("none", "interpolate", "yarn")  # "none": plain positions, the control
    finetune_steps: int = 200
    finetune_batch: int = 8
    finetune_lr: float = 5e-4
    per_class: int = 4  # samples per class, size, arm and seed (sizes above 4x the training area: half)
    loss_images: int = 24  # per test set, size, arm and seed (sizes above 4x the training area: 2/3)
    ts: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    euler_steps: int = 20
    cfg_scale: float = 3.0
    max_objects: int = 3  # on the canvas test set
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    draws: int = 2000  # bootstrap replicates
    workers: int = 2  # processes of one thread; 0: all in this one
    quick: bool = False

    def large(self, size: Size) -> bool:
        return size[0] * size[1] > 4 * self.resolution**2

    def samples_per_class(self, size: Size) -> int:
        return max(1, self.per_class // 2) if self.large(size) else self.per_class

    def loss_count(self, size: Size) -> int:
        return max(2, self.loss_images * 2 // 3) if self.large(size) else self.loss_images


FULL = ResolutionStudy()
QUICK = ResolutionStudy(
    seeds=(0,), resolution=16, steps=3, batch_size=4, sizes=((16, 16), (24, 24), (32, 32), (16, 32)),
    finetune_size=32, finetune_modes=("none", "interpolate"), finetune_steps=2, finetune_batch=2, per_class=1,
    loss_images=2, ts=(0.5,), euler_steps=2,
    classifier=ClassifierConfig(steps=4, batch_size=8, resolutions=(16, 32)), draws=200, workers=0, quick=True,
)  # fmt: skip


def size_name(size: Size) -> str:
    return f"{size[0]}x{size[1]}"


def finetuned_arm(mode: str) -> str:
    """The arm of the model fine-tuned under ``mode`` (``"fine-tuned, none"``: plain positions, the control)."""
    return f"fine-tuned, {mode}"


def arms_at(study: ResolutionStudy, size: Size) -> list[tuple[str, str | None]]:
    """``(arm, pos_mode)`` evaluated at ``size``; a fine-tuned arm runs its own model in its own mode (``None``)."""
    if size == (study.resolution, study.resolution):
        return [("trained size", "none")]
    square = size[0] == size[1]
    arms = [(m, m) for m in study.modes if not (square and m == "normalize")]
    if size == (study.finetune_size, study.finetune_size):
        arms += [(finetuned_arm(mode), None) for mode in study.finetune_modes]
    return arms


def train_config(study: ResolutionStudy, root: Path, seed: int, finetune: str | None = None) -> TrainConfig:
    """The base run of ``seed``, or its fine-tuning at ``finetune_size`` under the position mode ``finetune``
    (started from the base run's weights, positions relative to the base's size, EMA off)."""
    base = TrainConfig(
        model="dit", preset="tiny", resolution=study.resolution, steps=study.steps, batch_size=study.batch_size,
        lr=study.lr, seed=seed, out=str(root / "train" / f"s{seed}"), progress=False, report=False, ckpt_every=250,
    )  # fmt: skip
    if finetune is None:
        return base
    return replace(
        base, resolution=study.finetune_size, base_resolution=study.resolution, pos_mode=finetune,
        steps=study.finetune_steps, batch_size=study.finetune_batch, lr=study.finetune_lr, warmup=10, ema=0.0,
        out=str(root / "train" / f"ft_{finetune}_s{seed}"),
    )  # fmt: skip


def study_jobs(study: ResolutionStudy) -> list[Job]:
    """Every job in an order that respects ``needs`` (as ``workers=0`` runs them)."""
    jobs = [Job("classifier"), Job("validate", ("classifier",))]
    for seed in study.seeds:
        jobs.append(Job(f"train/s{seed}"))
        jobs += [Job(f"finetune/s{seed}/{mode}", (f"train/s{seed}",)) for mode in study.finetune_modes]
    for size in sorted(study.sizes, key=lambda s: -s[0] * s[1]):  # the longest jobs first: balanced workers
        for seed in study.seeds:
            tuned = tuple(f"finetune/s{seed}/{mode}" for mode in study.finetune_modes)
            jobs.append(Job(f"eval/s{seed}/{size_name(size)}", ("classifier", f"train/s{seed}", *tuned)))
    return jobs


def execute(study: ResolutionStudy, root: Path, job: Job) -> str:
    """Run one job of :func:`study_jobs` (in a worker or here); returns what happened."""
    kind, *rest = job.key.split("/")
    if (done := shape_classifier.shared_job(kind, study, root, validate)) is not None:
        return done
    seed = int(rest[0][1:])
    if kind == "train":
        return ensure_trained(train_config(study, root, seed))
    if kind == "finetune":
        return ensure_trained(train_config(study, root, seed, rest[1]), train_config(study, root, seed).out)
    size = tuple(int(v) for v in rest[1].split("x"))
    return evaluate(study, root, seed, size)


def executor(study: ResolutionStudy, root: Path):
    """``execute`` bound to the study and root: picklable, for the worker processes."""
    return partial(execute, study, root)


def _settings(study: ResolutionStudy) -> dict:
    """The fields that change results (where and how fast they are computed aside)."""
    return {k: v for k, v in asdict(study).items() if k not in ("workers", "draws", "quick")}


@torch.no_grad()
def per_image_loss(model, x0: torch.Tensor, y: torch.Tensor, noise: torch.Tensor, ts, **kw) -> torch.Tensor:
    """``[B]``: each image's (or video's) velocity error (mean squared), averaged over the noise levels ``ts``."""
    total = torch.zeros(len(x0))
    keep = torch.zeros(len(x0), dtype=torch.bool)  # no label dropout: the conditional prediction
    for t in ts:
        tt = torch.full((len(x0),), t)
        pred = model(noisy(x0, tt, noise), tt * T_SCALE, y, force_drop_ids=keep, **kw)[:, : x0.shape[1]]
        total += (pred.float() - target_velocity(x0, noise)).square().flatten(1).mean(1)  # [B]: images or videos
    return total / len(ts)


def held_out_sets(study: ResolutionStudy, size: Size) -> dict[str, tuple[torch.Tensor, ...]]:
    """``{"grown", "canvas"}: (x0, labels, noise)``: held-out scenes and fixed noise, the same for every arm and seed.

    The canvas' objects keep their trained size, or shrink to the shorter side where that is shorter than
    the training size (a 16 x 48 canvas holds objects drawn for 16 px, not clipped 32 px ones): a set
    that fits its objects and that no model trains on (several objects; every training image holds one).
    """
    n = study.loss_count(size)
    grown = Shapes(seed=10_007).grown(range(n), size)
    fitted = min(study.resolution, *size)
    canvas = Canvas(seed=10_008, train_resolution=fitted, max_objects=study.max_objects).batch(range(n), size)
    out = {}
    for i, (name, (x0, y)) in enumerate((("grown", grown), ("canvas", canvas[:2]))):
        gen = torch.Generator().manual_seed(7919 * (i + 1) + size[0] * 1009 + size[1])
        out[name] = (x0, y, torch.randn(x0.shape, generator=gen))
    return out


def sample_inputs(study: ResolutionStudy, size: Size) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels ``[N]`` (classes in order) and initial noise ``[N, 3, H, W]``: the same for every arm and seed."""
    labels = torch.arange(len(CLASSES)).repeat_interleave(study.samples_per_class(size))
    gen = torch.Generator().manual_seed(104_729 + size[0] * 1009 + size[1])
    return labels, torch.randn(len(labels), 3, *size, generator=gen)


def sample(model, labels: torch.Tensor, noise: torch.Tensor, study: ResolutionStudy, **kw) -> torch.Tensor:
    """Euler samples ``[N, 3, H, W]`` in [-1, 1] with classifier-free guidance (``kw``: ``pos_mode=``)."""

    def velocity(x, t):
        return model.forward_with_cfg(x, t, labels, study.cfg_scale, **kw)

    return sample_euler(velocity, noise, study.euler_steps).clamp(-1, 1)


def measure(
    model, sets: dict, labels, noise, study: ResolutionStudy, classifier, ref, **kw
) -> tuple[dict, torch.Tensor]:
    """One arm: ``{metric: per-image values}`` (the loss on each held-out set of :func:`held_out_sets`, the sample
    metrics) and its samples ``[N, 3, H, W]`` (``kw``: ``pos_mode=`` or ``scaling=`` of the model's forward)."""
    row = {f"loss_{name}": per_image_loss(model, *xs, study.ts, **kw).tolist() for name, xs in sets.items()}
    images = sample(model, labels, noise, study, **kw)
    return row | {m: v.tolist() for m, v in image_metrics(images, labels, classifier, ref).items()}, images


def samples_path(root: Path, size: Size, arm: str) -> Path:
    """Where an arm's samples at ``size`` are kept for the page's pictures (uint8 ``[N, 3, H, W]``)."""
    return root / "samples" / f"{size_name(size)}_{arm.replace(', ', '_').replace(' ', '-')}.pt"


def save_samples(root: Path, size: Size, arm: str, images: torch.Tensor) -> None:
    path = samples_path(root, size, arm)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(((images + 1) * 127.5).round().to(torch.uint8), path)


def evaluate(study: ResolutionStudy, root: Path, seed: int, size: Size) -> str:
    """Every arm at ``size`` with the models of ``seed``: losses and sample metrics, saved to ``root/eval``."""
    base_dir = train_config(study, root, seed).out
    run_dirs = {finetuned_arm(m): train_config(study, root, seed, m).out for m in study.finetune_modes}
    settings = {"study": _settings(study), "size": list(size), "checkpoint": checkpoint_hash(base_dir)}
    tuned = [arm for arm, mode in arms_at(study, size) if mode is None]
    if tuned:
        settings["finetuned"] = {arm: checkpoint_hash(run_dirs[arm]) for arm in tuned}
    path = root / "eval" / f"s{seed}_{size_name(size)}.json"
    if read_result(path, settings) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(root / "classifier.pt", study.classifier)
    ref = reference(study.resolution)
    sets, (labels, noise) = held_out_sets(study, size), sample_inputs(study, size)
    result, models = {}, {}
    for arm, mode in arms_at(study, size):
        source = run_dirs.get(arm, base_dir)
        model = models.setdefault(source, load_trained(source)[1])
        result[arm], images = measure(model, sets, labels, noise, study, classifier, ref, pos_mode=mode)
        if seed == study.seeds[0]:  # the page's pictures: the first seed's samples
            save_samples(root, size, arm, images)
    write_result(path, settings, result)
    return "evaluated"


def validation_settings(study: ResolutionStudy) -> dict:
    return {"classifier": _settings(study)["classifier"], "sizes": [list(s) for s in study.sizes]}


def validate(study: ResolutionStudy, root: Path) -> str:
    """The classifier's accuracy through the whole pipeline on held-out renders of both test sets at each size."""
    settings = validation_settings(study)
    path = root / "classifier_check.json"
    if read_result(path, settings) is not None:
        return "reused"
    classifier = shape_classifier.load_or_train(root / "classifier.pt", study.classifier)
    ref, n = reference(study.resolution), 16 if study.quick else 128
    result = {}
    for size in study.sizes:
        x, y = Shapes(seed=50_001).grown(range(n), size)
        grown = image_metrics(x, y, classifier, ref)
        canvas_set = Canvas(seed=50_002, train_resolution=study.resolution, max_objects=study.max_objects)
        x, y, count = canvas_set.batch(range(n), size)
        crops, found = shape_classifier.object_crops(x, ref.min_area)
        predicted = shape_classifier.classify(classifier, crops)
        truth = torch.cat([torch.full((len(f),), int(c)) for f, c in zip(found, y)])
        result[size_name(size)] = {
            "grown_accuracy": float(grown["correct"].mean()),
            "grown_size": float(grown["size"].mean()),
            "canvas_object_accuracy": float((predicted == truth).float().mean()),
            "canvas_count_accuracy": float((torch.tensor([len(f) for f in found]) == count).float().mean()),
            "images": n,
        }
    write_result(path, settings, result)
    return "validated"
