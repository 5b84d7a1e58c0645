"""Trainer runs as diffusers models: the image or video DiT of a ``checkpoint.safetensors``.

The trainer's checkpoint format is read here, in the training package, so that the
diffusers models (``models/diffusers_models.py``) know nothing of it. The model config is
the run's (its preset; the image DiT with ``input_size`` its ``base_resolution`` or ``resolution``,
and its ``pos_mode``); the weights are the EMA ones unless ``use_ema=False``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..diffusers_models import AxialDiT2DModel, AxialDiT3DModel
from .tasks import ImageTask, VideoTask
from .trainer import trained_weights

__all__ = ["dit_from_checkpoint", "video_dit_from_checkpoint"]


def _run(path: str | Path, task: type[ImageTask], use_ema: bool) -> tuple[ImageTask, dict[str, torch.Tensor]]:
    """The task of a run of ``task.name`` and its weights (EMA parameters and the model's buffers)."""
    run, weights = trained_weights(path, use_ema=use_ema)
    if run.get("model") != task.name:
        raise ValueError(f"{path} holds a {run.get('model')!r} run; this function converts {task.name!r} runs")
    return task.from_run(run), weights


def dit_from_checkpoint(path: str | Path, *, use_ema: bool = True) -> AxialDiT2DModel:
    """The :class:`AxialDiT2DModel` of an image DiT run (its folder or its ``checkpoint.safetensors``), in eval mode."""
    task, weights = _run(path, ImageTask, use_ema)
    model = AxialDiT2DModel(**dataclasses.asdict(task.config))
    model.dit.load_state_dict(weights)
    return model.eval()


def video_dit_from_checkpoint(path: str | Path, *, use_ema: bool = True) -> AxialDiT3DModel:
    """The :class:`AxialDiT3DModel` of a video DiT run (its folder or its ``checkpoint.safetensors``), in eval mode."""
    task, weights = _run(path, VideoTask, use_ema)
    model = AxialDiT3DModel(**dataclasses.asdict(task.config))
    model.dit.load_state_dict(weights)
    return model.eval()
