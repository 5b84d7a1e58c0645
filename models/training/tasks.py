"""What the trainer trains: one small adapter per model (image DiT, video DiT, language model).

A task builds its model, draws the batch of a step (a pure function of the seed and
the step, so training resumes exactly and ranks agree), computes the loss, a fixed
validation loss, and a picture of what the model does now. Its constructor takes the
run settings it uses and no others; ``from_run`` picks them from a run's settings
(``asdict(TrainConfig)`` or a checkpoint's saved ``run``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from .. import dit, video_dit
from ..flow import (
    T_SCALE,
    classifier_free_guidance,
    euler_times,
    flow_loss,
    logit_normal,
    noisy,
    sample_euler,
    target_velocity,
)
from .data import CLASSES, MovingShapes, Shapes, shard, step_generator
from .packed_data import MixedSizes, pick, render_images
from .pictures import save_gif, save_grid
from .text_task import TextTask


class ImageTask:
    """Class-conditional image DiT on :class:`~models.training.data.Shapes`, rectified flow."""

    name = "dit"
    presets = dit.PRESETS

    def __init__(self, preset: str, resolution: int, seed: int, pos_mode: str = "none", base_resolution: int = 0):
        # the model's positions are relative to base_resolution (its input_size), met at resolution under pos_mode
        self.config = replace(dit.PRESETS[preset], input_size=base_resolution or resolution, pos_mode=pos_mode)
        self.resolution, self.seed = resolution, seed
        self.data = Shapes(seed=seed)

    @classmethod
    def from_run(cls, run: Mapping) -> ImageTask:
        if cls is ImageTask and run.get("packed"):  # a native-resolution run (scripts.train --packed)
            return PackedImageTask.from_run(run)
        if cls is not ImageTask:
            return cls(run["preset"], run["resolution"], run["seed"])
        positions = {"pos_mode": run.get("pos_mode", "none"), "base_resolution": run.get("base_resolution", 0)}
        return cls(run["preset"], run["resolution"], run["seed"], **positions)  # older runs: the defaults

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
        t = self.timesteps(batch_size, gen)
        drop = torch.rand(batch_size, generator=gen) < self.config.class_dropout_prob
        part = shard(batch_size, rank, world)
        x0, y = self.inputs(range(step * batch_size + part.start, step * batch_size + part.stop))
        device = next(model.parameters()).device
        return flow_loss(
            model,
            *(v.to(device) for v in (x0, t[part], noise[part])),
            y=y.to(device),
            force_drop_ids=drop[part].to(device),
            **model_kwargs,
        )

    def timesteps(self, batch_size: int, gen: torch.Generator) -> torch.Tensor:
        """A step's noise levels ``[B]`` (logit-normal), drawn from its generator after the noise."""
        return logit_normal(batch_size, gen)

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
        resolution: int | tuple[int, int] | None = None,
        cfg_scale: float = 3.0,
        steps: int = 40,
        seed: int = 0,
        **kw,
    ) -> torch.Tensor:
        """Images ``[classes * per_class, 3, H, W]`` in [-1, 1], one row per class; ``resolution``: ``R`` or
        ``(H, W)``; ``kw`` go to the model (``pos_mode=``, ``scaling=``: a time-dependent one follows each step)."""
        resolution = resolution or self.resolution
        height, width = (resolution, resolution) if isinstance(resolution, int) else resolution
        y = torch.arange(len(CLASSES)).repeat_interleave(per_class)
        noise = torch.randn(len(y), 3, height, width, generator=torch.Generator().manual_seed(seed))
        device = next(model.parameters()).device
        y = y.to(device)
        out = sample_euler(lambda x, t: model.forward_with_cfg(x, t, y, cfg_scale, **kw), noise.to(device), steps)
        return out.clamp(-1, 1).cpu()

    def save_samples(self, model, path: Path, steps: int = 40) -> Path:
        return save_grid(self.sample(model, steps=steps), path.with_suffix(".png"), nrow=8)


# the motion of a preset's clips, when not MovingShapes' default: the frame study's model sees slow motion
# (velocity <= 0.03 of the frame per axis, spin <= 0.05 rad per frame), which neither bounces back to where
# it was nor turns a shape onto itself within 24 frames, so a repetition in its samples is the model's
VIDEO_MOTION: dict[str, dict[str, float]] = {"tiny-hunyuan": {"max_speed": 0.03, "max_spin": 0.05}}


