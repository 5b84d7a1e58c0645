"""The grid study's cells: one arm of one seed's model at one size, and the checks of its metrics.

A cell (:func:`evaluate`) measures, with the resolution study's inputs and sampler (the same held-out
scenes, labels and initial noise for every arm and seed; :mod:`.resolution`), the per-image loss on grown
scenes and on the canvas, and on samples the resolution study's metrics (:mod:`.metrics`) plus the
class-agnostic ``shape_error`` and ``canvas_error`` (:mod:`.quality`). It is saved to
``eval/s<seed>_<size>_<arm>.json`` with the settings and checkpoint hashes it was computed from, and
skipped when that file matches. :func:`validate` checks the classifier at every evaluated size (the
resolution study's check) and the quality score on changed renders at every evaluated size.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from ...training.trainer import load_trained
from ..jobs import checkpoint_hash, read_result, write_result
from . import classifier as shape_classifier
from . import resolution as one_size
from .grid import FINETUNED, GridStudy, arm_kwargs, settings, size_name, train_config
from .metrics import image_metrics, reference
from .quality import canvas_error, quality_table, shape_error

__all__ = ["cell_path", "evaluate", "samples_path", "validate"]

QUALITY_METRICS = ("shape_error", "canvas_error")
METRICS_VERSION = 1  # in every cell's settings: a change to the metrics' code recomputes the cells


@lru_cache(maxsize=4)
def _reference(resolution: int):
    return reference(resolution)  # 256 renders: once per process, not per cell


def cell_path(root: Path, seed: int, size, arm: str) -> Path:
    return root / "eval" / f"s{seed}_{size_name(size)}_{_file_name(arm)}.json"


def samples_path(root: Path, size, arm: str) -> Path:
    """The first seed's samples of a cell (uint8 ``[N, 3, H, W]``), for the page's pictures."""
    return root / "samples" / f"{size_name(size)}_{_file_name(arm)}.pt"


def _file_name(arm: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "_" for c in arm)


def _run_dir(study: GridStudy, root: Path, seed: int, arm: str) -> str:
    if arm.startswith("fine-tuned"):
        return train_config(study, root, seed, arm.removeprefix(FINETUNED.format(""))).out
    return train_config(study, root, seed).out


def _chunked(fn, *tensors, chunk: int) -> torch.Tensor:
    """``fn`` over ``chunk`` rows of ``tensors`` at a time, concatenated (the memory of 4096-token attention)."""
    return torch.cat([fn(*parts) for parts in zip(*(t.split(chunk) for t in tensors))])


def evaluate(study: GridStudy, root: Path, seed: int, size, arm: str) -> str:
    """One cell: losses and sample metrics of ``arm`` with the model of ``seed`` at ``size``, saved to its file."""
    run_dir = _run_dir(study, root, seed, arm)
    cell = {
        "study": settings(study),
        "size": list(size),
        "arm": arm,
        "checkpoint": checkpoint_hash(run_dir),
        "metrics": METRICS_VERSION,
    }
    path = cell_path(root, seed, size, arm)
    if read_result(path, cell) is not None:
        return "reused"
    model = load_trained(run_dir)[1]
    classifier = shape_classifier.load_or_train(root / "classifier.pt", study.classifier)
    kw = arm_kwargs(study, arm, size)
    result = {}
    for name, (x0, y, noise) in one_size.held_out_sets(study, size).items():
        loss = _chunked(lambda a, b, c: one_size.per_image_loss(model, a, b, c, study.ts, **kw), x0, y, noise,
                        chunk=study.chunk(size))  # fmt: skip
        result[f"loss_{name}"] = loss.tolist()
    labels, noise = one_size.sample_inputs(study, size)
    with torch.no_grad():
        images = _chunked(
            lambda y, z: one_size.sample(model, y, z, study, **kw), labels, noise, chunk=study.chunk(size)
        )
    metrics = image_metrics(images, labels, classifier, _reference(study.resolution))
    result |= {m: v.tolist() for m, v in metrics.items()}
    result |= {"shape_error": shape_error(images).tolist(), "canvas_error": canvas_error(images).tolist()}
    if seed == study.seeds[0]:
        target = samples_path(root, size, arm)
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(((images + 1) * 127.5).round().to(torch.uint8), target)
    write_result(path, cell, result)
    return "evaluated"


def validate(study: GridStudy, root: Path) -> str:
    """The classifier through the whole pipeline at every evaluated size (``classifier_check.json``, the resolution
    study's check) and ``shape_error`` on clean and changed renders at every size (``quality_check.json``)."""
    done = [one_size.validate(study, root)]
    wanted = {"sizes": [list(s) for s in study.sizes], "renders": 16 if study.quick else 64}
    path = root / "quality_check.json"
    if read_result(path, wanted) is None:
        write_result(path, wanted, quality_table(study.sizes, n=wanted["renders"], draws=study.draws))
        done.append("validated")
    return "validated" if "validated" in done else "reused"
