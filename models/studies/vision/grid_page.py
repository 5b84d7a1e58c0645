"""docs/experiments/grid.md from the grid study's finished cells: the declared family, exploratory tables, json.

The page is built from whatever cells exist (a session may end mid-study): at each size the seeds whose
declared arms are all done, and the arms done for every one of those seeds; the rest is listed as not run.
The declared family (:func:`~models.studies.vision.grid.declared_family`) is Holm-corrected on its own with
a contrast not run counting as p = 1; every other comparison is exploratory, Benjamini-Hochberg, and marked so
(:mod:`models.studies.family`). :func:`markdown` rebuilds the page from the json alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .. import paper_findings
from ..family import correct_declared
from ..papers import section_lines
from ..seed_intervals import crossed_t
from . import figures
from .grid import GridStudy, arms_at, declared_family, factors, plane_counts, policy_arm, size_name
from .grid_eval import cell_path, samples_path
from .report import (
    Metric,
    Table,
    difference_table,
    environment_lines,
    interval_table,
    settings_to,
    table_from_cells,
    table_to_cells,
)
from .resolution import sample_inputs

__all__ = ["METRICS", "build", "markdown", "page"]

METRICS = [
    Metric("shape_error", "shape error (E1)", True, 3),
    Metric("correct", "class accuracy", False, 2),
    Metric("empty", "empty", True, 2),
    Metric("objects", "objects", None, 2),
    Metric("size", "size (x trained)", None, 2),
    Metric("aspect", "aspect (log2 w/h)", None, 2),
    Metric("canvas_error", "canvas error", True, 3),
    Metric("loss_grown", "loss, grown scenes", True, 4),
    Metric("loss_canvas", "loss, canvas", True, 4),
]
COMPARED = ("shape_error", "correct", "empty", "loss_grown", "loss_canvas")  # the exploratory difference tables
ALPHA = 0.05


def build(study: GridStudy, root: Path) -> tuple[Table, dict[str, list[int]], dict[str, dict[str, list[int]]]]:
    """The finished cells as a :class:`Table`, the seeds in it per size, and per size and arm the seeds done."""
    from .grid import PRIMARY_ARMS

    values, seeds_of, done = {}, {}, {}
    for size in study.sizes:
        group, results = size_name(size), {}
        for arm in arms_at(study, size):
            for seed in study.seeds:
                path = cell_path(root, seed, size, arm)
                if path.is_file():
                    results[(seed, arm)] = json.loads(path.read_text())["result"]
        done[group] = {arm: [s for s in study.seeds if (s, arm) in results] for arm in arms_at(study, size)}
        anchors = [a for a in done[group] if a in PRIMARY_ARMS or a == "trained size"]
        seeds = [s for s in study.seeds if all(s in done[group][a] for a in anchors)]
        if not seeds:
            continue
        seeds_of[group] = seeds
        for arm, have in done[group].items():
            if all(s in have for s in seeds):
                for m in METRICS:
                    rows = [results[(s, arm)][m.key] for s in seeds]
                    values[(group, arm, m.key)] = np.array(rows, dtype=np.float64)
    return Table(values, study.draws), seeds_of, done


def pictures(study: GridStudy, root: Path, out: Path, table: Table) -> dict[str, str]:
    """One labelled grid per size with samples (rows: arms; two samples per class of the first seed)."""
    paths = {}
    for size in study.sizes:
        rows = []
        for arm in arms_at(study, size):
            path = samples_path(root, size, arm)
            if table.has(size_name(size), arm, "correct") and path.is_file():
                images = torch.load(path)
                n = images.shape[0] // 4
                rows.append((arm, images[[c * n + i for c in range(4) for i in range(min(2, n))]]))
        if rows:
            target = figures.labelled_grid(rows, out / "img" / f"grid_{size_name(size)}.png")
            paths[size_name(size)] = target.relative_to(out).as_posix()
    return paths


def page(study: GridStudy, root: Path, out: Path, env: dict) -> str:
    """Write ``out/grid.json`` (every finished cell) and the pictures; return the page (:func:`markdown` of it)."""
    table, seeds_of, done = build(study, root)
    checks = {}
    for name in ("classifier_check", "quality_check"):  # the validate job's files (absent before it ran)
        path = root / f"{name}.json"
        checks[name] = json.loads(path.read_text())["result"] if path.is_file() else None
    data = {
        "environment": env | {"settings": asdict(study)},
        "cells": table_to_cells(table),
        "seeds": seeds_of,
        "done": done,
        "planes": {
            f"{f:g}": plane_counts(study, f) for f in sorted({max(factors(study, s)) for s in study.sizes} - {1})
        },
        "policy": {size_name(s): policy_arm(study, s) for s in study.sizes if s != (study.resolution,) * 2},
        "sample_labels": {size_name(s): sample_inputs(study, s)[0].tolist() for s in study.sizes},
        "images": pictures(study, root, out, table),
    } | checks
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps(data, indent=1))
    return markdown(data)


def _primary(table: Table, study: GridStudy) -> tuple[list[str], dict]:
    """The declared family's table and its tests (two or more seeds), each with its family-adjusted interval."""
    family = declared_family(study)
    tests, lines = (
        {},
        [
            "| # | question | contrast | size | endpoint | difference [95%] | family-adjusted | Holm p | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ],
    )
    for c in family:
        x, y = table.values.get((c.group, c.a, c.metric)), table.values.get((c.group, c.b, c.metric))
        if x is not None and y is not None and x.shape[0] >= 2:
            tests[c.key] = crossed_t(x, y)
    corrected = correct_declared(tests | table.tests, family)
    for i, c in enumerate(family, 1):
        endpoint = {"shape_error": "E1 shape error", "correct": "E2 class accuracy"}[c.metric]
        head = f"| {i} | {c.question} | {c.a} - {c.b} | {c.group} | {endpoint} |"
        if c.key not in tests:
            why = "not run" if (c.group, c.a, c.metric) not in table.values else "one seed: no seed-level interval"
            lines.append(f"{head} - | - | 1 (counted) | {why} |")
            continue
        x, y = table.values[(c.group, c.a, c.metric)], table.values[(c.group, c.b, c.metric)]
        wide = crossed_t(x, y, level=1 - ALPHA / len(family)).interval
        p = corrected[c.key].adjusted
        verdict = ("lower" if wide.mean < 0 else "higher") if p < ALPHA else "no difference shown"
        digits = 3 if c.metric == "shape_error" else 2
        lines.append(f"{head} {tests[c.key].interval.format(digits)} | {wide.format(digits)} | {p:.3g} | {verdict} |")
    return lines, corrected


def markdown(data: dict) -> str:
    """The page from its json (:func:`page` writes it): every interval recomputed from the cells, the same draws."""
    env, study = data["environment"], settings_to(GridStudy, data["environment"]["settings"])
    table = table_from_cells(data["cells"], study.draws)
    R, trained = study.resolution, size_name((study.resolution, study.resolution))
    lines = [
        "# Scalings where they differ: the pre-registered grid study",
        "",
        f"The design, declared before any run: [design.md](design.md). An image DiT (preset `{study.preset}`: width"
        f" 128, depth 4, 2 heads of 64 channels, patch 2) trained at {R} px ({R // 2} x {R // 2} tokens, 16 rotary"
        f" planes per axis, theta 100) for {study.steps} steps of batch {study.batch_size}; {study.per_class * 4}"
        f" samples per seed, arm and size ({study.trained_per_class * 4} at the trained size), Euler"
        f" {study.euler_steps} steps, guidance {study.cfg_scale:g}. **Status**: {_status(data, study)}",
        "",
        *environment_lines(env),
        "",
        "## The grid",
        "",
        "What each scaling does to an axis' 16 planes (`ar.inv_freq`; wavelengths "
        + ", ".join(f"{w:g}" for w in next(iter(data["planes"].values()))["wavelengths"])
        + " tokens):",
        "",
        "| factor | YaRN kept / ramp / interpolated | Dy-YaRN interpolated at t = 1, 0.5, 0.25 | NTK ratio, planes 4-9 |",
        "|---|---|---|---|",
        *[
            f"| {f} | {p['yarn']['kept']} / {p['yarn']['ramp']} / {p['yarn']['interpolated']} | "
            + ", ".join(str(p["dy_yarn"][t]["interpolated"]) for t in ("1.0", "0.5", "0.25"))
            + f" | {p['ntk_ratio'][4]:.2f}-{p['ntk_ratio'][9]:.2f} |"
            for f, p in data["planes"].items()
        ],
        "",
        "The automatic policy (`axial_rope.policy`, content positions) is, per size: "
        + "; ".join(f"{g}: `{a}`" for g, a in data["policy"].items())
        + " (the same rotation: its cells are that arm's).",
        "",
        *_checks(data),
        "## Primary contrasts (declared)",
        "",
        f"Holm's correction over exactly these {len(declared_family(study))} contrasts (a contrast not run counts"
        " with p = 1); *difference*: the seed-level 95% interval (`crossed_t`); *family-adjusted*: the same at"
        f" 1 - {ALPHA:g}/{len(declared_family(study))} (Bonferroni: simultaneous, conservative for Holm).",
        "",
    ]
    primary, corrected = _primary(table, study)
    lines += primary + [""]
    for size in study.sizes:
        group = size_name(size)
        arms = [a for a in arms_at(study, size) if table.has(group, a, "correct")]
        if not arms:
            continue
        seeds = ", ".join(map(str, data["seeds"][group]))
        lines += [f"## {size[0]} x {size[1]} px (seeds {seeds})", ""]
        lines += interval_table(table, group, arms, METRICS) + [""]
        pairs = [(a, ref) for ref in ("none", "interpolate") if ref in arms for a in arms if a != ref]
        if pairs and group != trained:
            lines += [
                "Paired differences (*exploratory*, marks uncorrected; those in the declared family are corrected"
                " above):",
                "",
                *difference_table(table, group, pairs, [m for m in METRICS if m.key in COMPARED]),
                "",
            ]
        if group in data["images"]:
            lines += [f"![samples at {group}]({data['images'][group]})", ""]
    lines += section_lines("grid", paper_findings.grid(table, study))
    lines += _corrections(corrected)
    lines += _done_table(data, study)
    return "\n".join(lines) + "\n"


def _status(data: dict, study: GridStudy) -> str:
    cells = sum(len(arms) for arms in data["done"].values()) * len(study.seeds)
    finished = sum(len(seeds) for arms in data["done"].values() for seeds in arms.values())
    seeds = sorted({s for group in data["seeds"].values() for s in group})
    return f"{finished} of {cells} cells done (seeds {', '.join(map(str, seeds)) or 'none'}; the table at the end)." + (
        " With one seed there is no seed-level interval: every figure is descriptive." if len(seeds) < 2 else ""
    )


def _checks(data: dict) -> list[str]:
    lines = []
    if data.get("classifier_check"):
        lines += [
            "## Metric checks",
            "",
            "The classifier through the whole pipeline on held-out renders, per size:",
            "",
            "| size | grown: accuracy | canvas: per-object accuracy |",
            "|---|---|---|",
            *[
                f"| {g} | {c['grown_accuracy']:.3f} | {c['canvas_object_accuracy']:.3f} |"
                for g, c in data["classifier_check"].items()
            ],
            "",
        ]
    if data.get("quality_check"):
        conditions = list(next(iter(data["quality_check"].values())))
        lines += [
            "The shape error (E1) on clean and changed renders (mean [95% over renders]); it must rise from *clean*:",
            "",
            "| size | " + " | ".join(conditions) + " |",
            "|---|" + "---|" * len(conditions),
            *[
                f"| {g} | "
                + " | ".join(f"{row[c][0]:.2f} [{row[c][1]:.2f}, {row[c][2]:.2f}]" for c in conditions)
                + " |"
                for g, row in data["quality_check"].items()
            ],
            "",
        ]
    return lines


def _corrections(corrected: dict) -> list[str]:
    primary = {k: c for k, c in corrected.items() if c.primary}
    rest = {k: c for k, c in corrected.items() if not c.primary}
    names = [f"{a} - {b} ({m}, {g})" for (g, a, b, m), c in rest.items() if c.significant(ALPHA)]
    return [
        "## Multiple comparisons",
        "",
        f"Primary: Holm over the {len(primary)} declared contrasts (above). *Exploratory*: Benjamini-Hochberg over"
        f" the page's other {len(rest)} paired comparisons (false discovery rate {ALPHA:g}); significant there: "
        + ("; ".join(names) if names else "none")
        + ".",
        "",
    ]


def _done_table(data: dict, study: GridStudy) -> list[str]:
    lines = ["## Cells done", "", "| size | arm | seeds done |", "|---|---|---|"]
    for group, arms in data["done"].items():
        lines += [f"| {group} | {arm} | {', '.join(map(str, s)) or '-'} |" for arm, s in arms.items()]
    return lines
