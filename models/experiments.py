"""Extrapolation experiments behind ``python -m scripts.experiments NAME``.

Each experiment trains its model once (or reuses the run folder's checkpoint), then
evaluates it, training-free, beyond what it was trained on:

- ``resolution``: an image DiT trained at one resolution, denoising loss on held-out
  images at 1x, 1.5x and 2x with each position scaling, plus sample grids;
- ``length``: the byte-level language model trained at one context, held-out loss at
  1x-8x that context with each frequency scaling, on the same windows, plus a plot;
- ``frames``: a video DiT trained on N frames, evaluated at 2N without and with RIFLEx.

Results go to ``OUT/NAME.md`` (a table and pictures) and ``OUT/NAME.json``.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

import axial_rope as ar

from .flow import flow_loss
from .pictures import save_gif, save_grid
from .tasks import step_generator
from .train import TrainConfig, load_trained, train

# (training steps, evaluation sizes) per experiment; --smoke shrinks both
FULL = {
    "resolution": {"train": TrainConfig(out="runs/dit"), "n": 256},  # the default run of scripts.train
    "length": {
        "train": TrainConfig(
            model="gpt", steps=200, batch_size=32, lr=2e-3, schedule="cosine", ema=0.0, out="runs/gpt"
        ),
        "n": 16,
        "lengths": (256, 512, 1024, 2048),
    },
    "frames": {
        "train": TrainConfig(
            model="video_dit", steps=600, batch_size=16, resolution=16, frames=8, out="runs/video_dit"
        ),
        "n": 64,
    },
}


def _trained(cfg: TrainConfig, smoke: bool):
    cfg = replace(cfg, progress=not smoke, report=not smoke)
    if smoke:
        cfg = replace(cfg, steps=2, batch_size=4, out=str(Path(cfg.out).with_name(Path(cfg.out).name + "_smoke")))
    path = Path(cfg.out) / "checkpoint.safetensors"
    if not path.is_file() or json.loads((Path(cfg.out) / "config.json").read_text())["steps"] != cfg.steps:
        train(cfg)
    return load_trained(cfg.out)


def _machine() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _write(out: Path, name: str, title: str, command: str, table: list[str], notes: list[str], data: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    lines = [f"# {title}", "", f"`{command}` on {_machine()}, {time.strftime('%Y-%m-%d')}.", "", *table, "", *notes]
    path = out / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def resolution(out: Path, smoke: bool = False) -> Path:
    """Image DiT trained at R, evaluated at R, 1.5R and 2R with every position mode."""
    task, model = _trained(FULL["resolution"]["train"], smoke)
    n = 8 if smoke else FULL["resolution"]["n"]
    modes = ("none", "interpolate", "ntk", "yarn", "normalize")
    sizes = [task.resolution * f // 2 for f in (2, 3, 4)]
    results = {}
    for size in sizes:
        for mode in modes:
            results[f"{size}/{mode}"] = task.val_loss(model, n=n, resolution=size, pos_mode=mode)
    table = [
        "| resolution | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for size in sizes:
        mean = [sum(results[f"{size}/{m}"].values()) / len(results[f"{size}/{m}"]) for m in modes]
        high = [results[f"{size}/{m}"][0.9] for m in modes]
        table.append(f"| {size} px (mean over t) | " + " | ".join(f"{v:.4f}" for v in mean) + " |")
        table.append(f"| {size} px (t = 0.9) | " + " | ".join(f"{v:.4f}" for v in high) + " |")
    pictures = []
    img = out / "img"
    for mode in modes:
        images = task.sample(model, per_class=4, resolution=sizes[-1], steps=2 if smoke else 40, pos_mode=mode)
        path = save_grid(images, img / f"resolution_{mode}.png", nrow=4)
        pictures += [f"**{mode}** at {sizes[-1]} px:", "", f"![{mode}](img/{path.name})", ""]
    notes = [
        f"Held-out denoising loss (rectified flow, {n} images, t = 0.1 ... 0.9; lower is better) of the"
        f" DiT (width {task.config.hidden_size}, depth {task.config.depth}, patch {task.config.patch_size})"
        f" trained at {task.resolution} px. Absolute losses across resolutions"
        " mislead (a larger image is easier to denoise at low t); compare modes within a row.",
        "",
        *pictures,
    ]
    return _write(
        out, "resolution", "Resolution extrapolation", "python -m scripts.experiments resolution", table, notes, results
    )


def length(out: Path, smoke: bool = False) -> Path:
    """Language model trained at context L, held-out loss up to 8L with each scaling, training-free."""
    task, model = _trained(FULL["length"]["train"], smoke)
    base = task.context
    lengths = (base, 2 * base) if smoke else FULL["length"]["lengths"]
    n = 2 if smoke else FULL["length"]["n"]
    methods = {
        "none": lambda s: None,
        "Linear": lambda s: ar.scaling.Linear(s),
        "NTK": lambda s: ar.scaling.NTK(s),
        "DynamicNTK": lambda s: ar.scaling.DynamicNTK(2.0, base),
        "YaRN": lambda s: ar.scaling.YaRN(s, base),
        "Llama3": lambda s: ar.scaling.Llama3(s, base),
    }
    results: dict[str, dict[int, float]] = {}
    for name, make in methods.items():
        results[name] = {}
        for L in lengths:
            scaled = type(model)(replace(model.config, scaling=make(L / base) if L > base else None))
            scaled.load_state_dict(model.state_dict())  # rope buffers are not state: only the scaling differs
            results[name][L] = task.val_loss(scaled.eval(), n=n, context=L)[L]
    table = ["| method | " + " | ".join(str(L) for L in lengths) + " |", "|---|" + "---|" * len(lengths)]
    table += [f"| {m} | " + " | ".join(f"{results[m][L]:.3f}" for L in lengths) + " |" for m in methods]
    plot = _plot_length(results, out / "img" / "length.png", base)
    notes = [
        f"Held-out loss in nats/byte on the same {n} windows of the standard library's held-out files, for the"
        f" byte-level model trained at context {base}; every method is applied training-free, with factor"
        f" L / {base} (DynamicNTK: factor 2, growing with the length seen).",
        "",
        f"![length]({plot.relative_to(out).as_posix()})",
    ]
    return _write(
        out,
        "length",
        "Length extrapolation",
        "python -m scripts.experiments length",
        table,
        notes,
        {m: {str(k): v for k, v in r.items()} for m, r in results.items()},
    )


def _plot_length(results: dict, path: Path, base: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for name, by_length in results.items():
        ax.plot(list(by_length), list(by_length.values()), "o-", label=name)
    ax.axvline(base, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (bytes)")
    ax.set_ylabel("held-out loss (nats/byte)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def frames(out: Path, smoke: bool = False) -> Path:
    """Video DiT trained on N frames, evaluated at N and 2N frames without and with RIFLEx."""
    task, model = _trained(FULL["frames"]["train"], smoke)
    n = 4 if smoke else FULL["frames"]["n"]
    N = task.frames
    d_t = model.rope.axes_dim[0]
    k = ar.scaling.RIFLEx.intrinsic_k(d_t, model.config.theta, N)
    results = {}
    for T in (N, 2 * N):
        x0, y = task.val_inputs(n, task.resolution, frames=T)
        noise = torch.randn(x0.shape, generator=step_generator(task.seed, 0, f"frames{T}"))
        for name, scaling in (("none", None), ("RIFLEx", ar.scaling.RIFLEx(k, T))):
            losses = {}
            for t in (0.1, 0.3, 0.5, 0.7, 0.9):
                tt = torch.full((n,), t)
                with torch.no_grad():
                    losses[t] = float(flow_loss(model, x0, tt, noise, y=y, temporal_scaling=scaling))
            results[f"{T}/{name}"] = losses
    table = ["| frames | method | mean over t | t = 0.9 |", "|---|---|---|---|"]
    for key, losses in results.items():
        T, name = key.split("/")
        table.append(f"| {T} | {name} | {sum(losses.values()) / len(losses):.4f} | {losses[0.9]:.4f} |")
    pictures = []
    for name, scaling in (("none", None), ("RIFLEx", ar.scaling.RIFLEx(k, 2 * N))):
        videos = task.sample(model, per_class=1, frames=2 * N, steps=2 if smoke else 30, temporal_scaling=scaling)
        path = save_gif(videos, out / "img" / f"frames_{name}.gif")
        pictures += [f"**{name}** at {2 * N} frames:", "", f"![{name}](img/{path.name})", ""]
    notes = [
        f"Held-out denoising loss ({n} clips of moving shapes) of the video DiT trained on {N} frames; RIFLEx"
        f" sets the temporal pair k = {k} (period closest to {N}) to 0.9 * 2 pi / T.",
        "",
        *pictures,
    ]
    return _write(
        out,
        "frames",
        "Frame-count extrapolation",
        "python -m scripts.experiments frames",
        table,
        notes,
        {k_: {str(t): v for t, v in r.items()} for k_, r in results.items()},
    )


EXPERIMENTS = {"resolution": resolution, "length": length, "frames": frames}
