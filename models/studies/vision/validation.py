"""Validating the sample metrics on renders whose answer is known: clean, stretched 2:1, fragmented, blurred, empty.

A metric is only as good as what it sees. Issue 24 found the shape classifier calling every
2:1-stretched shape a triangle and fragments mostly crosses, and an empty sample averaging with a
fragmented one to "about 1 object". This table measures each failure on renders of the procedural
data (:class:`~models.training.data.Shapes`, a held-out seed), changed in one known way each:

- ``clean``: the renders as the models were trained on them;
- ``stretched 2:1``: each render resized to twice its width (bilinear), what a model that keeps its
  square position grid draws at a 1:2 size;
- ``fragmented``: background lines 2 px wide every 8 px cut each shape into pieces;
- ``blurred``: a 5 x 5 box blur (soft edges, as undertrained samples have);
- ``empty``: the flat background alone (plus the small noise every sample carries).

Per condition: class accuracy of the largest object, the empty rate, the mean object count, the
mean aspect of the largest object (``log2(width / height)``) and the class the classifier answers
most often, with its share.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...training.data import CLASSES, Shapes
from .metrics import Reference, image_metrics
from .objects import BACKGROUND

__all__ = ["CONDITIONS", "render_condition", "validation_markdown", "validation_section", "validation_table"]

CONDITIONS = ("clean", "stretched 2:1", "fragmented", "blurred", "empty")
SEED = 50_000  # renders of a seed no model or classifier trains on
NOISE = 0.05  # the noise the classifier is trained with: samples are never exactly flat


def render_condition(condition: str, n: int, resolution: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``images [n, 3, H, W]`` in [-1, 1] of ``condition`` and their classes ``[n]`` (``H = resolution``)."""
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, got {condition!r}")
    images, labels = Shapes(seed=SEED).batch(range(n), resolution)
    if condition == "stretched 2:1":
        images = F.interpolate(images, size=(resolution, 2 * resolution), mode="bilinear", align_corners=False)
    elif condition == "fragmented":
        grid = torch.arange(resolution) % 8 < 2  # [H]: 2 of every 8 rows and columns
        cut = grid[:, None] | grid[None, :]  # [H, W]
        images = torch.where(cut, torch.full_like(images, BACKGROUND), images)
    elif condition == "blurred":
        images = F.avg_pool2d(images, 5, stride=1, padding=2, count_include_pad=False)
    elif condition == "empty":
        images = torch.full_like(images, BACKGROUND)
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(SEED)) * NOISE
    return (images + noise).clamp(-1, 1), labels


def validation_table(classifier, ref: Reference, n: int = 128, resolution: int | None = None) -> dict[str, dict]:
    """``{condition: {accuracy, empty, objects, aspect, answer, answer_share}}`` on ``n`` renders each."""
    resolution = ref.resolution if resolution is None else resolution
    table = {}
    for condition in CONDITIONS:
        images, labels = render_condition(condition, n, resolution)
        m = image_metrics(images, labels, classifier, ref)
        found = m["empty"] == 0
        answers = _answers(images, classifier, ref) if found.any() else np.zeros(0, dtype=int)
        counts = np.bincount(answers, minlength=len(CLASSES))
        top = int(counts.argmax())
        table[condition] = {
            "accuracy": float(m["correct"].mean()),
            "empty": float(m["empty"].mean()),
            "objects": float(m["objects"].mean()),
            "aspect": float(np.nanmean(m["aspect"])) if found.any() else math.nan,
            "answer": CLASSES[top] if len(answers) else "-",
            "answer_share": float(counts[top] / len(answers)) if len(answers) else math.nan,
            "samples": n,
        }
    return table


def _answers(images: torch.Tensor, classifier, ref: Reference) -> np.ndarray:
    """The classifier's answer for the largest object of each image that has one."""
    from .classifier import classify, object_crops

    x, found = object_crops(images, ref.min_area)
    predicted = classify(classifier, x).split([len(f) for f in found])
    return np.array([int(p[0]) for p, f in zip(predicted, found) if f], dtype=int)


def validation_markdown(table: dict[str, dict]) -> str:
    """The page's "Validating the metrics" table."""
    lines = [
        "| render | class accuracy | empty rate | objects (mean) | aspect log2(w/h) | most common answer |",
        "|---|---|---|---|---|---|",
    ]
    for condition, row in table.items():
        aspect = "-" if math.isnan(row["aspect"]) else f"{row['aspect']:+.2f}"
        answer = "-" if row["answer"] == "-" else f"{row['answer']} ({row['answer_share']:.2f})"
        lines.append(
            f"| {condition} | {row['accuracy']:.2f} | {row['empty']:.2f} | {row['objects']:.2f} | {aspect} | {answer} |"
        )
    return "\n".join(lines) + "\n"


def validation_section(record: dict) -> str:
    """The page's "Validating the metrics" section from ``metric_validation.json`` (``scripts.validate_metrics``)."""
    n, resolution = record["table"]["clean"]["samples"], record["resolution"]
    return "\n".join(
        [
            "## Validating the metrics",
            "",
            f"The shape classifier and object finder on {n} held-out renders per row at {resolution} px, each changed in one"
            " known way (`models/studies/vision/validation.py`; `python -m scripts.validate_metrics`, "
            f"{record['wall_seconds']} s, torch {record['torch']}; data in `metric_validation.json`). Class accuracy is"
            " the largest object's class (an empty render counts as wrong); aspect is `log2(width / height)` of the"
            " largest object's box (0: as drawn, +1: twice as wide).",
            "",
            validation_markdown(record["table"]).rstrip("\n"),
            "",
            "What it means for the tables above: the classifier answers *triangle* for every 2:1-stretched shape and"
            " *square* for most fragmented ones, so class accuracy cannot tell a stretched or broken sample from a wrong"
            " class; the aspect column and the object count and empty rate separate those cases (an empty sample has"
            " 0 objects and empty rate 1, a fragmented one several objects); the tables above report them per arm.",
            "",
        ]
    )
