"""docs/experiments/streaming-video.md from the streaming video study's results: tables, GIFs and a json with every
cell, from which the page regenerates (:func:`markdown`)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from ..training.data import CLASSES
from . import paper_findings
from . import streaming_video as sv
from .bootstrap import verdict
from .papers import section_lines
from .vision import figures
from .vision.frames import intrinsic
from .vision.frames_page import METRICS as FRAME_METRICS
from .vision.report import (
    Published,
    Table,
    adjusted_p,
    best_lines,
    correction_lines,
    difference_table,
    environment,
    environment_lines,
    interval_table,
    load_results,
    settings_to,
    table_from_cells,
    table_to_cells,
)

__all__ = ["METRICS", "build_table", "markdown", "page", "run"]

METRICS = [m for m in FRAME_METRICS if m.key != "loss"]  # the frames page's sample metrics
KEY = [m for m in METRICS if m.key in ("presence", "correct", "speed", "jerk", "repetition")]
DATA = "data (real clips)"
STREAM, WHOLE, BI, RIFLEX = "causal (streaming)", "causal (all at once)", "bidirectional", "bidirectional + RIFLEx"
PAIRS = [(STREAM, BI), (STREAM, RIFLEX), (STREAM, WHOLE), (WHOLE, BI)]


def _lengths(study: sv.StreamingVideoStudy) -> tuple[int, ...]:
    return (study.frames, *study.lengths)


def _results(study: sv.StreamingVideoStudy, root: Path) -> dict[int, dict[int, dict]]:
    """``{length: {seed: {arm: {metric: [clips]}}}}``."""
    out = {}
    for length in _lengths(study):
        saved = load_results(root, [f"s{seed}_{length}" for seed in study.seeds])
        out[length] = {seed: saved[f"s{seed}_{length}"] for seed in study.seeds}
    return out


def build_table(study: sv.StreamingVideoStudy, root: Path) -> Table:
    """``(length, arm, metric) -> [seeds, clips]``; the real clips' metrics as the arm ``DATA`` (one 'seed')."""
    values, results = {}, _results(study, root)
    check = json.loads((root / "classifier_check.json").read_text())["result"]
    for length in _lengths(study):
        for arm in sv.arms_at(study, length):
            for m in METRICS:
                rows = [results[length][seed][arm][m.key] for seed in study.seeds]
                values[(str(length), arm, m.key)] = np.array(rows, dtype=np.float64)
        for m in METRICS:
            values[(str(length), DATA, m.key)] = np.array([check[str(length)][m.key]], dtype=np.float64)
    return Table(values, study.draws)


def _per_seed(table: Table, length: int, arm: str, key: str) -> list[float]:
    """One mean per seed over the table's cells (undefined ones, NaN, left out; NaN if none is defined)."""
    rows = table.values[(str(length), arm, key)]
    return [float(r[~np.isnan(r)].mean()) if (~np.isnan(r)).any() else float("nan") for r in rows]


def _seed_signs(table: Table, length: int, a: str, b: str) -> list[str]:
    """Per key metric: the per-seed differences of the seed means ``a - b``."""
    cells = []
    for m in KEY:
        d = np.subtract(_per_seed(table, length, a, m.key), _per_seed(table, length, b, m.key))
        cells.append("-" if np.isnan(d).all() else " ".join(f"{v:+.{m.digits}f}" for v in d))
    return cells


def _curve(by_frame: dict, length: int, arm: str, block: int) -> list[float]:
    """Presence per block of ``block`` frames, mean over seeds and clips (``by_frame``: the json's per-seed curves)."""
    curve = np.mean(by_frame[str(length)][arm], axis=0)  # [T]
    return [float(curve[i : i + block].mean()) for i in range(0, length, block)]


def _said(table: Table, length: int, a: str, b: str, key: str, digits: int = 2) -> str:
    """``a - b`` on ``key`` with its interval and, in words, what that interval shows."""
    d = table.difference(str(length), a, b, key)
    words = verdict(d, f"{a} higher", f"{a} lower", "not told apart")
    return f"{d.format(digits)}: {words}"


