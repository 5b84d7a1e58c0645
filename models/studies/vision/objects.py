"""Objects in a picture, found the way the renderer draws them: saturated colours on a flat background.

A pixel belongs to an object when one of its channels lies more than :data:`FOREGROUND` from the
renderer's background value (-0.8, ``models/training/data.py``); objects are the 4-connected
components of those pixels with at least ``min_area`` pixels (smaller ones are sampling specks).
For each object: its area, centroid, bounding box and median colour, and a crop of it alone
(other objects masked to the background), scaled to a fixed square for the classifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...training.data import PALETTE

__all__ = ["BACKGROUND", "FOREGROUND", "CROP", "Object", "components", "crops", "find_objects", "palette_error"]

BACKGROUND = -0.8  # data.render's background, every channel
# a palette colour lies >= 1.4 from the background in its brightest channel ([-1, 1] units); half of
# that keeps anti-aliased edges out and every palette colour in, whatever the colour
FOREGROUND = 0.7
CROP = 32  # side of the classifier's input


@dataclass(frozen=True)
class Object:
    """One connected object of image ``image``: component ``label`` of :func:`components`' map."""

    image: int
    label: int
    area: int  # pixels
    center: tuple[float, float]  # (y, x) pixels, the centroid
    box: tuple[int, int, int, int]  # (y0, y1, x0, x1), inclusive-exclusive
    color: tuple[float, float, float]  # median RGB in [-1, 1]


def foreground(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` in [-1, 1] -> ``[B, H, W]`` bool: pixels of an object."""
    return (images - BACKGROUND).abs().amax(1) > FOREGROUND


def _spread_along_runs(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every pixel of a run of ``mask`` along the last axis gets the run's largest label: ``[N, L]`` each."""
    N, L = mask.shape
    begins = mask & ~F.pad(mask, (1, 0))[:, :-1]  # a run starts where the pixel before it is off
    run = torch.cumsum(begins.long(), 1) + torch.arange(N)[:, None] * (L + 1)  # a global id per run
    run = torch.where(mask, run, N * (L + 1))  # off pixels: one spare slot
    best = torch.zeros(N * (L + 1) + 1).scatter_reduce(0, run.flatten(), labels.flatten(), "amax")
    return best[run] * mask


def components(mask: torch.Tensor, max_iterations: int = 10_000) -> torch.Tensor:
    """4-connected components of ``mask [B, H, W]`` (bool) -> int64 labels ``[B, H, W]``, 0 = background.

    Label propagation by runs: every pixel starts with its own index; each round gives every
    horizontal run of the mask its largest label, then every vertical run, until nothing changes
    (rounds: about the number of turns of the longest path inside a component, a few for these
    shapes). Labels are then renumbered ``1 .. n`` per image.
    """
    B, H, W = mask.shape
    labels = torch.arange(1, H * W + 1, dtype=torch.float32).view(1, H, W) * mask  # exact below 2**24
    for _ in range(max_iterations):
        rows = _spread_along_runs(labels.reshape(B * H, W), mask.reshape(B * H, W)).view(B, H, W)
        t_labels, t_mask = rows.transpose(1, 2).reshape(B * W, H), mask.transpose(1, 2).reshape(B * W, H)
        spread = _spread_along_runs(t_labels, t_mask).view(B, W, H).transpose(1, 2)
        if torch.equal(spread, labels):
            break
        labels = spread
    out = torch.zeros(B, H, W, dtype=torch.int64)
    for b in range(B):
        values = labels[b].long().contiguous()
        found = torch.unique(values[values > 0])  # sorted
        out[b] = torch.where(values > 0, torch.searchsorted(found, values) + 1, 0)
    return out


def find_objects(images: torch.Tensor, min_area: int = 1) -> tuple[list[list[Object]], torch.Tensor]:
    """The objects of each image (largest first) and the component map ``[B, H, W]`` they index.

    Args:
        images: ``[B, 3, H, W]`` in [-1, 1].
        min_area: components with fewer pixels are left out (specks).
    """
    images = images.float()
    labels = components(foreground(images))
    B, _, H, W = images.shape
    ys = torch.arange(H, dtype=torch.float32)[:, None].expand(H, W)
    xs = torch.arange(W, dtype=torch.float32)[None, :].expand(H, W)
    found = []
    for b in range(B):
        objects = []
        for label in range(1, int(labels[b].max()) + 1):
            inside = labels[b] == label  # [H, W]
            area = int(inside.sum())
            if area < min_area:
                continue
            y, x = ys[inside], xs[inside]
            color = images[b][:, inside].median(dim=1).values  # [3]
            box = (int(y.min()), int(y.max()) + 1, int(x.min()), int(x.max()) + 1)
            center = (float(y.mean()) + 0.5, float(x.mean()) + 0.5)  # pixel centres at i + 0.5, as data.render
            objects.append(Object(b, label, area, center, box, tuple(float(c) for c in color)))
        found.append(sorted(objects, key=lambda o: -o.area))
    return found, labels


def crops(images: torch.Tensor, labels: torch.Tensor, objects: list[Object], size: int = CROP) -> torch.Tensor:
    """``[N, 3, size, size]``: each object alone (other pixels set to the background), its bounding box
    padded to a square of 1.3 times its longer side and scaled to ``size`` (bilinear)."""
    if not objects:
        return torch.zeros(0, 3, size, size)
    H, W = images.shape[-2:]
    index = torch.tensor([o.image for o in objects])
    alone = (labels[index] == torch.tensor([o.label for o in objects])[:, None, None])[:, None]  # [N, 1, H, W]
    shifted = (images[index].float() - BACKGROUND) * alone  # background 0: zero padding is background
    theta = torch.zeros(len(objects), 2, 3)
    for i, o in enumerate(objects):
        y0, y1, x0, x1 = o.box
        side = 1.3 * max(y1 - y0, x1 - x0) + 2  # pixels
        cy, cx = (y0 + y1) / 2, (x0 + x1) / 2
        # output [-1, 1] -> input normalised coordinates (align_corners=False: pixel i at (2i + 1) / W - 1)
        theta[i, 0] = torch.tensor([side / W, 0.0, 2 * cx / W - 1])
        theta[i, 1] = torch.tensor([0.0, side / H, 2 * cy / H - 1])
    grid = F.affine_grid(theta, [len(objects), 3, size, size], align_corners=False)
    return F.grid_sample(shifted, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + BACKGROUND


def palette_error(color: tuple[float, float, float]) -> float:
    """Distance from an RGB colour in [-1, 1] to the nearest palette colour, in [0, 1] units per channel."""
    palette = PALETTE * 2 - 1  # [6, 3] in [-1, 1]
    return float((palette - torch.tensor(color)).norm(dim=1).min()) / 2
