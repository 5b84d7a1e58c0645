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

The models of ``Pilot.longer`` are also trained to a multiple of their steps (a constant-rate run by resuming
a copy of its base run, a cosine one from scratch), and held-out data go through the same metrics (their
ceiling). One seed: the intervals are 95% bootstrap intervals over samples (probes) of that one model, not
over training seeds; they say how well the samples pin down this model, not how another seed would do.
The json holds every per-sample value, the step times and the table (:func:`markdown` rebuilds it).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..training.data import CLASSES, Shapes
from ..training.trainer import Run
from .bootstrap import Bootstrap, Interval
from .jobs import Job, checkpoint_hash, compute_seconds, ensure_trained, read_result, run_jobs, write_result

__all__ = ["FULL", "QUICK", "Pilot", "markdown", "run", "run_names", "verdict"]


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
    # (model, factor): also trained to factor times its steps, chosen after the design's runs fell short (image
    # accuracy 0.62, passkey 0.01); the language model, far from its criterion, gets the larger factor
    longer: tuple[tuple[str, int], ...] = (("image", 2), ("length", 4))
    draws: int = 2000  # bootstrap replicates
    quick: bool = False


FULL = Pilot()
QUICK = Pilot(
    batch_size=4, image_resolution=16, image_steps=3, image_per_class=1, video_frames=4, video_steps=3,
    video_per_class=1, context=64, lm_steps=3, trials=2, longer=(("image", 2), ("length", 2)), draws=200, quick=True,
)  # fmt: skip
MODELS = ("image", "video", "length")


def run_names(pilot: Pilot) -> tuple[str, ...]:
    """The trained runs: each model at its design steps, then those of ``pilot.longer`` at their factor times."""
    return MODELS + tuple(f"{m}-x{factor}" for m, factor in pilot.longer)


def _model_and_factor(name: str) -> tuple[str, int]:
    model, _, factor = name.partition("-x")
    return model, int(factor or 1)


def _scaled(pilot: Pilot, factor: int) -> Pilot:
    return replace(pilot, image_steps=factor * pilot.image_steps, video_steps=factor * pilot.video_steps,
                   lm_steps=factor * pilot.lm_steps)  # fmt: skip


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
        lengths=(pilot.context,), trials=pilot.trials, probe=True, workers=0,
    )  # fmt: skip
    return dict(zip(MODELS, (image, video, length)))


def _train_config(pilot: Pilot, root: Path, name: str):
    """The ``TrainConfig`` of run ``name`` (each study's own run of seed ``pilot.seed``) in ``root/name``."""
    from .length.design import train_configs
    from .vision import frames, resolution

    model, factor = _model_and_factor(name)
    study, folder = _studies(_scaled(pilot, factor))[model], root / name
    if model == "image":
        return resolution.train_config(study, folder, pilot.seed)
    if model == "video":
        return frames.all_runs(study, folder)[f"s{pilot.seed}"]
    return train_configs(study, folder)["rope", pilot.seed][0]


def _jobs(pilot: Pilot) -> list[Job]:
    # one run at a time: train, then measure, so an interrupted pilot still holds the first results
    jobs = []
    for name in run_names(pilot):
        model, factor = _model_and_factor(name)
        jobs += [
            Job(f"train/{name}", () if factor == 1 else (f"train/{model}",)),
            Job(f"eval/{name}", (f"train/{name}",)),
        ]
    jobs.insert(0, Job("data"))  # the data through the same pipeline: what the metrics read on real renders
    return jobs


def _extend(pilot: Pilot, root: Path, name: str) -> str:
    """Run ``name`` (a longer one): on a constant learning rate the base run resumed to more steps is the same
    run as one trained that long (data and noise are functions of seed and step), so a copy of it is resumed;
    a schedule that depends on the steps (cosine) trains from scratch."""
    cfg, base = _train_config(pilot, root, name), _train_config(pilot, root, _model_and_factor(name)[0])
    if cfg.schedule != "constant" or (Path(cfg.out) / "checkpoint.safetensors").is_file():
        return ensure_trained(cfg)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    for file in ("checkpoint.safetensors", "config.json", "log.jsonl"):
        shutil.copyfile(Path(base.out) / file, Path(cfg.out) / file)
    Run(replace(cfg, resume=True)).train()
    return "extended"


def _execute(pilot: Pilot, root: Path, job: Job) -> str:
    if job.key == "data":
        return _eval_data(pilot, root)
    kind, name = job.key.split("/")
    model, factor = _model_and_factor(name)
    if kind == "train":
        return ensure_trained(_train_config(pilot, root, name)) if factor == 1 else _extend(pilot, root, name)
    return {"image": _eval_image, "video": _eval_video, "length": _eval_length}[model](
        _scaled(pilot, factor), root / name
    )


def _eval_image(pilot: Pilot, folder: Path) -> str:
    from .vision import resolution

    study, size = _studies(pilot)["image"], (pilot.image_resolution, pilot.image_resolution)
    return resolution.evaluate(study, folder, pilot.seed, size)  # its eval/s<seed>_<size>.json