class VideoTask(ImageTask):
    """Class-conditional video DiT on :class:`~models.training.data.MovingShapes`."""

    name = "video_dit"
    presets = video_dit.PRESETS

    def __init__(self, preset: str, resolution: int, frames: int, seed: int, causal: bool = False):
        # causal: frame-causal attention trained with one noise level per frame (diffusion forcing)
        self.config = replace(video_dit.PRESETS[preset], causal=causal)
        patch = self.config.patch_size  # (t, y, x): checked here, not at the first step's patch embedding
        if frames % patch[0] or resolution % patch[1] or resolution % patch[2]:
            raise ValueError(
                f"frames {frames} and resolution {resolution} must divide by the patch_size {patch} (t, y, x)"
            )
        self.resolution, self.frames, self.seed = resolution, frames, seed
        self.data = MovingShapes(seed=seed, **VIDEO_MOTION.get(preset, {}))

    @classmethod
    def from_run(cls, run: Mapping) -> VideoTask:
        return cls(run["preset"], run["resolution"], run["frames"], run["seed"], run.get("causal", False))

    def build(self) -> torch.nn.Module:
        return video_dit.VideoDiT(self.config)

    def shape(self) -> tuple[int, ...]:
        return (3, self.frames, self.resolution, self.resolution)

    def inputs(self, indices, frames: int | None = None):
        video, y = self.data.batch(indices, self.resolution, frames or self.frames)  # [B, T, 3, R, R]
        return video.transpose(1, 2), y  # [B, 3, T, R, R]: channels first, as the model takes

    def val_inputs(self, n: int, resolution: int, frames: int | None = None):
        held_out = replace(self.data, seed=10_000 + self.seed)  # the training motion, a seed never trained on
        video, y = held_out.batch(range(n), resolution, frames or self.frames)
        return video.transpose(1, 2), y

    def loss(self, model, step, batch_size, rank=0, world=1, *, context_parallel=None, **kw) -> torch.Tensor:
        """As :meth:`ImageTask.loss`; with ``context_parallel`` (collective over its group), this rank's
        share of the loss (:func:`models.video_dit.flow_loss_shard`), and ``rank`` / ``world`` are the
        data-parallel ones: every rank of a context group draws the same samples, noise and timesteps."""
        if context_parallel is None:
            return super().loss(model, step, batch_size, rank, world, **kw)
        gen = step_generator(self.seed, step, "noise")  # ImageTask.loss's draws, in its order
        noise = torch.randn(batch_size, *self.shape(), generator=gen)
        t = logit_normal(batch_size, gen)
        drop = torch.rand(batch_size, generator=gen) < self.config.class_dropout_prob
        part = shard(batch_size, rank, world)
        x0, y = self.inputs(range(step * batch_size + part.start, step * batch_size + part.stop))
        device = next(model.parameters()).device
        x0, t, noise = (v.to(device) for v in (x0, t[part], noise[part]))
        kw |= {"y": y.to(device), "force_drop_ids": drop[part].to(device)}
        return video_dit.flow_loss_shard(model, x0, t, noise, context_parallel, self.config.patch_size, **kw)

    def timesteps(self, batch_size: int, gen: torch.Generator) -> torch.Tensor:
        """As :meth:`ImageTask.timesteps`; a causal model draws one per latent frame, ``[B, T]``: diffusion forcing
        (Chen et al. 2024, arXiv:2407.01392), so it learns to denoise a frame whatever the others' noise."""
        if not self.config.causal:
            return super().timesteps(batch_size, gen)
        frames = self.frames // self.config.patch_size[0]
        return logit_normal(batch_size * frames, gen).view(batch_size, frames)

    @torch.no_grad()
    def sample(
        self,
        model,
        per_class: int = 2,
        frames: int | None = None,
        cfg_scale: float = 3.0,
        steps: int = 30,
        seed: int = 0,
        resolution: int | None = None,
        **kw,
    ) -> torch.Tensor:
        """Videos ``[classes * per_class, 3, T, R, R]`` in [-1, 1] (``R``: ``resolution``, default the trained one).

        ``context_parallel=cp`` (in ``kw``, passed to the model) shards every video's tokens over
        ``cp.group``: collective, the same noise on every rank, the whole videos returned on each.
        """
        frames = frames or self.frames
        y = torch.arange(len(CLASSES)).repeat_interleave(per_class)
        side = resolution or self.resolution
        shape = (len(y), 3, frames, side, side)
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        null = model.y_embedder.null_label
        device = next(model.parameters()).device  # a GPU under torchrun: the collectives need its tensors
        y, noise = y.to(device), noise.to(device)

        def velocity(x, t):
            return classifier_free_guidance(model, x, t, y, null, cfg_scale, **kw)

        return sample_euler(velocity, noise, steps).clamp(-1, 1).cpu()

    def save_samples(self, model, path: Path, steps: int = 30, **kw) -> Path:
        return save_gif(self.sample(model, steps=steps, **kw), path.with_suffix(".gif"))


