"""A run's settings (:class:`TrainConfig`) and the one table of per-model run defaults.

``python -m scripts.train --model NAME`` and ``python -m scripts.experiments`` both start
from :data:`RUN_DEFAULTS`, so a run trained by one is the run the other expects, in the
same folder (``runs/dit``, ``runs/video_dit``, ``runs/gpt``). Every setting is checked when
a :class:`TrainConfig` is made: nonsense fails there with the field's name, not steps later.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from axial_rope.parallel import LAYOUTS, METHODS

__all__ = [
    "TrainConfig",
    "RUN_DEFAULTS",
    "RUN_KEYS",
    "HYPERPARAMETERS",
    "WEIGHT_NEUTRAL",
    "SCHEDULES",
    "PRECISIONS",
    "run_config",
    "config_differences",
]

SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class TrainConfig:
    """Everything a run needs; the defaults train the tiny image DiT on CPU in minutes."""

    model: str = "dit"
    preset: str = "tiny"
    steps: int = 2000
    batch_size: int = 32  # tiny DiT, 64k images: held-out loss 0.063 (batch 64, 1000 steps: 0.072)
    lr: float = 2e-3  # (1e-3: 0.081 with batch 64, 1000 steps)
    warmup: int = 20
    schedule: str = "constant"  # or "cosine" (to 10% of lr)
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # 0: no clipping
    ema: float = 0.99  # 0: the EMA weights are the trained ones
    resolution: int = 32  # DiTs: pixels per side
    pos_mode: str = "none"  # image DiT: how its positions meet a size other than base_resolution (models.dit)
    base_resolution: int = 0  # image DiT: the side its positions are relative to (0: resolution; a fine-tune
    # at another size under pos_mode keeps its base model's, the resolution study's fine-tuned arms)
    frames: int = 8  # video DiT
    context: int = 256  # language model: bytes per window
    seed: int = 0
    out: str = "runs/dit"
    resume: bool = False
    overwrite: bool = False  # a fresh run into a folder that holds a run replaces it (else: refused)
    allow_changes: bool = False  # a resume may change HYPERPARAMETERS (recorded in the log; else: refused)
    log_every: int = 10
    val_every: int = 500  # validation loss, sample grid and loss curve every N steps
    ckpt_every: int = 500
    sample_steps: int = 40  # Euler steps of the sample grids (DiTs)
    report: bool = True  # validation, samples and loss curve (periodic and at the end)
    precision: str = "auto"  # "auto": bf16 autocast on GPUs with bf16, else float32; "bf16"; "fp32"
    fsdp: bool = False
    packed: bool = False  # image DiT at native resolution: mixed sizes packed per step (docs/packing.md)
    causal: bool = False  # video DiT: frame-causal attention, one noise level per frame (docs/models.md)
    context_parallel: int = 1  # P: each video's tokens sharded over P ranks (world / P data-parallel replicas)
    cp_method: str = "ring"  # "ring" or "ulysses" (num_heads divisible by P)
    cp_layout: str = "contiguous"  # or "zigzag" (balances causal masks; the DiTs attend bidirectionally)
    data_parallel: int = 0  # replicas of the (dp, cp) mesh; 0: world / context_parallel (docs/scale.md)
    checkpointing: bool = False  # recompute each block's activations in the backward (less memory, more time)
    compile: bool = False  # torch.compile each block (regional compilation)
    compile_backend: str = "inductor"  # torch.compile's backend under compile
    progress: bool = True

    def __post_init__(self):
        check(self)


def _fail(name: str, rule: str, value) -> None:
    raise ValueError(f"{name} must be {rule}, got {value!r}")


def check(cfg: TrainConfig) -> None:
    """Raise ``ValueError`` naming the first setting of ``cfg`` that has the wrong type or makes no sense."""
    for f in fields(cfg):
        value, kind = getattr(cfg, f.name), type(f.default)
        # bool is an int to Python; an int is a fine float; nothing else passes for another type
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            _fail(f.name, f"a {kind.__name__}", value)
        if kind is float and not math.isfinite(value):
            _fail(f.name, "finite", value)
    positive = ("steps", "batch_size", "resolution", "frames", "context", "log_every", "val_every", "ckpt_every")
    for name in (*positive, "sample_steps"):
        if getattr(cfg, name) < 1:
            _fail(name, ">= 1", getattr(cfg, name))
    if cfg.context < 2:
        _fail("context", ">= 2 (a window predicts its next byte)", cfg.context)
    if cfg.lr <= 0:
        _fail("lr", "> 0", cfg.lr)
    for name in ("warmup", "seed", "weight_decay", "grad_clip"):
        if getattr(cfg, name) < 0:
            _fail(name, ">= 0" + (" (0: no clipping)" if name == "grad_clip" else ""), getattr(cfg, name))
    if not 0 <= cfg.ema < 1:
        _fail("ema", "in [0, 1) (the weight of the old EMA per step; 0: no averaging)", cfg.ema)
    if cfg.schedule not in SCHEDULES:
        _fail("schedule", f"one of {SCHEDULES}", cfg.schedule)
    if cfg.precision not in PRECISIONS:
        _fail("precision", f"one of {PRECISIONS}", cfg.precision)
    if not cfg.compile and cfg.compile_backend != TrainConfig.compile_backend:  # never silently ignored
        _fail("compile_backend", f"the default {TrainConfig.compile_backend!r} without compile (it is compile's "
              "backend)", cfg.compile_backend)  # fmt: skip
    if cfg.resume and cfg.overwrite:
        raise ValueError("resume and overwrite exclude each other: resume continues the run, overwrite replaces it")
    check_context_parallel(cfg)
    check_packed(cfg)
    check_positions(cfg)
    if cfg.causal and (cfg.model != "video_dit" or cfg.context_parallel > 1):
        _fail("causal", f"False for model {cfg.model!r} with context_parallel {cfg.context_parallel} "
              "(frame-causal training is the video DiT's, unsharded)", cfg.causal)  # fmt: skip


# models whose trainer loss shards a sequence over a context-parallel group (tasks.py: VideoTask.loss)
CONTEXT_PARALLEL_MODELS = ("video_dit",)


def check_context_parallel(cfg: TrainConfig) -> None:
    """The context-parallel settings alone; that ``context_parallel`` divides the world is checked at launch."""
    if cfg.context_parallel < 1:
        _fail("context_parallel", ">= 1 (1: no context parallelism)", cfg.context_parallel)
    if cfg.cp_method not in METHODS:
        _fail("cp_method", f"one of {METHODS}", cfg.cp_method)
    if cfg.data_parallel < 0:
        _fail("data_parallel", ">= 0 (0: world / context_parallel)", cfg.data_parallel)
    if cfg.cp_layout not in LAYOUTS:
        _fail("cp_layout", f"one of {LAYOUTS}", cfg.cp_layout)
    if cfg.context_parallel > 1 and cfg.model not in CONTEXT_PARALLEL_MODELS:
        rule = f"1 for model {cfg.model!r} (the models trained sharded: {CONTEXT_PARALLEL_MODELS})"
        _fail("context_parallel", rule, cfg.context_parallel)


def check_packed(cfg: TrainConfig) -> None:
    """``packed`` trains the image DiT on mixed sizes (tasks.py: PackedImageTask); other models have no packed task."""
    if cfg.packed and cfg.model != "dit":
        _fail("packed", f"False for model {cfg.model!r} (native-resolution packing trains the image DiT)", cfg.packed)
    if cfg.packed and cfg.resolution < 8:
        _fail("resolution", ">= 8 with packed (sides from resolution / 2 to 3 resolution / 2)", cfg.resolution)


def check_positions(cfg: TrainConfig) -> None:
    """``pos_mode`` and ``base_resolution`` set the image DiT's positions (one size per step: not packed)."""
    from ..dit import POS_MODES

    if cfg.pos_mode not in POS_MODES:
        _fail("pos_mode", f"one of {POS_MODES}", cfg.pos_mode)
    if cfg.base_resolution < 0:
        _fail("base_resolution", ">= 0 (0: resolution)", cfg.base_resolution)
    if (cfg.pos_mode != "none" or cfg.base_resolution) and (cfg.model != "dit" or cfg.packed):
        rule = "the default for a model other than the one-size image DiT (packed runs place positions per image)"
        name = "pos_mode" if cfg.pos_mode != "none" else "base_resolution"
        _fail(name, rule, getattr(cfg, name))


