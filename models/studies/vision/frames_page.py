"""docs/experiments/frames.md from the frame study's results: tables with intervals, GIFs, frame strips, json."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ...training.data import CLASSES
from .. import paper_findings
from ..bootstrap import Bootstrap
from ..papers import section_lines
from . import figures
from .frames import REFERENCE, FramesStudy, intrinsic
from .report import (
    INTERVALS,
    Metric,
    Table,
    best_and_tied,
    correction_lines,
    difference_table,
    environment_lines,
    interval_table,
    load_results,
    settings_to,
    table_from_cells,
    table_to_cells,
)

__all__ = ["METRICS", "build_table", "markdown", "page"]

METRICS = [
    Metric("loss", "loss", True, 4),
    Metric("presence", "presence", False, 2),
    Metric("correct", "class accuracy", False, 2),
    Metric("objects", "objects", None, 2),
    Metric("size", "size (x trained)", None, 2),
    Metric("speed", "speed (px/frame)", None, 2),
    Metric("jerk", "jerk (px/frame²)", True, 2),
    Metric("repetition", "repetition", True, 3),
]
DATA = "data (real clips)"


def build_table(study: FramesStudy, root: Path) -> Table:
    """``(length, arm, metric) -> [seeds, clips]``; the real clips' metrics as the arm ``DATA`` (one 'seed')."""
    values = {}
    check = json.loads((root / "classifier_check.json").read_text())["result"]
    for length in (study.frames, *study.lengths):
        results = load_results(root, [f"s{seed}_{length}" for seed in study.seeds])
        arms = [REFERENCE] if length == study.frames else list(study.arms)
        for arm in arms:
            for m in METRICS:
                rows = [results[f"s{seed}_{length}"][arm][m.key] for seed in study.seeds]
                values[(str(length), arm, m.key)] = np.array(rows, dtype=np.float64)
        for m in METRICS[1:]:  # the data have no denoising loss
            values[(str(length), DATA, m.key)] = np.array([check[str(length)][m.key]], dtype=np.float64)
    return Table(values, study.draws)


def _rows(table: Table, length: int, arms: list[str]) -> list[str]:
    lines = interval_table(table, str(length), [*arms, DATA], [m for m in METRICS if m.key != "loss"])
    loss = " | ".join(f"{a}: {table.interval(str(length), a, 'loss').format(4)}" for a in arms)
    return [*lines, "", f"Denoising loss of held-out clips (mean over t): {loss}."]


def _pairs(arms: list[str]) -> list[tuple[str, str]]:
    """``(arm, reference)``: each arm against ``none``, and RIFLEx against the other two ways to scale time."""
    pairs = [(arm, "none") for arm in arms if arm != "none"]
    return pairs + [("RIFLEx", ref) for ref in ("interpolate", "NTK") if "RIFLEx" in arms and ref in arms]


def _differences(table: Table, length: int, arms: list[str]) -> list[str]:
    keys = [m for m in METRICS if m.key in ("loss", "presence", "correct", "speed", "repetition")]
    lines = difference_table(table, str(length), _pairs(arms), keys)
    best = []
    for m in METRICS:
        if m.lower_is_better is not None:
            top, tied = best_and_tied(table, str(length), arms, m)
            best.append(f"- {m.heading}: best {top}" + (f" (not distinguishable: {', '.join(tied)})." if tied else "."))
    return [*lines, "", *best]


def pictures(study: FramesStudy, root: Path, out: Path) -> dict[str, dict[str, str]]:
    """Per length: a GIF (rows: arms; one clip per class) and frame strips (two clips per arm)."""
    paths = {}
    for length in (study.frames, *study.lengths):
        arms = [REFERENCE] if length == study.frames else list(study.arms)
        clips = {a: torch.load(root / "samples" / f"{length}_{a.replace(' ', '-')}.pt") for a in arms}
        per = clips[arms[0]].shape[0] // len(CLASSES)
        firsts = [c * per for c in range(len(CLASSES))]  # the first clip of each class
        gif = figures.labelled_gif([(a, v[firsts]) for a, v in clips.items()], out / "img" / f"frames_{length}.gif")
        rows = [(f"{a}, {CLASSES[c]}", clips[a][c * per]) for a in arms for c in (0, 2)]
        strip = figures.frame_strips(rows, out / "img" / f"frames_{length}_strip.png")
        paths[str(length)] = {"gif": gif.relative_to(out).as_posix(), "strip": strip.relative_to(out).as_posix()}
    return paths


