"""Sample metrics computed from what the data renderer knows, per image or per video.

Images (:func:`image_metrics`), for each sample of class ``c``:

- ``correct``: the classifier reads class ``c`` in the largest object (no object: wrong);
- ``objects``: how many objects (components of at least ``min_area`` pixels);
- ``size``: the largest object's linear size relative to class ``c``'s median at the training
  resolution, ``sqrt(area / median area)``: 1 = the trained pixel size, 2 = twice as wide;
- ``color``: distance of its median colour to the nearest palette colour ([0, 1] per channel);
- ``empty``: 1 when no object is found (a blank sample), else 0: an empty sample's ``objects`` is 0
  and a fragmented one's more than 1, so their mean count can look like "about 1" while this cannot;
- ``aspect``: ``log2(width / height)`` of the largest object's bounding box: about 0 for the data's
  shapes, +1 for one stretched twice as wide (a 2:1 sample drawn with square positions).

:func:`per_class_accuracy` splits ``correct`` by the conditioning class.

Videos (:func:`video_metrics`) add, over the frames: ``presence`` (share of frames with an object;
``empty`` is then the share without one),
``speed`` and ``jerk`` of the largest object's centroid (pixels per frame, and per frame squared:
the data moves at constant velocity between bounces), and ``repetition``: the mean foreground IoU
of frame ``t`` with frame ``t - N`` minus that with frame ``t - ceil(N / 2)``, for ``N`` the period
RIFLEx targets (a clip that comes back to where it was ``N`` frames before scores high; a still one
or one that moves on scores about 0 or below). A metric a sample does not define (the size of an
object never drawn) is NaN, left out of the means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ...training.data import CLASSES, MovingShapes, Shapes
from .classifier import ShapeClassifier, classify, object_crops
from .objects import Object, find_objects, foreground, palette_error

__all__ = [
    "IMAGE_METRICS", "VIDEO_METRICS", "Reference", "image_metrics", "per_class_accuracy", "reference", "video_metrics",
]  # fmt: skip

IMAGE_METRICS = ("correct", "objects", "size", "color", "empty", "aspect")
VIDEO_METRICS = ("presence", "correct", "objects", "size", "color", "empty", "aspect", "speed", "jerk", "repetition")


@dataclass(frozen=True)
class Reference:
    """What the training data looks like at its resolution: each class's median object area (pixels)."""

    resolution: int
    areas: tuple[float, ...]  # per class
    min_area: int  # smaller components are specks: a tenth of the smallest class median

    def to_dict(self) -> dict:
        return {"resolution": self.resolution, "areas": list(self.areas), "min_area": self.min_area}


def reference(resolution: int, n: int = 256, moving: bool = False) -> Reference:
    """Median object area per class of ``n`` renders at ``resolution`` (held-out seed; ``moving``: rotated)."""
    data = MovingShapes(seed=40_000) if moving else Shapes(seed=40_000)
    images, labels = data.batch(range(n), resolution)
    images = images[:, 0] if moving else images  # first frames
    found, _ = find_objects(images)
    areas = torch.tensor([float(f[0].area) if f else math.nan for f in found])
    medians = tuple(float(areas[labels == c].nanmedian()) for c in range(len(CLASSES)))
    return Reference(resolution, medians, max(1, int(min(medians) / 10)))


def _largest_stats(objects: list[Object], predicted: torch.Tensor, label: int, ref: Reference) -> dict:
    """The metrics of one picture from its objects (largest first) and their predicted classes."""
    if not objects:
        return {"correct": 0.0, "objects": 0.0, "size": math.nan, "color": math.nan, "empty": 1.0, "aspect": math.nan}
    largest = objects[0]
    y0, y1, x0, x1 = largest.box
    return {
        "correct": float(int(predicted[0]) == label),
        "objects": float(len(objects)),
        "size": math.sqrt(largest.area / ref.areas[label]),
        "color": palette_error(largest.color),
        "empty": 0.0,
        "aspect": math.log2((x1 - x0) / (y1 - y0)),
    }


