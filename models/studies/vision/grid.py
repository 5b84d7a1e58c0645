"""The grid study's design and jobs (``python -m scripts.experiments grid``): scalings where they differ.

Pre-registered in docs/experiments/design.md (committed before any of its runs). An image DiT
(preset ``tiny-16``: 32 px in 2 px patches, 16 x 16 tokens; 2 heads of 64 channels, so 16 rotary planes per
axis; theta 100) is trained at its own size over five seeds, then sampled at FiT's test sizes scaled to
16 tokens (1.25x square, 1:2 and 1:3 aspect: FiT 2402.12376 scores a 256^2 model at 320^2, 224 x 448 and
160 x 480) and at 2x, 3x and 4x squares, under every arm of :data:`ARMS`, and at 2x fine-tuned under plain,
interpolated and YaRN positions for the same steps. On this grid YaRN keeps one plane, ramps three and
interpolates twelve, NTK rescales the planes whose wavelengths lie near the 16-token extent by 0.9-0.3,
and Dy-YaRN moves YaRN's ramp with the sampling time (:func:`plane_counts`, the page and design.md).

Every cell (seed, size, arm) is one job and one file (``eval/s<seed>_<size>_<arm>.json``): a session that
ends mid-study loses at most the cell it was computing, and the next run skips every finished one.
The jobs are listed in the design's priority order (:func:`study_jobs`), which is the order one worker
runs them in.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

import axial_rope as ar
from axial_rope.time_scaling import DyPE

from ...dit import PRESETS
from ...training.config import TrainConfig
from ..family import Contrast
from ..jobs import Job, ensure_trained
from .classifier import ClassifierConfig

__all__ = [
    "ARMS", "FINETUNED", "FULL", "QUICK", "GridStudy", "arm_kwargs", "arms_at", "declared_family", "executor",
    "plane_counts", "policy_arm",
    "size_name", "study_jobs", "train_config",
]  # fmt: skip

Size = tuple[int, int]

# arm -> what it does at a size whose axis a is s_a = n_a / N_a > 1 times its training length (other axes: plain)
ARMS = {
    "none": "integer positions, no scaling (extrapolation)",
    "interpolate": "positions divided by s (position interpolation, Chen et al. 2023)",
    "ntk": "NTK-aware base theta * s^(d/(d-2)) (bloc97 2023; FiT's VisionNTK per axis)",
    "yarn": "YaRN(s, 16): ramp over the planes and attention factor 0.1 ln s + 1 (Peng et al. 2023)",
    "yarn, no attention factor": "YaRN's frequencies with attention factor 1",
    "interpolate, YaRN's factor": "interpolation's frequencies with YaRN's attention factor 0.1 ln s + 1",
    "dy-ntk": "DyPE's NTK variant: the NTK factor raised to kappa(t) = 2 t^2 (Issachar et al. 2025)",
    "dy-yarn": "DyPE's default Dy-YaRN: YaRN's ramp thresholds times kappa(t) (Issachar et al. 2025)",
    "normalize": "centred coordinates, the longest axis spanning the trained extent (non-square sizes only)",
}
FINETUNED = "fine-tuned, {}"  # the arm of the model fine-tuned at finetune_size under a position mode


@dataclass(frozen=True)
class GridStudy:
    """One run of the study (``FULL``: the declared design; ``QUICK``: about a minute, plumbing only)."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    preset: str = "tiny-16"
    resolution: int = 32  # training side in pixels: 16 x 16 tokens of 2 px
    steps: int = 12000  # the 8 x 8-token study's count (its base model: class accuracy 0.93 at 32 px)
    batch_size: int = 16
    lr: float = 2e-3
    # (H, W) px in the design's priority order: the trained size (the pilot), FiT's three, then 2x, 3x, 4x
    sizes: tuple[Size, ...] = ((32, 32), (40, 40), (28, 56), (20, 60), (64, 64), (96, 96), (128, 128))
    exploratory_sizes: tuple[Size, ...] = ((96, 96),)  # 3x: between the declared 2x and 4x, outside the family
    arms: tuple[str, ...] = tuple(ARMS)
    finetune_size: int = 64
    finetune_modes: tuple[str, ...] = ("none", "interpolate", "yarn")  # "none": plain positions, the control
    finetune_steps: int = 200
    finetune_batch: int = 8
    finetune_lr: float = 5e-4
    per_class: int = 16  # samples per class, size, arm and seed: 64 (the trained size: trained_per_class)
    trained_per_class: int = 32  # 128 samples at the trained size: the competence criterion's interval
    loss_images: int = 24  # per held-out set, size, arm and seed
    ts: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    euler_steps: int = 20
    cfg_scale: float = 3.0
    max_objects: int = 3  # the canvas test set
    competence: float = 0.8  # class accuracy at the trained size the base model must reach (issue 24)
    classifier: ClassifierConfig = field(
        default_factory=lambda: ClassifierConfig(steps=350, resolutions=(16, 24, 32, 48, 64, 96, 128))
    )
    draws: int = 2000
    workers: int = 1  # one process of one thread: the other core stays free
    quick: bool = False

    @property
    def train_grid(self) -> int:
        return self.resolution // PRESETS[self.preset].patch_size

    def samples_per_class(self, size: Size) -> int:
        return self.trained_per_class if size == (self.resolution, self.resolution) else self.per_class

    def loss_count(self, size: Size) -> int:
        return self.loss_images

    def chunk(self, size: Size) -> int:
        """Images per forward at ``size`` (the fastest measured on this CPU: attention over 2304 or 4096 tokens is
        memory-bound); the results do not depend on it."""
        tokens = size[0] * size[1] // PRESETS[self.preset].patch_size ** 2
        return 8 if tokens <= 1024 else 4 if tokens <= 2304 else 1


