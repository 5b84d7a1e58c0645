"""Training data generated on the machine: procedural shapes, moving shapes, stdlib bytes.

Nothing is downloaded. Every sample is a pure function of ``(seed, index)``, so a
dataset is deterministic, indexable and resumable at any position.

- :class:`Shapes`: class-labelled images of one filled shape (circle, square,
  triangle, cross) in a random colour, size and position, upright, rendered
  anti-aliased at any resolution from the same continuous description.
- :class:`MovingShapes`: the same objects bouncing off the borders and rotating,
  for any number of frames.
- :class:`StdlibText`: the Python standard library's source as bytes, split into a
  training and a held-out set by a hash of each file's path.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

CLASSES = ("circle", "square", "triangle", "cross")
# saturated colours on a dark background, so shape and colour are separable
PALETTE = torch.tensor(
    [[0.95, 0.25, 0.2], [0.2, 0.8, 0.3], [0.25, 0.45, 0.95], [0.95, 0.8, 0.2], [0.8, 0.3, 0.9], [0.2, 0.85, 0.9]]
)


_MASK = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (lowbias32) on int64 tensors holding values in [0, 2**32)."""
    # products may wrap past int64, but their low 32 bits, all that the mask keeps, are exact
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK
    return x ^ (x >> 16)


def uniform(seed: int, indices: torch.Tensor, n_fields: int) -> torch.Tensor:
    """Counter-based random numbers: ``[len(indices), n_fields]`` in [0, 1), a pure function of
    ``(seed, index, field)``, computed for a whole batch at once (no per-sample generator)."""
    key = _hash32(_hash32(torch.tensor(seed & _MASK)) ^ (indices.long() & _MASK))  # [B]
    fields = torch.arange(n_fields) * 0x9E3779B9 & _MASK  # [F] golden-ratio strides
    return (_hash32((key[:, None] + fields) & _MASK) >> 8).float() / 2**24  # 24 bits: exact, always < 1