def _diagnosis(saved: dict, study: FramesStudy) -> list[str]:
    keys = ("presence", "correct", "objects", "repetition")
    lines = ["| run and setting | " + " | ".join(keys) + " | presence per frame |", "|---|" + "---|" * (len(keys) + 1)]
    for name, row in saved.items():
        n = len(row["presence"])
        boot = Bootstrap(1, n, draws=study.draws)
        cells = [boot.interval(np.array([row[k]], dtype=np.float64)).format(2) for k in keys]
        frames = " ".join(f"{v:.2f}" for v in row["by_frame"])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {frames} |")
    return lines


def page(study: FramesStudy, root: Path, out: Path, env: dict) -> str:
    """Write ``out/frames.json`` (every cell included) and the pictures; return the page's markdown, which
    :func:`markdown` rebuilds from that json alone."""
    table, images = build_table(study, root), pictures(study, root, out)
    data = {"environment": env | {"settings": asdict(study)}, "results": _json(table, study)}
    if study.diagnosis:
        data["diagnosis"] = json.loads((root / "diagnosis.json").read_text())["result"]
    data |= {"cells": table_to_cells(table), "images": images}
    out.mkdir(parents=True, exist_ok=True)
    (out / "frames.json").write_text(json.dumps(data, indent=1))
    return markdown(data)


def markdown(data: dict) -> str:
    """The page from its json (:func:`page` writes it): intervals recomputed from the cells, the same draws."""
    env, images = data["environment"], data["images"]
    study = settings_to(FramesStudy, env["settings"])
    table = table_from_cells(data["cells"], study.draws)
    k, period = intrinsic(study.preset, study.frames)
    lag = round(period)
    lines = [
        "# Frame-count extrapolation",
        "",
        f"A video DiT (preset `{study.preset}`: width 128, depth 3, 4 heads; temporal rope of 16 channels with"
        f" theta 256, as HunyuanVideo) trained on {study.frames}-frame clips of {study.resolution} px for {study.steps}"
        f" steps of batch {study.batch_size}, training seeds {', '.join(map(str, study.seeds))}, sampled at"
        f" {' and '.join(map(str, study.lengths))} frames with each arm on the time axis. RIFLEx's pair is k = {k}"
        f" (period {period:.1f} frames: the first period beyond the {study.frames} training frames, the paper's rule),"
        f" set to 0.9 * 2 pi / T.",
        INTERVALS,
        "",
        *environment_lines(env),
        "",
        "## What is measured",
        "",
        f"Per clip ({study.per_class} per class, Euler {study.euler_steps} steps, guidance {study.cfg_scale:g}):"
        " *presence* (share of frames showing an object), *class accuracy* (over the frames with an object), *objects*"
        " per frame, *size* (relative to the class at the training resolution), *speed* and *jerk* of the largest"
        " object's centroid, *repetition* (mean foreground IoU of frame t with frame t - N minus that with frame"
        f" t - ceil(N / 2), N = {lag}: the period RIFLEx targets; positive when a clip returns to where it was). The row"
        " *data* is the same metrics on real clips of the training motion (no bounce back, no turn onto itself within"
        " 24 frames); the classifier's accuracy is its class accuracy.",
        "",
    ]
    for length in (study.frames, *study.lengths):
        arms = [REFERENCE] if length == study.frames else list(study.arms)
        lines += [f"## {length} frames", "", *_rows(table, length, arms), ""]
        if len(arms) > 1:
            lines += ["Paired differences:", "", *_differences(table, length, arms), ""]
        pic = images[str(length)]
        lines += [f"![clips at {length} frames]({pic['gif']})", "", f"![frames]({pic['strip']})", ""]
    if study.diagnosis:
        lines += [
            "## Why objects vanished from the default run's 16-frame samples",
            "",
            "The default video run (`RUN_DEFAULTS['video_dit']`: tiny preset, temporal rope of 12 channels with theta"
            " 10000, 16 px, 8 frames, 600 steps) and the same run trained twice as long, seed 0, 16 clips per row:",
            "",
            *_diagnosis(data["diagnosis"], study),
            "",
        ]
    lines += section_lines("frames", paper_findings.frames(table))
    lines += correction_lines(table)  # every comparison of the page, Holm-corrected together
    return "\n".join(lines) + "\n"


def _json(table: Table, study: FramesStudy) -> dict:
    out = {}
    for length in (study.frames, *study.lengths):
        arms = [REFERENCE] if length == study.frames else list(study.arms)
        out[str(length)] = {
            arm: {
                m.key: list(table.interval(str(length), arm, m.key))
                for m in METRICS
                if table.has(str(length), arm, m.key)
            }
            for arm in [*arms, DATA]
        }
    return out