def _eval_video(pilot: Pilot, folder: Path) -> str:
    from .vision import frames

    return frames.evaluate(_studies(pilot)["video"], folder, pilot.seed, pilot.video_frames)


def _eval_data(pilot: Pilot, root: Path) -> str:
    """The metrics of held-out renders and clips of the training data at the models' sizes (the classifier of
    each study's root, as its samples are read): the ceiling the criteria are measured against."""
    from ..training.tasks import VideoTask
    from .vision import classifier as shape_classifier
    from .vision.metrics import image_metrics, reference, video_metrics

    studies, path = _studies(pilot), root / "data_eval.json"
    image, video = studies["image"], studies["video"]
    settings = {"pilot": asdict(pilot), "classifiers": [asdict(image.classifier), asdict(video.classifier)]}
    if read_result(path, settings) is not None:
        return "reused"
    r, n = pilot.image_resolution, len(CLASSES) * pilot.image_per_class
    x, y = Shapes(seed=50_001).batch(range(n), r)  # the resolution study's validation renders
    clf = shape_classifier.load_or_train(root / "image" / "classifier.pt", image.classifier)
    out = {"image": {m: v.tolist() for m, v in image_metrics(x, y, clf, reference(r)).items()} | {"labels": y.tolist()}}
    task = VideoTask(video.preset, video.resolution, video.frames, seed=0)
    x, y = task.val_inputs(len(CLASSES) * pilot.video_per_class, video.resolution, frames=video.frames)
    clf = shape_classifier.load_or_train(root / "video" / "classifier.pt", video.classifier)
    lag = round(frames_period(video))
    metrics = video_metrics(x, y, clf, reference(video.resolution, moving=True), lag)
    out["video"] = {m: v.tolist() for m, v in metrics.items()} | {"labels": y.tolist()}
    write_result(path, settings, out)
    return "evaluated"


def frames_period(video) -> float:
    """RIFLEx's period in frames of the frame study's settings ``video`` (the lag of its repetition metric)."""
    from .vision.frames import intrinsic

    return intrinsic(video.preset, video.frames)[1]


def _length_settings(pilot: Pilot, folder: Path) -> dict:
    study = _studies(pilot)["length"]
    run_dir = _train_config(pilot, folder.parent, folder.name).out
    return {"study": {k: v for k, v in asdict(study).items() if k != "quick"}, "checkpoint": checkpoint_hash(run_dir)}


def _eval_length(pilot: Pilot, folder: Path) -> str:
    import torch

    from .length.design import arms
    from .length.evaluate import evaluate_arm, result_path

    study, path = _studies(pilot)["length"], folder / "pilot_eval.json"
    settings = _length_settings(pilot, folder)
    if read_result(path, settings) is not None:
        return "reused"
    arm = arms(study)["RoPE"]
    result_path(folder, arm, pilot.seed).unlink(missing_ok=True)  # the study reuses any file: not here
    result = torch.load(evaluate_arm(study, folder, arm, pilot.seed), weights_only=False)
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


def _measured(pilot: Pilot, folder: Path, model: str) -> dict:
    """``{criterion, needed, samples (per-sample values), ...}`` of one run, read from its study's result file."""
    from .vision.metrics import per_class_accuracy
    from .vision.resolution import sample_inputs

    r = pilot.image_resolution
    if model == "image":
        image = json.loads((folder / "eval" / f"s{pilot.seed}_{r}x{r}.json").read_text())["result"]["trained size"]
        labels, _ = sample_inputs(_studies(pilot)["image"], (r, r))
        per_class = per_class_accuracy(image["correct"], labels).tolist()
        return {
            "criterion": "class accuracy", "needed": pilot.accuracy_needed, "samples": image["correct"],
            "empty": image["empty"], "per_class": dict(zip(CLASSES, per_class)), "loss_grown": image["loss_grown"],
            "trained": f"{r} px",
        }  # fmt: skip
    if model == "video":
        video = json.loads((folder / "eval" / f"s{pilot.seed}_{pilot.video_frames}.json").read_text())["result"]
        video = video["trained length"]
        return {
            "criterion": "presence (share of frames with an object)", "needed": pilot.presence_needed,
            "samples": video["presence"], "class_accuracy": video["correct"], "objects": video["objects"],
            "loss": video["loss"], "trained": f"{pilot.video_resolution} px x {pilot.video_frames} frames",
        }  # fmt: skip
    length = json.loads((folder / "pilot_eval.json").read_text())["result"]
    return {
        "criterion": "passkey found", "needed": pilot.passkey_needed,
        "samples": [v for row in length["passkey"] for v in row], "depths": length["depths"],
        "loss": length["loss"], "trained": f"context {pilot.context}",
    }  # fmt: skip


