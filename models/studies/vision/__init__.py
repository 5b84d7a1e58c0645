"""The resolution and frame-count studies behind ``python -m scripts.experiments resolution|frames``.

Each trains its models over several seeds (two at a time, resumable: finished runs and evaluations
are files under its root and are reused when their settings match), measures samples with metrics
read from pictures (:mod:`.metrics`: a shape classifier, object count, size, colour; for video
presence, motion and repetition), reports every figure with a paired bootstrap interval
(:mod:`models.studies.bootstrap`), and writes ``OUT/NAME.md``, ``OUT/NAME.json`` and its pictures under ``OUT/img``.

- :mod:`.resolution`: an image DiT trained at 8 x 8 tokens, at 1.5x, 2x, 3x and 1:2 with every
  position mode (time-dependent Dy-YaRN included) and fine-tuned, on two test sets;
- :mod:`.frames`: a video DiT with HunyuanVideo's temporal rope trained on 8 frames, at 16 and 24
  with none, RIFLEx (k as the paper picks it), interpolation and NTK on the time axis;
- :mod:`.packing`: the image DiT trained packed on mixed sizes and aspects against the resolution
  study's one-size runs, at sizes inside and beyond the packed range, with and without scaling;
- :mod:`.grid`: the pre-registered study at 16 x 16 tokens where the scalings differ (docs/experiments/design.md),
  at FiT's sizes and 2x-4x, one resumable job per (seed, size, arm) cell.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

__all__ = ["run_frames", "run_grid", "run_packing", "run_resolution"]


def _log(line: str) -> None:
    print(line, flush=True)


def _study_root(root: Path) -> Path:
    """``root``, refused when it is a training run's folder (``--run-dir`` names the study's root here)."""
    from ...training.checkpoint import CheckpointError

    if (root / "checkpoint.safetensors").is_file():
        raise CheckpointError(f"{root} holds a training run; the study's runs need a folder of their own (--run-dir)")
    return root


def _run_jobs(name: str, module, quick: bool, root, workers: int | None, jobs_args: tuple = (), **changes):
    """A study's settings (``module.QUICK`` or ``module.FULL``, with ``changes``), its root and the wall time of
    its jobs (run two at a time, resumably: :func:`~models.studies.jobs.run_jobs`; ``jobs_args``: more arguments
    of ``module.study_jobs``)."""
    from ..jobs import run_jobs

    changes |= {} if workers is None else {"workers": workers}
    study = replace(module.QUICK if quick else module.FULL, **changes)
    root = _study_root(Path(root or f"runs/{name}{'_quick' if quick else ''}"))
    wall = run_jobs(module.study_jobs(study, *jobs_args), module.executor(study, root), root, study.workers, _log)
    return study, root, wall


def _environment(name: str, quick: bool, wall: float, root: Path, runs: dict, study) -> dict:
    """What the page cites (:func:`.report.environment`), with the checksum of each run folder in ``runs``."""
    from ..jobs import checkpoint_hash, compute_seconds
    from .report import environment

    command = f"python -m scripts.experiments {name}" + (" --quick" if quick else "")
    hashes = {key: checkpoint_hash(run_dir) for key, run_dir in runs.items()}
    return environment(command, wall, compute_seconds(root), hashes, asdict(study))


def _write(out: Path, name: str, text: str) -> Path:
    path = out / f"{name}.md"
    path.write_text(text)
    return path


def run_resolution(out: Path, quick: bool = False, root: str | Path | None = None, workers: int | None = None) -> Path:
    """Train, evaluate and write ``out/resolution.md`` (``quick``: toy sizes, seconds; ``root``: the runs)."""
    from ..jobs import read_result
    from . import resolution, resolution_page

    study, root, wall = _run_jobs("resolution", resolution, quick, root, workers)
    runs = {f"s{s}": resolution.train_config(study, root, s).out for s in study.seeds}
    runs |= {
        f"ft_{mode}_s{s}": resolution.train_config(study, root, s, mode).out
        for s in study.seeds
        for mode in study.finetune_modes
    }
    env = _environment("resolution", quick, wall, root, runs, study)
    check = read_result(root / "classifier_check.json", resolution.validation_settings(study))
    return _write(out, "resolution", resolution_page.page(study, root, out, env, check))


def run_frames(out: Path, quick: bool = False, root: str | Path | None = None, workers: int | None = None) -> Path:
    """Train, evaluate and write ``out/frames.md`` (``quick``: toy sizes, seconds; ``root``: the runs)."""
    from . import frames, frames_page

    study, root, wall = _run_jobs("frames", frames, quick, root, workers)
    runs = {name: cfg.out for name, cfg in frames.all_runs(study, root).items()}
    env = _environment("frames", quick, wall, root, runs, study)
    return _write(out, "frames", frames_page.page(study, root, out, env))


def run_packing(
    out: Path,
    quick: bool = False,
    root: str | Path | None = None,
    workers: int | None = None,
    base_root: str | Path | None = None,
) -> Path:
    """Train, evaluate and write ``out/packing.md`` (``quick``: toy sizes, seconds; ``root``: the packed runs and
    evaluations; ``base_root``: the resolution study's root, whose runs are the one-size arm)."""
    from . import packing, packing_page

    changes = {} if base_root is None else {"base_root": str(base_root)}
    study, root, wall = _run_jobs("packing", packing, quick, root, workers, **changes)
    runs = {
        f"{'packed_' if packed else ''}s{s}": packing.train_config(study, root, s, packed).out
        for s in study.seeds
        for packed in (False, True)
    }
    env = _environment("packing", quick, wall, root, runs, study)
    return _write(out, "packing", packing_page.page(study, root, out, env))


def run_grid(
    out: Path, quick: bool = False, root: str | Path | None = None, workers: int | None = None, stage: str = "all"
) -> Path:
    """Run the grid study's jobs (``stage="pilot"``: the first seed's base model and its trained-size cell only;
    ``"page"``: none, only the page from the cells done) and write ``out/grid.md`` from every finished cell."""
    from . import grid

    if stage == "page":
        study = replace(grid.QUICK if quick else grid.FULL, **({} if workers is None else {"workers": workers}))
        root, wall = _study_root(Path(root or f"runs/grid{'_quick' if quick else ''}")), 0.0
    else:
        study, root, wall = _run_jobs("grid", grid, quick, root, workers, (stage,))
    runs = {f"s{s}": grid.train_config(study, root, s).out for s in study.seeds}
    runs |= {f"ft_{m}_s{s}": grid.train_config(study, root, s, m).out for s in study.seeds for m in study.finetune_modes}
    runs = {k: v for k, v in runs.items() if (Path(v) / "checkpoint.safetensors").is_file()}
    env = _environment("grid", quick, wall, root, runs, study)
    from . import grid_page  # after the jobs: a study runs for days, its page is read at the end

    return _write(out, "grid", grid_page.page(study, root, out, env))
