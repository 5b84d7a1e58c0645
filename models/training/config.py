"""A run's settings (:class:`TrainConfig`) and the one table of per-model run defaults.

``python -m scripts.train --model NAME`` and ``python -m scripts.experiments`` both start
from :data:`RUN_DEFAULTS`, so a run trained by one is the run the other expects, in the
same folder (``runs/dit``, ``runs/video_dit``, ``runs/gpt``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

__all__ = ["TrainConfig", "RUN_DEFAULTS", "RUN_KEYS", "WEIGHT_NEUTRAL", "run_config", "config_differences"]


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
    grad_clip: float = 1.0
    ema: float = 0.99
    resolution: int = 32  # DiTs: pixels per side
    frames: int = 8  # video DiT
    context: int = 256  # language model: bytes per window
    seed: int = 0
    out: str = "runs/dit"
    resume: bool = False
    log_every: int = 10
    val_every: int = 500  # validation loss, sample grid and loss curve every N steps
    ckpt_every: int = 500
    sample_steps: int = 40  # Euler steps of the sample grids (DiTs)
    report: bool = True  # validation, samples and loss curve (periodic and at the end)
    precision: str = "auto"  # "auto": bf16 autocast on GPUs with bf16, else float32
    fsdp: bool = False
    progress: bool = True


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
RUN_KEYS = ("model", "preset", "resolution", "frames", "context", "seed", "batch_size")

# settings that do not change the trained weights: where and how a run reports, not what it learns
WEIGHT_NEUTRAL = ("out", "resume", "progress", "report", "log_every", "val_every", "ckpt_every", "sample_steps")


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
