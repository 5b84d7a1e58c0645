"""A class-agnostic quality score for samples: how far a picture is from one clean render of the data.

``shape_error`` (0 = a clean render, 1 = nothing like one; lower is better): one minus the best soft IoU
between the picture's coverage and a clean render of a single shape (any of the four classes: the score
never reads the conditioning label) fitted to the picture's largest object. The fit places each class'
shape on the object's bounding box at three sizes (from the box's height, width and their geometric mean)
times 0.92, 1 and 1.08, rendered by the data's own renderer (:func:`~models.training.data.render_objects`).
Coverage is soft (``[0, 1]`` per pixel from the distance to the background colour, a dead zone for the
samples' small noise), so the score sees what the class accuracy and object count miss:

- a stretched object does not fit a shape of the data's aspect;
- tiled copies, fragments and stripes add coverage outside the fitted shape or remove it inside;
- a blurred object spreads coverage over its edges;
- an empty picture scores 1.

:func:`quality_table` validates it like the classifier (``validation.py``): it must rise from clean
renders to each changed one, at every evaluated size. ``canvas_error`` reads a picture as the canvas task
does (objects at the trained pixel size, several per picture): the mean over its objects of each one's own
fit, so a sample of clean tiled objects scores well there and badly on ``shape_error``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...training.data import PALETTE, Shapes, render_objects
from ..bootstrap import Bootstrap
from .objects import BACKGROUND, find_objects

__all__ = ["CORRUPTIONS", "canvas_error", "corrupt", "coverage", "quality_table", "shape_error"]

DEAD_ZONE = 0.15  # [-1, 1] units: the samples' background noise (the classifier trains with 0.05) is not coverage
FULL = 1.4  # a palette colour lies >= 1.4 from the background in its brightest channel (objects.FOREGROUND)
# per class (circle, square, triangle, cross): the half height and half width of the shape's box in half sizes,
# and its box centre's offset below the shape's centre (models/training/data.py _shape_distance: the triangle's
# apex at v = -1.2, base at v = 0.6)
EXTENTS = ((1.0, 1.0, 0.0), (0.85, 0.85, 0.0), (0.9, 1.8 / math.sqrt(3.0), -0.3), (1.0, 1.0, 0.0))
SCALES = (0.92, 1.0, 1.08)
CORRUPTIONS = ("clean", "stretched 2:1", "fragmented", "tiled 2x2", "striped", "blurred", "empty")


def coverage(images: torch.Tensor) -> torch.Tensor:
    """``[B, H, W]`` in [0, 1]: how much of each pixel an object covers, from ``images [B, 3, H, W]`` in [-1, 1]."""
    distance = (images.float() - BACKGROUND).abs().amax(1)
    return ((distance - DEAD_ZONE) / (FULL - DEAD_ZONE)).clamp(0, 1)


def _templates(box: tuple[int, int, int, int], height: int, width: int, origin=(0, 0)) -> torch.Tensor:
    """``[36, H, W]``: the coverage of each class' clean shape fitted to ``box`` (y0, y1, x0, x1) at 9 sizes, on a
    ``height x width`` window whose top left pixel is ``origin`` (y, x) of the picture."""
    y0, y1, x0, x1 = box
    cy, cx, bh, bw = (y0 + y1) / 2 - origin[0], (x0 + x1) / 2 - origin[1], y1 - y0, x1 - x0
    labels, centers, halves = [], [], []
    for label, (ey, ex, offset) in enumerate(EXTENTS):
        for half in (bh / (2 * ey), bw / (2 * ex), math.sqrt(bh * bw / (4 * ey * ex))):
            for scale in SCALES:
                labels.append(label)
                halves.append(half * scale)
                centers.append((cy - offset * half * scale, cx))
    n = len(labels)
    objects = {
        "label": torch.tensor(labels)[:, None],
        "color": PALETTE[:1].expand(n, 3)[:, None],
        "center": torch.tensor(centers, dtype=torch.float32)[:, None],
        "size": torch.tensor(halves, dtype=torch.float32)[:, None],
        "angle": torch.zeros(n, 1),
    }
    return coverage(render_objects(objects, height, width))


def _best_iou(cover: torch.Tensor, templates: torch.Tensor) -> float:
    """The largest soft IoU (``sum min / sum max``) of ``cover [H, W]`` with any of ``templates [K, H, W]``."""
    inter = torch.minimum(cover, templates).sum((1, 2))
    union = torch.maximum(cover, templates).sum((1, 2)).clamp(min=1e-6)
    return float((inter / union).max())


@torch.no_grad()
def shape_error(images: torch.Tensor, min_area: int = 6) -> np.ndarray:
    """``[B]``: one minus the best soft IoU of each picture with one clean shape fitted to its largest object."""
    found, _ = find_objects(images, min_area)
    cover = coverage(images)
    H, W = images.shape[-2:]
    return np.array([1.0 - _best_iou(c, _templates(f[0].box, H, W)) if f else 1.0 for c, f in zip(cover, found)])


@torch.no_grad()
def canvas_error(images: torch.Tensor, min_area: int = 6, margin: int = 3) -> np.ndarray:
    """``[B]``: the mean over each picture's objects of one minus the best soft IoU of the object alone (other
    objects removed, a window ``margin`` px around its box) with one clean shape; NaN for an empty picture."""
    found, labels = find_objects(images, min_area)
    cover = coverage(images)
    H, W = images.shape[-2:]
    out = []
    for b, objects in enumerate(found):
        errors = []
        for o in objects:
            y0, y1, x0, x1 = o.box
            top, left = max(0, y0 - margin), max(0, x0 - margin)
            bottom, right = min(H, y1 + margin), min(W, x1 + margin)
            others = (labels[b] > 0) & (labels[b] != o.label)
            alone = torch.where(others, 0.0, cover[b])[top:bottom, left:right]
            errors.append(1.0 - _best_iou(alone, _templates(o.box, bottom - top, right - left, (top, left))))
        out.append(float(np.mean(errors)) if errors else math.nan)
    return np.array(out)


def corrupt(condition: str, n: int, size: tuple[int, int], seed: int = 50_003) -> torch.Tensor:
    """``[n, 3, H, W]`` in [-1, 1]: held-out renders at ``size`` (objects grow with the image), changed in one known
    way (:data:`CORRUPTIONS`), plus the noise every sample carries (0.05)."""
    if condition not in CORRUPTIONS:
        raise ValueError(f"condition must be one of {CORRUPTIONS}, got {condition!r}")
    H, W = size
    data = Shapes(seed=seed)
    if condition == "stretched 2:1":  # the scene drawn at half the width, then stretched: objects twice as wide
        images = F.interpolate(data.grown(range(n), (H, W // 2))[0], size=(H, W), mode="bilinear", align_corners=False)
    elif condition == "tiled 2x2":  # four copies of the scene at half size
        images = data.grown(range(n), (H // 2, W // 2))[0].repeat(1, 1, 2, 2)
        images = F.pad(images, (0, W - images.shape[-1], 0, H - images.shape[-2]), value=BACKGROUND)
    else:
        images = data.grown(range(n), (H, W))[0]
    if condition == "fragmented":  # background lines 2 px wide every 8 px, both ways
        rows, cols = torch.arange(H) % 8 < 2, torch.arange(W) % 8 < 2
        images = torch.where(rows[:, None] | cols[None, :], torch.full_like(images, BACKGROUND), images)
    elif condition == "striped":  # a background row every 4 rows
        images = torch.where((torch.arange(H) % 4 == 0)[:, None], torch.full_like(images, BACKGROUND), images)
    elif condition == "blurred":  # a box blur of about a sixth of the object's side (5 px at 32 px)
        k = 2 * max(2, round(2 * min(H, W) / 32)) + 1
        images = F.avg_pool2d(images, k, stride=1, padding=k // 2, count_include_pad=False)
    elif condition == "empty":
        images = torch.full_like(images, BACKGROUND)
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed)) * 0.05
    return (images + noise).clamp(-1, 1)


def quality_table(sizes, n: int = 64, draws: int = 1000) -> dict[str, dict[str, list[float]]]:
    """``{size: {condition: [mean, low, high]}}`` of ``shape_error`` on ``n`` renders per condition and size
    (95% bootstrap over the renders): the score must rise from ``clean`` to every other condition."""
    boot = Bootstrap(1, n, draws=draws)
    table = {}
    for H, W in sizes:
        table[f"{H}x{W}"] = {c: list(boot.interval(shape_error(corrupt(c, n, (H, W)))[None])) for c in CORRUPTIONS}
    return table
