"""What the trainer trains: one small adapter per model (image DiT, video DiT, language model).

A task builds its model, draws the batch of a step (a pure function of the seed and
the step, so training resumes exactly and ranks agree), computes the loss, a fixed
validation loss, and a picture of what the model does now. Its constructor takes the
run settings it uses and no others; ``from_run`` picks them from a run's settings
(``asdict(TrainConfig)`` or a checkpoint's saved ``run``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from .. import dit, gpt, video_dit
from ..flow import classifier_free_guidance, flow_loss, logit_normal, sample_euler
from .data import CLASSES, MovingShapes, Shapes, StdlibText
from .pictures import save_gif, save_grid


def step_generator(seed: int, step: int, stream: str) -> torch.Generator:
    """A generator for one step and purpose (``"noise"``, ``"val"``, ...), the same on every rank."""
    digest = hashlib.blake2b(f"{seed}:{step}:{stream}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def _shard(n: int, rank: int, world: int) -> slice:
    if n % world:
        raise ValueError(f"the global batch {n} must divide by the number of processes {world}")
    part = n // world
    return slice(rank * part, (rank + 1) * part)


class ImageTask:
    """Class-conditional image DiT on :class:`~models.training.data.Shapes`, rectified flow."""

    name = "dit"
    presets = dit.PRESETS

    def __init__(self, preset: str, resolution: int, seed: int):
        self.config = replace(dit.PRESETS[preset], input_size=resolution)
        self.resolution, self.seed = resolution, seed
        self.data = Shapes(seed=seed)

    @classmethod
    def from_run(cls, run: Mapping) -> ImageTask:
        return cls(run["preset"], run["resolution"], run["seed"])

    def build(self) -> torch.nn.Module:
        return dit.DiT(self.config)

    def shape(self) -> tuple[int, ...]:
        return (3, self.resolution, self.resolution)

    def inputs(self, indices, resolution: int | None = None):
        return self.data.batch(indices, resolution or self.resolution)

    def loss(self, model, step: int, batch_size: int, rank: int = 0, world: int = 1, **model_kwargs) -> torch.Tensor:
        """The loss of this rank's share of the global batch of ``step``."""
        gen = step_generator(self.seed, step, "noise")
        noise = torch.randn(batch_size, *self.shape(), generator=gen)  # drawn globally, then sharded
        t = logit_normal(batch_size, gen)
        drop = torch.rand(batch_size, generator=gen) < self.config.class_dropout_prob
        part = _shard(batch_size, rank, world)
        x0, y = self.inputs(range(step * batch_size + part.start, step * batch_size + part.stop))
        device = next(model.parameters()).device
        return flow_loss(
            model,
            *(v.to(device) for v in (x0, t[part], noise[part])),
            y=y.to(device),
            force_drop_ids=drop[part].to(device),
            **model_kwargs,
        )

    def val_inputs(self, n: int, resolution: int):
        """``n`` held-out images at ``resolution`` (a seed never trained on) and their labels."""
        return Shapes(seed=10_000 + self.seed).batch(range(n), resolution)

    @torch.no_grad()
    def val_loss(self, model, n: int = 64, resolution: int | None = None, ts=(0.1, 0.3, 0.5, 0.7, 0.9), **kw) -> dict:
        """Held-out denoising loss per noise level (images from a seed never trained on)."""
        x0, y = self.val_inputs(n, resolution or self.resolution)
        gen = step_generator(self.seed, 0, f"val{tuple(x0.shape)}")
        noise = torch.randn(x0.shape, generator=gen)
        device = next(model.parameters()).device
        out = {}
        for t in ts:
            tt = torch.full((n,), t)
            keep = torch.zeros(n, dtype=torch.bool)
            out[t] = float(
                flow_loss(
                    model,
                    x0.to(device),
                    tt.to(device),
                    noise.to(device),
                    y=y.to(device),
                    force_drop_ids=keep.to(device),
                    **kw,
                )
            )
        return out

    @torch.no_grad()
    def sample(
        self,
        model,
        per_class: int = 8,
        resolution: int | None = None,
        cfg_scale: float = 3.0,
        steps: int = 40,
        seed: int = 0,
        **kw,
    ) -> torch.Tensor:
        """Images ``[classes * per_class, 3, R, R]`` in [-1, 1], one row per class."""
        resolution = resolution or self.resolution
        y = torch.arange(len(CLASSES)).repeat_interleave(per_class)
        noise = torch.randn(len(y), 3, resolution, resolution, generator=torch.Generator().manual_seed(seed))
        device = next(model.parameters()).device
        y = y.to(device)
        out = sample_euler(lambda x, t: model.forward_with_cfg(x, t, y, cfg_scale, **kw), noise.to(device), steps)
        return out.clamp(-1, 1).cpu()

    def save_samples(self, model, path: Path, steps: int = 40) -> Path:
        return save_grid(self.sample(model, steps=steps), path.with_suffix(".png"), nrow=8)