FULL = GridStudy()
QUICK = GridStudy(
    seeds=(0, 1), resolution=16, steps=3, batch_size=4, sizes=((16, 16), (20, 20), (10, 30), (32, 32)),
    exploratory_sizes=(), arms=("none", "interpolate", "ntk", "yarn", "dy-yarn", "normalize"), finetune_size=32,
    finetune_modes=("none", "interpolate"), finetune_steps=2, finetune_batch=2, per_class=1, trained_per_class=2,
    loss_images=2, ts=(0.5,), euler_steps=2, classifier=ClassifierConfig(steps=4, batch_size=8, resolutions=(16, 32)),
    draws=200, workers=0, quick=True,
)  # fmt: skip


def size_name(size: Size) -> str:
    return f"{size[0]}x{size[1]}"


def arms_at(study: GridStudy, size: Size) -> list[str]:
    """The arms evaluated at ``size``: one ``trained size`` arm at the training size (every arm is the same model
    there), ``normalize`` on non-square sizes only (on a square one it is interpolation), the fine-tuned arms at
    ``finetune_size``."""
    if size == (study.resolution, study.resolution):
        return ["trained size"]
    arms = [a for a in study.arms if not (a == "normalize" and size[0] == size[1])]
    if size == (study.finetune_size, study.finetune_size):
        arms += [FINETUNED.format(m) for m in study.finetune_modes]
    return arms


