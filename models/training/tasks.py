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
from . import needles
from .data import CLASSES, MovingShapes, Shapes, StdlibText, uniform
from .packed_data import MixedSizes, pick, render_images
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
        if cls is ImageTask and run.get("packed"):  # a native-resolution run (scripts.train --packed)
            return PackedImageTask.from_run(run)
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
        t = self.timesteps(batch_size, gen)
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
        part = _shard(batch_size, rank, world)
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


_STDLIB: dict[str, StdlibText] = {}


def stdlib_text(split: str) -> StdlibText:
    """The standard library's bytes of ``split``, read once per process (11 MB; a study builds many tasks)."""
    if split not in _STDLIB:
        _STDLIB[split] = StdlibText(split)
    return _STDLIB[split]


NEEDLE_RATE = 0.25  # the share of a study model's training windows that hold a planted key
NEEDLE_STREAM = 0x6E656564  # offsets the seed of the needle draws ("need")


class _TextPresets(Mapping):
    """``{name: GPTConfig}``: the reference GPT's presets and the length study's (``lm-*``), which the study's
    factory builds with their position schemes (imported when first asked: the study imports this loop)."""

    def _all(self) -> dict:
        from ..studies.length.positions import STUDY_PRESETS

        return {**gpt.PRESETS, **{name: m.config for name, m in STUDY_PRESETS.items()}}

    def __getitem__(self, name: str):
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class TextTask:
    """Byte-level language model on the standard library's source, next-byte cross-entropy.

    The length study's presets (``models.studies.length.positions.STUDY_PRESETS``) are built by the
    study's factory, with their position schemes; they also see planted keys: in a share
    :data:`NEEDLE_RATE` of their training windows a ``secret_key = '...'`` line is inserted and
    asked for at the window's end (:mod:`models.training.needles`), so that the retrieval probe
    measures how far a model that can retrieve keeps doing so, not whether copying emerged.
    """

    name = "gpt"
    presets = _TextPresets()

    def __init__(self, preset: str, context: int, seed: int):
        if preset in gpt.PRESETS:
            self.config, self.positions = replace(gpt.PRESETS[preset], max_seq_len=context), None
        else:  # a length-study model: its config and position scheme from the study's factory
            from ..studies.length.positions import study_model

            self.config, self.positions = study_model(preset, context)
        self.context, self.seed = context, seed
        self.needle_rate = 0.0 if self.positions is None else NEEDLE_RATE

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training windows ``x, y [batch_size, context]`` of ``step`` (planted keys included)."""
        x, y = self.train_data.batch(step, batch_size, self.context, seed=self.seed)
        if self.needle_rate:  # a stream of its own: independent of the window starts drawn from `seed`
            rows = torch.arange(step * batch_size, (step + 1) * batch_size)
            u = uniform(self.seed + NEEDLE_STREAM, rows, 2 + needles.KEY_LENGTH)  # [B, 7]
            x, y = needles.plant_batch(x, y, u, self.needle_rate)
        return x, y

    @classmethod
    def from_run(cls, run: Mapping) -> TextTask:
        return cls(run["preset"], run["context"], run["seed"])

    @property
    def train_data(self) -> StdlibText:
        return stdlib_text("train")

    @property
    def val_data(self) -> StdlibText:
        return stdlib_text("val")

    def build(self) -> torch.nn.Module:
        return gpt.GPT(self.config, positions=self.positions)

    def loss(self, model, step: int, batch_size: int, rank: int = 0, world: int = 1, **kw) -> torch.Tensor:
        x, y = self.batch(step, batch_size)
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