def _shape_distance(label: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Signed distance (< 0 inside) of each class's unit shape at local coordinates u, v.

    label ``[B]``; u, v ``[B, ..., R, R]`` in units of the shape's half size.
    """
    circle = torch.sqrt(u**2 + v**2) - 1.0
    square = torch.maximum(u.abs(), v.abs()) - 0.85
    # equilateral triangle, circumradius 1.2, apex at v = -1: the largest of its three edge distances
    triangle = torch.maximum(v, math.sqrt(3.0) / 2 * u.abs() - v / 2) - 0.6
    # a plus sign with arms 0.9 wide (thicker than a patch at the default sizes)
    arm = 0.45
    cross = torch.minimum(torch.maximum(u.abs() - arm, v.abs() - 1.0), torch.maximum(u.abs() - 1.0, v.abs() - arm))
    shapes = torch.stack([circle, square, triangle, cross])  # [4, B, ..., R, R]
    index = label.view(1, -1, *([1] * (u.ndim - 1))).expand(1, *u.shape)
    return shapes.gather(0, index)[0]


def render(params: dict[str, torch.Tensor], resolution: int) -> torch.Tensor:
    """Rasterise shapes described in continuous coordinates.

    Args:
        params: ``label [B]``, ``color [B, 3]``, and per frame ``center [B, T, 2]`` (y, x
            in [0, 1]), ``size [B]`` (half size, fraction of the image), ``angle [B, T]``.
        resolution: pixels per side.

    Returns:
        float32 ``[B, T, 3, R, R]`` in [-1, 1].
    """
    c = (torch.arange(resolution, dtype=torch.float32) + 0.5) / resolution  # pixel centres in [0, 1]
    y, x = c[:, None], c[None, :]  # [R, 1], [1, R]
    center, angle = params["center"], params["angle"]
    dy = y - center[..., 0, None, None]  # [B, T, R, R] after broadcasting
    dx = x - center[..., 1, None, None]
    cos, sin = angle.cos()[..., None, None], angle.sin()[..., None, None]
    size = params["size"][:, None, None, None]
    u = (cos * dx + sin * dy) / size  # rotate into the shape's frame, in half sizes
    v = (cos * dy - sin * dx) / size
    distance = _shape_distance(params["label"], u, v) * size * resolution  # in pixels
    coverage = (0.5 - distance).clamp(0, 1)  # one-pixel anti-aliasing ramp
    background = -0.8
    color = params["color"][:, None, :, None, None] * 2 - 1  # [B, 1, 3, 1, 1]
    return background + coverage[:, :, None] * (color - background)


@dataclass(frozen=True)
class Shapes:
    """Class-labelled images of one shape each; ``batch(indices, resolution)``."""

    seed: int = 0
    # half size as a fraction of the image: 7-10 px at 32 px, so a cross's arms and notches are about
    # a patch (4 px) or more (from 0.18, crosses came out as blobs after the default run)
    min_size: float = 0.22
    max_size: float = 0.32
    # initial angle uniform in [0, angle_range) radians. Upright by default: a DiT of a few minutes on
    # CPU learns upright classes far sooner (tiny DiT, 32k images: recognisable triangles and squares
    # upright, round blobs rotated)
    angle_range: float = 0.0

    def params(self, indices: int | list[int] | range, frames: int = 1) -> dict[str, torch.Tensor]:
        """The continuous description of samples ``indices`` over ``frames`` frames (see :func:`render`)."""
        indices = torch.as_tensor([indices] if isinstance(indices, int) else list(indices))
        u = uniform(self.seed, indices, 10).unbind(-1)  # one column per random quantity
        label = (u[0] * len(CLASSES)).long()
        color = PALETTE[(u[1] * len(PALETTE)).long()]
        size = self.min_size + (self.max_size - self.min_size) * u[2]
        center = size[:, None] + (1 - 2 * size[:, None]) * torch.stack([u[3], u[4]], -1)  # fully inside
        angle = self.angle_range * u[5]
        velocity = (torch.stack([u[6], u[7]], -1) - 0.5) * 0.12  # image fractions per frame
        spin = (u[8] - 0.5) * 0.4  # radians per frame
        t = torch.arange(frames, dtype=torch.float32)
        center = _bounce(center[:, None] + velocity[:, None] * t[None, :, None], size)
        angle = angle[:, None] + spin[:, None] * t[None]
        return {"label": label, "color": color, "size": size, "center": center, "angle": angle}

    def batch(self, indices: list[int] | range, resolution: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``[B, 3, R, R]`` in [-1, 1] and labels ``[B]`` (int64)."""
        images, labels = self._render(indices, resolution, frames=1)
        return images[:, 0], labels

    def _render(self, indices, resolution, frames):
        params = self.params(indices, frames)
        return render(params, resolution), params["label"]


def _bounce(center: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    # reflect positions into [size, 1 - size] (a triangle wave): objects bounce off the borders
    low, span = size[:, None, None], (1 - 2 * size)[:, None, None]
    phase = torch.remainder(center - low, 2 * span)
    return low + torch.where(phase > span, 2 * span - phase, phase)


@dataclass(frozen=True)
class MovingShapes(Shapes):
    """The shapes of :class:`Shapes`, bouncing and rotating over ``frames`` frames, starting at any angle."""

    angle_range: float = 2 * math.pi

    def batch(self, indices, resolution: int = 32, frames: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """Videos ``[B, T, 3, R, R]`` in [-1, 1] and labels ``[B]``."""
        return self._render(indices, resolution, frames)


class StdlibText:
    """Bytes of the Python standard library's ``.py`` files, train or held-out split.

    A file is held out when the first byte of the SHA-1 of its relative path is below
    ``256 * held_out``: a split fixed by the file names, independent of order and machine.
    """

    def __init__(self, split: str = "train", held_out: float = 0.03, root: str | Path | None = None):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        root = Path(root or sysconfig.get_paths()["stdlib"])
        skip = {"site-packages", "test", "tests", "idlelib"}  # library code only: no test suites, no third party
        files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
        if not files:
            raise FileNotFoundError(f"no .py files under {root}: cannot build the text corpus")
        chunks = []
        for path in files:
            name = path.relative_to(root).as_posix()
            is_val = hashlib.sha1(name.encode()).digest()[0] < 256 * held_out
            if is_val == (split == "val"):
                chunks.append(path.read_bytes() + b"\n")
        self.split, self.files = split, len(chunks)
        self.data = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)  # [N] bytes

    def __len__(self) -> int:
        return self.data.numel()

    def windows(self, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-byte targets ``[B, length]`` (int64) starting at ``starts``."""
        offsets = starts[:, None] + torch.arange(length + 1)
        tokens = self.data[offsets].long()
        return tokens[:, :-1], tokens[:, 1:]

    def batch(self, step: int, batch_size: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch of windows, a pure function of ``(seed, step)``."""
        u = uniform(seed, torch.arange(step * batch_size, (step + 1) * batch_size), 1)[:, 0].double()
        starts = (u * (len(self) - length - 1)).long()
        return self.windows(starts, length)
