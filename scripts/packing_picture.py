"""The picture of one packed batch in docs/packing.md: ``python -m scripts.packing_picture [--out docs/img/packing.png]``.

Four items (an image, a captioned image, a text, a short video) packed by ``axial_rope.packing.pack``:
left, each item's tokens on its own grid, coloured by item; top right, the packed sequence with
each token's coordinates; bottom right, the block-diagonal mask that ``axial_rope.varlen`` applies
(a token attends to the tokens of its own item only).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from axial_rope.packing import Item, pack

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"]
NAMES = ["image 3 x 4", "caption (3) + image 2 x 3", "text (5)", "video 2 x 2 x 2"]


def batch():
    """The packed batch drawn: tokens are 1-wide placeholders, only positions and boundaries matter."""
    one = lambda *shape: torch.zeros(*shape, 1)
    items = [Item.grid(one(3, 4)), Item.grid(one(2, 3), prefix=one(3)), Item.text(one(5)), Item.grid(one(2, 2, 2))]
    return pack(items)


def _layouts() -> list[list[tuple[float, float, bool]]]:
    """Per item, each token's (row, column, is text) on the picture, in packing order."""
    image = [(r, c, False) for r in range(3) for c in range(4)]
    caption = [(0, c, True) for c in range(3)] + [(1 + r, c, False) for r in range(2) for c in range(3)]
    text = [(0, c, True) for c in range(5)]
    video = [(r, c + 3 * t, False) for t in range(2) for r in range(2) for c in range(2)]  # frames side by side
    return [image, caption, text, video]


def draw(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    p = batch()
    T, ids = p.segments.total, p.segment_ids
    fig = plt.figure(figsize=(10, 6.2), dpi=110)
    grid = fig.add_gridspec(3, 2, width_ratios=[1, 2.4], height_ratios=[0.5, 1, 1.6], hspace=0.45, wspace=0.15)
    # the packed sequence: one cell per token, its (t, y, x) written in it
    strip = fig.add_subplot(grid[0, 1])
    strip.imshow(ids[None].numpy(), cmap=ListedColormap(COLORS), aspect="auto", vmin=-0.5, vmax=3.5)
    for t in range(T):
        strip.text(t, 0, "\n".join(str(int(v)) for v in p.pos[t]), ha="center", va="center", fontsize=5, color="w")
    strip.set_yticks([])
    strip.set_xticks(list(p.segments.bounds[:-1]))
    strip.set_title(
        f"packed: tokens [T={T}, C], positions [T, 3] (t, y, x per cell), cu_seqlens {list(p.segments.bounds)}",
        fontsize=8,
    )
    # the mask: query row attends to key column where True
    mask = fig.add_subplot(grid[1:, 1])
    shown = torch.where(p.segments.dense_mask(), ids[:, None].float(), torch.tensor(float("nan")))
    mask.imshow(shown.numpy(), cmap=ListedColormap(COLORS), vmin=-0.5, vmax=3.5, interpolation="nearest")
    mask.set_title("attention mask (block diagonal): query row attends to key column", fontsize=8)
    mask.set_xlabel("key token")
    mask.set_ylabel("query token")
    # each item on its own grid: one square per token, numbered by its place in the packed sequence
    items = fig.add_subplot(grid[:, 0])
    items.set_xlim(-0.2, 9.5)
    items.set_ylim(-21.5, 1.2)
    items.set_aspect("equal")
    items.axis("off")
    for i, (name, color, cells) in enumerate(zip(NAMES, COLORS, _layouts())):
        top = -5.6 * i
        items.text(0, top + 0.3, f"item {i}: {name}", color=color, fontsize=8, fontweight="bold")
        for n, (row, col, text) in enumerate(cells):
            face = "white" if text else color
            items.add_patch(Rectangle((col, top - 1 - row), 0.9, 0.9, facecolor=face, edgecolor=color, lw=1.2))
            label = p.segments.bounds[i] + n
            items.text(col + 0.45, top - 0.55 - row, str(label), ha="center", va="center", fontsize=6,
                       color=color if text else "white")  # fmt: skip
    fig.suptitle("one packed batch: an image, a captioned image, a text and a video in one sequence", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img/packing.png")
    print(draw(Path(parser.parse_args(argv).out)))


if __name__ == "__main__":
    main()
