"""From the arms' result files to the study's numbers: means, paired intervals, comparisons.

An arm's mean has the bootstrap interval of :class:`~models.studies.bootstrap.Bootstrap`; a paired
difference (the stated comparisons, effective context, break positions) has the seed-level interval of
:class:`~models.studies.seed_intervals.SeedBootstrap`, the windows clustered by the held-out file they
start in (192 windows come from 16 files, 40 from one: windows of a file are not independent). With
one seed (quick runs) no seed-level interval exists and differences fall back to the windows-only bootstrap.

Everything here is a pure function of the result files (or the page's json, :func:`from_cells`) and the
study's sizes (the bootstrap draws are seeded), so the page and its json can be rebuilt at any time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import bootstrap
from ..bootstrap import Bootstrap, Interval, overlap
from ..seed_intervals import PairedTest, SeedBootstrap
from .design import Arm, Study
from .evaluate import BIN, result_path, window_sources

__all__ = ["BINS_DECIMALS", "Results", "compare", "from_cells", "load"]

BINS_DECIMALS = 4  # per-bin losses kept to 1e-4 nats/byte, so the json holds them in a few characters each


class Results:
    """The per-window numbers of every arm, stacked over seeds, with one set of bootstrap draws per array shape.

    ``sources``: ``[windows]`` the file each window starts in (the clusters of the seed-level intervals);
    ``None``: every window its own cluster."""

    def __init__(self, study: Study, arms: dict[str, Arm], raw: dict[str, list[dict]], sources=None):
        self.study, self.arms, self.raw = study, arms, raw
        self.sources = None if sources is None else list(sources)
        cells, seeds = len(study.depths) * study.trials, len(study.seeds)
        self.loss_draws = Bootstrap(seeds, study.windows, study.draws, seed=0)
        self.probe_draws = Bootstrap(seeds, cells, study.draws, seed=1)
        self.seed_draws = (
            SeedBootstrap(seeds, study.windows, clusters=self.sources, draws=study.draws, seed=0) if seeds > 1 else None
        )

    def losses(self, arm: str, length: int) -> np.ndarray | None:
        """``[seeds, windows]`` losses of ``arm`` at ``length``, or ``None`` where it cannot run."""
        if length not in self.raw[arm][0]["loss"]:
            return None
        return np.stack([r["loss"][length] for r in self.raw[arm]])

    def passes(self, arm: str, length: int) -> np.ndarray | None:
        """``[seeds, depths * trials]`` probe results (1.0 pass), or ``None``."""
        if length not in self.raw[arm][0]["retrieval"]:
            return None
        return np.stack([r["retrieval"][length].reshape(-1) for r in self.raw[arm]]).astype(np.float64)

    def loss(self, arm: str, length: int) -> Interval | None:
        values = self.losses(arm, length)
        return None if values is None else self.loss_draws.interval(values)

    def pass_rate(self, arm: str, length: int) -> Interval | None:
        values = self.passes(arm, length)
        return None if values is None else self.probe_draws.interval(values)

    def paired(self, x: np.ndarray, y: np.ndarray, level: float = 0.95) -> PairedTest:
        """``x - y`` (``[seeds, windows]`` each, paired): the seed-level test, or with one seed the windows-only
        interval (p-value NaN: it enters no correction)."""
        if self.seed_draws is not None:
            return self.seed_draws.difference(x, y, level=level)
        d = self.loss_draws.difference(x, y, level=level)
        per_seed = tuple(float(v) for v in np.nanmean(np.asarray(x, np.float64) - y, 1))
        return PairedTest(d, float("nan"), per_seed, 1, "bootstrap over windows (one seed)")

    def test(self, a: str, b: str, length: int, length_b: int | None = None) -> PairedTest | None:
        """Paired ``loss(a, length) - loss(b, length_b or length)``: the same windows and seeds."""
        x, y = self.losses(a, length), self.losses(b, length_b or length)
        return None if x is None or y is None else self.paired(x, y)

    def difference(self, a: str, b: str, length: int, length_b: int | None = None) -> Interval | None:
        test = self.test(a, b, length, length_b)
        return None if test is None else test.interval

    def ratio(self, arm: str) -> Interval | None:
        """``loss(longest) / loss(context)`` of one arm (the survey table's extrapolation ratio)."""
        x, y = self.losses(arm, self.study.longest), self.losses(arm, self.study.context)
        return None if x is None or y is None else self.loss_draws.ratio(x, y)

    def effective_context(self, arm: str) -> int:
        """The longest length up to which the loss is never significantly above the loss at the training
        context (the paired interval of ``loss(L) - loss(context)`` reaches 0 or below at every length)."""
        best = self.study.context
        for L in self.study.lengths[1:]:
            diff = self.difference(arm, arm, L, self.study.context)
            if diff is None or diff.low > 0:
                break
            best = L
        return best

    def break_arms(self) -> list[str]:
        """The arms whose break position the page states (every arm but the sweeps that runs the longest length)."""
        L = self.study.longest
        return [n for n, a in self.arms.items() if a.family != "sweep" and (a.max_length is None or a.max_length >= L)]

    def curve(self, arm: str) -> np.ndarray:
        """``[n_bins]`` mean loss per 64-position bin over windows and seeds (longest forward)."""
        return np.mean([r["bins"] for r in self.raw[arm]], axis=(0, 1))

    def break_position(self, arm: str) -> int | None:
        """Where the arm breaks: the start of the first 64-position bin past the training context whose loss is
        significantly above that of the context's last bin (paired, seed-level; the 95% holds for
        all bins together, Bonferroni: one bin in 28 of a flat curve would pass a per-bin 95% by chance);
        ``None``: none is."""
        bins = np.stack([r["bins"] for r in self.raw[arm]])  # [S, W, n_bins]
        last = self.study.context // BIN - 1
        level = 1 - 0.05 / max(1, bins.shape[2] - last - 1)
        for b in range(last + 1, bins.shape[2]):
            if self.paired(bins[:, :, b], bins[:, :, last], level=level).interval.low > 0:
                return b * BIN
        return None

    def depth_rates(self, arm: str, length: int) -> list[float] | None:
        """Mean pass rate per depth at ``length`` (the heat map's row)."""
        if length not in self.raw[arm][0]["retrieval"]:
            return None
        return np.mean([r["retrieval"][length] for r in self.raw[arm]], axis=(0, 2)).tolist()


def _float64(result: dict) -> dict:
    """One result file's arrays as the json holds them: float64 (float32 widens exactly), bins rounded."""
    loss = {L: np.asarray(v, dtype=np.float64) for L, v in result["loss"].items()}
    bins = np.round(np.asarray(result["bins"], dtype=np.float64), BINS_DECIMALS)
    return {"loss": loss, "bins": bins, "retrieval": result["retrieval"]}


def load(study: Study, root: Path, arms: dict[str, Arm]) -> Results:
    """Every arm's result files (one per seed) as :class:`Results`."""
    raw = {}
    for name, arm in arms.items():
        raw[name] = [_float64(torch.load(result_path(root, arm, s), weights_only=False)) for s in study.seeds]
    return Results(study, arms, raw, window_sources(study))


def from_cells(study: Study, arms: dict[str, Arm], cells: dict, sources: list[str]) -> Results:
    """The :class:`Results` whose numbers ``cells`` holds (the json's ``cells``: lengths as strings)."""
    shape = (len(study.depths), study.trials)
    raw = {}
    for name, c in cells.items():
        raw[name] = [
            {
                "loss": {int(L): np.asarray(v[s], dtype=np.float64) for L, v in c["loss"].items()},
                "bins": np.asarray(c["bins"][s], dtype=np.float64) if "bins" in c else None,
                "retrieval": {int(L): np.asarray(v[s], dtype=bool).reshape(shape) for L, v in c["retrieval"].items()},
            }
            for s in range(len(study.seeds))
        ]
    return Results(study, {n: arms[n] for n in cells}, raw, sources)


def verdict(diff: Interval, a: Interval, b: Interval) -> str:
    """Words that follow from the intervals: which is lower, or that they are not told apart."""
    paired = bootstrap.verdict(diff)
    sides = "their intervals overlap" if overlap(a, b) else "their intervals do not overlap"
    if paired == "no difference shown":
        return f"not resolved: the paired difference's interval contains 0 ({sides})"
    return f"{paired} (paired interval excludes 0; {sides})"


def compare(results: Results, pairs: list[tuple[str, str, int]]) -> list[dict]:
    """``[{a, b, length, difference, test, a_loss, b_loss, verdict}]`` for each ``(a, b, length)`` both arms ran."""
    out = []
    for a, b, L in pairs:
        test = results.test(a, b, L)
        if test is None:
            continue
        diff, la, lb = test.interval, results.loss(a, L), results.loss(b, L)
        out.append({"a": a, "b": b, "length": L, "difference": diff, "test": test, "a_loss": la, "b_loss": lb})
        out[-1]["verdict"] = verdict(diff, la, lb)
    return out
