"""Picture grids with a label per row: samples per arm (PNG), videos per arm (GIF) and frame strips (PNG).

Every cell is upscaled (nearest) to at least :data:`MIN_CELL` pixels, so a 32 px frame is readable.
Inputs are uint8 tensors (``[N, 3, H, W]`` images, ``[N, 3, T, H, W]`` videos) as the studies save them.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

__all__ = ["MIN_CELL", "frame_strips", "labelled_gif", "labelled_grid"]

MIN_CELL = 96  # pixels: the shortest side of a cell on the page
PAD = 4
LABEL = 120  # width of the label column


def _scale(height: int, width: int) -> int:
    return max(1, math.ceil(MIN_CELL / min(height, width)))


def _sheet(rows: list[tuple[str, list[torch.Tensor]]], scale: int):
    """One PIL image: a label column, then each row's cells (``[3, H, W]`` uint8, possibly of different sizes)."""
    from PIL import Image, ImageDraw

    heights = [max(c.shape[1] for c in cells) * scale for _, cells in rows]
    widths = [sum(c.shape[2] * scale + PAD for c in cells) for _, cells in rows]
    sheet = Image.new("RGB", (LABEL + max(widths) + PAD, sum(h + PAD for h in heights) + PAD), "white")
    draw = ImageDraw.Draw(sheet)
    y = PAD
    for (name, cells), h in zip(rows, heights):
        draw.text((6, y + h // 2 - 6), name, fill="black")
        x = LABEL
        for cell in cells:
            picture = Image.fromarray(cell.permute(1, 2, 0).numpy())
            picture = picture.resize((cell.shape[2] * scale, cell.shape[1] * scale), Image.NEAREST)
            sheet.paste(picture, (x, y))
            x += cell.shape[2] * scale + PAD
        y += h + PAD
    return sheet


def labelled_grid(rows: list[tuple[str, torch.Tensor]], path: Path) -> Path:
    """A PNG with one labelled row per ``(name, images [N, 3, H, W] uint8)``."""
    h, w = rows[0][1].shape[-2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    _sheet([(name, list(images)) for name, images in rows], _scale(h, w)).save(path)
    return path


def labelled_gif(rows: list[tuple[str, torch.Tensor]], path: Path, fps: int = 6) -> Path:
    """An animated GIF with one labelled row per ``(name, videos [N, 3, T, H, W] uint8)`` (equal ``T``)."""
    h, w = rows[0][1].shape[-2:]
    scale, frames = _scale(h, w), rows[0][1].shape[2]
    pictures = [_sheet([(name, list(videos[:, :, t])) for name, videos in rows], scale) for t in range(frames)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=int(1000 / fps), loop=0)
    return path


def frame_strips(rows: list[tuple[str, torch.Tensor]], path: Path) -> Path:
    """A PNG with one labelled row of frames per ``(name, video [3, T, H, W] uint8)``."""
    h, w = rows[0][1].shape[-2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    _sheet([(name, list(video.unbind(1))) for name, video in rows], _scale(h, w)).save(path)
    return path
