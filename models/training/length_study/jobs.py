"""Running the study's jobs: training runs and arm evaluations, two at a time, resumable.

Every job writes its result into its own file (a run folder's checkpoint, an arm's result
file) and is skipped when that is already there, so an interrupted study picks up where it
stopped. Workers are separate processes with one thread each (``torch.set_num_threads(1)``):
two models train at once on a 2-core machine. ``workers=0`` runs everything in this process.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import checkpoint
from ..config import config_differences
from ..trainer import Run, trained_weights
from .design import Study, arms, run_dir, train_configs
from .evaluate import evaluate_arm, result_path

__all__ = ["Job", "compute_seconds", "ensure_trained", "run_jobs", "study_jobs"]


def ensure_trained(cfg, start_from: str | Path | None = None) -> str:
    """Train ``cfg`` into ``cfg.out`` unless it is there: the run folder's reuse rule of the experiments.

    A checkpoint of the same settings (``config.json``, weight-neutral fields aside) is reused,
    or resumed to ``cfg.steps``; one of other settings raises :class:`~models.training.checkpoint.CheckpointError`.
    A fresh run starts from the weights of ``start_from`` (a run folder: fine-tuning) if given.
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
    run = Run(replace(cfg, overwrite=True))  # no checkpoint: nothing to lose (a run killed before its first save)
    if start_from is not None:
        _, weights = trained_weights(Path(start_from))
        run.model.load_state_dict(weights)
        run.ema = [p.detach().clone() for p in run.model.parameters()]
    run.train()
    return "trained"


@dataclass(frozen=True)
class Job:
    """One unit of work: ``("train", model, seed)`` or ``("eval", arm name, seed)``, after its ``needs``."""

    kind: str
    name: str
    seed: int
    needs: tuple[tuple[str, str, int], ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        return self.kind, self.name, self.seed


def study_jobs(study: Study) -> list[Job]:
    """Every job of the study: the trainings (fine-tunes after their RoPE run), then the evaluations."""
    jobs = []
    for (model, seed), (_, start) in train_configs(study, Path(".")).items():
        needs = () if start is None else (("train", *start),)
        jobs.append(Job("train", model, seed, needs))
    for arm in arms(study).values():
        for seed in study.seeds:
            jobs.append(Job("eval", arm.name, seed, (("train", arm.model, seed),)))
    return jobs


def _setup(threads: int) -> None:
    torch.set_num_threads(threads)


def execute(study: Study, root: Path, job: Job) -> str:
    """Run one job (in a worker or here); returns what happened."""
    if job.kind == "train":
        cfg, start = train_configs(study, root)[job.name, job.seed]
        return ensure_trained(cfg, None if start is None else run_dir(root, *start))
    arm = arms(study)[job.name]
    if result_path(root, arm, job.seed).is_file():
        return "reused"
    evaluate_arm(study, root, arm, job.seed)
    return "evaluated"


def run_jobs(study: Study, root: Path, jobs: list[Job], log=print) -> float:
    """Run ``jobs`` respecting their ``needs``, ``study.workers`` at a time; returns the wall time (s)."""
    tic, done, total = time.perf_counter(), set(), len(jobs)
    root.mkdir(parents=True, exist_ok=True)
    pending = list(jobs)

    def report(job: Job, what: str, started: float) -> None:
        done.add(job.key)
        elapsed = time.perf_counter() - started
        log(f"[{len(done)}/{total}] {job.kind} {job.name} s{job.seed}: {what} ({elapsed:.0f} s)")
        if what != "reused":  # the compute each result took, kept across resumed invocations
            record = {"kind": job.kind, "name": job.name, "seed": job.seed, "what": what, "seconds": elapsed}
            with open(root / "jobs.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    if study.workers == 0:
        for job in pending:
            started = time.perf_counter()
            report(job, execute(study, root, job), started)
        return time.perf_counter() - tic
    context = multiprocessing.get_context("spawn")  # no fork of a process whose torch threads are running
    with ProcessPoolExecutor(study.workers, context, initializer=_setup, initargs=(1,)) as pool:
        running = {}
        while pending or running:
            ready = [j for j in pending if all(n in done for n in j.needs)]
            for job in ready[: study.workers - len(running)]:
                pending.remove(job)
                running[pool.submit(execute, study, root, job)] = (job, time.perf_counter())
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                job, started = running.pop(future)
                report(job, future.result(), started)  # a failed job raises here and stops the study
    sys.stdout.flush()
    return time.perf_counter() - tic


def compute_seconds(root: Path) -> dict[str, float]:
    """``{"train", "eval"}``: seconds of one worker the study's results took (the latest record of each job)."""
    from ..rundir import read_log

    latest = {(r["kind"], r["name"], r["seed"]): r["seconds"] for r in read_log(root / "jobs.jsonl")}
    return {kind: sum(s for (k, _, _), s in latest.items() if k == kind) for kind in ("train", "eval")}