def _reading(study: sv.StreamingVideoStudy, table: Table, by_frame: dict) -> list[str]:
    """What the intervals support, in words computed from them (each verdict is its paired interval's alone)."""
    n, longest = study.frames, max(study.lengths)
    blocks = lambda arm: ", ".join(f"{v:.2f}" for v in _curve(by_frame, longest, arm, n))  # noqa: E731
    fades = verdict(table.difference(str(longest), STREAM, BI, "presence")) == "lower"
    cause = (
        f"The rolling cache keeps every time position within the trained 0..{n - 1}, so a fade is not positions"
        " past the trained range; what else differs from training is that each frame's context is the model's own"
        " earlier output, where training gave it real clips at random noise levels (the train-test gap of"
        " teacher-forced context that Self-Forcing, Huang et al. 2025, trains on). That this is the cause is not"
        " tested here."
    )
    return [
        f"- At the training length ({n} frames), streaming - bidirectional: presence"
        f" {_said(table, n, STREAM, BI, 'presence')}; class accuracy {_said(table, n, STREAM, BI, 'correct')}.",
        f"- Presence per block of {n} frames at {longest} frames: streaming {blocks(STREAM)}, bidirectional"
        f" {blocks(BI)}; streaming - bidirectional"
        + ";".join(f" at {L} frames {_said(table, L, STREAM, BI, 'presence')}" for L in study.lengths)
        + ".",
        *([f"- {cause}"] if fades else []),
        f"- At {longest} frames the causal model sampled all at once - bidirectional: presence"
        f" {_said(table, longest, WHOLE, BI, 'presence')}; speed {_said(table, longest, WHOLE, BI, 'speed')} px/frame;"
        f" jerk {_said(table, longest, WHOLE, BI, 'jerk')}. Streaming - bidirectional speed:"
        f" {_said(table, longest, STREAM, BI, 'speed')}.",
        f"- Repetition, streaming - bidirectional at {longest} frames: {_said(table, longest, STREAM, BI, 'repetition', 3)}."
        " The score is computed on foreground masks, and clips whose objects vanish score low for that reason too:"
        " read it with presence.",
    ]


def _corrected_reading(study: sv.StreamingVideoStudy, table: Table) -> list[str]:
    """Which of the presence comparisons above survive the page's Holm correction (the bullets give each interval
    alone)."""
    adjusted = adjusted_p(table)
    found = [(L, adjusted.get((str(L), STREAM, BI, "presence"))) for L in study.lengths]
    cells = [f"{L} frames p = {p:.3f}" for L, p in found if p is not None]
    held = [L for L, p in found if p is not None and p < 0.05]
    signs = [np.subtract(_per_seed(table, L, STREAM, "presence"), _per_seed(table, L, BI, "presence")) for L in
             study.lengths]  # fmt: skip
    same = sum(bool((d < 0).all()) for d in signs)
    verdict_ = (
        "both hold"
        if len(held) == len(found)
        else "none holds"
        if not held
        else f"only {', '.join(map(str, held))} holds"
    )
    return [
        f"- Corrected together with the page's other comparisons (Holm, [below](#multiple-comparisons)), the"
        f" streaming - bidirectional presence differences give adjusted {'; '.join(cells)}: {verdict_} at 0.05."
        f" Every seed's own difference is negative at {same} of {len(study.lengths)} lengths (tables below)."
    ]


def _fade(by_frame: dict, length: int, arms, block: int) -> list[str]:
    """Presence per block of ``block`` frames: mean over seeds and clips, per arm."""
    spans = [(i, min(i + block, length)) for i in range(0, length, block)]
    lines = ["| arm | " + " | ".join(f"frames {a + 1}-{b}" for a, b in spans) + " |", "|---|" + "---|" * len(spans)]
    for arm in arms:
        curve = np.mean(by_frame[str(length)][arm], axis=0)  # [T]
        lines.append(f"| {arm} | " + " | ".join(f"{curve[a:b].mean():.2f}" for a, b in spans) + " |")
    return lines


# settings of the frame-count study that choose which cells exist (matched cell by cell) or how fast they are computed
_SELECTION = ("seeds", "lengths", "arms", "diagnosis", "draws", "workers", "quick")


def reproduction(study: sv.StreamingVideoStudy, table: Table, published: Path, hashes: dict[str, str]) -> str:
    """How the bidirectional arm compares with the frame-count study's published runs (``published``: its json):
    the checkpoints' hashes and, at the lengths both studies sample with the same clips, labels and noise, the
    largest difference of a seed's mean presence and class accuracy; only against a json of the same settings."""
    theirs = Published.read(published)
    if theirs is None:
        return (
            f"The frame-count study's json ({published.name}) was not found, so the bidirectional arm was not compared."
        )
    source = f"[frame-count study](frames.md)'s json of {theirs.date}"
    differing = theirs.differing(asdict(study.base), _SELECTION)
    if differing:
        return (
            f"The bidirectional arm was not compared with the {source}: it was made with other settings ({differing})."
        )
    ours = {}  # (length, their arm, seed) -> our seed means; the frames study's arm at the training length
    for length in _lengths(study):
        per_seed = {key: _per_seed(table, length, BI, key) for key in ("presence", "correct")}
        arm = "trained length" if length == study.frames else "none"
        for i, seed in enumerate(study.seeds):
            ours[(str(length), arm, seed)] = {key: means[i] for key, means in per_seed.items()}
    worst, cells = theirs.largest_gaps(ours)
    same = theirs.same_hashes({s: hashes[f"s{s}-bidirectional"] for s in study.seeds})
    gaps = f"presence {worst.get('presence', 0.0):.3g}, class accuracy {worst.get('correct', 0.0):.3g}"
    return (
        f"Check against the {source} (the same settings): {same} of {len(study.seeds)} bidirectional checkpoints"
        " have the hashes it cites"
        + (f"; over the {cells} (length, seed) cells both studies sample alike, the largest difference of a seed's"
           f" mean is: {gaps}." if cells else "; the two studies share no length and seed.")
    )  # fmt: skip