class PackedImageTask(ImageTask):
    """The image DiT at native resolution (``--packed``, docs/packing.md): each step packs images of mixed
    sizes and aspect ratios (sides ``R / 2 .. 3 R / 2``, up to 3:1) into one sequence of a token budget.

    The budget is ``batch_size`` images of the training size ``R`` (``batch_size * (R / patch)^2`` tokens),
    so a step costs about what an unpacked step of ``batch_size`` does. The loss is the mean squared
    velocity error over every pixel of the step (larger images weigh more, as in token-level losses).
    Validation and the square sample grid are :class:`ImageTask`'s, so runs compare at ``R``.
    """

    def __init__(self, preset: str, resolution: int, seed: int):
        super().__init__(preset, resolution, seed)
        p = self.config.patch_size
        low, high = max(p, (resolution // 2) // p * p), (resolution * 3 // 2) // p * p
        self.sizes = MixedSizes(low, high, 3.0, p, seed)

    def budget(self, batch_size: int) -> int:
        return batch_size * (self.resolution // self.config.patch_size) ** 2

    def images(self, step: int, batch_size: int, rank: int = 0, world: int = 1):
        """This rank's images of ``step`` (``[3, H_i, W_i]``), labels ``[N]`` and the unused share of the budget."""
        pool = 8 * batch_size  # candidates per rank and step: enough to fill the budget closely
        first = (step * world + rank) * pool
        indices, sizes, waste = pick(self.sizes, first, pool, self.budget(batch_size), self.config.patch_size)
        images, labels = render_images(self.data, indices, sizes)
        return images, labels, waste

    def loss(self, model, step: int, batch_size: int, rank: int = 0, world: int = 1, **model_kwargs) -> torch.Tensor:
        """Rectified-flow loss of this rank's packed step (each rank packs its own images)."""
        x0, y, _ = self.images(step, batch_size, rank, world)
        gen = step_generator(self.seed, step, f"packed-noise{rank}")
        noise = [torch.randn(x.shape, generator=gen) for x in x0]
        t = logit_normal(len(x0), gen)
        drop = torch.rand(len(x0), generator=gen) < self.config.class_dropout_prob
        device = next(model.parameters()).device
        x0, noise = [x.to(device) for x in x0], [n.to(device) for n in noise]
        t = t.to(device)
        xt = [noisy(x, t[i : i + 1], n) for i, (x, n) in enumerate(zip(x0, noise))]  # each image at its own t
        preds = model(xt, t * T_SCALE, y.to(device), force_drop_ids=drop.to(device), **model_kwargs)
        err = [
            (p[: x.shape[0]].float() - target_velocity(x, n).float()).square().sum()
            for p, x, n in zip(preds, x0, noise)
        ]
        return torch.stack(err).sum() / sum(x.numel() for x in x0)

    @torch.no_grad()
    def sample_sizes(self, model, sizes, labels, cfg_scale: float = 3.0, steps: int = 40, seed: int = 0) -> list:
        """Images ``[3, H_i, W_i]`` in [-1, 1] at ``sizes`` (pixels), one packed batch, Euler from noise."""
        device = next(model.parameters()).device
        gen = torch.Generator().manual_seed(seed)
        xs = [torch.randn(3, h, w, generator=gen).to(device) for h, w in sizes]
        y = torch.as_tensor(labels, device=device)
        ts = euler_times(steps)
        for t, t_next in zip(ts[:-1].tolist(), ts[1:].tolist()):
            tt = torch.full((len(xs),), t * T_SCALE, device=device)
            v = model.forward_packed_with_cfg(xs, tt, y, cfg_scale)
            xs = [x + (t_next - t) * vi[: x.shape[0]] for x, vi in zip(xs, v)]
        return [x.clamp(-1, 1).cpu() for x in xs]

    def save_samples(self, model, path: Path, steps: int = 40, **kw) -> Path:
        """The square grid of :meth:`ImageTask.save_samples`, and ``<name>_mixed.png``: one packed batch of sizes."""
        out = super().save_samples(model, path, steps=steps)
        sizes = [(16, 48), (48, 16), (24, 40), (32, 32), (48, 48), (20, 36), (40, 24), (16, 16)]
        side = self.resolution / 32  # the sizes above are for R = 32
        sizes = [tuple(max(4, round(s * side / 4) * 4) for s in hw) for hw in sizes]
        labels = [i % len(CLASSES) for i in range(len(sizes))]
        images = self.sample_sizes(model, sizes, labels, steps=steps)
        H, W = max(h for h, _ in sizes), max(w for _, w in sizes)
        sheet = torch.ones(len(images), 3, H, W)  # white around each image
        for cell, img in zip(sheet, images):
            cell[:, : img.shape[1], : img.shape[2]] = img
        save_grid(sheet, path.with_name(path.stem + "_mixed.png"), nrow=4)
        return out


TASKS = {task.name: task for task in (ImageTask, VideoTask, TextTask)}
