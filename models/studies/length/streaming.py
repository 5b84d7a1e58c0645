"""StreamingLLM's question at small scale: ``python -m scripts.experiments streaming`` (docs/experiments/streaming.md).

The length study's RoPE byte model (the same training run, ``ROOT/train/rope_s<seed>``, reused when the
length study has trained it) reads the study's held-out windows at up to 4x its training context, three ways:

- **full attention**: the plain causal forward, positions past the trained range (extrapolation);
- **rolling, sinks 0**: :meth:`models.gpt.GPT.stream_logits` with rolling caches of ``context`` tokens, one
  token a call: every token sees the latest ``context`` tokens, re-indexed to positions below ``context``
  (a sliding window; equal to the length study's "Window" arm, tests/test_rolling_cache.py);
- **rolling, sinks 4**: the same caches keeping the first 4 tokens as attention sinks (Xiao et al. 2024,
  "Efficient Streaming Language Models with Attention Sinks").

Every arm reads the same windows with the same models. An arm's loss has the bootstrap interval over
windows and seeds (:mod:`models.studies.bootstrap`); the three pairwise differences have seed-level
intervals (:mod:`models.studies.seed_intervals`: the seed bootstrap with windows clustered by the held-out
file they start in; a t interval over seeds where only per-seed means are known) and are Holm-corrected
together.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ...training.trainer import load_trained
from .. import paper_findings
from ..bootstrap import Bootstrap, Interval, verdict
from ..jobs import checkpoint_hash, ensure_trained
from ..papers import section_lines
from ..seed_intervals import CORRECTIONS, PairedTest, SeedBootstrap, correct, paired_t
from ..settings import settings_to
from . import report
from .design import FULL, QUICK, Study, run_dir, train_configs
from .evaluate import BIN, eval_windows, position_losses, variant, window_sources
from .plots import _pyplot, _save

__all__ = ["ARMS", "differences", "run"]

SINKS = 4
ARMS = {"full attention": None, "rolling, sinks 0": 0, f"rolling, sinks {SINKS}": SINKS}  # name -> sinks
PAIRS = [(f"rolling, sinks {SINKS}", "rolling, sinks 0"), ("rolling, sinks 0", "full attention")]
PAIRS += [(f"rolling, sinks {SINKS}", "full attention")]


def study_of(quick: bool) -> Study:
    """The length study's sizes, evaluated at 1x, 2x and 4x its context."""
    base = QUICK if quick else FULL
    return replace(base, lengths=tuple(base.context * k for k in (1, 2, 4)))


