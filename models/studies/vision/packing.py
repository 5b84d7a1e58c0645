"""The packing study's design, jobs and evaluation (``python -m scripts.experiments packing``).

Does native-resolution training remove the need for test-time scaling? Two image DiTs (the tiny preset)
see the same number of steps, tokens per step, learning rate and seeds:

- **one size**: every image at ``R`` = 32 px (8 x 8 tokens): the resolution study's runs
  (:mod:`.resolution`; trained there, or here into its folders when missing);
- **packed**: images of sides ``R / 2 .. 3 R / 2`` (16 to 48 px) and any aspect up to 3:1, packed into
  ``batch_size * 64`` tokens per step (``scripts.train --packed``, :class:`~models.training.tasks.PackedImageTask`).

Both are then measured at sizes inside the packed range (0.75x, 1.5x, 1:3), at ``R`` and beyond both
ranges (2x, 1:2), on the resolution study's held-out sets and sample inputs (the same test scenes,
labels and initial noise for every arm and seed): the one-size model with plain positions,
interpolation and YaRN, the packed model with plain positions, and beyond its largest trained side
(12 tokens) also with its positions interpolated into that side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from axial_rope.scaling import Linear

from ...training import checkpoint
from ...training.config import TrainConfig
from ...training.trainer import load_trained
from ..jobs import Job, checkpoint_hash, ensure_trained, read_result, write_result
from . import classifier as shape_classifier
from . import resolution
from .metrics import reference
from .resolution import ResolutionStudy, held_out_sets, measure, sample_inputs, save_samples, size_name

__all__ = ["FULL", "QUICK", "PackingStudy", "arms_at", "execute", "study_jobs", "train_config"]

Size = tuple[int, int]


@dataclass(frozen=True)
class PackingStudy:
    """The sizes of one run (``FULL``: the designed one; ``QUICK``: seconds, plumbing only).

    ``base`` is the resolution study whose runs are the one-size arm and whose training settings, test
    sets, sample inputs and sampler every arm here uses; ``base_root`` is where its runs live. The published
    page (2026-12-02) was run when that study trained 6000 steps and records its own settings; ``FULL``
    trains both arms for the resolution study's 12000 steps today (not yet run).
    """

    base: ResolutionStudy = resolution.FULL
    base_root: str = "runs/resolution"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # the resolution study's
    sizes: tuple[Size, ...] = ((32, 32), (24, 24), (48, 48), (16, 48), (32, 64), (64, 64))  # of base.resolution 32
    draws: int = 2000
    workers: int = 2
    quick: bool = False

    @property
    def classifier_path(self) -> Path:
        return Path(self.base_root) / "classifier.pt"  # the resolution study's shape classifier

    @property
    def packed_max(self) -> int:
        """The largest side (tokens) the packed model trains on: ``3 R / 2`` pixels in patches of 4."""
        return (self.base.resolution * 3 // 2) // 4


FULL = PackingStudy()
QUICK = PackingStudy(
    base=resolution.QUICK, base_root="runs/resolution_quick", seeds=(0,), sizes=((16, 16), (24, 24), (8, 24), (32, 32)),
    draws=200, workers=0, quick=True,
)  # fmt: skip

ONE_SIZE, PACKED = "one size", "packed"


def arms_at(study: PackingStudy, size: Size) -> list[tuple[str, str, str]]:
    """``(arm, model, pos_mode)`` evaluated at ``size``; ``model`` is ``ONE_SIZE`` or ``PACKED``.

    ``pos_mode`` ``"fit"`` is the packed model with each axis longer than its largest trained side
    interpolated into it (:func:`packed_scaling`)."""
    R = study.base.resolution
    if size == (R, R):
        return [(ONE_SIZE, ONE_SIZE, "none"), (PACKED, PACKED, "none")]
    arms = [(f"{ONE_SIZE}, {m}", ONE_SIZE, m) for m in ("none", "interpolate", "yarn")]
    arms.append((PACKED, PACKED, "none"))
    if max(size) // 4 > study.packed_max:
        arms.append((f"{PACKED}, interpolate to {study.packed_max * 4} px", PACKED, "fit"))
    return arms


def train_config(study: PackingStudy, root: Path, seed: int, packed: bool) -> TrainConfig:
    """The one-size run of ``seed`` (the resolution study's, in its folder) or the packed run like it."""
    base = resolution.train_config(study.base, Path(study.base_root), seed)
    return replace(base, packed=True, out=str(root / "train" / f"packed_s{seed}")) if packed else base


def study_jobs(study: PackingStudy) -> list[Job]:
    """Every job in an order that respects ``needs`` (as ``workers=0`` runs them): trainings, then evaluations."""
    jobs = [Job("classifier")]
    for seed in study.seeds:
        jobs += [Job(f"train/packed_s{seed}"), Job(f"train/s{seed}")]
    for size in sorted(study.sizes, key=lambda s: -s[0] * s[1]):  # the longest first: balanced workers
        for seed in study.seeds:
            jobs.append(
                Job(f"eval/s{seed}/{size_name(size)}", ("classifier", f"train/s{seed}", f"train/packed_s{seed}"))
            )
    return jobs


def execute(study: PackingStudy, root: Path, job: Job) -> str:
    """Run one job of :func:`study_jobs` (in a worker or here); returns what happened."""
    kind, *rest = job.key.split("/")
    if kind == "classifier":
        shape_classifier.load_or_train(study.classifier_path, study.base.classifier)
        return "ready"
    if kind == "train":
        packed = rest[0].startswith("packed_")
        return ensure_trained(train_config(study, root, int(rest[0].split("s")[-1]), packed))
    size = tuple(int(v) for v in rest[1].split("x"))
    return evaluate(study, root, int(rest[0][1:]), size)


def executor(study: PackingStudy, root: Path):
    """``execute`` bound to the study and root: picklable, for the worker processes."""
    return partial(execute, study, root)


def packed_scaling(study: PackingStudy, size: Size) -> tuple:
    """Per axis (y, x): ``Linear`` squeezing a side longer than the packed model's largest into it, else ``None``."""
    return tuple(Linear(n / study.packed_max) if n > study.packed_max else None for n in (s // 4 for s in size))


def _settings(study: PackingStudy) -> dict:
    """The fields that change results (where and how fast they are computed aside)."""
    return {k: v for k, v in asdict(study).items() if k not in ("workers", "draws", "quick")}


def evaluate(study: PackingStudy, root: Path, seed: int, size: Size) -> str:
    """Every arm at ``size`` with the two models of ``seed``: losses and sample metrics, saved to ``root/eval``."""
    dirs = {ONE_SIZE: train_config(study, root, seed, False).out, PACKED: train_config(study, root, seed, True).out}
    for d in dirs.values():  # never a run still training (an evaluation started beside it by hand)
        if checkpoint.metadata(d)["step"] < study.base.steps:
            raise RuntimeError(f"{d} has not finished training ({study.base.steps} steps)")
    settings = {"study": _settings(study), "size": list(size)} | {m: checkpoint_hash(d) for m, d in dirs.items()}
    path = root / "eval" / f"s{seed}_{size_name(size)}.json"
    if read_result(path, settings) is not None:
        return "reused"
    base = study.base
    classifier = shape_classifier.load_or_train(study.classifier_path, base.classifier)
    ref = reference(base.resolution)
    sets, (labels, noise) = held_out_sets(base, size), sample_inputs(base, size)
    models = {name: load_trained(d)[1] for name, d in dirs.items()}
    result = {}
    for arm, which, mode in arms_at(study, size):
        kw = {"scaling": packed_scaling(study, size)} if mode == "fit" else {"pos_mode": mode}
        result[arm], images = measure(models[which], sets, labels, noise, base, classifier, ref, **kw)
        if seed == study.seeds[0]:  # the page's pictures: the first seed's samples
            save_samples(root, size, arm, images)
    write_result(path, settings, result)
    return "evaluated"