# The default run of each model (docs/training.md, docs/experiments.md). The video DiT trains at
# 16 px: the frame-count study measures time, and 16 px keeps its 600 steps within minutes on a CPU.
RUN_DEFAULTS: dict[str, TrainConfig] = {
    "dit": TrainConfig(),
    "video_dit": TrainConfig(
        model="video_dit", steps=600, batch_size=16, resolution=16, frames=8, out="runs/video_dit"
    ),
    "gpt": TrainConfig(model="gpt", steps=200, batch_size=32, lr=2e-3, schedule="cosine", ema=0.0, out="runs/gpt"),
}

# settings a resumed run must share with its checkpoint (the model, the data order, the batch)
RUN_KEYS = ("model", "preset", "resolution", "pos_mode", "base_resolution", "frames", "context", "seed", "batch_size",
            "packed", "causal")  # fmt: skip

# settings of the optimisation: a resume keeps them unless allow_changes (then the log records the change);
# steps may grow on any resume (train longer)
HYPERPARAMETERS = ("lr", "warmup", "schedule", "weight_decay", "grad_clip", "ema", "precision")

# settings that do not change the trained weights: where and how a run reports, not what it learns
WEIGHT_NEUTRAL = (
    "out",
    "resume",
    "overwrite",
    "allow_changes",
    "progress",
    "report",
    "log_every",
    "val_every",
    "ckpt_every",
    "sample_steps",
    # how a step is spread over processes, not what it computes (equal to rounding: tests/test_distributed.py)
    "context_parallel",
    "cp_method",
    "cp_layout",
    "data_parallel",
    "checkpointing",  # recomputes the same activations (tests/test_distributed_composition.py)
    "compile",
    "compile_backend",
)


def run_config(model: str = "dit", **overrides) -> TrainConfig:
    """The default run of ``model`` (:data:`RUN_DEFAULTS`) with ``overrides`` replacing fields."""
    if model not in RUN_DEFAULTS:
        raise ValueError(f"model must be one of {sorted(RUN_DEFAULTS)}, got {model!r}")
    return replace(RUN_DEFAULTS[model], **overrides)


def config_differences(saved: dict, wanted: TrainConfig) -> dict[str, tuple]:
    """``{field: (saved, wanted)}`` for every field, except :data:`WEIGHT_NEUTRAL`, where a saved
    ``config.json`` (a dict) and ``wanted`` differ; a field missing from ``saved`` counts as different."""
    missing = object()
    out = {}
    for name, value in asdict(wanted).items():
        if name not in WEIGHT_NEUTRAL and saved.get(name, missing) != value:
            out[name] = (saved.get(name), value)
    return out
