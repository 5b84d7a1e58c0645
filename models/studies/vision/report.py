"""What both studies' pages share: results as arrays, intervals, 'best and tied' lines, the environment block."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...training.data import CLASSES
from ..bootstrap import Bootstrap, Interval, verdict
from ..seed_intervals import PairedTest, correct, correction_note, crossed_t
from ..settings import settings_to  # noqa: F401 - the pages rebuild their study from the json with it
from .metrics import per_class_accuracy

__all__ = [
    "INTERVALS",
    "Metric",
    "Published",
    "Table",
    "adjusted_p",
    "best_and_tied",
    "best_lines",
    "common_cells",
    "correction_lines",
    "difference_table",
    "environment",
    "interval_table",
    "per_class_table",
    "load_results",
    "mark",
    "settings_to",
    "table_from_cells",
    "table_to_cells",
    "undefined_lines",
]


# how every vision page's intervals are made (Table.interval, Table.difference, correction_lines)
INTERVALS = (
    "A mean carries its 95% bootstrap interval over training seeds and samples (descriptive). A paired difference"
    " (every arm sees the same held-out data, labels and initial noise) carries the seed-level 95% t interval of"
    " a two-way random-effects model with seeds and samples crossed, Satterthwaite's degrees of freedom (`crossed_t`,"
    " models/studies/seed_intervals.py: it covers 0.93-0.97 on synthetic studies with a seed and a shared sample"
    " effect); `(+)` / `(-)`: that interval lies above / below 0. The page ends with every comparison it made,"
    " Holm-corrected together."
)


@dataclass(frozen=True)
class Metric:
    """A column: the key in the results, its heading, whether lower is better (``None``: neither), digits."""

    key: str
    heading: str
    lower_is_better: bool | None
    digits: int = 3


@dataclass(frozen=True)
class Published:
    """Another study's published json, read by a page that checks its own runs of that study's model against it.

    ``cells[group][arm][metric]``: per seed (in the order of ``seeds``) the per-sample values, ``None`` where
    undefined; ``checkpoints``: ``{"s<seed>": hash}`` of the runs that study cites; ``date`` and ``settings``:
    when and with which study settings they were made.
    """

    cells: dict
    seeds: list[int]
    checkpoints: dict[str, str]
    date: str
    settings: dict

    @classmethod
    def read(cls, path: Path) -> Published | None:
        """The json at ``path``, or ``None`` where there is none."""
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        env = data["environment"]
        return cls(data["cells"], env["settings"]["seeds"], env["checkpoints"], env["date"], env["settings"])

    def differing(self, ours: dict, ignore: tuple[str, ...]) -> str:
        """``"field X there, Y here"`` for every setting of ``ours`` (a study's ``asdict``) outside ``ignore`` whose
        published value differs, joined by ``"; "``; ``""`` where none does. ``ignore``: the settings that only
        choose which cells exist (seeds, sizes, arms), which :meth:`largest_gaps` matches cell by cell."""
        ours = json.loads(json.dumps(ours))  # tuples as the json holds them: lists
        return "; ".join(
            f"{k} {self.settings.get(k)} there, {v} here"
            for k, v in ours.items()
            if k not in ignore and self.settings.get(k) != v
        )

    def same_hashes(self, ours: dict[int, str]) -> int:
        """How many of ``ours`` (``{seed: checkpoint hash}``) are the checkpoints it cites."""
        return sum(self.checkpoints.get(f"s{seed}") == h for seed, h in ours.items())

    def seed_mean(self, group: str, arm: str, metric: str, seed: int) -> float:
        """The mean of ``seed``'s defined values in a cell (the cell and seed must be there)."""
        row = self.cells[group][arm][metric][self.seeds.index(seed)]
        return float(np.nanmean(np.array([np.nan if x is None else x for x in row], dtype=float)))

    def largest_gaps(self, ours: dict[tuple[str, str, int], dict[str, float]]) -> tuple[dict[str, float], int]:
        """Per metric the largest ``|our seed mean - theirs|`` over the cells of ``ours`` (``(group, their arm,
        seed) -> {metric: our seed mean}``) that it holds too, and how many such cells there are."""
        worst, cells = {}, 0
        for (group, arm, seed), means in ours.items():
            if seed not in self.seeds or arm not in self.cells.get(group, {}):
                continue
            for metric, mean in means.items():
                worst[metric] = max(worst.get(metric, 0.0), abs(mean - self.seed_mean(group, arm, metric, seed)))
            cells += 1
        return worst, cells


def load_results(root: Path, names: list[str]) -> dict[str, dict]:
    """``{name: result}`` of ``root/eval/<name>.json`` (each written by an evaluation job)."""
    return {name: json.loads((root / "eval" / f"{name}.json").read_text())["result"] for name in names}


def common_cells(values: dict[tuple[str, str, str], np.ndarray]) -> tuple[dict, dict[tuple[str, str], tuple[int, int]]]:
    """``values`` with every cell undefined (NaN) in any arm of a ``(group, metric)`` made undefined in all of
    them, so that every arm's mean is over the same cells; and per ``(group, metric)`` ``(undefined, cells)``.

    Without it an arm that drew no object for a hard sample drops that sample from its ``size`` mean while
    another arm keeps it: the arms would be averaged over different subsets."""
    keys_of: dict[tuple, list] = {}
    for key, v in values.items():
        group, _, metric = key
        keys_of.setdefault((group, metric, np.shape(v)), []).append(key)
    out, undefined = dict(values), {}
    for (group, metric, shape), keys in keys_of.items():
        missing = np.zeros(shape, dtype=bool)
        for key in keys:
            missing |= np.isnan(np.asarray(values[key], dtype=np.float64))
        for key in keys:
            out[key] = np.where(missing, np.nan, np.asarray(values[key], dtype=np.float64))
        n, total = undefined.get((group, metric), (0, 0))
        undefined[(group, metric)] = (n + int(missing.sum()), total + missing.size)
    return out, undefined


class Table:
    """Per ``(group, arm, metric)`` an array ``[seeds, samples]`` and its bootstrap (one per sample count).

    Every arm of a ``(group, metric)`` is averaged over the same cells (:func:`common_cells`);
    ``undefined[(group, metric)]`` is ``(cells dropped, cells)``. A paired difference with two or more seeds
    is the seed-level interval (:func:`~models.studies.seed_intervals.crossed_t`: seeds and samples crossed), recorded in ``tests``
    for the page's correction (:func:`correction_lines`); with one seed (quick runs) the samples-only one."""

    def __init__(self, values: dict[tuple[str, str, str], np.ndarray], draws: int):
        self.values, self.undefined = common_cells(values)
        self.draws, self._boot = draws, {}
        self.tests: dict[tuple[str, str, str, str], PairedTest] = {}  # (group, a, b, metric) -> its test

    def boot(self, key) -> Bootstrap:
        shape = self.values[key].shape
        if shape not in self._boot:
            self._boot[shape] = Bootstrap(*shape, draws=self.draws)
        return self._boot[shape]

    def has(self, group: str, arm: str, metric: str) -> bool:
        return (group, arm, metric) in self.values

    def interval(self, group: str, arm: str, metric: str) -> Interval:
        key = (group, arm, metric)
        return self.boot(key).interval(self.values[key])

    def difference(self, group: str, a: str, b: str, metric: str) -> Interval:
        """``a - b`` on the same cells (paired): the seed-level interval with two or more seeds."""
        key = (group, a, metric)
        x, y = self.values[key], self.values[(group, b, metric)]
        if x.shape[0] < 2:  # one seed: no seed-level interval exists; the bootstrap over samples alone
            return self.boot(key).difference(x, y)
        test = crossed_t(x, y)
        self.tests[(group, a, b, metric)] = test
        return test.interval


def table_to_cells(table: Table) -> dict:
    """``{group: {arm: {metric: [seeds][samples]}}}``: every cell of ``table`` for the page's json (NaN as ``null``),
    so a reader can recompute every interval (:func:`table_from_cells`)."""
    cells: dict = {}
    for (group, arm, metric), v in table.values.items():
        rows = [[None if np.isnan(x) else float(x) for x in row] for row in np.asarray(v, dtype=np.float64)]
        cells.setdefault(group, {}).setdefault(arm, {})[metric] = rows
    return cells


def table_from_cells(cells: dict, draws: int) -> Table:
    """The :class:`Table` whose cells :func:`table_to_cells` wrote (the same draws: the same intervals)."""
    values = {
        (group, arm, metric): np.array([[np.nan if x is None else x for x in row] for row in rows], dtype=np.float64)
        for group, arms in cells.items()
        for arm, metrics in arms.items()
        for metric, rows in metrics.items()
    }
    return Table(values, draws)


def interval_table(table: Table, group: str, arms: list[str], metrics: list[Metric]) -> list[str]:
    """Markdown rows: one per arm, one column per metric with its mean and 95% interval."""
    lines = ["| arm | " + " | ".join(m.heading for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for arm in arms:
        cells = [table.interval(group, arm, m.key).format(m.digits) for m in metrics]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines + undefined_lines(table, group, metrics)


def per_class_table(table: Table, group: str, arms: list[str], labels) -> list[str]:
    """Markdown rows: each arm's class accuracy split by the conditioning class (``labels [samples]``), a mean over
    seeds and that class's samples (no interval: a cell holds only seeds x samples-per-class pictures)."""
    counts = np.bincount(np.asarray(labels), minlength=len(CLASSES))
    seeds = table.values[(group, arms[0], "correct")].shape[0]
    per = f"{counts[0]}" if (counts == counts[0]).all() else "/".join(map(str, counts))  # samples of each class
    lines = [
        f"Class accuracy per conditioning class (a mean over {seeds} seed(s) x {per} samples per class):",
        "",
        "| arm | " + " | ".join(CLASSES) + " |",
        "|---|" + "---|" * len(CLASSES),
    ]
    for arm in arms:
        accuracy = per_class_accuracy(table.values[(group, arm, "correct")], labels)  # [classes]
        lines.append(f"| {arm} | " + " | ".join("-" if np.isnan(a) else f"{a:.2f}" for a in accuracy) + " |")
    return lines


def adjusted_p(table: Table, method: str = "holm") -> dict[tuple[str, str, str, str], float]:
    """``{(group, a, b, metric): adjusted p}`` over every paired comparison the page made, corrected together;
    a pair compared both ways (``a - b`` and ``b - a``: the same test) counts once, in its first direction."""
    tests: dict = {}
    for (group, a, b, metric), test in table.tests.items():
        if not np.isnan(test.p_value) and (group, b, a, metric) not in tests:
            tests[(group, a, b, metric)] = test
    return correct(tests, method) if tests else {}


def correction_lines(table: Table, method: str = "holm", alpha: float = 0.05) -> list[str]:
    """The page's closing section: every paired comparison it made, corrected together (``method``, named)."""
    adjusted = adjusted_p(table, method)
    if not adjusted:
        return []
    significant = [f"{a} - {b} ({metric}, {group})" for (group, a, b, metric), p in adjusted.items() if p < alpha]
    return [
        "## Multiple comparisons",
        "",
        correction_note(method, len(adjusted), alpha),
        "",
        "Significant after the correction: " + ("; ".join(significant) if significant else "none") + ".",
        "",
    ]


def undefined_lines(table: Table, group: str, metrics: list[Metric]) -> list[str]:
    """The line under a table that says how many cells were undefined in some arm (none: no line)."""
    counts = [(m.heading, *table.undefined.get((group, m.key), (0, 0))) for m in metrics]
    counts = [f"{heading} {n} of {total}" for heading, n, total in counts if n]
    if not counts:
        return []
    return ["", "Cells undefined in some arm, left out of every arm's mean: " + "; ".join(counts) + "."]


def best_and_tied(table: Table, group: str, arms: list[str], metric: Metric) -> tuple[str, list[str]]:
    """The arm with the best mean and the arms whose paired difference to it has an interval including 0."""
    means = {a: table.interval(group, a, metric.key).mean for a in arms}
    means = {a: v for a, v in means.items() if not np.isnan(v)}
    best = (min if metric.lower_is_better else max)(means, key=means.get)
    tied = [
        a for a in means if a != best and verdict(table.difference(group, a, best, metric.key)) == "no difference shown"
    ]
    return best, tied


def mark(d: Interval) -> str:
    """``(+)`` / ``(-)`` when a paired difference's interval lies above / below 0, else nothing."""
    return {"higher": "(+)", "lower": "(-)"}.get(verdict(d), "")


def difference_table(table: Table, group: str, pairs: list[tuple[str, str]], metrics: list[Metric]) -> list[str]:
    """Markdown rows: one per ``(arm, reference)``, each metric's paired difference ``arm - reference`` and its mark."""
    lines = ["| arm - reference | " + " | ".join(m.heading for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for arm, ref in pairs:
        cells = []
        for m in metrics:
            d = table.difference(group, arm, ref, m.key)
            cells.append(f"{d.format(m.digits)} {mark(d)}")
        lines.append(f"| {arm} - {ref} | " + " | ".join(cells) + " |")
    return lines


def best_lines(table: Table, group: str, arms: list[str], metrics: list[Metric]) -> list[str]:
    """One line per ranked metric: the best arm and those not distinguishable from it (none for one arm)."""
    lines = []
    for m in metrics:
        if m.lower_is_better is None or len(arms) < 2:
            continue
        best, tied = best_and_tied(table, group, arms, m)
        rest = f" (not distinguishable from it: {', '.join(tied)})" if tied else " (every other arm differs)"
        lines.append(f"- {m.heading}: best {best}{rest}.")
    return lines


def environment(command: str, wall: float, compute: dict, hashes: dict, study: dict) -> dict:
    """What the page cites: command, machine, versions, date, times, checkpoints and the study's settings."""
    import diffusers

    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "diffusers": diffusers.__version__,
        },  # fmt: skip
        "wall_seconds": round(wall),
        "worker_seconds": {k: round(v) for k, v in compute.items()},
        "checkpoints": hashes,
        "settings": study,
    }


def environment_lines(env: dict) -> list[str]:
    """The page's reproduction block."""
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    work = ", ".join(f"{k} {v} s" for k, v in env["worker_seconds"].items())
    hashes = ", ".join(f"`{k}` {v}" for k, v in env["checkpoints"].items())
    return [
        f"Command: `{env['command']}` ({env['date']}, {env['machine']}; {versions}).",
        f"Wall time of this invocation: {env['wall_seconds']} s; worker time of the results (one thread each): {work}.",
        f"Checkpoints (SHA-256 of `checkpoint.safetensors`, first 12 hex digits): {hashes}.",
        "The full configuration is in the page's json (`environment.settings`).",
    ]
