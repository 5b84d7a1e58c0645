"""The length study's jobs: training runs and arm evaluations, run by :func:`models.studies.jobs.run_jobs`.

Every job writes its result into its own file (a run folder's checkpoint, an arm's result
file) and is skipped when that is already there, so an interrupted study picks up where it
stopped. Keys: ``train/<model>/s<seed>``, ``eval/<arm>/s<seed>``.
"""

from __future__ import annotations

from pathlib import Path

from ..jobs import Job, ensure_trained
from .design import Study, arms, run_dir, train_configs
from .evaluate import evaluate_arm, result_path

__all__ = ["execute", "job_key", "study_jobs"]


def job_key(kind: str, name: str, seed: int) -> str:
    return f"{kind}/{name}/s{seed}"


def study_jobs(study: Study) -> list[Job]:
    """Every job of the study: the trainings (fine-tunes after their RoPE run), then the evaluations."""
    jobs = []
    for (model, seed), (_, start) in train_configs(study, Path(".")).items():
        needs = () if start is None else (job_key("train", *start),)
        jobs.append(Job(job_key("train", model, seed), needs))
    for arm in arms(study).values():
        for seed in study.seeds:
            jobs.append(Job(job_key("eval", arm.name, seed), (job_key("train", arm.model, seed),)))
    return jobs


def execute(study: Study, root: Path, job: Job) -> str:
    """Run one job (in a worker or here); returns what happened."""
    kind, rest = job.key.split("/", 1)
    name, seed = rest.rsplit("/s", 1)
    if kind == "train":
        cfg, start = train_configs(study, root)[name, int(seed)]
        return ensure_trained(cfg, None if start is None else run_dir(root, *start))
    arm = arms(study)[name]
    if result_path(root, arm, int(seed)).is_file():
        return "reused"
    evaluate_arm(study, root, arm, int(seed))
    return "evaluated"
