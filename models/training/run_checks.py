"""Checks of a run against its model and the machine, before anything is built.

- :func:`check_run`: the settings (``TrainConfig``'s own checks), then what the model cannot take:
  an unknown preset, a side or frame count its patch does not divide.
- :func:`check_memory`: the memory a training step holds, estimated from the settings, against the
  machine's (``scripts.train`` refuses a run that does not fit, with the estimate). A language
  model's step grows with the square of its context: the attention path the trainer takes holds one
  layer's scores, ``B * H * S * S`` float32 numbers, at a time (context 8192, batch 32, 4 heads:
  32 GiB). On the tiny model at context 4096 the estimate (2.0 GiB) is within a factor 1.5 of the
  measured peak above the interpreter's own memory.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

import torch

from .config import TrainConfig
from .config import check as check_config
from .tasks import TASKS

__all__ = ["GIB", "check_memory", "check_run", "gpt_training_memory", "machine_memory"]

GIB = 2**30


def check_run(cfg: TrainConfig):
    """The task of ``cfg``, or a ``ValueError`` naming what its model cannot take (an unknown preset, a side
    or frame count the patch does not divide); builds no model."""
    check_config(cfg)  # a TrainConfig checks itself when made; fields set afterwards are checked here
    if cfg.model not in TASKS:
        raise ValueError(f"model must be one of {sorted(TASKS)}, got {cfg.model!r}")
    presets = TASKS[cfg.model].presets
    if cfg.preset not in presets:
        raise ValueError(f"preset for {cfg.model} must be one of {sorted(presets)}, got {cfg.preset!r}")
    return TASKS[cfg.model].from_run(asdict(cfg))


def machine_memory(device: torch.device | None = None) -> int | None:
    """Bytes of memory of ``device`` (a GPU's own; else the machine's RAM), or ``None`` where unknown."""
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return None


def gpt_training_memory(config, batch: int, context: int, positions=None) -> dict[str, int]:
    """Bytes, by part, that one float32 training step of :class:`models.gpt.GPT` holds at its peak.

    Args:
        config: the model's :class:`~models.gpt.GPTConfig`; batch: sequences per process; context: ``S``;
        positions: its position scheme (``None``: RoPE; linear attention keeps no score matrix).
    """
    B, S, H, C = batch, context, config.num_heads, config.hidden_size
    embeddings = config.vocab_size * C * (1 if config.tie_embeddings else 2)
    params = embeddings + config.depth * (4 * C * C + 3 * C * config.mlp_width)  # attention, SwiGLU; norms aside
    return {
        "weights": 4 * 5 * params,  # weights, gradients, AdamW's two moments, EMA
        "activations": 4 * config.depth * B * S * (12 * C + 3 * config.mlp_width),  # kept for the backward
        "logits": 4 * 3 * B * S * config.vocab_size,  # logits, their float32 copy, their gradient
        "scores": 0 if getattr(positions, "attention", "softmax") == "linear" else 4 * B * H * S * S,  # one layer's
    }


def check_memory(cfg: TrainConfig, task, world: int = 1, device: torch.device | None = None) -> None:
    """Raise ``ValueError`` with the estimate when a language-model run (``task``: :func:`check_run`'s) needs
    more memory than ``device`` has; ``world``: the processes sharing the batch."""
    if cfg.model != "gpt":
        return
    if device is None and torch.cuda.is_available():  # where the trainer trains: this rank's GPU
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    have = machine_memory(device)
    need = gpt_training_memory(task.config, math.ceil(cfg.batch_size / world), cfg.context, task.positions)
    if have is None or sum(need.values()) <= have:
        return
    raise ValueError(
        f"--context {cfg.context} with --batch-size {cfg.batch_size} needs about "
        f"{sum(need.values()) / GIB:,.1f} GiB to train (the attention scores B*H*S*S alone: "
        f"{need['scores'] / GIB:,.1f} GiB), more than the {have / GIB:.1f} GiB of this machine: "
        "lower --context or --batch-size"
    )
