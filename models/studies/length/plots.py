"""The study's pictures: loss per length with intervals, per-position curves, the retrieval heat map."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .evaluate import BIN
from .summary import Results

__all__ = ["PANELS", "plot_curves", "plot_lengths", "plot_retrieval"]

# the two panels of the line plots: the position schemes, and RoPE's scaling methods and their references
PANELS = {
    "position schemes": ("RoPE", "NoPE", "Sinusoidal", "Learned", "T5 bias", "ALiBi", "Linear attention + RoPE"),
    "RoPE scaling": (
        "RoPE",
        "PI",
        "NTK",
        "YaRN",
        "Llama 3",
        "Dual Chunk",
        "Window {c}",
        "YaRN fine-tuned x{f}",
        "RoPE fine-tuned x{f}",
    ),
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panel_arms(results: Results, panel: str) -> list[str]:
    s = results.study
    names = [n.format(c=s.context, f=s.finetune_factor) for n in PANELS[panel]]
    return [n for n in names if n in results.arms] + [n for n in results.arms if results.arms[n].family == "bound"]


def plot_lengths(results: Results, path: Path) -> Path:
    """Mean held-out loss per length with its 95% interval, one panel per group of arms."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=110, sharey=True)
    for ax, panel in zip(axes, PANELS):
        for name in panel_arms(results, panel):
            pts = [(L, results.loss(name, L)) for L in results.study.lengths]
            pts = [(L, i) for L, i in pts if i is not None]
            xs = [L for L, _ in pts]
            mean = np.array([i.mean for _, i in pts])
            err = np.array([[i.mean - i.low for _, i in pts], [i.high - i.mean for _, i in pts]])
            ax.errorbar(xs, mean, yerr=err, marker="o", ms=3, capsize=2, label=name)
        ax.axvline(results.study.context, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(panel)
        ax.set_xlabel("context (bytes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("held-out loss (nats/byte), 95% interval")
    return _save(fig, path, plt)


def plot_curves(results: Results, path: Path) -> Path:
    """Loss per position (64-byte bins, mean over windows and seeds) across the longest windows."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=110, sharey=True)
    for ax, panel in zip(axes, PANELS):
        for name in panel_arms(results, panel):
            curve = results.curve(name)
            ax.plot((np.arange(len(curve)) + 0.5) * BIN, curve, lw=1.2, label=name)
        ax.axvline(results.study.context, color="gray", lw=0.8, ls="--")
        ax.set_title(panel)
        ax.set_xlabel("position in the window (bytes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"loss per {BIN}-byte bin (nats/byte)")
    return _save(fig, path, plt)


def plot_retrieval(results: Results, path: Path) -> Path:
    """Pass rate per arm (rows) and (length, depth) (columns), mean over seeds and trials."""
    plt = _pyplot()
    s = results.study
    names = [n for n, a in results.arms.items() if a.retrieval]
    grid = np.full((len(names), len(s.lengths) * len(s.depths)), np.nan)
    for r, name in enumerate(names):
        for j, L in enumerate(s.lengths):
            rates = results.depth_rates(name, L)
            if rates is not None:
                grid[r, j * len(s.depths) : (j + 1) * len(s.depths)] = rates
    fig, ax = plt.subplots(figsize=(1.2 + 0.32 * grid.shape[1], 0.8 + 0.3 * len(names)), dpi=110)
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ticks = [f"{L}\n{d:g}" if i == 0 else f"{d:g}" for L in s.lengths for i, d in enumerate(s.depths)]
    ax.set_xticks(range(grid.shape[1]), ticks, fontsize=6)
    for j in range(1, len(s.lengths)):
        ax.axvline(j * len(s.depths) - 0.5, color="white", lw=1.5)
    ax.set_xlabel("length (bytes) and depth of the key (0: start, 1: end)")
    fig.colorbar(image, ax=ax, label="pass rate")
    return _save(fig, path, plt)


def _save(fig, path: Path, plt) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