def factors(study: GridStudy, size: Size) -> tuple[float, float]:
    """``(s_y, s_x)``: each axis' tokens over its training tokens, at least 1 (``ar.positions_for_size``'s)."""
    patch = PRESETS[study.preset].patch_size
    sized = ar.positions_for_size((size[0] // patch, size[1] // patch), study.train_grid, "none")
    return tuple(float(f) for f in sized.factors)


def policy_arm(study: GridStudy, size: Size) -> str:
    """The arm whose rotation the automatic policy (``axial_rope.policy``: ``"content"`` positions for image axes)
    gives at ``size``: ``interpolate`` where both axes grow alike, ``none`` where one stays inside its trained
    extent (the shared growth is then 1); the page reports the policy through it."""
    s_y, s_x = factors(study, size)
    if min(s_y, s_x) > 1 and s_y != s_x:
        raise ValueError(f"size {size}: the policy's content positions are neither interpolation nor plain there")
    return "interpolate" if min(s_y, s_x) > 1 else "none"


def _axis_scaling(arm: str, s: float, grid: int, planes: int):
    """The scaling of one axis ``s`` times longer than its ``grid`` training tokens, for an arm given by methods."""
    if arm == "yarn, no attention factor":
        return ar.scaling.YaRN(s, grid, attention_factor=1.0)
    if arm == "interpolate, YaRN's factor":  # every plane divided by s (= Linear) with YaRN's attention factor
        every = (s,) * planes
        return ar.scaling.LongRoPE(every, every, grid, attention_factor=0.1 * math.log(s) + 1.0)
    if arm == "dy-ntk":
        return DyPE(s, grid, method="ntk")
    if arm == "dy-yarn":
        return DyPE(s, grid)  # the DiT's pos_mode="dype"
    raise ValueError(f"arm {arm!r} is a position mode of the DiT, not a scaling")


def arm_kwargs(study: GridStudy, arm: str, size: Size) -> dict:
    """The DiT forward's keyword arguments of ``arm`` at ``size``: ``pos_mode=`` (the DiT's own modes) or
    ``scaling=`` (one method per axis longer than in training, integer coordinates)."""
    if arm in ("none", "interpolate", "ntk", "yarn", "normalize", "trained size") or arm.startswith("fine-tuned"):
        return {"pos_mode": "none" if arm == "trained size" or arm.startswith("fine-tuned") else arm}
    c = PRESETS[study.preset]
    planes = (c.hidden_size // c.num_heads) // 4  # per axis, as models.dit builds its rope
    scaling = tuple(None if s <= 1 else _axis_scaling(arm, s, study.train_grid, planes) for s in factors(study, size))
    return {"scaling": scaling}


def plane_counts(study: GridStudy, factor: float) -> dict[str, object]:
    """What the scalings do to one axis' planes at ``factor`` (computed with ``ar.inv_freq``): the planes YaRN keeps,
    ramps and interpolates, the same for Dy-YaRN at sampling times t = 1, 0.5 and 0.25, NTK's frequency ratio per
    plane, the unscaled wavelengths (tokens) and how many of them exceed the training extent."""
    c = PRESETS[study.preset]
    dim, grid = 2 * ((c.hidden_size // c.num_heads) // 4), study.train_grid
    base = ar.inv_freq(dim, c.theta)[0]  # float64 [dim // 2]
    linear = ar.inv_freq(dim, c.theta, ar.scaling.Linear(factor))[0]

    def split(inv: torch.Tensor) -> dict[str, int]:
        kept, interpolated = int(torch.isclose(inv, base).sum()), int(torch.isclose(inv, linear).sum())
        return {"kept": kept, "ramp": dim // 2 - kept - interpolated, "interpolated": interpolated}

    dype = DyPE(factor, grid)
    dy_yarn = {str(t): split(dype.inv_freq_at(dim, c.theta, torch.tensor(t, dtype=torch.float64)))
               for t in (1.0, 0.5, 0.25)}  # fmt: skip
    ntk = ar.inv_freq(dim, c.theta, ar.scaling.NTK(factor))[0] / base
    return {
        "planes": dim // 2, "theta": c.theta, "train_tokens": grid, "factor": factor,
        "wavelengths": [round(float(w), 1) for w in 2 * math.pi / base],
        "partial_turn_planes": int((2 * math.pi / base > grid).sum()),  # wavelength past the training extent
        "yarn": split(ar.inv_freq(dim, c.theta, ar.scaling.YaRN(factor, grid))[0]), "dy_yarn": dy_yarn,
        "ntk_ratio": [round(float(r), 2) for r in ntk],
    }  # fmt: skip


def train_config(study: GridStudy, root: Path, seed: int, finetune: str | None = None) -> TrainConfig:
    """The base run of ``seed`` (checkpoints every 250 steps: resumable), or its fine-tuning at ``finetune_size``
    under the position mode ``finetune`` (from the base run's EMA weights, positions relative to the base size)."""
    base = TrainConfig(
        model="dit", preset=study.preset, resolution=study.resolution, steps=study.steps,
        batch_size=study.batch_size, lr=study.lr, seed=seed, out=str(root / "train" / f"s{seed}"), progress=False,
        report=False, ckpt_every=250,
    )  # fmt: skip
    if finetune is None:
        return base
    return replace(
        base, resolution=study.finetune_size, base_resolution=study.resolution, pos_mode=finetune,
        steps=study.finetune_steps, batch_size=study.finetune_batch, lr=study.finetune_lr, warmup=10, ema=0.0,
        out=str(root / "train" / f"ft_{finetune}_s{seed}"),
    )  # fmt: skip


PRIMARY_ARMS = ("none", "interpolate", "ntk", "yarn", "dy-yarn")  # the arms of the declared contrasts
# Q1's contrasts at each primary size (docs/experiments/design.md): a - b of the shape error
TRAINING_FREE = (
    ("interpolate", "none", "Q1: does the cheapest fix help?"),
    ("ntk", "interpolate", "Q1: NTK against interpolation"),
    ("yarn", "interpolate", "Q1: YaRN against interpolation"),
    ("dy-yarn", "yarn", "Q1: does following the sampling time help?"),
)


def declared_family(study: GridStudy) -> list[Contrast]:
    """The primary family of docs/experiments/design.md: Q1's four contrasts on the shape error at every size but
    the trained one and the exploratory ``exploratory_sizes``, and Q2's two at ``finetune_size`` on the shape
    error and class accuracy (24 for ``FULL``). Holm runs over exactly these (:mod:`models.studies.family`)."""
    trained, tuned = (study.resolution, study.resolution), (study.finetune_size, study.finetune_size)
    family = [
        Contrast(size_name(size), a, b, "shape_error", question)
        for size in study.sizes
        if size != trained and size not in study.exploratory_sizes
        for a, b, question in TRAINING_FREE
    ]
    for metric in ("shape_error", "correct"):
        family += [
            Contrast(size_name(tuned), FINETUNED.format("interpolate"), FINETUNED.format("none"), metric,
                     "Q2: positions for the same fine-tuning steps"),
            Contrast(size_name(tuned), FINETUNED.format("none"), "interpolate", metric,
                     "Q2: a short fine-tune against the training-free incumbent"),
        ]  # fmt: skip
    return family


def _eval_job(study: GridStudy, seed: int, size: Size, arm: str) -> Job:
    needs = ["classifier", f"train/s{seed}"]
    if arm.startswith("fine-tuned"):
        needs.append(f"finetune/s{seed}/{arm.split(', ')[1]}")
    return Job(f"eval/s{seed}/{size_name(size)}/{arm}", tuple(needs))


def study_jobs(study: GridStudy, stage: str = "all") -> list[Job]:
    """Every job in the design's priority order (one worker runs them in this order): per seed its base model, its
    trained-size cell and its cells up to 2x (the declared arms first), seed after seed, so that what one session
    finishes is whole seeds; then the 3x and 4x cells; then the fine-tunes. ``stage="pilot"``: the first seed's
    base model and its trained-size cell only (the competence check)."""
    first, trained = study.seeds[0], (study.resolution, study.resolution)
    jobs = [Job("classifier"), Job(f"train/s{first}"), _eval_job(study, first, trained, "trained size")]
    if stage == "pilot":
        return jobs
    jobs.append(Job("validate", ("classifier",)))
    cheap = [s for s in study.sizes if s != trained and s[0] * s[1] <= 4 * study.resolution**2]
    dear = [s for s in study.sizes if s[0] * s[1] > 4 * study.resolution**2]

    def cells(seed: int, sizes) -> list[Job]:
        arms = [(s, a) for s in sizes for a in arms_at(study, s) if not a.startswith("fine-tuned")]
        declared = [_eval_job(study, seed, s, a) for s, a in arms if a in PRIMARY_ARMS]
        return declared + [_eval_job(study, seed, s, a) for s, a in arms if a not in PRIMARY_ARMS]

    for seed in study.seeds:
        if seed != first:
            jobs += [Job(f"train/s{seed}"), _eval_job(study, seed, trained, "trained size")]
        jobs += cells(seed, cheap)
    for seed in study.seeds:
        jobs += cells(seed, dear)
    for seed in study.seeds:  # the fine-tune question
        jobs += [Job(f"finetune/s{seed}/{m}", (f"train/s{seed}",)) for m in study.finetune_modes]
        size = (study.finetune_size, study.finetune_size)
        jobs += [_eval_job(study, seed, size, FINETUNED.format(m)) for m in study.finetune_modes]
    return jobs


def execute(study: GridStudy, root: Path, job: Job) -> str:
    """Run one job of :func:`study_jobs` (in a worker or here); returns what happened."""
    from . import grid_eval
    from .classifier import shared_job

    kind, *rest = job.key.split("/")
    if (done := shared_job(kind, study, root, grid_eval.validate)) is not None:
        return done
    seed = int(rest[0][1:])
    if kind == "train":
        return ensure_trained(train_config(study, root, seed))
    if kind == "finetune":
        return ensure_trained(train_config(study, root, seed, rest[1]), train_config(study, root, seed).out)
    size = tuple(int(v) for v in rest[1].split("x"))
    return grid_eval.evaluate(study, root, seed, size, rest[2])


def executor(study: GridStudy, root: Path):
    """``execute`` bound to the study and root: picklable, for the worker processes."""
    return partial(execute, study, root)


def settings(study: GridStudy) -> dict:
    """The fields that change a cell's result (not which cells exist, nor where or how fast they run)."""
    ignore = ("seeds", "sizes", "exploratory_sizes", "arms", "finetune_modes", "draws", "workers", "quick")
    return {k: v for k, v in asdict(study).items() if k not in ignore}
