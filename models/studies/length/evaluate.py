"""Evaluating one arm with the models of one seed: per-window losses at every length, per-position curves, retrieval.

The held-out windows are the same for every arm and seed: ``study.windows`` windows of the
longest length, evenly spaced over the standard library's held-out files; the windows of
a shorter length ``L`` are their first ``L`` bytes. One arm and seed give

- ``loss[L]``: ``[W]`` mean next-byte loss (nats/byte) of each window's length-``L`` prefix;
- ``bins``: ``[W, n_bins]`` mean loss per 64-position bin of the longest windows (the
  per-position curves; for ``per_length`` arms: the forward at the longest length);
- ``retrieval[L]``: ``[depths, trials]`` bool, the probe's pass or fail.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ...gpt import GPT
from ...training.data import StdlibText
from ...training.text_task import stdlib_text
from ...training.trainer import load_trained
from .design import Arm, Study, run_dir
from .positions import StudyPositions
from .retrieval import passes, probe_inputs

__all__ = ["BIN", "evaluate_arm", "eval_windows", "result_path", "variant", "window_sources"]

BIN = 64  # positions per bin of the per-position curves
SCHEME_FIELDS = set(StudyPositions.__dataclass_fields__)  # an arm's change to the scheme, not to the config
PROBE_SEED = 0  # the retrieval probes: the same for every arm and seed (paired)


def _starts(study: Study, val: StdlibText) -> torch.Tensor:
    last = len(val) - study.longest - 1  # the last valid start
    return torch.linspace(0, last, study.windows).long()  # [W]


def eval_windows(study: Study, val: StdlibText | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x, y [W, longest]``: the study's held-out windows, evenly spaced (non-overlapping where the text allows)."""
    val = val or stdlib_text("val")
    return val.windows(_starts(study, val), study.longest)


def window_sources(study: Study, val: StdlibText | None = None) -> list[str]:
    """``[W]``: the held-out file each of :func:`eval_windows`'s windows starts in (the clusters of the
    intervals: windows of one file share its style, so they are not independent samples)."""
    val = val or stdlib_text("val")
    return val.source(_starts(study, val))


def variant(model: GPT, change: dict) -> GPT:
    """``model`` with its config or scheme changed (a scaling; a window, Dual Chunk Attention) and the same weights."""
    if not change:
        return model
    scheme = {k: v for k, v in change.items() if k in SCHEME_FIELDS}
    config = {k: v for k, v in change.items() if k not in SCHEME_FIELDS}
    changed = GPT(replace(model.config, **config), positions=replace(model.positions, **scheme))
    changed.load_state_dict(model.state_dict())  # rope tables are buffers, not state: only the config differs
    return changed.eval()


def _batch(model: GPT, length: int) -> int:
    """Windows per forward: explicit ``S x S`` score matrices (biases, windows, DCA, linear) take few at a time."""
    p = model.positions
    explicit = p.position in ("t5", "alibi") or p.window or p.dual_chunk or p.attention == "linear"
    return max(1, (2 if explicit else 8) * 2048 // max(length, 2048)) if length > 512 else 16


@torch.no_grad()
def position_losses(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[W, L]`` next-byte losses (float32) of ``x, y [W, L]``."""
    step, out = _batch(model, x.shape[1]), []
    for i in range(0, len(x), step):
        logits = model(x[i : i + step]).float()  # [b, L, V]
        out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), y[i : i + step], reduction="none"))
    return torch.cat(out)


def _bins(losses: torch.Tensor) -> np.ndarray:
    """``[W, L]`` -> ``[W, L / BIN]`` mean per bin (a partial last bin is dropped)."""
    W, L = losses.shape
    n = max(1, L // BIN)
    return losses[:, : n * BIN].reshape(W, n, -1).mean(-1).numpy()


def _at(arm: Arm, model: GPT, study: Study, length: int) -> GPT:
    """The arm's model at evaluation length ``length``."""
    if arm.change is None:
        return model
    factor = length / study.context if arm.per_length else arm.factor or 1.0
    return variant(model, arm.change(factor))


def losses(arm: Arm, model: GPT, study: Study, x: torch.Tensor, y: torch.Tensor) -> dict:
    """``{"loss": {L: [W]}, "bins": [W, n_bins]}`` of one arm (lengths past ``arm.max_length`` left out)."""
    lengths = [L for L in study.lengths if arm.max_length is None or L <= arm.max_length]
    out = {"loss": {}, "bins": None}
    if not arm.per_length:  # one fixed model: prefixes of the longest forward give every length
        per_pos = position_losses(_at(arm, model, study, lengths[-1]), x[:, : lengths[-1]], y[:, : lengths[-1]])
        out["loss"] = {L: per_pos[:, :L].mean(1).numpy() for L in lengths}
        out["bins"] = _bins(per_pos)
        return out
    for L in lengths:
        per_pos = position_losses(_at(arm, model, study, L), x[:, :L], y[:, :L])
        out["loss"][L] = per_pos.mean(1).numpy()
        if L == lengths[-1]:
            out["bins"] = _bins(per_pos)
    return out


def retrieval(arm: Arm, model: GPT, study: Study, val: StdlibText) -> dict:
    """``{L: [depths, trials] bool}``: the probe at every length the arm runs."""
    out = {}
    for L in study.lengths:
        if arm.max_length is not None and L > arm.max_length:
            continue
        at = _at(arm, model, study, L)
        rows = []
        for depth in study.depths:
            inputs, keys = probe_inputs(val.data, L, depth, study.trials, PROBE_SEED)
            rows.append(passes(at, inputs, keys, batch=_batch(at, L)))
        out[L] = np.stack(rows)
    return out


def result_path(root: Path, arm: Arm, seed: int) -> Path:
    return root / "eval" / f"{arm.slug}_s{seed}.pt"


def evaluate_arm(study: Study, root: Path, arm: Arm, seed: int) -> Path:
    """Evaluate ``arm`` with the models of ``seed``; the result is saved (atomically) and reused if there."""
    path = result_path(root, arm, seed)
    if path.is_file():
        return path
    torch.manual_seed(0)
    _, model = load_trained(run_dir(root, arm.model, seed) / "checkpoint.safetensors")
    val = stdlib_text("val")
    x, y = eval_windows(study, val)
    result = losses(arm, model, study, x, y)
    result["retrieval"] = retrieval(arm, model, study, val) if arm.retrieval else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(result, tmp)
    os.replace(tmp, path)
    return path
