"""The length study behind ``python -m scripts.experiments length`` (docs/experiments/length.md).

Every position scheme of :mod:`.positions` trained with the same budget at one
context, over several seeds; RoPE's scaling methods applied training-free (with the factor
of each length, and fixed factors), fine-tuned at 4x, and against a model trained at the
longest length; all evaluated on the same held-out windows at every length, with paired
seed-level intervals (windows clustered by source file), per-position curves and a retrieval probe.
:func:`run` does it all, resumable: trained runs and evaluated arms are files under ``root`` and are
reused; :func:`markdown` rebuilds the page from its json alone.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ...training.text_task import stdlib_text
from ...training.trainer import load_trained
from ..jobs import compute_seconds, run_jobs
from ..settings import settings_to
from . import paradigm, plots, report, summary
from .design import DYNAMIC_NTK, FULL, QUICK, Arm, Study, arms, run_dir
from .evaluate import variant
from .jobs import execute, study_jobs
from .positions import fused_path

__all__ = ["FULL", "QUICK", "PICTURES", "Study", "comparisons", "markdown", "run"]

PICTURES = {"lengths": "img/length.png", "curves": "img/length_positions.png", "retrieval": "img/length_retrieval.png"}


def comparisons(study: Study) -> list[tuple[str, str, int]]:
    """The pairs the page states a verdict on: ``(a, b, length)``."""
    c, L, f = study.context, study.longest, study.finetune_factor
    pairs = [(m, "RoPE", L) for m in ("PI", "NTK", "YaRN", "Llama 3", DYNAMIC_NTK, "Dual Chunk", f"Window {c}")]
    pairs += [("YaRN", "Llama 3", L), ("YaRN", "NTK", L), ("Llama 3", "NTK", L)]  # the guide's ordering
    pairs += [("YaRN", "YaRN, no attention factor", length) for length in study.lengths[1:]]
    pairs += [(f"RoPE fine-tuned x{f}", "RoPE", L)]  # what the steps alone give
    pairs += [(f"{m} fine-tuned x{f}", m, L) for m in ("PI", "NTK", "YaRN")]
    pairs += [(f"{m} fine-tuned x{f}", f"RoPE fine-tuned x{f}", L) for m in ("PI", "NTK", "YaRN")]  # the control
    pairs += [(m, f"RoPE trained at {L}", L) for m in (f"YaRN fine-tuned x{f}", "YaRN", "Dual Chunk", "ALiBi")]
    pairs += [(m, f"Window {c}", L) for m in ("YaRN", "Llama 3", "NTK", "Dual Chunk", "ALiBi", "T5 bias", "NoPE")]
    pairs += [(m, "RoPE", length) for m in ("NoPE", "Sinusoidal", "Learned", "T5 bias", "ALiBi") for length in (c, L)]
    pairs += [("Linear attention + RoPE", "RoPE", length) for length in (c, L)]
    present = arms(study)  # a study that trains fewer schemes, or no upper bound, states fewer verdicts
    return [(a, b, length) for a, b, length in pairs if a in present and b in present]


def measure_paradigm(study: Study, root: Path, all_arms: dict[str, Arm]) -> tuple[dict, dict]:
    """The survey table's measured cells per arm (seed 0's models) and the bare SDPA timings."""
    text, measured = stdlib_text("val").data, {}
    for _, name, _ in report.paradigm_rows(all_arms, study.context):
        arm = all_arms[name]
        _, model = load_trained(run_dir(root, arm.model, study.seeds[0]))
        model = variant(model, arm.change(1.0) if arm.change else {})
        row = paradigm.invariance(model, text, study.context)
        row["parameters"] = paradigm.position_parameters(model)
        row["fused"], row["why"] = fused_path(model.positions)
        runs = arm.max_length is None or study.timing_length <= arm.max_length
        row["seconds"] = paradigm.forward_time(model, study.timing_length) if runs else None
        measured[arm.name] = row
    return measured, paradigm.sdpa_timings(study.timing_length)


def _interval_dict(value) -> list[float] | None:
    return None if value is None else list(value)


def to_json(results: summary.Results, measured: dict, timings: dict, found: list[dict], env: dict) -> dict:
    """The page's numbers as json: every top-level value a dict."""
    s = results.study
    loss = {n: {L: _interval_dict(results.loss(n, L)) for L in s.lengths} for n in results.arms}
    rates = {n: {L: _interval_dict(results.pass_rate(n, L)) for L in s.lengths} for n, a in results.arms.items()}
    depth = {n: {L: results.depth_rates(n, L) for L in s.lengths} for n, a in results.arms.items() if a.retrieval}
    return {
        "environment": env,
        "loss": loss,
        "retrieval": {n: r for n, r in rates.items() if results.arms[n].retrieval},
        "retrieval_by_depth": depth,
        "effective_context": {n: results.effective_context(n) for n in results.arms},
        "loss_ratio": {n: _interval_dict(results.ratio(n)) for n in results.arms},
        "curves": {n: results.curve(n).tolist() for n in results.arms},
        "paradigm": measured,
        "sdpa_seconds": timings,
        "comparisons": {f"{c['a']} vs {c['b']} at {c['length']}": _comparison(c) for c in found},
        "windows": {"sources": results.sources},
        "cells": cells(results),
    }