def pictures(study: sv.StreamingVideoStudy, root: Path, out: Path) -> dict[str, str]:
    """Per length a GIF: one row per arm, the first clip of each class (seed ``study.seeds[0]``)."""
    paths = {}
    for length in _lengths(study):
        arms = sv.arms_at(study, length)
        clips = {a: torch.load(sv.sample_path(root, length, a)) for a in arms}
        per = clips[arms[0]].shape[0] // len(CLASSES)
        firsts = [c * per for c in range(len(CLASSES))]
        gif = figures.labelled_gif([(a, v[firsts]) for a, v in clips.items()], out / "img" / f"streaming_{length}.gif")
        paths[str(length)] = gif.relative_to(out).as_posix()
    return paths


def _json(study: sv.StreamingVideoStudy, table: Table) -> dict:
    """Per length and arm each metric's interval, and the paired differences the page compares."""
    out = {}
    for length in _lengths(study):
        arms, g = sv.arms_at(study, length), str(length)
        out[g] = {arm: {m.key: list(table.interval(g, arm, m.key)) for m in METRICS} for arm in arms}
        out[g]["differences"] = {
            f"{a} - {b}": {m.key: list(table.difference(g, a, b, m.key)) for m in METRICS}
            for a, b in PAIRS
            if a in arms and b in arms
        }
    return out


def page(study: sv.StreamingVideoStudy, root: Path, out: Path, env: dict) -> str:
    """Write ``out/streaming-video.json`` (every cell, the per-seed presence curves) and the GIFs; return the page's
    markdown, which :func:`markdown` rebuilds from that json alone."""
    table, results = build_table(study, root), _results(study, root)
    by_frame = {
        str(L): {arm: [results[L][s][arm]["by_frame"] for s in study.seeds] for arm in sv.arms_at(study, L)}
        for L in _lengths(study)
    }  # {length: {arm: [seeds][frames]}}
    data = {
        "environment": env | {"settings": asdict(study)},
        "results": _json(study, table),
        "cells": table_to_cells(table),
        "by_frame": by_frame,
        "images": pictures(study, root, out),
        "reproduction": {"text": reproduction(study, table, out / "frames.json", env["checkpoints"])},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "streaming-video.json").write_text(json.dumps(data, indent=1))
    return markdown(data)


