"""The competence pilot (``python -m scripts.experiments pilot``): is each study's base model good enough to judge?

Issue 24 asks that every study's base model first be competent at its own training size before
any arm is compared on it. The pilot trains one seed of each base model at the sizes of the
re-run's design (docs/experiments.md, "Re-running") and measures it there, with the studies' own
training runs, samplers and metrics (nothing is re-implemented here):

- image DiT (the resolution and packing studies' base): 32 px, class accuracy of its samples read by
  the shape classifier (:func:`.vision.resolution.evaluate` at the training size), criterion >= 0.8;
- video DiT (the frame study's base): 16 px x 8 frames, the share of frames that show an object
  (``presence`` of :func:`.vision.frames.evaluate` at the training length), criterion >= 0.9;
- GPT ``lm-rope`` (the length study's base): context 256, the passkey probe inside that context
  (:mod:`.length.retrieval` through :func:`.length.evaluate.evaluate_arm`), criterion >= 0.9.

One seed: the intervals are 95% bootstrap intervals over samples (probes) of that one model, not
over training seeds; they say how well the samples pin down this model, not how another seed would do.
The json holds every per-sample value, the step times and the table (:func:`markdown` rebuilds it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..training.data import CLASSES
from .bootstrap import Bootstrap, Interval
from .jobs import Job, checkpoint_hash, compute_seconds, ensure_trained, read_result, run_jobs, write_result

__all__ = ["FULL", "QUICK", "Pilot", "markdown", "run", "verdict"]


@dataclass(frozen=True)
class Pilot:
    """The pilot's sizes (``FULL``: the design's; ``QUICK``: seconds, plumbing only)."""

    seed: int = 0
    batch_size: int = 16  # every base model's, as in the design's step timings
    image_resolution: int = 32  # 8 x 8 tokens of the tiny preset's 4 px patches
    image_steps: int = 3000
    image_per_class: int = 32  # samples per class: 128 images
    video_resolution: int = 16
    video_frames: int = 8
    video_steps: int = 3000
    video_per_class: int = 16  # videos per class: 64 clips of 8 frames
    context: int = 256
    lm_steps: int = 600
    trials: int = 20  # passkey probes per depth (5 depths): 100 probes
    accuracy_needed: float = 0.8
    presence_needed: float = 0.9
    passkey_needed: float = 0.9
    draws: int = 2000  # bootstrap replicates
    quick: bool = False


FULL = Pilot()
QUICK = Pilot(
    batch_size=4, image_resolution=16, image_steps=3, image_per_class=1, video_frames=4, video_steps=3,
    video_per_class=1, context=64, lm_steps=3, trials=2, draws=200, quick=True,
)  # fmt: skip
MODELS = ("image", "video", "length")


def _studies(pilot: Pilot):
    """The resolution, frame and length studies' settings that train and measure the pilot's three models."""
    from .length import design as length_design
    from .vision import frames, resolution

    r, seeds = pilot.image_resolution, (pilot.seed,)
    base = resolution.QUICK if pilot.quick else resolution.FULL
    image = replace(
        base, seeds=seeds, resolution=r, steps=pilot.image_steps, batch_size=pilot.batch_size, sizes=((r, r),),
        per_class=pilot.image_per_class, workers=0,
    )  # fmt: skip
    base = frames.QUICK if pilot.quick else frames.FULL
    video = replace(
        base, seeds=seeds, resolution=pilot.video_resolution, frames=pilot.video_frames, steps=pilot.video_steps,
        batch_size=pilot.batch_size, lengths=(), per_class=pilot.video_per_class, diagnosis=False, workers=0,
    )  # fmt: skip
    base = length_design.QUICK if pilot.quick else length_design.FULL
    length = replace(
        base, seeds=seeds, context=pilot.context, steps=pilot.lm_steps, batch_size=pilot.batch_size,
        lengths=(pilot.context,), trials=pilot.trials, workers=0,
    )  # fmt: skip
    return image, video, length


def _train_configs(pilot: Pilot, root: Path) -> dict:
    """``{model: TrainConfig}`` of the three runs (each study's own run of seed ``pilot.seed``)."""
    from .length.design import train_configs
    from .vision import frames, resolution

    image, video, length = _studies(pilot)
    return {
        "image": resolution.train_config(image, root / "image", pilot.seed),
        "video": frames.all_runs(video, root / "video")[f"s{pilot.seed}"],
        "length": train_configs(length, root / "length")["rope", pilot.seed][0],
    }


def _jobs() -> list[Job]:
    # one model at a time: train, then measure, so an interrupted pilot still holds the first results
    return [job for m in MODELS for job in (Job(f"train/{m}"), Job(f"eval/{m}", (f"train/{m}",)))]


def _execute(pilot: Pilot, root: Path, job: Job) -> str:
    kind, model = job.key.split("/")
    cfg = _train_configs(pilot, root)[model]
    if kind == "train":
        return ensure_trained(cfg)
    return {"image": _eval_image, "video": _eval_video, "length": _eval_length}[model](pilot, root)


def _eval_image(pilot: Pilot, root: Path) -> str:
    from .vision import resolution

    study, size = _studies(pilot)[0], (pilot.image_resolution, pilot.image_resolution)
    return resolution.evaluate(study, root / "image", pilot.seed, size)  # its eval/s<seed>_<size>.json


def _eval_video(pilot: Pilot, root: Path) -> str:
    from .vision import frames

    return frames.evaluate(_studies(pilot)[1], root / "video", pilot.seed, pilot.video_frames)


def _length_settings(pilot: Pilot, root: Path) -> dict:
    study = _studies(pilot)[2]
    cfg = _train_configs(pilot, root)["length"]
    return {"study": {k: v for k, v in asdict(study).items() if k != "quick"}, "checkpoint": checkpoint_hash(cfg.out)}


def _eval_length(pilot: Pilot, root: Path) -> str:
    import torch

    from .length.design import arms
    from .length.evaluate import evaluate_arm, result_path

    study, path = _studies(pilot)[2], root / "length" / "pilot_eval.json"
    settings = _length_settings(pilot, root)
    if read_result(path, settings) is not None:
        return "reused"
    arm = arms(study)["RoPE"]
    result_path(root / "length", arm, pilot.seed).unlink(missing_ok=True)  # the study reuses any file: not here
    result = torch.load(evaluate_arm(study, root / "length", arm, pilot.seed), weights_only=False)
    L = pilot.context
    out = {"passkey": np.asarray(result["retrieval"][L], dtype=np.float64).tolist(), "loss": result["loss"][L].tolist()}
    write_result(path, settings, out | {"depths": list(study.depths)})
    return "evaluated"


def _interval(values, draws: int) -> Interval:
    """The mean of per-sample ``values [N]`` and its 95% bootstrap interval over the samples (one seed)."""
    values = np.asarray(values, dtype=np.float64).reshape(1, -1)  # [seeds = 1, samples]
    return Bootstrap(1, values.shape[1], draws=draws).interval(values)


def verdict(interval: Interval, needed: float) -> str:
    """Whether the criterion ``mean >= needed`` is met, and whether the interval settles it."""
    if interval.low >= needed:
        return "yes"
    if interval.high < needed:
        return "no"
    return "yes, interval reaches below" if interval.mean >= needed else "no, interval reaches above"


def _per_model(pilot: Pilot, root: Path) -> dict:
    """``{model: {criterion, needed, per-sample values, ...}}`` read from the studies' result files."""
    from .vision.metrics import per_class_accuracy
    from .vision.resolution import sample_inputs

    r, out = pilot.image_resolution, {}
    image = json.loads((root / "image" / "eval" / f"s{pilot.seed}_{r}x{r}.json").read_text())["result"]["trained size"]
    labels, _ = sample_inputs(_studies(pilot)[0], (r, r))
    out["image"] = {
        "criterion": "class accuracy", "needed": pilot.accuracy_needed, "samples": image["correct"],
        "empty": image["empty"], "per_class": dict(zip(CLASSES, per_class_accuracy(image["correct"], labels).tolist())),
        "loss_grown": image["loss_grown"], "trained": f"{r} px",
    }  # fmt: skip
    video = json.loads((root / "video" / "eval" / f"s{pilot.seed}_{pilot.video_frames}.json").read_text())["result"]
    video = video["trained length"]
    out["video"] = {
        "criterion": "presence (share of frames with an object)", "needed": pilot.presence_needed,
        "samples": video["presence"], "class_accuracy": video["correct"], "objects": video["objects"],
        "loss": video["loss"],
        "trained": f"{pilot.video_resolution} px x {pilot.video_frames} frames",
    }  # fmt: skip
    length = json.loads((root / "length" / "pilot_eval.json").read_text())["result"]
    out["length"] = {
        "criterion": "passkey found", "needed": pilot.passkey_needed,
        "samples": [v for row in length["passkey"] for v in row], "depths": length["depths"],
        "loss": length["loss"], "trained": f"context {pilot.context}",
    }  # fmt: skip
    return out


def _step_seconds(root: Path, pilot: Pilot, configs: dict) -> dict:
    """Seconds per training step of each run: its job's time (setup and checkpoints included: an upper bound)."""
    from ..training.rundir import read_log

    if not (root / "jobs.jsonl").is_file():
        return {}
    latest = {r["key"]: r for r in read_log(root / "jobs.jsonl")}
    out = {}
    for model, cfg in configs.items():
        record = latest.get(f"train/{model}")
        if record is not None and record["what"] == "trained":  # a resumed run's time covers only part of it
            out[model] = record["seconds"] / cfg.steps
    return out


NAMES = {"image": "image DiT tiny", "video": "video DiT tiny-hunyuan", "length": "GPT lm-rope"}


def markdown(data: dict) -> str:
    """The pilot's table from its json (``data``: what :func:`run` wrote): one row per base model."""
    rows = [
        "| model | trained at | steps | s / step | criterion | measured [95%, over samples] | samples | needed | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        m = data["models"][model]
        interval = _interval(m["samples"], data["draws"])
        step = data["step_seconds"].get(model)
        rows.append(
            f"| {NAMES[model]} | {m['trained']} | {m['steps']} | {'-' if step is None else f'{step:.2f}'} "
            f"| {m['criterion']} | {interval.format(2)} | {len(m['samples'])} | {m['needed']:g} "
            f"| {verdict(interval, m['needed'])} |"
        )
    return "\n".join(rows + ["", *_other_measures(data)]) + "\n"


def _other_measures(data: dict) -> list[str]:
    """What the criteria alone do not show (clamped Gaussian noise has presence 1: a video must also show its class)."""
    image, video, length = (data["models"][m] for m in MODELS)
    per_class = ", ".join(f"{c} {v:.2f}" for c, v in image["per_class"].items())
    rows = [
        "| model | also measured (mean [95%, over samples]) |",
        "|---|---|",
        f"| {NAMES['image']} | empty samples {_interval(image['empty'], data['draws']).format(2)}; per class: {per_class} |",
        f"| {NAMES['video']} | class accuracy over the frames with an object "
        f"{_interval(video['class_accuracy'], data['draws']).format(2)}; objects per frame "
        f"{_interval(video['objects'], data['draws']).format(2)} |",
        f"| {NAMES['length']} | held-out loss at its context (nats/byte, {len(length['loss'])} windows) "
        f"{_interval(length['loss'], data['draws']).format(3)} |",
    ]
    return rows


def run(out: Path, quick: bool = False, root: str | Path | None = None) -> Path:
    """Train and measure the three base models, write ``out/pilot.json`` (per-sample values, the table)."""
    from functools import partial

    from .vision.report import environment

    pilot = QUICK if quick else FULL
    root = Path(root or f"runs/pilot{'_quick' if quick else ''}")
    wall = run_jobs(_jobs(), partial(_execute, pilot, root), root, workers=0, log=lambda s: print(s, flush=True))
    configs = _train_configs(pilot, root)
    models = _per_model(pilot, root)
    for name, cfg in configs.items():
        models[name]["steps"] = cfg.steps
    command = "python -m scripts.experiments pilot" + (" --quick" if quick else "")
    hashes = {name: checkpoint_hash(cfg.out) for name, cfg in configs.items()}
    env = environment(command, wall, compute_seconds(root), hashes, asdict(pilot))
    data = {"draws": pilot.draws, "step_seconds": _step_seconds(root, pilot, configs), "models": models}
    data |= {"environment": env, "table": None}
    data["table"] = markdown(data)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pilot.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
