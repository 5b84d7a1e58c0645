"""Pictures people would rather look at than read: sample grids, GIFs, loss curves."""

from __future__ import annotations

from pathlib import Path

import torch

from .rundir import read_log

# the file types save_grid and save_gif write (by the name's extension; PIL's writers)
GRID_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")
ANIMATION_SUFFIXES = (".gif", ".png", ".apng", ".webp", ".tif", ".tiff")  # frames: animated formats only


def _to_uint8(images: torch.Tensor) -> torch.Tensor:
    # [-1, 1] float -> [0, 255] uint8
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def grid_image(images: torch.Tensor, nrow: int = 8, pad: int = 2) -> torch.Tensor:
    """``[N, 3, H, W]`` in [-1, 1] -> one uint8 image ``[H', W', 3]`` with ``nrow`` images per row."""
    n, c, h, w = images.shape
    rows = (n + nrow - 1) // nrow
    canvas = torch.full((c, rows * (h + pad) + pad, nrow * (w + pad) + pad), 255, dtype=torch.uint8)
    for i, img in enumerate(_to_uint8(images)):
        r, col = divmod(i, nrow)
        canvas[:, pad + r * (h + pad) : pad + r * (h + pad) + h, pad + col * (w + pad) : pad + col * (w + pad) + w] = (
            img
        )
    return canvas.permute(1, 2, 0)


def save_grid(images: torch.Tensor, path: str | Path, nrow: int = 8, upscale: int = 2) -> Path:
    """Write a PNG grid of ``[N, 3, H, W]`` images in [-1, 1]; small images are upscaled (nearest)."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    picture = Image.fromarray(grid_image(images, nrow).numpy())
    picture = picture.resize((picture.width * upscale, picture.height * upscale), Image.NEAREST)
    picture.save(path)
    return path


def save_gif(videos: torch.Tensor, path: str | Path, nrow: int = 4, fps: int = 6, upscale: int = 2) -> Path:
    """Write an animated GIF of ``[N, 3, T, H, W]`` videos in [-1, 1], tiled ``nrow`` per row."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = []
    for t in range(videos.shape[2]):
        frame = Image.fromarray(grid_image(videos[:, :, t], nrow).numpy())
        frames.append(frame.resize((frame.width * upscale, frame.height * upscale), Image.NEAREST))
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    return path


def plot_loss(log_path: str | Path, out_path: str | Path) -> Path:
    """A loss-curve PNG from a training JSONL log (training loss, and validation loss when logged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)  # a line cut off by a kill is skipped, not a crash
    train = [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r and "step" in r]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    if train:
        ax.plot(*zip(*train), label="train", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="validation", lw=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
