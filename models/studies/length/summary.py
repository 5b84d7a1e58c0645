"""From the arms' result files to the study's numbers: means, paired bootstrap intervals, comparisons.

Everything here is a pure function of the result files and the study's sizes (the bootstrap
draws are seeded), so the page and its json can be rebuilt from ``ROOT/eval`` at any time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import bootstrap
from ..bootstrap import Bootstrap, Interval, overlap
from .design import Arm, Study
from .evaluate import BIN, result_path

__all__ = ["Results", "compare", "load"]


class Results:
    """The per-window numbers of every arm, stacked over seeds, with one set of bootstrap draws per array shape."""

    def __init__(self, study: Study, arms: dict[str, Arm], raw: dict[str, list[dict]]):
        self.study, self.arms, self.raw = study, arms, raw
        cells = len(study.depths) * study.trials
        self.loss_draws = Bootstrap(len(study.seeds), study.windows, study.draws, seed=0)
        self.probe_draws = Bootstrap(len(study.seeds), cells, study.draws, seed=1)

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

    def difference(self, a: str, b: str, length: int, length_b: int | None = None) -> Interval | None:
        """Paired ``loss(a, length) - loss(b, length_b or length)``: the same windows and seeds."""
        x, y = self.losses(a, length), self.losses(b, length_b or length)
        return None if x is None or y is None else self.loss_draws.difference(x, y)

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

    def curve(self, arm: str) -> np.ndarray:
        """``[n_bins]`` mean loss per 64-position bin over windows and seeds (longest forward)."""
        return np.mean([r["bins"] for r in self.raw[arm]], axis=(0, 1))

    def break_position(self, arm: str) -> int | None:
        """Where the arm breaks: the start of the first 64-position bin past the training context whose loss is
        significantly above that of the context's last bin (paired over windows and seeds; the 95% holds for
        all bins together, Bonferroni: one bin in 28 of a flat curve would pass a per-bin 95% by chance);
        ``None``: none is."""
        bins = np.stack([r["bins"] for r in self.raw[arm]])  # [S, W, n_bins]
        last = self.study.context // BIN - 1
        level = 1 - 0.05 / max(1, bins.shape[2] - last - 1)
        for b in range(last + 1, bins.shape[2]):
            if self.loss_draws.difference(bins[:, :, b], bins[:, :, last], level=level).low > 0:
                return b * BIN
        return None

    def depth_rates(self, arm: str, length: int) -> list[float] | None:
        """Mean pass rate per depth at ``length`` (the heat map's row)."""
        if length not in self.raw[arm][0]["retrieval"]:
            return None
        return np.mean([r["retrieval"][length] for r in self.raw[arm]], axis=(0, 2)).tolist()


def load(study: Study, root: Path, arms: dict[str, Arm]) -> Results:
    """Every arm's result files (one per seed) as :class:`Results`."""
    raw = {}
    for name, arm in arms.items():
        raw[name] = [torch.load(result_path(root, arm, s), weights_only=False) for s in study.seeds]
    return Results(study, arms, raw)


def verdict(diff: Interval, a: Interval, b: Interval) -> str:
    """Words that follow from the intervals: which is lower, or that they are not told apart."""
    paired = bootstrap.verdict(diff)
    sides = "their intervals overlap" if overlap(a, b) else "their intervals do not overlap"
    if paired == "no difference shown":
        return f"not resolved: the paired difference's interval contains 0 ({sides})"
    return f"{paired} (paired interval excludes 0; {sides})"


def compare(results: Results, pairs: list[tuple[str, str, int]]) -> list[dict]:
    """``[{a, b, length, difference, a_loss, b_loss, verdict}]`` for each ``(a, b, length)`` both arms ran."""
    out = []
    for a, b, L in pairs:
        diff = results.difference(a, b, L)
        if diff is None:
            continue
        la, lb = results.loss(a, L), results.loss(b, L)
        out.append({"a": a, "b": b, "length": L, "difference": diff, "a_loss": la, "b_loss": lb})
        out[-1]["verdict"] = verdict(diff, la, lb)
    return out
