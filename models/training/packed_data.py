"""Images of mixed sizes and aspect ratios for native-resolution (packed) training: sizes, rendering, a step's pick.

:class:`MixedSizes` draws each image's height and width (a pure function of the seed and
the index, as :mod:`~models.training.data` draws everything else); :func:`render_image`
rasterises one :class:`~models.training.data.Shapes` sample on an ``H x W`` canvas (the
shape sized by the short side, so it fits any aspect); :func:`pick` fills one step's token
budget from candidates in drawing order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .data import Shapes, _shape_distance, uniform

__all__ = ["MixedSizes", "pick", "render_image", "render_images"]


@dataclass(frozen=True)
class MixedSizes:
    """Sides in ``[min_px, max_px]``, multiples of ``multiple`` (the patch), long / short side at most ``max_aspect``."""

    min_px: int = 16
    max_px: int = 48
    max_aspect: float = 3.0
    multiple: int = 4
    seed: int = 0

    def __post_init__(self):
        if self.min_px % self.multiple or self.max_px % self.multiple or not 0 < self.min_px <= self.max_px:
            raise ValueError(f"sides [{self.min_px}, {self.max_px}] must be positive multiples of {self.multiple}")
        if self.max_aspect < 1:
            raise ValueError(f"max_aspect must be >= 1, got {self.max_aspect}")

    @property
    def sides(self) -> list[int]:
        return list(range(self.min_px, self.max_px + 1, self.multiple))

    def sizes(self, indices) -> list[tuple[int, int]]:
        """``(H, W)`` of samples ``indices``: the height uniform over the sides, the width over those within the aspect."""
        u = uniform(self.seed ^ 0x5A5A, torch.as_tensor(list(indices)), 2).tolist()
        sides, out = self.sides, []
        for a, b in u:
            h = sides[int(a * len(sides))]
            widths = [w for w in sides if max(h, w) <= self.max_aspect * min(h, w)]
            out.append((h, widths[int(b * len(widths))]))
        return out


def render_image(params: dict[str, torch.Tensor], i: int, height: int, width: int) -> torch.Tensor:
    """Sample ``i`` of ``Shapes.params`` on an ``H x W`` canvas: ``[3, H, W]`` in [-1, 1].

    The half size is ``size * min(H, W)`` pixels and the centre keeps the shape inside, as
    :func:`~models.training.data.render` does on a square (which this equals when ``H == W``).
    """
    short = min(height, width)
    size = params["size"][i] * short  # half size in pixels
    span = (1 - 2 * params["size"][i]).clamp_min(1e-6)
    frac = (params["center"][i, 0] - params["size"][i]) / span  # where in the free range, [0, 1]
    cy = size + (height - 2 * size) * frac[0]
    cx = size + (width - 2 * size) * frac[1]
    y = torch.arange(height, dtype=torch.float32)[:, None] + 0.5
    x = torch.arange(width, dtype=torch.float32)[None, :] + 0.5
    angle = params["angle"][i, 0]
    cos, sin = angle.cos(), angle.sin()
    u = (cos * (x - cx) + sin * (y - cy)) / size  # the shape's frame, in half sizes
    v = (cos * (y - cy) - sin * (x - cx)) / size
    distance = _shape_distance(params["label"][i : i + 1], u[None], v[None])[0] * size  # pixels
    coverage = (0.5 - distance).clamp(0, 1)
    background = -0.8
    color = params["color"][i][:, None, None] * 2 - 1
    return background + coverage[None] * (color - background)


def render_images(
    data: Shapes, indices: list[int], sizes: list[tuple[int, int]]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Images ``[3, H_i, W_i]`` of samples ``indices`` at ``sizes``, and their labels ``[N]``."""
    params = data.params(indices)
    images = [render_image(params, i, h, w) for i, (h, w) in enumerate(sizes)]
    return images, params["label"]


def pick(
    sizes: MixedSizes, first: int, pool: int, budget: int, patch: int
) -> tuple[list[int], list[tuple[int, int]], float]:
    """One step's images: candidates ``first, first + 1, ...`` taken in order while they fit ``budget`` tokens.

    First fit in drawing order, not decreasing: sorting by size (``greedy_pack``) would fill each
    step with the largest candidates and skew the size distribution trained on. Returns the
    indices, their sizes and the budget's unused fraction (the padding a fixed-length row would hold).
    """
    smallest = (sizes.min_px // patch) ** 2
    indices, chosen, load = [], [], 0
    for j, (h, w) in zip(range(first, first + pool), sizes.sizes(range(first, first + pool))):
        n = (h // patch) * (w // patch)
        if load + n <= budget:
            indices.append(j)
            chosen.append((h, w))
            load += n
        if budget - load < smallest:
            break
    return indices, chosen, 1 - load / budget