def markdown(data: dict) -> str:
    """The page from its json (:func:`page` writes it): intervals recomputed from the cells, the same draws."""
    env, gifs, by_frame = data["environment"], data["images"], data["by_frame"]
    study = settings_to(sv.StreamingVideoStudy, env["settings"])
    table = table_from_cells(data["cells"], study.draws)
    k, period = intrinsic(study.preset, study.frames)
    seeds = ", ".join(map(str, study.seeds))
    lines = [
        "# Streaming video: frame-causal generation with rolling frame caches",
        "",
        f"Two video DiTs (preset `{study.preset}`: width 128, depth 3, 4 heads, temporal rope of 16 channels with"
        f" theta 256) trained on the same {study.frames}-frame clips of {study.resolution} px, {study.steps} steps of"
        f" batch {study.batch_size}, seeds {seeds}: *bidirectional*, one noise level per clip: the"
        " [frame-count study](frames.md)'s runs (retrained in their folders where missing: the check below compares"
        " them with the published ones); *causal*, the same run with frame-causal attention and one noise level"
        " per frame (diffusion forcing, `python -m scripts.train --model video_dit --causal`). Same clips, labels,"
        " initial noise and seeds for every arm.",
        "",
        "Arms: *bidirectional*: every frame at once at plain positions (the frames study's `none`);"
        f" *bidirectional + RIFLEx*: the same with RIFLEx (k = {k}, period {period:.1f} frames) on the time axis;"
        " *causal (all at once)*: the causal model denoising every frame together at plain positions;"
        " *causal (streaming)*: a frame at a time (`models.video_streaming.sample_streaming`), each denoised from noise"
        f" with the earlier frames as clean context (timestep 0) from a rolling frame cache of {study.frames} frames"
        f" (the new one included), time positions re-indexed to 0..{study.frames - 1} as it rolls.",
        f"Euler {study.euler_steps} steps (per clip, or per frame when streaming), guidance {study.cfg_scale:g},"
        f" {study.per_class} clips per class. Metrics: the frames study's (presence, class accuracy, objects, size,"
        f" speed, jerk, repetition at lag {round(period)}; see [frames.md](frames.md#what-is-measured)); *data* is the"
        " same metrics on real clips. Every figure is a mean with its 95% bootstrap interval over training seeds and"
        " clips; a paired difference (every arm sees the same clips, labels and initial noise) is seed-level: seeds"
        " and clips as crossed random factors, the two-way random-effects t interval with Satterthwaite's degrees"
        " of freedom (`crossed_t`, `models/studies/seed_intervals.py`); `(+)` / `(-)`: the paired interval lies"
        " above / below 0. The per-seed differences are"
        " listed with each comparison, and the page ends with every comparison it made, Holm-corrected together.",
        "",
        "What differs between the two models is only what the comparison is about: the attention mask and the"
        " timestep draws (one per frame against one per clip, from the same seeded generator); the clips, their order,"
        f" the noise, the optimiser and the steps are shared. At {study.resolution} px a frame is"
        f" {study.resolution // 4} x {study.resolution // 4} tokens of 4 px, so objects are a few pixels wide; the"
        " frame-count study's shape classifier reads the class of real clips at"
        f" {table.interval(str(study.frames), DATA, 'correct').mean:.2f} ({study.frames} frames, the *data* row).",
        "",
        *environment_lines(env),
        "",
        data["reproduction"]["text"],
        "",
        "## What the numbers support",
        "",
    ]
    reading_at = len(lines)  # filled once every table's comparisons are made: the correction is over all of them
    for length in _lengths(study):
        arms = list(sv.arms_at(study, length))
        g = str(length)
        title = "the training length" if length == study.frames else f"{length // study.frames}x the training length"
        lines += [f"## {length} frames ({title})", "", *interval_table(table, g, [*arms, DATA], METRICS), ""]
        pairs = [p for p in PAIRS if p[0] in arms and p[1] in arms]
        lines += ["Paired differences:", "", *difference_table(table, g, pairs, KEY), ""]
        lines += ["Per-seed differences of the seed means (seeds " + seeds + "):", ""]
        lines += ["| arm - reference | " + " | ".join(m.heading for m in KEY) + " |", "|---|" + "---|" * len(KEY)]
        lines += [f"| {a} - {b} | " + " | ".join(_seed_signs(table, length, a, b)) + " |" for a, b in pairs]
        ranked = [m for m in KEY if any(not np.isnan(table.interval(g, a, m.key).mean) for a in arms)]
        lines += ["", *best_lines(table, g, arms, ranked), ""]
        lines += [f"Presence per block of {study.frames} frames (share of clips showing an object):", ""]
        lines += [*_fade(by_frame, length, arms, study.frames), "", f"![clips at {length} frames]({gifs[g]})", ""]
    lines += section_lines("streaming-video", paper_findings.streaming_video(table))
    lines += correction_lines(table)  # every comparison of the page, Holm-corrected together
    lines[reading_at:reading_at] = [*_reading(study, table, by_frame), *_corrected_reading(study, table), ""]
    return "\n".join(lines) + "\n"


def run(out: Path, quick: bool = False, root: str | Path | None = None, base_root: str | Path | None = None) -> Path:
    """Train (or reuse) the study's runs, evaluate every arm, write ``out/streaming-video.md`` and its json
    (``root``: the causal runs and evaluations; ``base_root``: the frame-count study's root, whose runs are the
    bidirectional arm)."""
    from .jobs import checkpoint_hash, compute_seconds, run_jobs

    study = sv.QUICK if quick else sv.FULL
    study = study if base_root is None else replace(study, base_root=str(base_root))
    root = Path(root or ("runs/streaming-video_quick" if quick else "runs/streaming-video"))
    wall = run_jobs(sv.study_jobs(study), sv.executor(study, root), root, study.workers, lambda s: print(s, flush=True))
    command = "python -m scripts.experiments streaming-video" + (" --quick" if quick else "")
    hashes = {name: checkpoint_hash(cfg.out) for name, cfg in sv.all_runs(study, root).items()}
    env = environment(command, wall, compute_seconds(root), hashes, asdict(study))
    text = page(study, root, out, env)
    path = out / "streaming-video.md"
    path.write_text(text)
    return path
