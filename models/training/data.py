"""Training data generated on the machine: procedural shapes, moving shapes, stdlib bytes.

Nothing is downloaded. Every sample is a pure function of ``(seed, index)``, so a
dataset is deterministic, indexable and resumable at any position.

- :class:`Shapes`: class-labelled images of one filled shape (circle, square,
  triangle, cross) in a random colour, size and position, upright, rendered
  anti-aliased at any resolution from the same continuous description.
- :class:`MovingShapes`: the same objects bouncing off the borders and rotating,
  for any number of frames (``max_speed`` and ``max_spin`` set how fast).
- :meth:`Shapes.grown`: the same scenes at any height and width (objects grow with the image);
  :class:`Canvas`: objects at their trained pixel size on a larger canvas, several per image
  (the two test sets of the resolution study, ``models/studies/vision``).
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
    # motion per frame (MovingShapes): velocity uniform in [-max_speed, max_speed] image fractions per
    # axis, spin in [-max_spin, max_spin] radians; the defaults bounce within ~13 frames and turn a square
    # by a quarter within ~8, so a clip can repeat on its own: slower motion for the frame study
    max_speed: float = 0.06
    max_spin: float = 0.2

    def params(self, indices: int | list[int] | range, frames: int = 1) -> dict[str, torch.Tensor]:
        """The continuous description of samples ``indices`` over ``frames`` frames (see :func:`render`)."""
        indices = torch.as_tensor([indices] if isinstance(indices, int) else list(indices))
        u = uniform(self.seed, indices, 10).unbind(-1)  # one column per random quantity
        label = (u[0] * len(CLASSES)).long()
        color = PALETTE[(u[1] * len(PALETTE)).long()]
        size = self.min_size + (self.max_size - self.min_size) * u[2]
        center = size[:, None] + (1 - 2 * size[:, None]) * torch.stack([u[3], u[4]], -1)  # fully inside
        angle = self.angle_range * u[5]
        velocity = (torch.stack([u[6], u[7]], -1) - 0.5) * (2 * self.max_speed)  # image fractions per frame
        spin = (u[8] - 0.5) * (2 * self.max_spin)  # radians per frame
        t = torch.arange(frames, dtype=torch.float32)
        center = _bounce(center[:, None] + velocity[:, None] * t[None, :, None], size)
        angle = angle[:, None] + spin[:, None] * t[None]
        return {"label": label, "color": color, "size": size, "center": center, "angle": angle}

    def batch(self, indices: list[int] | range, resolution: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``[B, 3, R, R]`` in [-1, 1] and labels ``[B]`` (int64)."""
        images, labels = self._render(indices, resolution, frames=1)
        return images[:, 0], labels

    def grown(self, indices: list[int] | range, size: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The scenes of :meth:`batch` at ``size`` (``R`` or ``(H, W)``): objects scale with the shorter side,
        centres keep their place in the free range of each axis. ``[B, 3, H, W]`` and labels ``[B]``; a square
        ``size`` gives :meth:`batch`'s images (to float rounding)."""
        height, width = (size, size) if isinstance(size, int) else size
        p = self.params(indices)
        size_px = p["size"] * min(height, width)  # [B] half size in pixels
        # the uniform draw behind each centre ([B, 2] in [0, 1]) placed in the free range of its axis
        free = (p["center"][:, 0] - p["size"][:, None]) / (1 - 2 * p["size"][:, None])
        extent = torch.tensor([height, width], dtype=torch.float32)
        center = size_px[:, None] + (extent - 2 * size_px[:, None]) * free  # [B, 2] pixels (y, x)
        objects = {"label": p["label"][:, None], "color": p["color"][:, None], "center": center[:, None],
                   "size": size_px[:, None], "angle": p["angle"][:, :1]}  # fmt: skip
        return render_objects(objects, height, width), p["label"]

    def _render(self, indices, resolution, frames):
        params = self.params(indices, frames)
        return render(params, resolution), params["label"]


def _bounce(center: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    # reflect positions into [size, 1 - size] (a triangle wave): objects bounce off the borders
    low, span = size[:, None, None], (1 - 2 * size)[:, None, None]
    phase = torch.remainder(center - low, 2 * span)
    return low + torch.where(phase > span, 2 * span - phase, phase)


def render_objects(objects: dict[str, torch.Tensor], height: int, width: int) -> torch.Tensor:
    """Rasterise ``K`` objects per image in pixel units onto an ``height x width`` canvas.

    Args:
        objects: ``label [B, K]``, ``color [B, K, 3]`` in [0, 1], ``center [B, K, 2]`` (y, x in pixels),
            ``size [B, K]`` (half size in pixels), ``angle [B, K]``, optionally ``present [B, K]`` (bool:
            objects beyond an image's count are left out).

    Returns:
        float32 ``[B, 3, H, W]`` in [-1, 1]: the objects composited over the background in order.
    """
    label, size = objects["label"], objects["size"]
    B, K = label.shape
    y = (torch.arange(height, dtype=torch.float32) + 0.5)[:, None]  # [H, 1] pixel centres
    x = (torch.arange(width, dtype=torch.float32) + 0.5)[None, :]  # [1, W]
    dy = y - objects["center"][..., 0, None, None]  # [B, K, H, W] after broadcasting
    dx = x - objects["center"][..., 1, None, None]
    angle = objects["angle"]
    cos, sin = angle.cos()[..., None, None], angle.sin()[..., None, None]
    half = size[..., None, None]
    u, v = (cos * dx + sin * dy) / half, (cos * dy - sin * dx) / half  # in half sizes, the shape's frame
    distance = _shape_distance(label.reshape(-1), u.flatten(0, 1), v.flatten(0, 1)).view(B, K, height, width)
    coverage = (0.5 - distance * half).clamp(0, 1)  # [B, K, H, W]: one-pixel anti-aliasing ramp
    if "present" in objects:
        coverage = coverage * objects["present"][..., None, None]
    background = -0.8
    image = torch.full((B, 3, height, width), background)
    for k in range(K):  # "over" compositing, object k on top of those before it
        color = objects["color"][:, k, :, None, None] * 2 - 1  # [B, 3, 1, 1]
        image = image + coverage[:, k, None] * (color - image)
    return image


@dataclass(frozen=True)
class Canvas:
    """Objects of :class:`Shapes` at their trained pixel size on a larger canvas: the test set of a model
    trained at ``train_resolution`` run at a larger size whose objects keep their size (they do not grow).

    The canvas is cut into cells of ``train_resolution`` pixels (``floor(H / R0) x floor(W / R0)``, at least
    one); an image holds 1 ... ``max_objects`` objects (no more than cells), one per distinct cell, all of
    the image's class (its label), each in its own colour and place, none overlapping. Sizes and angles
    are drawn as :class:`Shapes` draws them, in pixels of the training resolution.
    """

    seed: int = 0
    train_resolution: int = 32
    max_objects: int = 3
    min_size: float = Shapes.min_size
    max_size: float = Shapes.max_size
    angle_range: float = 0.0

    def batch(self, indices, size: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Images ``[B, 3, H, W]`` in [-1, 1], labels ``[B]`` and object counts ``[B]`` (int64)."""
        height, width = (size, size) if isinstance(size, int) else size
        r0, K = self.train_resolution, self.max_objects
        rows, cols = max(1, height // r0), max(1, width // r0)
        indices = torch.as_tensor(list(indices))
        u = uniform(self.seed, indices, 2 + 5 * K)  # [B, 2 + 5K]: label, count, then 5 per object
        label = (u[:, 0] * len(CLASSES)).long()
        count = 1 + (u[:, 1] * min(K, rows * cols)).long()  # [B] in 1 .. min(K, cells)
        per = u[:, 2:].view(-1, K, 5)  # [B, K, 5]: size, y, x, colour, angle
        cells = rows * cols
        order = uniform(self.seed + 0x63656C6C, indices, cells).argsort(-1)  # [B, cells]: a random order of cells
        cell = order[:, :K] if cells >= K else torch.cat([order, order[:, :1].expand(-1, K - cells)], -1)  # [B, K]
        size = r0 * (self.min_size + (self.max_size - self.min_size) * per[..., 0])  # [B, K] half size, px
        # cell height and width; a cell of the canvas' own size when it is smaller than the training size
        ch, cw = height / rows, width / cols
        edge = size + 2  # 2 px from the cell's border: objects of neighbouring cells never touch
        cy = (cell // cols).float() * ch + edge + (ch - 2 * edge).clamp(min=0) * per[..., 1]
        cx = (cell % cols).float() * cw + edge + (cw - 2 * edge).clamp(min=0) * per[..., 2]
        objects = {
            "label": label[:, None].expand(-1, K),
            "color": PALETTE[(per[..., 3] * len(PALETTE)).long()],
            "center": torch.stack([cy, cx], -1),
            "size": size,
            "angle": self.angle_range * per[..., 4],
            "present": torch.arange(K) < count[:, None],
        }
        return render_objects(objects, height, width), label, count


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
        chunks, self.names = [], []  # names: each chunk's file, relative to the standard library
        for path in files:
            name = path.relative_to(root).as_posix()
            is_val = hashlib.sha1(name.encode()).digest()[0] < 256 * held_out
            if is_val == (split == "val"):
                chunks.append(path.read_bytes() + b"\n")
                self.names.append(name)
        self.split, self.files = split, len(chunks)
        self.file_starts = torch.tensor([0] + [len(c) for c in chunks[:-1]]).cumsum(0)  # [files] first byte of each
        self.data = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)  # [N] bytes

    def __len__(self) -> int:
        return self.data.numel()

    def windows(self, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-byte targets ``[B, length]`` (int64) starting at ``starts``."""
        offsets = starts[:, None] + torch.arange(length + 1)
        tokens = self.data[offsets].long()
        return tokens[:, :-1], tokens[:, 1:]

    def source(self, starts: torch.Tensor) -> list[str]:
        """The file each window starting at ``starts [B]`` begins in (a window may run into the next)."""
        index = torch.searchsorted(self.file_starts, starts, right=True) - 1
        return [self.names[i] for i in index.tolist()]

    def batch(self, step: int, batch_size: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch of windows, a pure function of ``(seed, step)``."""
        u = uniform(seed, torch.arange(step * batch_size, (step + 1) * batch_size), 1)[:, 0].double()
        starts = (u * (len(self) - length - 1)).long()
        return self.windows(starts, length)


def step_generator(seed: int, step: int, stream: str) -> torch.Generator:
    """A generator for one step and purpose (``"noise"``, ``"val"``, ...), the same on every rank."""
    digest = hashlib.blake2b(f"{seed}:{step}:{stream}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def shard(n: int, rank: int, world: int) -> slice:
    """This rank's part of a global batch of ``n`` (the same data order at every world size)."""
    if n % world:
        raise ValueError(f"the global batch {n} must divide by the number of processes {world}")
    part = n // world
    return slice(rank * part, (rank + 1) * part)
