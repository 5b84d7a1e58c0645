"""Draw docs/img/conventions/<family>.png (which rotary planes listen to which axis, for every convention)
and rewrite the conventions table of docs/conventions.md from the registry.

    python -m scripts.convention_pictures

One panel per convention (its registry ``example``, a small instance): rows are the axes (per-head
conventions: one block of rows per head), columns the planes of a head; a cell is coloured by
``log10 |F|`` where the plane reads that axis and left blank where it does not, so an axial plane
is one coloured cell in its column, a mixed plane several, an unrotated plane none.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from axial_rope import conventions  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
OUT = DOCS / "img" / "conventions"
BEGIN, END = "<!-- conventions-table", "<!-- /conventions-table -->"
AXIS_NAMES = {1: ["pos"], 2: ["y", "x"], 3: ["t", "y", "x"]}


def _matrix(rope) -> tuple[np.ndarray, list[str]]:
    """``log10 |F|`` as rows (head, axis) x planes, NaN where zero; and the row labels."""
    freqs = rope.freqs if rope.learned_freqs is None else rope.learned_freqs.detach().double()
    freqs = freqs[None] if freqs.ndim == 2 else freqs  # [H, A, n]
    values = freqs.abs().numpy()
    with np.errstate(divide="ignore"):
        logs = np.where(values > 0, np.log10(np.where(values > 0, values, 1.0)), np.nan)
    names = AXIS_NAMES.get(freqs.shape[1], [str(a) for a in range(freqs.shape[1])])
    labels = [f"h{h} {n}" if freqs.shape[0] > 1 else n for h in range(freqs.shape[0]) for n in names]
    return logs.reshape(-1, logs.shape[-1]), labels


def draw(family: str, members: list) -> Path:
    fig, axes = plt.subplots(len(members), 1, figsize=(7.5, 0.9 + 0.55 * sum(len(_matrix(c.example())[1]) for c in members)),
                             squeeze=False)  # fmt: skip
    for ax, convention in zip(axes[:, 0], members):
        rope = convention.example()
        logs, labels = _matrix(rope)
        image = ax.imshow(logs, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xticks(range(logs.shape[1]), [str(j) for j in range(logs.shape[1])], fontsize=6)
        ax.set_title(f"{convention.name} ({rope.pairing} pairing): plane -> axis, colour log10|F|", fontsize=8)
        ax.set_facecolor("#eeeeee")  # blank cells: the plane does not read this axis
        fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01)
    axes[-1, 0].set_xlabel("plane of a head", fontsize=8)
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{family}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def update_table() -> None:
    """Replace the generated table (between its markers) in docs/conventions.md with ``conventions.table()``."""
    page = DOCS / "conventions.md"
    text = page.read_text()
    start = text.index("\n", text.index(BEGIN)) + 1
    end = text.index(END)
    page.write_text(text[:start] + conventions.table() + text[end:])


def main() -> None:
    update_table()
    families = defaultdict(list)
    for convention in conventions.REGISTRY.values():
        families[convention.family].append(convention)
    for family, members in families.items():
        print(draw(family, members))


if __name__ == "__main__":
    main()
