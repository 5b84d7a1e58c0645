"""Running an experiment's jobs two at a time, resumably: trainings, fine-tunings, evaluations.

The length study (:mod:`.length`) and the vision studies (:mod:`.vision`) run here.

A job writes its result to its own file (a run folder's checkpoint, an evaluation's json) and is
skipped when that file holds the result of the same settings, so an interrupted study resumes
where it stopped. Workers are spawned processes with one thread each (two models train at once on
two cores); ``workers=0`` runs every job in this process, in order.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..training import checkpoint
from ..training.config import TrainConfig, config_differences
from ..training.trainer import Run, trained_weights

__all__ = ["Job", "checkpoint_hash", "ensure_trained", "read_result", "run_jobs", "write_result"]


@dataclass(frozen=True)
class Job:
    """One unit of work named ``key`` (``"train/s0"``, ``"eval/s0/128x128"``), run after every job in ``needs``."""

    key: str
    needs: tuple[str, ...] = ()


def checkpoint_hash(run_dir: str | Path) -> str:
    """The first 12 hex digits of the SHA-256 of a run's ``checkpoint.safetensors`` (the page cites it)."""
    return hashlib.sha256((Path(run_dir) / "checkpoint.safetensors").read_bytes()).hexdigest()[:12]


def ensure_trained(cfg: TrainConfig, start_from: str | Path | None = None) -> str:
    """Train ``cfg`` into ``cfg.out`` unless it is there (``"reused"``, ``"resumed"`` or ``"trained"``).

    A checkpoint of the same settings (``config.json``; the weight-neutral fields aside) is reused, or
    resumed to ``cfg.steps``; one of other settings raises :class:`~models.training.checkpoint.CheckpointError`
    (never overwritten). A fresh run starts from the EMA weights of the run folder ``start_from`` if given.
    """
    out = Path(cfg.out)
    if (out / "checkpoint.safetensors").is_file():
        saved = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
        diff = config_differences(saved, cfg)
        if diff:
            raise checkpoint.CheckpointError(f"{out} holds another run ({diff}): remove it or choose another root")
        if checkpoint.metadata(out)["step"] >= cfg.steps:
            return "reused"
        Run(replace(cfg, resume=True)).train()
        return "resumed"
    run = Run(replace(cfg, overwrite=True))  # no checkpoint, nothing to lose (a run killed before its first save)
    if start_from is not None:
        _, weights = trained_weights(Path(start_from))
        run.model.load_state_dict(weights)
        run.ema = [p.detach().clone() for p in run.model.parameters()]
    run.train()
    return "trained"


def read_result(path: Path, settings: dict) -> dict | None:
    """The result saved at ``path`` if it was computed with ``settings`` (json-equal), else ``None``."""
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["result"] if saved.get("settings") == json.loads(json.dumps(settings)) else None


def write_result(path: Path, settings: dict, result: dict) -> None:
    """Save ``result`` with the ``settings`` that produced it (written whole, then renamed: never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"settings": settings, "result": result}))
    partial.replace(path)


def _one_thread() -> None:
    torch.set_num_threads(1)


def run_jobs(jobs: list[Job], execute: Callable[[Job], str], root: Path, workers: int, log=print) -> float:
    """Run ``jobs`` (respecting ``needs``), ``workers`` at a time; ``execute(job)`` (picklable) returns what it
    did. Each job's seconds are appended to ``root/jobs.jsonl``. Returns the wall time in seconds."""
    tic, done, pending = time.perf_counter(), set(), list(jobs)
    root.mkdir(parents=True, exist_ok=True)

    def finished(job: Job, what: str, started: float) -> None:
        done.add(job.key)
        seconds = time.perf_counter() - started
        log(f"[{len(done)}/{len(jobs)}] {job.key}: {what} ({seconds:.0f} s)")
        if what != "reused":
            with open(root / "jobs.jsonl", "a") as f:
                f.write(json.dumps({"key": job.key, "what": what, "seconds": seconds}) + "\n")

    if workers == 0:  # here, one thread as a worker has (a busy 2-core machine runs many threads far slower)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for job in pending:
                started = time.perf_counter()
                finished(job, execute(job), started)
        finally:
            torch.set_num_threads(threads)
        return time.perf_counter() - tic
    context = multiprocessing.get_context("spawn")  # no fork of a process whose torch threads run
    with ProcessPoolExecutor(workers, context, initializer=_one_thread) as pool:
        running = {}
        while pending or running:
            ready = [j for j in pending if all(n in done for n in j.needs)]
            for job in ready[: workers - len(running)]:
                pending.remove(job)
                running[pool.submit(execute, job)] = (job, time.perf_counter())
            if not running:
                missing = sorted({n for j in pending for n in j.needs} - done - {j.key for j in pending})
                raise RuntimeError(f"jobs wait for jobs that do not exist: {missing}")
            over, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in over:
                job, started = running.pop(future)
                finished(job, future.result(), started)  # a failed job raises here and stops the study
    return time.perf_counter() - tic


def compute_seconds(root: Path) -> dict[str, float]:
    """Worker seconds per kind of job (the part of the key before ``/``), the latest record of each job."""
    from ..training.rundir import read_log

    latest = {r["key"]: r["seconds"] for r in read_log(root / "jobs.jsonl")}
    out: dict[str, float] = {}
    for key, seconds in latest.items():
        out[key.split("/")[0]] = out.get(key.split("/")[0], 0.0) + seconds
    return out