@torch.no_grad()
def _arm_losses(model, sinks: int | None, context: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[W, L]`` next-byte losses of one arm."""
    if sinks is None:
        return position_losses(model, x, y)
    out = []
    for i in range(0, len(x), 64):  # a token a call, 64 windows at once
        logits = model.stream_logits(x[i : i + 64], context, sinks=sinks)  # [b, L, V]
        out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), y[i : i + 64], reduction="none"))
    return torch.cat(out)


def evaluate_seed(study: Study, root: Path, seed: int) -> dict:
    """One seed's model (trained if needed) on every arm: ``{"settings", "seconds", "arms": {arm: [W, L] losses}}``,
    saved under ``ROOT/streaming`` and reused while the checkpoint and the windows are the same."""
    cfg, _ = train_configs(study, root)["rope", seed]
    print(f"train rope s{seed}: {ensure_trained(cfg)}", flush=True)
    run = run_dir(root, "rope", seed)
    settings = {"checkpoint": checkpoint_hash(run), "windows": study.windows, "lengths": list(study.lengths)}
    path = root / "streaming" / f"s{seed}.pt"
    if path.is_file() and (saved := torch.load(path, weights_only=False)).get("settings") == settings:
        return saved
    tic = time.perf_counter()
    _, model = load_trained(run / "checkpoint.safetensors")
    model = variant(model, {"max_seq_len": study.longest})  # RoPE needs no table entry per position
    x, y = eval_windows(study)
    arms = {}
    for name, sinks in ARMS.items():
        arms[name] = _arm_losses(model, sinks, study.context, x, y).numpy()
        print(f"evaluated {name} s{seed}: loss at {study.longest} {arms[name].mean():.3f}", flush=True)
    result = {"settings": settings, "seconds": time.perf_counter() - tic, "arms": arms}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(result, tmp)
    os.replace(tmp, path)  # whole or absent: an interrupted study resumes at the seed it stopped in
    return result


def _test(x: np.ndarray, y: np.ndarray, sources: list[str] | None, draws: int) -> PairedTest:
    """``x - y`` (``[seeds, windows]`` each): the seed bootstrap clustered by ``sources``; without sources (only
    per-seed means known) the t interval over seeds; with one seed the windows-only bootstrap (no p-value)."""
    S, W = x.shape
    if S < 2:
        d = Bootstrap(S, W, draws, seed=0).difference(x, y)
        return PairedTest(d, float("nan"), (d.mean,), 1, "bootstrap over windows (one seed)")
    if sources is None:
        return paired_t(x, y)
    return SeedBootstrap(S, W, clusters=sources, draws=draws, seed=0).difference(x, y)


def differences(cells: dict[str, np.ndarray], sources: list[str] | None, draws: int, alpha: float = 0.05) -> dict:
    """``{"a - b": test}`` for each of :data:`PAIRS` from ``cells {arm: [seeds, windows]}`` (the longest length):
    the test's dict, its Holm-adjusted p-value over the pairs, and the verdict at ``alpha`` after that correction."""
    tests = {f"{a} - {b}": _test(cells[a], cells[b], sources, draws) for a, b in PAIRS}
    defined = {k: t for k, t in tests.items() if not np.isnan(t.p_value)}
    adjusted = correct(defined, "holm") if defined else {}
    out = {}
    for k, t in tests.items():
        p = adjusted.get(k, float("nan"))
        shown = verdict(t.interval) if np.isnan(p) or p < alpha else "no difference shown"
        out[k] = t.to_dict() | {"holm_p": p, "verdict": shown}
    return out


def summarise(study: Study, raw: dict[int, dict[str, np.ndarray]], sources: list[str] | None = None) -> dict:
    """Loss per length and arm, paired differences at the longest length, per-bin curves: json-ready.
    ``sources``: ``[windows]`` the file each window starts in (the clusters of the differences)."""
    seeds = sorted(raw)
    draws = Bootstrap(len(seeds), study.windows, study.draws, seed=0)

    def at(arm: str, L: int) -> np.ndarray:  # [seeds, windows]
        return np.stack([raw[s][arm][:, :L].mean(1) for s in seeds])

    loss = {a: {L: list(draws.interval(at(a, L))) for L in study.lengths} for a in ARMS}
    diffs = differences({a: at(a, study.longest) for a in ARMS}, sources, study.draws)
    n = study.longest // BIN
    curves = {a: np.mean([raw[s][a][:, : n * BIN].reshape(-1, n, BIN).mean(-1) for s in seeds], (0, 1)).tolist()
              for a in ARMS}  # fmt: skip
    per_seed = {a: {s: {L: float(raw[s][a][:, :L].mean()) for L in study.lengths} for s in seeds} for a in ARMS}
    # every [seeds, windows] array the intervals above are computed from (seeds in `seeds` order)
    cells = {a: {L: at(a, L).tolist() for L in study.lengths} for a in ARMS}
    windows = {"sources": sources}
    return {"loss": loss, "differences": diffs, "curves": curves, "per_seed": per_seed, "cells": cells} | {
        "windows": windows
    }


def plot(summary: dict, study: Study, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for (arm, curve), style in zip(summary["curves"].items(), ("-", "-", "--")):  # dashed: the sinks, which
        ax.plot((np.arange(len(curve)) + 0.5) * BIN, curve, lw=1.3, ls=style, label=arm)  # may lie on sinks 0
    ax.axvline(study.context, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("position in the window (bytes)")
    ax.set_ylabel(f"loss per {BIN}-byte bin (nats/byte)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, plt)


def _fmt(interval) -> str:
    small = max(abs(v) for v in interval) < 1e-2  # differences far below a thousandth need their digits
    cell = "{:.2e}" if small else "{:.3f}"
    return f"{cell.format(interval[0])} [{cell.format(interval[1])}, {cell.format(interval[2])}]"


def _seed_differences(summary: dict, a: str, b: str, length: int) -> str:
    per = summary["per_seed"]
    diffs = [per[a][s][length] - per[b][s][length] for s in sorted(per[a])]
    return ", ".join(f"{d:+.2e}" if abs(d) < 1e-2 else f"{d:+.3f}" for d in diffs)


def _reading(summary: dict, study: Study) -> list[str]:
    """What the intervals support, in words computed from them."""
    L, c, per = study.longest, study.context, summary["per_seed"]
    full, roll = summary["loss"]["full attention"], summary["loss"]["rolling, sinks 0"]
    sunk = f"rolling, sinks {SINKS}"
    sinks = summary["differences"][f"{sunk} - rolling, sinks 0"]["difference"]
    window = summary["differences"]["rolling, sinks 0 - full attention"]["difference"]
    names = {"the rolling cache against full attention": ("rolling, sinks 0", "full attention"),
             f"{SINKS} sinks against none": (sunk, "rolling, sinks 0")}  # fmt: skip
    held = [k for k, (a, b) in names.items() if len({np.sign(per[a][s][L] - per[b][s][L]) for s in per[a]}) == 1]
    return [
        f"- Past the trained {c} bytes, full attention's loss rises ({_fmt(full[c])} at {c}, {_fmt(full[L])} at "
        f"{L}); the rolling cache's stays where it was ({_fmt(roll[L])} at {L}): every position it rotates "
        "by is one the model was trained on.",
        _sinks_reading(sinks, window, L),
        f"- With {len(study.seeds)} seeds the seed part of each interval is coarse; the per-seed difference has "
        f"one sign in every seed for: {'; '.join(held) or 'neither comparison'}.",
    ]


def _sinks_reading(sinks, window, length: int) -> str:
    """The sinks' effect in words: ``sinks``, ``window``: the (estimate, low, high) differences at ``length``."""
    said = f"- {SINKS} attention sinks change the loss at {length} by {_fmt(sinks)} nats/byte"
    shown = verdict(Interval(*sinks), neither="")
    if shown:  # the interval excludes 0: say which way (the interval gives how far)
        return f"{said}, {shown} with them (uncorrected)."
    bound = max(abs(sinks[1]), abs(sinks[2]))  # the most the interval allows, either way
    ratio = abs(window[0]) / bound
    if ratio < 100:  # too wide to call the sinks negligible beside the window's gain
        return (
            f"{said}: no difference shown, at most {bound:.1e} either way (the rolling cache's gain: {window[0]:+.3f})."
        )
    step = 10 ** max(0, int(np.floor(np.log10(ratio))) - 1)  # floored to two significant figures: "under" stays true
    return (
        f"{said}: no difference shown, and at most {bound:.1e} either way, under 1/{int(ratio // step * step)} "
        f"of what the rolling cache gains over full attention ({window[0]:+.3f}): on this model the sinks make no "
        "practical difference. Why it does not lean on its first tokens as the large models of StreamingLLM do "
        "is not tested here."
    )


def _time(env: dict) -> str:
    """The evaluation's worker time (one thread) and the last invocation's wall time, from the json's environment."""
    minutes, wall = env["worker_minutes"]["eval"], env["wall_minutes"]
    return f" Evaluation: {minutes} worker-minutes on one thread ({wall} min wall in the last invocation; evaluated seeds are reused)."


def page(summary: dict, study: Study, env: dict, picture: str) -> str:
    L = study.longest
    methods = "; ".join(sorted({d["method"] for d in summary["differences"].values()}))
    lines = [
        "# Streaming past the context: rolling caches with and without attention sinks",
        "",
        f"`python -m scripts.experiments streaming` on {env['machine']}, {env['date']}, "
        f"Python {env['python']}, torch {env['torch']}, axial_rope {env['axial_rope']}.{_time(env)}",
        "",
        f"The length study's RoPE byte model ([length.md](length.md): width 128, depth 3, trained {study.steps} steps "
        f"of {study.batch_size} windows of {study.context} bytes), seeds {list(study.seeds)}, on {study.windows} "
        f"held-out windows of {L} bytes (shorter lengths: their prefixes). Full attention is the plain forward "
        f"at positions up to {L}; the rolling arms stream a byte at a time through `GPT.stream_logits` with "
        f"rolling KV caches of {study.context} tokens (every kept key re-rotated to its new position as the "
        "cache rolls), without sinks and with the first 4 bytes kept as attention sinks. Intervals of an arm: 95% "
        f"bootstrap over windows and seeds. Paired differences: 95% seed-level intervals ({methods}), uncorrected; "
        f"a verdict is significant at 0.05 after {CORRECTIONS['holm'][1]} over the {len(PAIRS)} comparisons.",
        "",
        "| arm | " + " | ".join(str(n) for n in study.lengths) + " |",
        "|---|" + "---|" * len(study.lengths),
    ]
    for arm, row in summary["loss"].items():
        lines.append(f"| {arm} | " + " | ".join(_fmt(row[n]) for n in study.lengths) + " |")
    lines += ["", f"Paired differences at {L} bytes (nats/byte):", ""]
    lines += ["| comparison | difference | p | Holm p | verdict | per seed |", "|---|---|---|---|---|---|"]
    for k, v in summary["differences"].items():
        a, b = k.split(" - ")
        p = " | ".join("-" if np.isnan(v[k]) else f"{v[k]:.2g}" for k in ("p_value", "holm_p"))  # one seed: none
        lines.append(
            f"| {k} | {_fmt(v['difference'])} | {p} | {v['verdict']} | {_seed_differences(summary, a, b, L)} |"
        )
    lines += ["", "What the numbers support:", "", *_reading(summary, study), "", f"![loss per position]({picture})"]
    lines += ["", *section_lines("streaming", paper_findings.streaming(summary["differences"]))[:-1]]
    lines += ["", "Mean loss per seed (nats/byte; also in `streaming.json`):", ""]
    lines += [
        "| arm | seed | " + " | ".join(str(n) for n in study.lengths) + " |",
        "|---|---|" + "---|" * len(study.lengths),
    ]
    for arm, seeds in summary["per_seed"].items():
        for seed, row in seeds.items():
            lines.append(f"| {arm} | {seed} | " + " | ".join(f"{row[n]:.4f}" for n in study.lengths) + " |")
    return "\n".join(lines) + "\n"


def page_from_json(data: dict, picture: str = "img/streaming.png") -> str:
    """The page from ``streaming.json`` alone (json turned the lengths and seeds into strings: back to ints)."""

    def ints(d: dict) -> dict:
        return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in d.items()}

    study = settings_to(Study, data["environment"]["study"])
    summary = {
        "loss": {arm: ints(row) for arm, row in data["loss"].items()},
        "differences": data["differences"],
        "per_seed": {arm: {int(s): ints(row) for s, row in seeds.items()} for arm, seeds in data["per_seed"].items()},
    }
    return page(summary, study, data["environment"], picture)


def run(out: Path, quick: bool = False, root: str | Path | None = None) -> Path:
    """Train (or reuse) the RoPE runs, evaluate the three arms, write ``out/streaming.md`` and its json."""
    study = study_of(quick)
    root = Path(root or ("runs/length_quick" if quick else "runs/length"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the length study's workers run
    tic = time.perf_counter()
    try:
        done = {seed: evaluate_seed(study, root, seed) for seed in study.seeds}
    finally:
        torch.set_num_threads(threads)
    summary = summarise(study, {seed: r["arms"] for seed, r in done.items()}, window_sources(study))
    env = report.environment(study, time.perf_counter() - tic, {"eval": sum(r["seconds"] for r in done.values())})
    picture = plot(summary, study, out / "img" / "streaming.png").relative_to(out).as_posix()
    out.mkdir(parents=True, exist_ok=True)
    (out / "streaming.json").write_text(json.dumps({"environment": env} | summary, indent=1, default=str))
    path = out / "streaming.md"
    path.write_text(page(summary, study, env, picture))
    return path
