"""docs/experiments/packing.md from the packing study's results: tables with intervals, pictures, json."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from ...training.data import CLASSES
from .. import paper_findings
from ..papers import section_lines
from . import figures
from .packing import ONE_SIZE, PACKED, PackingStudy, arms_at
from .report import (
    Published,
    Table,
    best_lines,
    correction_lines,
    difference_table,
    environment_lines,
    interval_table,
    load_results,
    mark,
    per_class_table,
    settings_to,
    table_from_cells,
    table_to_cells,
)
from .resolution import samples_path, size_name
from .resolution_page import METRICS, sample_labels

__all__ = ["build_table", "markdown", "page"]

COMPARED = ("loss_grown", "loss_canvas", "correct", "size")  # the paired-difference tables' metrics
DIFFERENCE_METRICS = [m for m in METRICS if m.key in COMPARED]


def build_table(study: PackingStudy, root: Path) -> Table:
    """``(size, arm, metric) -> [seeds, samples]`` from every evaluation file."""
    values = {}
    for size in study.sizes:
        names = [f"s{seed}_{size_name(size)}" for seed in study.seeds]
        results = load_results(root, names)
        for arm, _, _ in arms_at(study, size):
            for m in METRICS:
                rows = [results[name][arm][m.key] for name in names]
                values[(size_name(size), arm, m.key)] = np.array(rows, dtype=np.float64)
    return Table(values, study.draws)


def _pairs(study: PackingStudy, size) -> list[tuple[str, str]]:
    """``(arm, reference)`` of the paired-difference table at ``size``: the packed model against each one-size arm."""
    arms = [a for a, _, _ in arms_at(study, size)]
    pairs = [(a, b) for a in arms if a.startswith(PACKED) for b in arms if b.startswith(ONE_SIZE)]
    return pairs + [(a, PACKED) for a in arms if a.startswith(PACKED) and a != PACKED]


def _summary(table: Table, study: PackingStudy) -> list[str]:
    """Per size: the packed model (plain positions) against the one-size model's best arm on the grown-scene loss."""
    lines = [
        "| size | packed: loss, grown | one size, best arm | its loss | packed - that arm | packed: class accuracy |",
        "|---|---|---|---|---|---|",
    ]
    loss = next(m for m in METRICS if m.key == "loss_grown")
    for size in study.sizes:
        group = size_name(size)
        one = [a for a, which, _ in arms_at(study, size) if which == ONE_SIZE]
        best = min(one, key=lambda a: table.interval(group, a, loss.key).mean)
        d = table.difference(group, PACKED, best, loss.key)
        lines.append(
            f"| {size[0]} x {size[1]} | {table.interval(group, PACKED, loss.key).format(4)} | {best} |"
            f" {table.interval(group, best, loss.key).format(4)} | {d.format(4)} {mark(d)} |"
            f" {table.interval(group, PACKED, 'correct').format(2)} |"
        )
    return lines


# settings of the resolution study that choose which cells exist (matched cell by cell) or how fast they are computed
_SELECTION = ("seeds", "sizes", "modes", "finetune_size", "finetune_modes", "finetune_steps", "finetune_batch",
              "finetune_lr", "draws", "workers", "quick")  # fmt: skip


def reproduction(study: PackingStudy, root: Path, published: Path, hashes: dict[str, str]) -> str:
    """How the one-size arms compare with the resolution study's published runs: their checkpoints' hashes
    (``hashes``, as this page cites them) and, at the sizes both studies evaluate, their per-seed means against
    that study's json (``published``), made with the same settings (else they are not compared)."""
    theirs = Published.read(published)
    if theirs is None:
        return f"The resolution study's json ({published.name}) was not found, so the one-size arms were not compared."
    source = f"[resolution study](resolution.md)'s json of {theirs.date}"
    differing = theirs.differing(asdict(study.base), _SELECTION)
    if differing:
        return f"The one-size arms were not compared with the {source}: it was made with other settings ({differing})."
    ours = {}  # (size, their arm, seed) -> our seed means
    for size in study.sizes:
        group = size_name(size)
        for seed in study.seeds:
            result = load_results(root, [f"s{seed}_{group}"])[f"s{seed}_{group}"]
            for arm, which, mode in arms_at(study, size):
                if which == ONE_SIZE:
                    mean = {m: float(np.nanmean(np.array(result[arm][m], dtype=float))) for m in COMPARED}
                    ours[(group, "trained size" if arm == ONE_SIZE else mode, seed)] = mean
    worst, cells = theirs.largest_gaps(ours)
    if not cells:
        return f"The {source} shares no size and seed with this study: the one-size arms were not compared."
    same = theirs.same_hashes({s: hashes[f"s{s}"] for s in study.seeds})
    gaps = "; ".join(f"{m.heading} {worst[m.key]:.4g}" for m in DIFFERENCE_METRICS)
    return (
        f"Check against the {source} (the same settings): {same} of {len(study.seeds)} one-size checkpoints have the"
        f" hashes it cites; over the {cells} (size, arm, seed) cells both studies evaluate, the largest difference of"
        f" a seed's mean is: {gaps}."
    )


def pictures(study: PackingStudy, root: Path, out: Path) -> dict[str, str]:
    """One labelled grid per size (rows: arms; columns: two samples per class of the first seed)."""
    paths = {}
    for size in study.sizes:
        rows = []
        for arm, _, _ in arms_at(study, size):
            images = torch.load(samples_path(root, size, arm))
            n = images.shape[0] // len(CLASSES)
            pick = [c * n + i for c in range(len(CLASSES)) for i in range(min(2, n))]
            rows.append((arm, images[pick]))
        path = figures.labelled_grid(rows, out / "img" / f"packing_{size_name(size)}.png")
        paths[size_name(size)] = path.relative_to(out).as_posix()
    return paths