class VideoTask(ImageTask):
    """Class-conditional video DiT on :class:`~models.training.data.MovingShapes`."""

    name = "video_dit"
    presets = video_dit.PRESETS

    def __init__(self, preset: str, resolution: int, frames: int, seed: int):
        self.config = video_dit.PRESETS[preset]
        self.resolution, self.frames, self.seed = resolution, frames, seed
        self.data = MovingShapes(seed=seed)

    @classmethod
    def from_run(cls, run: Mapping) -> VideoTask:
        return cls(run["preset"], run["resolution"], run["frames"], run["seed"])

    def build(self) -> torch.nn.Module:
        return video_dit.VideoDiT(self.config)

    def shape(self) -> tuple[int, ...]:
        return (3, self.frames, self.resolution, self.resolution)

    def inputs(self, indices, frames: int | None = None):
        video, y = self.data.batch(indices, self.resolution, frames or self.frames)  # [B, T, 3, R, R]
        return video.transpose(1, 2), y  # [B, 3, T, R, R]: channels first, as the model takes

    def val_inputs(self, n: int, resolution: int, frames: int | None = None):
        video, y = MovingShapes(seed=10_000 + self.seed).batch(range(n), resolution, frames or self.frames)
        return video.transpose(1, 2), y

    @torch.no_grad()
    def sample(
        self,
        model,
        per_class: int = 2,
        frames: int | None = None,
        cfg_scale: float = 3.0,
        steps: int = 30,
        seed: int = 0,
        **kw,
    ) -> torch.Tensor:
        """Videos ``[classes * per_class, 3, T, R, R]`` in [-1, 1]."""
        frames = frames or self.frames
        y = torch.arange(len(CLASSES)).repeat_interleave(per_class)
        shape = (len(y), 3, frames, self.resolution, self.resolution)
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        null = model.y_embedder.null_label

        def velocity(x, t):
            return classifier_free_guidance(model, x, t, y, null, cfg_scale, **kw)

        return sample_euler(velocity, noise, steps).clamp(-1, 1)

    def save_samples(self, model, path: Path, steps: int = 30) -> Path:
        return save_gif(self.sample(model, steps=steps), path.with_suffix(".gif"))


class TextTask:
    """Byte-level language model on the standard library's source, next-byte cross-entropy."""

    name = "gpt"
    presets = gpt.PRESETS

    def __init__(self, preset: str, context: int, seed: int):
        self.config = replace(gpt.PRESETS[preset], max_seq_len=context)
        self.context, self.seed = context, seed
        self.train_data, self._val_data = StdlibText("train"), None

    @classmethod
    def from_run(cls, run: Mapping) -> TextTask:
        return cls(run["preset"], run["context"], run["seed"])

    @property
    def val_data(self) -> StdlibText:
        if self._val_data is None:
            self._val_data = StdlibText("val")
        return self._val_data

    def build(self) -> torch.nn.Module:
        return gpt.GPT(self.config)

    def loss(self, model, step: int, batch_size: int, rank: int = 0, world: int = 1, **kw) -> torch.Tensor:
        x, y = self.train_data.batch(step, batch_size, self.context, seed=self.seed)
        part = _shard(batch_size, rank, world)
        device = next(model.parameters()).device
        logits = model(x[part].to(device), **kw)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y[part].flatten().to(device))

    @torch.no_grad()
    def val_loss(self, model, n: int = 16, context: int | None = None, **kw) -> dict:
        """Mean held-out loss (nats/byte) over ``n`` fixed windows of ``context`` bytes."""
        context = context or self.context
        gen = step_generator(self.seed, 0, "val")
        starts = torch.randint(len(self.val_data) - context - 1, (n,), generator=gen)
        x, y = self.val_data.windows(starts, context)
        device = next(model.parameters()).device
        losses = []
        for i in range(0, n, 4):  # small chunks: long contexts stay within memory
            logits = model(x[i : i + 4].to(device), **kw)
            losses.append(
                torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y[i : i + 4].flatten().to(device))
            )
        return {context: float(torch.stack(losses).mean())}

    def save_samples(self, model, path: Path, steps: int = 200) -> Path:
        """A 200-byte continuation of ``def `` (``steps`` is the DiTs' knob; text length is fixed)."""
        prompt = torch.tensor([list(b"def ")])
        out = model.generate(
            prompt.to(next(model.parameters()).device),
            200,
            temperature=0.8,
            top_k=40,
            generator=torch.Generator().manual_seed(0),
        )
        path = path.with_suffix(".txt")
        path.write_bytes(bytes(out[0].tolist()))
        return path


TASKS = {task.name: task for task in (ImageTask, VideoTask, TextTask)}
