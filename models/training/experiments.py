"""Extrapolation experiments behind ``python -m scripts.experiments NAME``.

Each experiment trains its model once (the default run of :data:`~models.training.config.RUN_DEFAULTS`,
the one ``python -m scripts.train --model MODEL`` trains), then evaluates it, training-free,
beyond what it was trained on:

- ``resolution``: an image DiT trained at one resolution, denoising loss on held-out
  images at 1x, 1.5x and 2x with each position mode of ``ar.positions_for_size``, plus sample grids;
- ``length``: the byte-level language model trained at one context, held-out loss at
  1x-8x that context with each scaling, on the same windows, plus a plot;
- ``frames``: a video DiT trained on N frames, evaluated at 2N without and with RIFLEx.

Results go to ``OUT/NAME.md`` (a table and pictures) and ``OUT/NAME.json``. Reuse rule
(:func:`trained_run`): a run folder's model is reused only when the folder's whole saved
configuration (``config.json``) equals the requested one, the fields that do not change
the weights aside (``WEIGHT_NEUTRAL``); a folder holding any other run is an error.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

import axial_rope as ar

from ..flow import flow_loss
from . import checkpoint
from .config import RUN_DEFAULTS, TrainConfig, config_differences
from .pictures import save_gif, save_grid
from .tasks import step_generator
from .trainer import load_trained, train

# the run (a model of RUN_DEFAULTS) and the evaluation sizes of each experiment; --smoke shrinks both
SETUP = {
    "resolution": {"model": "dit", "n": 256},
    "length": {"model": "gpt", "n": 16, "lengths": (256, 512, 1024, 2048)},
    "frames": {"model": "video_dit", "n": 64},
}

# length: the table's methods in order; those with a positions_for_size mode use it (positions
# and per-axis frequency scaling by s = L / L_train), the others are built from s explicitly
LENGTH_MODES = {"none": "none", "Linear": "interpolate", "NTK": "ntk", "YaRN": "yarn"}
LENGTH_METHODS = {
    "DynamicNTK": lambda s, base: ar.scaling.DynamicNTK(2.0, base),  # grows with the length seen
    "Llama3": lambda s, base: ar.scaling.Llama3(s, base),
}
LENGTH_ORDER = ("none", "Linear", "NTK", "DynamicNTK", "YaRN", "Llama3")


def run_for(name: str, smoke: bool = False, run_dir: str | Path | None = None) -> TrainConfig:
    """The training run of experiment ``name``: its model's default run; ``--smoke``: 2 steps into ``OUT_smoke``."""
    cfg = replace(RUN_DEFAULTS[SETUP[name]["model"]], progress=not smoke, report=not smoke)
    if smoke:
        cfg = replace(cfg, steps=2, batch_size=4, out=cfg.out + "_smoke")
    return cfg if run_dir is None else replace(cfg, out=str(run_dir))


def trained_run(cfg: TrainConfig):
    """``(task, model)`` of the run ``cfg``, trained into ``cfg.out`` unless that folder holds it already.

    The folder's run is reused when its ``config.json`` equals ``cfg`` in every field but the
    ``WEIGHT_NEUTRAL`` ones (a run of those settings stopped early, e.g. by Ctrl-C, is resumed
    to ``cfg.steps``). A folder with a checkpoint of any other settings raises
    :class:`~models.training.checkpoint.CheckpointError` naming the differences: it is never
    overwritten; remove it or train elsewhere (``--run-dir`` of ``scripts.experiments``).
    """
    out = Path(cfg.out)
    if not (out / "checkpoint.safetensors").is_file():
        # no checkpoint, no weights to lose: what a run killed before its first save left is replaced
        train(replace(cfg, overwrite=True))
        return load_trained(out)
    hint = f"remove {out} or pass another --run-dir"
    if not (out / "config.json").is_file():
        raise checkpoint.CheckpointError(f"{out} holds a checkpoint without config.json (settings unknown): {hint}")
    diff = config_differences(json.loads((out / "config.json").read_text()), cfg)
    if diff:
        detail = ", ".join(f"{k}: saved {a!r} vs wanted {b!r}" for k, (a, b) in diff.items())
        raise checkpoint.CheckpointError(f"{out} holds another run ({detail}): {hint}")
    if checkpoint.metadata(out)["step"] < cfg.steps:
        train(replace(cfg, resume=True))
    return load_trained(out)


def _machine() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _write(out: Path, name: str, title: str, command: str, table: list[str], notes: list[str], data: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    lines = [f"# {title}", "", f"`{command}` on {_machine()}, {time.strftime('%Y-%m-%d')}.", "", *table, "", *notes]
    path = out / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def resolution(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """Image DiT trained at R, evaluated at R, 1.5R and 2R with every position mode."""
    task, model = trained_run(run_for("resolution", smoke, run_dir))
    n = 8 if smoke else SETUP["resolution"]["n"]
    modes = ar.POSITION_MODES
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


def _at_length(model, base: int, length: int, method: str):
    """The language model and its forward arguments at context ``length`` under ``method``, training-free."""
    if method in LENGTH_MODES:
        sized = ar.positions_for_size((length,), (base,), LENGTH_MODES[method])
        scaling = sized.scaling[0]
        kwargs = {"input_pos": sized.pos[:, 0].to(next(model.parameters()).device)}  # [L] positions
    else:
        scaling, kwargs = (LENGTH_METHODS[method](length / base, base) if length > base else None), {}
    if scaling == model.config.scaling:
        return model, kwargs
    scaled = type(model)(replace(model.config, scaling=scaling))
    scaled.load_state_dict(model.state_dict())  # rope buffers are not state: only the scaling differs
    return scaled.to(next(model.parameters()).device).eval(), kwargs


def length(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """Language model trained at context L, held-out loss up to 8L with each scaling, training-free."""
    task, model = trained_run(run_for("length", smoke, run_dir))
    base = task.context
    lengths = (base, 2 * base) if smoke else SETUP["length"]["lengths"]
    n = 2 if smoke else SETUP["length"]["n"]
    results: dict[str, dict[int, float]] = {}
    for name in LENGTH_ORDER:
        results[name] = {}
        for L in lengths:
            scaled, kwargs = _at_length(model, base, L, name)
            results[name][L] = task.val_loss(scaled, n=n, context=L, **kwargs)[L]
    table = ["| method | " + " | ".join(str(L) for L in lengths) + " |", "|---|" + "---|" * len(lengths)]
    table += [f"| {m} | " + " | ".join(f"{results[m][L]:.3f}" for L in lengths) + " |" for m in LENGTH_ORDER]
    plot = _plot_length(results, out / "img" / "length.png", base)
    notes = [
        f"Held-out loss in nats/byte on the same {n} windows of the standard library's held-out files, for the"
        f" byte-level model trained at context {base}; every method is applied training-free, with factor"
        f" L / {base} (DynamicNTK: factor 2, growing with the length seen). Linear is position"
        f" interpolation (positions times {base} / L).",
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


def frames(out: Path, smoke: bool = False, run_dir: str | Path | None = None) -> Path:
    """Video DiT trained on N frames, evaluated at N and 2N frames without and with RIFLEx."""
    task, model = trained_run(run_for("frames", smoke, run_dir))
    n = 4 if smoke else SETUP["frames"]["n"]
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