def per_class_accuracy(correct, labels) -> np.ndarray:
    """``[classes]``: the mean of ``correct [..., B]`` over the samples of each conditioning class (``labels [B]``;
    NaN for a class without samples)."""
    correct, labels = np.asarray(correct, dtype=np.float64), np.asarray(labels)
    if correct.shape[-1] != labels.shape[-1]:
        raise ValueError(f"correct [..., B] and labels [B] must agree on B, got {correct.shape} and {labels.shape}")
    out = np.full(len(CLASSES), math.nan)
    for c in range(len(CLASSES)):
        if (labels == c).any():
            out[c] = float(np.nanmean(correct[..., labels == c]))
    return out


def _per_picture(images: torch.Tensor, classifier: ShapeClassifier, ref: Reference):
    """Objects of each picture and the classifier's answer for each object (largest first)."""
    x, found = object_crops(images, ref.min_area)
    predicted = classify(classifier, x)
    split = predicted.split([len(f) for f in found])
    return found, split


@torch.no_grad()
def image_metrics(images: torch.Tensor, labels: torch.Tensor, classifier, ref: Reference) -> dict[str, np.ndarray]:
    """``{metric: [B]}`` of samples ``[B, 3, H, W]`` in [-1, 1] drawn for ``labels [B]``."""
    found, predicted = _per_picture(images, classifier, ref)
    rows = [_largest_stats(f, p, int(y), ref) for f, p, y in zip(found, predicted, labels)]
    return {m: np.array([r[m] for r in rows]) for m in IMAGE_METRICS}


def _nanmean(values) -> float:
    """Mean of the defined values (NaN when there are none), without numpy's empty-slice warning."""
    defined = [v for v in values if not math.isnan(v)]
    return float(np.mean(defined)) if defined else math.nan


def _iou(a: torch.Tensor, b: torch.Tensor) -> float:
    union = (a | b).sum()
    return math.nan if union == 0 else float((a & b).sum() / union)


def repetition(masks: torch.Tensor, lag: int) -> float:
    """``mean IoU(t, t - lag) - mean IoU(t, t - ceil(lag / 2))`` of foreground masks ``[T, H, W]`` (NaN if T <= lag)."""
    T, half = masks.shape[0], math.ceil(lag / 2)
    if T <= lag:
        return math.nan
    far = _nanmean([_iou(masks[t], masks[t - lag]) for t in range(lag, T)])
    near = _nanmean([_iou(masks[t], masks[t - half]) for t in range(half, T)])
    return far - near


def _motion(centers: list[tuple[float, float] | None]) -> tuple[float, float]:
    """Mean speed over consecutive frames with an object, and mean |second difference| over such triples."""
    c = [None if p is None else np.array(p) for p in centers]
    steps = [np.linalg.norm(b - a) for a, b in zip(c, c[1:]) if a is not None and b is not None]
    jerks = [np.linalg.norm(a - 2 * b + d) for a, b, d in zip(c, c[1:], c[2:]) if all(v is not None for v in (a, b, d))]
    return _nanmean(steps), _nanmean(jerks)


@torch.no_grad()
def video_metrics(
    videos: torch.Tensor, labels: torch.Tensor, classifier, ref: Reference, lag: int
) -> dict[str, np.ndarray]:
    """``{metric: [B]}`` of videos ``[B, 3, T, H, W]`` in [-1, 1] drawn for ``labels [B]``; ``lag``: RIFLEx's period."""
    B, _, T = videos.shape[:3]
    frames = videos.transpose(1, 2).flatten(0, 1)  # [B * T, 3, H, W], video-major
    found, predicted = _per_picture(frames, classifier, ref)
    masks = foreground(frames).view(B, T, *frames.shape[-2:])
    out = {m: [] for m in VIDEO_METRICS}
    for b in range(B):
        y = int(labels[b])
        per_frame = [_largest_stats(found[b * T + t], predicted[b * T + t], y, ref) for t in range(T)]
        present = [r["objects"] > 0 for r in per_frame]
        out["presence"].append(float(np.mean(present)))
        out["empty"].append(1.0 - out["presence"][-1])
        for m in ("correct", "size", "color", "aspect"):  # over the frames that show an object
            values = [r[m] for r, p in zip(per_frame, present) if p]
            out[m].append(_nanmean(values))
        out["objects"].append(float(np.mean([r["objects"] for r in per_frame])))
        centers = [found[b * T + t][0].center if present[t] else None for t in range(T)]
        speed, jerk = _motion(centers)
        out["speed"].append(speed)
        out["jerk"].append(jerk)
        out["repetition"].append(repetition(masks[b], lag))
    return {m: np.array(v) for m, v in out.items()}
