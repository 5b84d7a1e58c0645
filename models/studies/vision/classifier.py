"""A small shape classifier, trained on the procedural data, that reads the class of each object in a sample.

It sees one object at a time: the crop of :func:`~.objects.crops` (the object alone, its box scaled to
32 x 32), so it reads shape, not size or place, and every object of a multi-object canvas gets its own
answer. It trains in seconds on objects rendered at several resolutions (their crops then differ in
sharpness as samples at several sizes do), upright and rotated (the video data rotates). Its accuracy
is measured through the whole pipeline (find objects, crop, classify) on held-out renders of each test
set and size: the figure that says how far to trust the class accuracy of samples.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ...training.data import CLASSES, Shapes, step_generator
from .objects import crops, find_objects

__all__ = ["ClassifierConfig", "ShapeClassifier", "classify", "load_or_train", "object_crops", "shared_job"]


@dataclass(frozen=True)
class ClassifierConfig:
    """How the classifier is trained (its file is reused only when these match)."""

    steps: int = 250
    batch_size: int = 64
    lr: float = 3e-3
    resolutions: tuple[int, ...] = (32, 48, 64, 96)  # objects rendered at these sizes, one per step in turn
    seed: int = 0
    min_area: int = 6  # pixels: specks are left out


class ShapeClassifier(nn.Module):
    """Three conv blocks and a linear head: ``[N, 3, 32, 32]`` crops -> logits ``[N, classes]``."""

    def __init__(self, classes: int = len(CLASSES), width: int = 24):
        super().__init__()
        layers, channels = [], 3
        for out in (width, 2 * width, 4 * width):  # 32 -> 16 -> 8 -> 4 pixels
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))  # global average over the 4 x 4 map


def object_crops(images: torch.Tensor, min_area: int) -> tuple[torch.Tensor, list[list]]:
    """Crops ``[N, 3, 32, 32]`` of every object of ``images [B, 3, H, W]`` and the objects of each image."""
    found, labels = find_objects(images, min_area)
    flat = [o for objects in found for o in objects]
    return crops(images, labels, flat), found


def _training_batch(cfg: ClassifierConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Crops and labels of step ``step``: one object per image, rendered at ``resolutions[step % n]``,
    half upright and half at any angle (a seed of its own, never the diffusion models' data)."""
    resolution = cfg.resolutions[step % len(cfg.resolutions)]
    half = cfg.batch_size // 2
    first = step * cfg.batch_size
    upright, y0 = Shapes(seed=20_000 + cfg.seed).batch(range(first, first + half), resolution)
    turned, y1 = Shapes(seed=30_000 + cfg.seed, angle_range=2 * math.pi).batch(range(first, first + half), resolution)
    images, labels = torch.cat([upright, turned]), torch.cat([y0, y1])
    x, found = object_crops(images, cfg.min_area)
    keep = torch.tensor([len(f) > 0 for f in found])  # an object too small to find is skipped
    return x, labels[keep]


def train(cfg: ClassifierConfig) -> tuple[ShapeClassifier, dict]:
    """Train on fresh renders each step (Adam, cosine to 0); returns the model in eval mode and a log."""
    torch.manual_seed(cfg.seed)
    model = ShapeClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, cfg.steps)
    losses = []
    for step in range(cfg.steps):
        x, y = _training_batch(cfg, step)
        gen = step_generator(cfg.seed, step, "classifier")
        x = x + 0.05 * torch.randn(x.shape, generator=gen)  # samples are never exactly flat
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return model.eval(), {"final_loss": sum(losses[-20:]) / len(losses[-20:])}


@torch.no_grad()
def classify(model: ShapeClassifier, x: torch.Tensor) -> torch.Tensor:
    """Predicted classes ``[N]`` of crops ``[N, 3, 32, 32]`` (chunks of 512)."""
    if not len(x):
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([model(chunk).argmax(-1) for chunk in x.split(512)])


def load_or_train(path: Path, cfg: ClassifierConfig) -> ShapeClassifier:
    """The classifier of ``cfg`` saved at ``path`` (with its config), trained and saved if absent or different."""
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if saved.get("config") == _plain(cfg):
            model = ShapeClassifier()
            model.load_state_dict(saved["weights"])
            return model.eval()
    model, log = train(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": _plain(cfg), "weights": model.state_dict(), "log": log}, path)
    return model


def _plain(cfg: ClassifierConfig) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}


def shared_job(kind: str, study, root: Path, validate) -> str | None:
    """The job kinds every vision study runs alike: ``"classifier"`` (train or load the study's shape classifier
    at ``root/classifier.pt``) and ``"validate"`` (``validate(study, root)``: the metrics on real data); what
    happened, or ``None`` for another kind."""
    if kind == "classifier":
        load_or_train(root / "classifier.pt", study.classifier)
        return "ready"
    if kind == "validate":
        return validate(study, root)
    return None
