"""The resolution and frame-count studies behind ``python -m scripts.experiments resolution|frames``.

Each trains its models over several seeds (two at a time, resumable: finished runs and evaluations
are files under its root and are reused when their settings match), measures samples with metrics
read from pictures (:mod:`.metrics`: a shape classifier, object count, size, colour; for video
presence, motion and repetition), reports every figure with a paired bootstrap interval
(:mod:`models.training.bootstrap`), and writes ``OUT/NAME.md``, ``OUT/NAME.json`` and its pictures under ``OUT/img``.

- :mod:`.resolution`: an image DiT trained at 16 x 16 tokens, at 1.5x, 2x, 3x and 1:2 with every
  position mode (time-dependent Dy-YaRN included) and fine-tuned, on two test sets;
- :mod:`.frames`: a video DiT with HunyuanVideo's temporal rope trained on 8 frames, at 16 and 24
  with none, RIFLEx (k as the paper picks it), interpolation and NTK on the time axis;
- :mod:`.packing`: the image DiT trained packed on mixed sizes and aspects against the resolution
  study's one-size runs, at sizes inside and beyond the packed range, with and without scaling.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

__all__ = ["run_frames", "run_packing", "run_resolution"]


def _log(line: str) -> None:
    print(line, flush=True)


def _study_root(root: Path) -> Path:
    """``root``, refused when it is a training run's folder (``--run-dir`` names the study's root here)."""
    from ..checkpoint import CheckpointError

    if (root / "checkpoint.safetensors").is_file():
        raise CheckpointError(f"{root} holds a training run; the study's runs need a folder of their own (--run-dir)")
    return root


def run_resolution(out: Path, quick: bool = False, root: str | Path | None = None, workers: int | None = None) -> Path:
    """Train, evaluate and write ``out/resolution.md`` (``quick``: toy sizes, seconds; ``root``: the runs)."""
    from ..jobs import checkpoint_hash, compute_seconds, read_result, run_jobs
    from . import resolution, resolution_page
    from .report import environment

    study = resolution.QUICK if quick else resolution.FULL
    study = study if workers is None else replace(study, workers=workers)
    root = _study_root(Path(root or ("runs/resolution_quick" if quick else "runs/resolution")))
    wall = run_jobs(resolution.study_jobs(study), resolution.executor(study, root), root, study.workers, _log)
    hashes = {f"s{s}": checkpoint_hash(resolution.train_config(study, root, s).out) for s in study.seeds}
    hashes |= {f"ft_s{s}": checkpoint_hash(resolution.train_config(study, root, s, True).out) for s in study.seeds}
    command = "python -m scripts.experiments resolution" + (" --quick" if quick else "")
    env = environment(command, wall, compute_seconds(root), hashes, asdict(study))
    check = read_result(root / "classifier_check.json", resolution.validation_settings(study))
    text = resolution_page.page(study, root, out, env, check)
    path = out / "resolution.md"
    path.write_text(text)
    return path


def run_frames(out: Path, quick: bool = False, root: str | Path | None = None, workers: int | None = None) -> Path:
    """Train, evaluate and write ``out/frames.md`` (``quick``: toy sizes, seconds; ``root``: the runs)."""
    from ..jobs import checkpoint_hash, compute_seconds, run_jobs
    from . import frames, frames_page
    from .report import environment

    study = frames.QUICK if quick else frames.FULL
    study = study if workers is None else replace(study, workers=workers)
    root = _study_root(Path(root or ("runs/frames_quick" if quick else "runs/frames")))
    wall = run_jobs(frames.study_jobs(study), frames.executor(study, root), root, study.workers, _log)
    hashes = {name: checkpoint_hash(cfg.out) for name, cfg in frames.all_runs(study, root).items()}
    command = "python -m scripts.experiments frames" + (" --quick" if quick else "")
    env = environment(command, wall, compute_seconds(root), hashes, asdict(study))
    text = frames_page.page(study, root, out, env)
    path = out / "frames.md"
    path.write_text(text)
    return path


def run_packing(
    out: Path,
    quick: bool = False,
    root: str | Path | None = None,
    workers: int | None = None,
    base_root: str | Path | None = None,
) -> Path:
    """Train, evaluate and write ``out/packing.md`` (``quick``: toy sizes, seconds; ``root``: the packed runs and
    evaluations; ``base_root``: the resolution study's root, whose runs are the one-size arm)."""
    from ..jobs import checkpoint_hash, compute_seconds, run_jobs
    from . import packing, packing_page
    from .report import environment

    study = packing.QUICK if quick else packing.FULL
    study = study if workers is None else replace(study, workers=workers)
    study = study if base_root is None else replace(study, base_root=str(base_root))
    root = _study_root(Path(root or ("runs/packing_quick" if quick else "runs/packing")))
    wall = run_jobs(packing.study_jobs(study), packing.executor(study, root), root, study.workers, _log)
    hashes = {
        f"{'packed_' if packed else ''}s{s}": checkpoint_hash(packing.train_config(study, root, s, packed).out)
        for s in study.seeds
        for packed in (False, True)
    }
    command = "python -m scripts.experiments packing" + (" --quick" if quick else "")
    env = environment(command, wall, compute_seconds(root), hashes, asdict(study))
    text = packing_page.page(study, root, out, env)
    path = out / "packing.md"
    path.write_text(text)
    return path