def _step_seconds(root: Path, pilot: Pilot) -> dict:
    """Seconds per training step of each run: its job's time over the steps it trained (setup and checkpoints
    included: an upper bound; a run resumed after an interruption is left out, its time covers part of it)."""
    from ..training.rundir import read_log

    if not (root / "jobs.jsonl").is_file():
        return {}
    latest = {r["key"]: r for r in read_log(root / "jobs.jsonl")}
    out = {}
    for name in run_names(pilot):
        record, steps = latest.get(f"train/{name}"), _train_config(pilot, root, name).steps
        if record is not None and record["what"] in ("trained", "extended"):
            base = _train_config(pilot, root, _model_and_factor(name)[0]).steps if record["what"] == "extended" else 0
            out[name] = record["seconds"] / (steps - base)
    return out


NAMES = {"image": "image DiT tiny", "video": "video DiT tiny-hunyuan", "length": "GPT lm-rope"}


def _label(name: str) -> str:
    model, factor = _model_and_factor(name)
    return NAMES[model] + ("" if factor == 1 else f", {factor}x steps")


def markdown(data: dict) -> str:
    """The pilot's tables from its json (``data``: what :func:`run` wrote): one row per run."""
    rows = [
        "| model | trained at | steps | s / step | criterion | measured [95%, over samples] | samples | needed | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in data["models"].items():
        interval = _interval(m["samples"], data["draws"])
        step = data["step_seconds"].get(name)
        rows.append(
            f"| {_label(name)} | {m['trained']} | {m['steps']} | {'-' if step is None else f'{step:.2f}'} "
            f"| {m['criterion']} | {interval.format(2)} | {len(m['samples'])} | {m['needed']:g} "
            f"| {verdict(interval, m['needed'])} |"
        )
    return "\n".join(rows + ["", *_other_measures(data)]) + "\n"


def _other_measures(data: dict) -> list[str]:
    """What the criteria alone do not show (clamped Gaussian noise has presence 1: a video must also show its class)."""
    rows, draws = ["| model | also measured (mean [95%, over samples]) |", "|---|---|"], data["draws"]
    for name, m in data["models"].items():
        model = _model_and_factor(name)[0]
        if model == "image":
            per_class = ", ".join(f"{c} {v:.2f}" for c, v in m["per_class"].items())
            what = f"empty samples {_interval(m['empty'], draws).format(2)}; accuracy per class: {per_class}"
        elif model == "video":
            what = (
                f"class accuracy over the frames with an object {_interval(m['class_accuracy'], draws).format(2)}; "
                f"objects per frame {_interval(m['objects'], draws).format(2)}"
            )
        else:
            what = f"held-out loss at its context (nats/byte, {len(m['loss'])} windows) {_interval(m['loss'], draws).format(3)}"
        rows.append(f"| {_label(name)} | {what} |")
    if "data" in data:  # held-out training data through the same pipeline
        image, video = data["data"]["image"], data["data"]["video"]
        per_class = ", ".join(f"{c} {v:.2f}" for c, v in zip(CLASSES, _class_means(image)))
        rows.append(
            f"| data: {len(image['correct'])} renders at {data['models']['image']['trained']} | class accuracy "
            f"{_interval(image['correct'], draws).format(2)}; per class: {per_class} |"
        )
        per_class = ", ".join(f"{c} {v:.2f}" for c, v in zip(CLASSES, _class_means(video)))
        rows.append(
            f"| data: {len(video['presence'])} clips at {data['models']['video']['trained']} | presence "
            f"{_interval(video['presence'], draws).format(2)}; class accuracy over the frames with an object "
            f"{_interval(video['correct'], draws).format(2)}; per class: {per_class} |"
        )
    return rows


def _class_means(measured: dict) -> list[float]:
    from .vision.metrics import per_class_accuracy

    return per_class_accuracy(measured["correct"], measured["labels"]).tolist()


def run(out: Path, quick: bool = False, root: str | Path | None = None) -> Path:
    """Train and measure the base models, write ``out/pilot.json`` (per-sample values, the tables)."""
    from functools import partial

    from .vision.report import environment

    pilot = QUICK if quick else FULL
    root = Path(root or f"runs/pilot{'_quick' if quick else ''}")
    wall = run_jobs(_jobs(pilot), partial(_execute, pilot, root), root, workers=0, log=lambda s: print(s, flush=True))
    models, hashes = {}, {}
    for name in run_names(pilot):
        model, factor = _model_and_factor(name)
        cfg = _train_config(pilot, root, name)
        models[name] = _measured(_scaled(pilot, factor), root / name, model) | {"steps": cfg.steps}
        hashes[name] = checkpoint_hash(cfg.out)
    command = "python -m scripts.experiments pilot" + (" --quick" if quick else "")
    env = environment(command, wall, compute_seconds(root), hashes, asdict(pilot))
    data = {"draws": pilot.draws, "step_seconds": _step_seconds(root, pilot), "models": models}
    data["data"] = json.loads((root / "data_eval.json").read_text())["result"]
    data |= {"environment": env, "table": None}
    data["table"] = markdown(data)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pilot.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
