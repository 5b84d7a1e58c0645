"""docs/experiments/resolution.md from the resolution study's results: tables with intervals, pictures, json."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

import axial_rope as ar

from ...training.data import CLASSES
from .. import paper_findings
from ..papers import section_lines
from . import figures
from .report import (
    INTERVALS,
    Metric,
    Table,
    best_lines,
    correction_lines,
    difference_table,
    environment_lines,
    interval_table,
    load_results,
    per_class_table,
    settings_to,
    table_from_cells,
    table_to_cells,
)
from .resolution import ResolutionStudy, arms_at, finetuned_arm, sample_inputs, samples_path, size_name
from .validation import validation_section

__all__ = ["METRICS", "build_table", "markdown", "page", "sample_labels"]

METRICS = [
    Metric("loss_grown", "loss, grown scenes", True, 4),
    Metric("loss_canvas", "loss, canvas", True, 4),
    Metric("correct", "class accuracy", False, 2),
    Metric("objects", "objects", None, 2),
    Metric("size", "size (x trained)", None, 2),
    Metric("color", "colour error", True, 3),
    Metric("empty", "empty", True, 2),
    Metric("aspect", "aspect (log2 w/h)", None, 2),
]
COMPARED = ("loss_grown", "loss_canvas", "correct", "size", "empty")  # the paired-difference table's metrics


def build_table(study: ResolutionStudy, root: Path) -> Table:
    """``(size, arm, metric) -> [seeds, samples]`` from every evaluation file."""
    values = {}
    for size in study.sizes:
        results = load_results(root, [f"s{seed}_{size_name(size)}" for seed in study.seeds])
        for arm, _ in arms_at(study, size):
            for m in METRICS:
                rows = [results[f"s{seed}_{size_name(size)}"][arm][m.key] for seed in study.seeds]
                values[(size_name(size), arm, m.key)] = np.array(rows, dtype=np.float64)
    return Table(values, study.draws)


def _factor(study: ResolutionStudy, size) -> str:
    h, w = size[0] / study.resolution, size[1] / study.resolution
    return f"{h:g}x" if h == w else f"{h:g}x by {w:g}x"


def _pairs(study: ResolutionStudy, size) -> list[tuple[str, str]]:
    """``(arm, reference)`` of the paired-difference table: each arm against ``none`` and ``interpolate``, and
    each fine-tuned arm against the fine-tune with plain positions (the same steps: the control)."""
    arms = [a for a, _ in arms_at(study, size)]
    pairs = [(arm, ref) for ref in ("none", "interpolate") if ref in arms for arm in arms if arm != ref]
    control = finetuned_arm("none")
    return pairs + [(arm, control) for arm, mode in arms_at(study, size) if mode is None and arm != control]


def yarn_ramp_lines(study: ResolutionStudy) -> list[str]:
    """What YaRN does on this grid: per square size, the frequency pairs of an axis it interpolates as ``Linear``
    does, keeps or ramps (computed with :class:`axial_rope.scaling.YaRN` at the DiT's per-axis width and theta)."""
    from ...dit import PRESETS

    c = PRESETS["tiny"]
    dim, grid = 2 * ((c.hidden_size // c.num_heads) // 4), study.resolution // c.patch_size  # as models.dit builds
    plain = ar.inv_freq(dim, c.theta)[0]  # float64 [dim // 2]
    lines = []
    for size in study.sizes:
        factor = size[0] / study.resolution
        if size[0] != size[1] or factor <= 1:
            continue
        yarn = ar.inv_freq(dim, c.theta, ar.scaling.YaRN(factor, grid))[0]
        interpolated = int(torch.isclose(yarn, ar.inv_freq(dim, c.theta, ar.scaling.Linear(factor))[0]).sum())
        kept = int(torch.isclose(yarn, plain).sum())
        lines.append(f"{_factor(study, size)}: {interpolated} interpolated, {kept} kept, "
                     f"{dim // 2 - interpolated - kept} on the ramp")  # fmt: skip
    return [
        f"YaRN on {grid} tokens per axis: of each axis' {dim // 2} frequency pairs, "
        + "; ".join(lines)
        + ". Its ramp needs pairs that turn more than once over the training length but fewer than 32 times;"
        " on this grid there are almost none, so YaRN differs from interpolation here only by the pairs it keeps"
        " (counted above; truncation rounds the ramp's ends outward) and its attention temperature: its ramp is"
        " not tested.",
    ]


def pictures(study: ResolutionStudy, root: Path, out: Path) -> dict[str, str]:
    """One labelled grid per size (rows: arms; columns: two samples per class of the first seed)."""
    paths = {}
    per = study.per_class
    for size in study.sizes:
        rows = []
        for arm, _ in arms_at(study, size):
            images = torch.load(samples_path(root, size, arm))
            n = images.shape[0] // len(CLASSES)
            pick = [c * n + i for c in range(len(CLASSES)) for i in range(min(2, n, per))]
            rows.append((arm, images[pick]))
        path = figures.labelled_grid(rows, out / "img" / f"resolution_{size_name(size)}.png")
        paths[size_name(size)] = path.relative_to(out).as_posix()
    return paths


def page(study: ResolutionStudy, root: Path, out: Path, env: dict, check: dict) -> str:
    """Write ``out/resolution.json`` (every cell included) and the pictures; return the page's markdown, which
    :func:`markdown` rebuilds from that json alone."""
    table, images = build_table(study, root), pictures(study, root, out)
    data = _json(table, study, env, check) | {"cells": table_to_cells(table), "images": images}
    data["sample_labels"] = sample_labels(study)
    if (out / "metric_validation.json").is_file():  # scripts.validate_metrics: the metrics on known renders
        data["metric_validation"] = json.loads((out / "metric_validation.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "resolution.json").write_text(json.dumps(data, indent=1))
    return markdown(data)


def markdown(data: dict) -> str:
    """The page from its json (:func:`page` writes it): intervals recomputed from the cells, the same draws."""
    env, check, images = data["environment"], data["classifier_check"], data["images"]
    study = settings_to(ResolutionStudy, env["settings"])
    table = table_from_cells(data["cells"], study.draws)
    R, seeds = study.resolution, ", ".join(map(str, study.seeds))
    lines = [
        "# Resolution extrapolation",
        "",
        f"An image DiT (tiny preset: width 128, depth 4, 4 heads, patch 4) trained at {R} px ({R // 4} x {R // 4}"
        f" tokens) for {study.steps} steps of batch {study.batch_size}, training seeds {seeds}, run at larger sizes"
        " with each training-free way to place positions, and fine-tuned at"
        f" {study.finetune_size} px ({study.finetune_steps} steps of batch {study.finetune_batch}, EMA off) under each"
        f" of {', '.join(f'`{m}`' for m in study.finetune_modes)} (`fine-tuned, none`: plain positions, the control"
        " that has the same steps).",
        INTERVALS,
        "",
        *environment_lines(env),
        "",
        "## What is measured",
        "",
        "- **loss**: per-image velocity error, mean over t = " + ", ".join(f"{t:g}" for t in study.ts) + ", on"
        " held-out scenes: *grown scenes* are the training scenes rendered larger (objects grow with the image);"
        f" *canvas* holds 1-{study.max_objects} objects at their trained pixel size on the larger canvas.",
        f"- **samples** ({study.per_class} per class, half that above 4x the training area; Euler {study.euler_steps}"
        f" steps, guidance {study.cfg_scale:g}): *class accuracy* (the classifier reads the conditioning class in the"
        " largest object), *objects* (connected objects), *size* (the largest object's linear size relative to its"
        f" class at {R} px: 1 = trained pixel size, the factor = grown with the image), *colour error* (distance"
        " of its median colour to the palette, 0-1 per channel), *empty* (no object found), *aspect* (log2 of the"
        " largest object's box width over height: 0 square, 1 twice as wide). Every arm's mean is over the same"
        " cells: a cell undefined in any arm (no object: no size) is left out of all, counted under the table.",
        "- `normalize` equals `interpolate` on square sizes (the same rotation: RoPE sees only differences),"
        " so it is evaluated on the non-square size only.",
        "",
        *yarn_ramp_lines(study),
        "",
        "## Classifier check",
        "",
        "The whole pipeline (find objects, crop, classify) on held-out renders, per size:",
        "",
        "| size | grown: accuracy | grown: size | canvas: per-object accuracy | canvas: count correct |",
        "|---|---|---|---|---|",
        *[
            f"| {name} | {c['grown_accuracy']:.3f} | {c['grown_size']:.2f} | {c['canvas_object_accuracy']:.3f} |"
            f" {c['canvas_count_accuracy']:.3f} |"
            for name, c in check.items()
        ],
        "",
    ]
    for size in study.sizes:
        arms = [a for a, _ in arms_at(study, size)]
        lines += [f"## {size[0]} x {size[1]} px ({_factor(study, size)})", ""]
        lines += interval_table(table, size_name(size), arms, METRICS) + [""]
        lines += per_class_table(table, size_name(size), arms, data["sample_labels"][size_name(size)]) + [""]
        if len(arms) > 1:
            lines += [
                "Paired differences:",
                "",
                *difference_table(
                    table, size_name(size), _pairs(study, size), [m for m in METRICS if m.key in COMPARED]
                ),
                "",
                *best_lines(table, size_name(size), arms, METRICS),
            ]
        lines += ["", f"![samples at {size_name(size)}]({images[size_name(size)]})", ""]
    lines += section_lines("resolution", paper_findings.resolution(table))
    lines += correction_lines(table)  # every comparison of the page, Holm-corrected together
    text = "\n".join(lines) + "\n"  # ends in a blank line: the validation section follows it
    return text + validation_section(data["metric_validation"]) if "metric_validation" in data else text


def sample_labels(study: ResolutionStudy) -> dict[str, list[int]]:
    """``{size: [samples]}``: the conditioning class of each sample (the cells' sample order), for the json."""
    return {size_name(size): sample_inputs(study, size)[0].tolist() for size in study.sizes}


def _json(table: Table, study: ResolutionStudy, env: dict, check: dict) -> dict:
    results = {}
    for size in study.sizes:
        group = size_name(size)
        results[group] = {
            arm: {m.key: list(table.interval(group, arm, m.key)) for m in METRICS} for arm, _ in arms_at(study, size)
        }
    return {"environment": env | {"settings": asdict(study)}, "classifier_check": check, "results": results}
