"""docs/experiments/streaming-video.md from the streaming video study's results: tables, GIFs, json with per-seed values."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from ..training.data import CLASSES
from . import streaming_video as sv
from .vision import figures
from .vision.frames import intrinsic
from .vision.frames_page import METRICS as FRAME_METRICS
from .vision.report import (
    Table,
    best_lines,
    correction_lines,
    difference_table,
    environment,
    environment_lines,
    interval_table,
    load_results,
    mark,
)

__all__ = ["METRICS", "build_table", "page", "run"]

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


def _per_seed(results: dict, length: int, arm: str, key: str) -> list[float]:
    """One mean per seed (clips whose metric is undefined, NaN, left out; NaN if none is defined)."""
    rows = [np.array(results[length][s][arm][key], dtype=np.float64) for s in sorted(results[length])]
    return [float(r[~np.isnan(r)].mean()) if (~np.isnan(r)).any() else float("nan") for r in rows]


def _seed_signs(results: dict, length: int, a: str, b: str) -> list[str]:
    """Per key metric: the per-seed differences of the seed means ``a - b``."""
    cells = []
    for m in KEY:
        d = np.subtract(_per_seed(results, length, a, m.key), _per_seed(results, length, b, m.key))
        cells.append("-" if np.isnan(d).all() else " ".join(f"{v:+.{m.digits}f}" for v in d))
    return cells


def _curve(results: dict, length: int, arm: str, block: int) -> list[float]:
    """Presence per block of ``block`` frames, mean over seeds and clips."""
    curve = np.mean([results[length][s][arm]["by_frame"] for s in results[length]], axis=0)  # [T]
    return [float(curve[i : i + block].mean()) for i in range(0, length, block)]


def _reading(study: sv.StreamingVideoStudy, table: Table, results: dict) -> list[str]:
    """What the intervals support, in words computed from them (the verdicts are the paired intervals')."""
    n, longest = study.frames, max(study.lengths)

    def diff(length, a, b, key, digits=2):
        d = table.difference(str(length), a, b, key)
        return f"{d.format(digits)}{' ' + mark(d) if mark(d) else ''}"

    fade = ", ".join(f"{v:.2f}" for v in _curve(results, longest, STREAM, n))
    return [
        f"- At the training length ({n} frames) streaming and the bidirectional model are not told apart on presence"
        f" ({diff(n, STREAM, BI, 'presence')}) or class accuracy ({diff(n, STREAM, BI, 'correct')}).",
        "- Past it, the stream loses its objects as it goes on: presence per block of"
        f" {n} frames at {longest} frames is {fade}, against"
        f" {', '.join(f'{v:.2f}' for v in _curve(results, longest, BI, n))} for the bidirectional model;"
        + ";".join(
            f" at {L} frames streaming - bidirectional is {diff(L, STREAM, BI, 'presence')}" for L in study.lengths
        )
        + ".",
        "- The rolling cache keeps every time position within the trained 0.."
        f"{n - 1}, so the fade is not positions past the trained range; what else differs from training is that each"
        " frame's context is the model's own earlier output, where training gave it real clips at random noise levels"
        " (the train-test gap of teacher-forced context that Self-Forcing, Huang et al. 2025, trains on). That this is"
        " the cause is not tested here.",
        f"- The causal model sampled all at once is not told apart from the bidirectional one on presence at {longest}"
        f" frames ({diff(longest, WHOLE, BI, 'presence')}) but moves its objects faster"
        f" ({diff(longest, WHOLE, BI, 'speed')} px/frame) and less smoothly ({diff(longest, WHOLE, BI, 'jerk')});"
        " streaming is not told apart from it on speed"
        f" ({diff(longest, STREAM, BI, 'speed')}).",
        f"- Streaming repeats least ({diff(longest, STREAM, BI, 'repetition', 3)} against bidirectional at"
        f" {longest}), but the score is computed on foreground masks, and clips whose objects vanish score low for"
        " that reason too: read it with presence.",
    ]


def _fade(results: dict, length: int, arms, block: int) -> list[str]:
    """Presence per block of ``block`` frames: mean over seeds and clips, per arm."""
    spans = [(i, min(i + block, length)) for i in range(0, length, block)]
    lines = ["| arm | " + " | ".join(f"frames {a + 1}-{b}" for a, b in spans) + " |", "|---|" + "---|" * len(spans)]
    for arm in arms:
        curve = np.mean([results[length][s][arm]["by_frame"] for s in results[length]], axis=0)  # [T]
        lines.append(f"| {arm} | " + " | ".join(f"{curve[a:b].mean():.2f}" for a, b in spans) + " |")
    return lines


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


def _json(study: sv.StreamingVideoStudy, table: Table, results: dict) -> dict:
    out = {}
    for length in _lengths(study):
        arms = sv.arms_at(study, length)
        out[str(length)] = {
            arm: {
                "interval": {m.key: list(table.interval(str(length), arm, m.key)) for m in METRICS},
                "per_seed": {m.key: _per_seed(results, length, arm, m.key) for m in METRICS},
                "presence_by_frame_per_seed": [results[length][s][arm]["by_frame"] for s in study.seeds],
            }
            for arm in arms
        }
        out[str(length)]["differences"] = {
            f"{a} - {b}": {m.key: list(table.difference(str(length), a, b, m.key)) for m in METRICS}
            for a, b in PAIRS
            if a in arms and b in arms
        }
    return out


def page(study: sv.StreamingVideoStudy, root: Path, out: Path, env: dict) -> str:
    """Write ``out/streaming-video.json`` and the GIFs; return the page's markdown."""
    table, results, gifs = build_table(study, root), _results(study, root), pictures(study, root, out)
    k, period = intrinsic(study.preset, study.frames)
    seeds = ", ".join(map(str, study.seeds))
    lines = [
        "# Streaming video: frame-causal generation with rolling frame caches",
        "",
        f"Two video DiTs of the [frame-count study](frames.md)'s design (preset `{study.preset}`: width 128, depth 3,"
        f" 4 heads, temporal rope of 16 channels with theta 256) trained on the same {study.frames}-frame clips of"
        f" {study.resolution} px, {study.steps} steps of batch {study.batch_size}, seeds {seeds}: *bidirectional* (one"
        " noise level per clip, as the frames study) and *causal* (frame-causal attention and one noise level per"
        " frame: diffusion forcing, `python -m scripts.train --model video_dit --causal`). Same clips, labels, initial"
        " noise and seeds for every arm.",
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
        " resampled, with one shared draw of clips for every seed and arm (`models/studies/seed_intervals.py`,"
        " `SeedBootstrap`); `(+)` / `(-)`: the paired interval lies above / below 0. The per-seed differences are"
        " listed with each comparison, and the page ends with every comparison it made, Holm-corrected together.",
        "",
        "What differs between the two models is only what the comparison is about: the attention mask and the"
        " timestep draws (one per frame against one per clip, from the same seeded generator); the clips, their order,"
        f" the noise, the optimiser and the steps are shared. At {study.resolution} px a frame is"
        f" {study.resolution // 4} x {study.resolution // 4} tokens of 4 px, so objects are a few pixels wide and the"
        " classifier reads real clips far from perfectly (the *data* row): class accuracy compares arms, it does not"
        " grade them.",
        "",
        *environment_lines(env),
        "",
        "## What the numbers support",
        "",
        *_reading(study, table, results),
        "",
    ]
    for length in _lengths(study):
        arms = list(sv.arms_at(study, length))
        g = str(length)
        title = "the training length" if length == study.frames else f"{length // study.frames}x the training length"
        lines += [f"## {length} frames ({title})", "", *interval_table(table, g, [*arms, DATA], METRICS), ""]
        pairs = [p for p in PAIRS if p[0] in arms and p[1] in arms]
        lines += ["Paired differences:", "", *difference_table(table, g, pairs, KEY), ""]
        lines += ["Per-seed differences of the seed means (seeds " + seeds + "):", ""]
        lines += ["| arm - reference | " + " | ".join(m.heading for m in KEY) + " |", "|---|" + "---|" * len(KEY)]
        lines += [f"| {a} - {b} | " + " | ".join(_seed_signs(results, length, a, b)) + " |" for a, b in pairs]
        ranked = [m for m in KEY if any(not np.isnan(table.interval(g, a, m.key).mean) for a in arms)]
        lines += ["", *best_lines(table, g, arms, ranked), ""]
        lines += [f"Presence per block of {study.frames} frames (share of clips showing an object):", ""]
        lines += [*_fade(results, length, arms, study.frames), "", f"![clips at {length} frames]({gifs[g]})", ""]
    lines += correction_lines(table)  # every comparison of the page, Holm-corrected together
    out.mkdir(parents=True, exist_ok=True)
    data = {"environment": env | {"settings": asdict(study)}, "results": _json(study, table, results)}
    (out / "streaming-video.json").write_text(json.dumps(data, indent=1))
    return "\n".join(lines) + "\n"


def run(out: Path, quick: bool = False, root: str | Path | None = None) -> Path:
    """Train (or reuse) the study's runs, evaluate every arm, write ``out/streaming-video.md`` and its json."""
    from .jobs import checkpoint_hash, compute_seconds, run_jobs

    study = sv.QUICK if quick else sv.FULL
    root = Path(root or ("runs/streaming-video_quick" if quick else "runs/streaming-video"))
    wall = run_jobs(sv.study_jobs(study), sv.executor(study, root), root, study.workers, lambda s: print(s, flush=True))
    command = "python -m scripts.experiments streaming-video" + (" --quick" if quick else "")
    hashes = {name: checkpoint_hash(cfg.out) for name, cfg in sv.all_runs(study, root).items()}
    env = environment(command, wall, compute_seconds(root), hashes, asdict(replace(study)))
    text = page(study, root, out, env)
    path = out / "streaming-video.md"
    path.write_text(text)
    return path