def _where(study: PackingStudy, size) -> str:
    R, top, low = study.base.resolution, study.packed_max * 4, study.base.resolution // 2
    h, w = size[0] / R, size[1] / R
    factor = f"{h:g}x" if h == w else f"{h:g}x by {w:g}x"
    if size == (R, R):
        return f"{factor}: both models' training size"
    inside = all(low <= s <= top for s in size) and max(size) <= 3 * min(size)
    return f"{factor}: " + ("inside the packed training range" if inside else "beyond both training ranges")


def page(study: PackingStudy, root: Path, out: Path, env: dict) -> str:
    """Write ``out/packing.json`` (every cell included) and the pictures; return the page's markdown, which
    :func:`markdown` rebuilds from that json alone. The one-size arms are checked against ``out/resolution.json``."""
    table, images = build_table(study, root), pictures(study, root, out)
    check = reproduction(study, root, out / "resolution.json", env["checkpoints"])
    data = _json(table, study, env) | {
        "cells": table_to_cells(table),
        "images": images,
        "reproduction": {"text": check},  # every top-level value a dict
        "sample_labels": sample_labels(replace(study.base, sizes=study.sizes)),  # the samples' classes, per size
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "packing.json").write_text(json.dumps(data, indent=1))
    return markdown(data)


def markdown(data: dict) -> str:
    """The page from its json (:func:`page` writes it): intervals recomputed from the cells, the same draws."""
    env, images = data["environment"], data["images"]
    study = settings_to(PackingStudy, env["settings"])
    table = table_from_cells(data["cells"], study.draws)
    base, R = study.base, study.base.resolution
    seeds = ", ".join(map(str, study.seeds))
    lines = [
        "# Native-resolution (packed) training vs one size",
        "",
        f"Two tiny image DiTs (width 128, depth 4, 4 heads, patch 4), {base.steps} steps of"
        f" {base.batch_size * (R // 4) ** 2} tokens, learning rate {base.lr:g}, training seeds {seeds}: *one size*"
        f" trains every image at {R} x {R} px (batch {base.batch_size}; the [resolution study](resolution.md)'s"
        " configuration and seeds at these steps, its runs reused or trained in their folders: the check below"
        " compares them with the published ones where that page has the same settings),"
        f" *packed* packs images of sides {R // 2} to {study.packed_max * 4} px and any aspect up to 3:1 into the"
        " same number of tokens per step (`python -m scripts.train --packed`, [packing](../packing.md)). Both are"
        " sampled and scored at sizes inside the packed range and beyond both ranges; the one-size model also with"
        " the training-free scalings that did best in the resolution study. Does native-resolution training remove"
        " the need for test-time scaling?",
        "Every figure is a mean with its 95% bootstrap interval over training seeds and samples (paired: every arm"
        " sees the same test images, labels and initial noise: the resolution study's). `(+)` / `(-)`: the paired"
        " interval lies above / below 0.",
        "",
        *environment_lines(env),
        "",
        "## What is measured",
        "",
        "As in the [resolution study](resolution.md): the per-image velocity error (mean over t = "
        + ", ".join(f"{t:g}" for t in base.ts)
        + ") on *grown scenes* (objects scale with the shorter side, as the packed training data draws them) and on a"
        f" *canvas* of 1-{base.max_objects} objects at their {R} px size (drawn for the shorter side where it is"
        f" below {R} px, so every object fits): the canvas is neither model's training distribution, both train on"
        f" one object per image; samples ({base.per_class} per class, half that"
        f" above 4x the training area; Euler {base.euler_steps} steps, guidance {base.cfg_scale:g}) scored by the shape"
        " classifier (class accuracy), object count, the largest object's size relative to its class at"
        f" {R} px, and its colour error. *packed, interpolate to {study.packed_max * 4} px*: the packed model with"
        f" each side longer than its largest trained one ({study.packed_max} tokens) interpolated into it.",
        "",
        data["reproduction"]["text"],
        "",
        "## Summary",
        "",
        "The packed model with plain positions against the one-size model's best arm at each size (the arm with"
        " the lowest mean loss on grown scenes):",
        "",
        *_summary(table, study),
        "",
    ]
    for size in study.sizes:
        arms = [a for a, _, _ in arms_at(study, size)]
        lines += [f"## {size[0]} x {size[1]} px ({_where(study, size)})", ""]
        lines += interval_table(table, size_name(size), arms, METRICS) + [""]
        lines += per_class_table(table, size_name(size), arms, data["sample_labels"][size_name(size)]) + [""]
        lines += [
            "Paired differences:",
            "",
            *difference_table(table, size_name(size), _pairs(study, size), DIFFERENCE_METRICS),
            "",
            *best_lines(table, size_name(size), arms, METRICS),
        ]
        lines += ["", f"![samples at {size_name(size)}]({images[size_name(size)]})", ""]
    lines += section_lines("packing", paper_findings.packing(table))
    lines += correction_lines(table)  # every comparison of the page, Holm-corrected together
    return "\n".join(lines) + "\n"


def _json(table: Table, study: PackingStudy, env: dict) -> dict:
    results = {}
    for size in study.sizes:
        group = size_name(size)
        results[group] = {
            arm: {m.key: list(table.interval(group, arm, m.key)) for m in METRICS} for arm, _, _ in arms_at(study, size)
        }
    return {"environment": env | {"settings": asdict(study)}, "results": results}