def cells(results: summary.Results) -> dict:
    """Every number the page is computed from, so a reader can recompute it: per arm and length, the
    ``[seeds][windows]`` losses (``loss``) and the ``[seeds][depths * trials]`` probe results (``retrieval``),
    and the ``[seeds][windows][bins]`` per-bin losses (``bins``, of the arms the break test reads); seeds in
    ``results.study.seeds`` order, windows as :func:`.evaluate.eval_windows` cuts them (their source files:
    the json's ``windows``)."""
    out, breaks = {}, set(results.break_arms())  # bins only where the page tests them: they are most of the json
    for name in results.arms:
        out[name] = {"loss": {}, "retrieval": {}}
        if name in breaks:
            out[name]["bins"] = np.stack([r["bins"] for r in results.raw[name]]).tolist()  # [S, W, n_bins]
        for L in results.study.lengths:
            losses, passes = results.losses(name, L), results.passes(name, L)
            if losses is not None:
                out[name]["loss"][L] = np.asarray(losses, dtype=np.float64).tolist()
            if passes is not None:
                out[name]["retrieval"][L] = passes.tolist()
    return out


def _comparison(c: dict) -> dict:
    return c["test"].to_dict() | {"verdict": c["verdict"]}


def markdown(data: dict) -> str:
    """The page from ``length.json`` alone: the same tables, intervals and corrections as :func:`run` wrote."""
    env = data["environment"]
    study = settings_to(Study, env["study"])
    results = summary.from_cells(study, arms(study), data["cells"], data["windows"]["sources"])
    found = summary.compare(results, comparisons(study))
    return report.page(results, data["paradigm"], data["sdpa_seconds"], found, env, PICTURES)


def run(out: Path, quick: bool = False, root: str | Path | None = None, workers: int | None = None) -> Path:
    """Train, evaluate and write ``out/length.md``, ``out/length.json`` and ``out/img/length*.png``."""
    study = QUICK if quick else FULL
    if workers is not None:
        study = replace(study, workers=workers)
    root = Path(root or ("runs/length_quick" if quick else "runs/length"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs (and the timings assume); restored at the end
    try:
        return _run(study, out, root)
    finally:
        torch.set_num_threads(threads)


def _run(study: Study, out: Path, root: Path) -> Path:
    all_arms = arms(study)
    wall = run_jobs(
        study_jobs(study), partial(execute, study, root), root, study.workers, lambda line: print(line, flush=True)
    )
    measured, timings = measure_paradigm(study, root, all_arms)
    results = summary.load(study, root, all_arms)
    found = summary.compare(results, comparisons(study))
    env = report.environment(study, wall, compute_seconds(root))
    plots.plot_lengths(results, out / PICTURES["lengths"])
    plots.plot_curves(results, out / PICTURES["curves"])
    if study.probe:
        plots.plot_retrieval(results, out / PICTURES["retrieval"])
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(results, measured, timings, found, env)
    (out / "length.json").write_text(json.dumps(data, indent=1, default=str))
    path = out / "length.md"
    path.write_text(report.page(results, measured, timings, found, env, PICTURES))
    return path
