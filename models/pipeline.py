"""diffusers pipelines for the reference DiTs: class-conditional images and videos in pixel space.

The models work directly on RGB in [-1, 1] (no VAE) and are trained as rectified flows
(:mod:`models.flow`): ``x_t = (1 - sigma) x_0 + sigma eps``, velocity ``eps - x_0``, model
timestep ``1000 sigma``. diffusers' flow-match schedulers use the same convention (their
``timesteps`` are ``sigmas * num_train_timesteps``; ``step`` adds ``(sigma_next - sigma) v``).
By default the sigmas are SD3's ``linspace(1, 1/n, n)`` and a final 0, the ``n + 1`` equal
steps of :func:`models.flow.sample_euler`, so the default pipeline reproduces it. Other
schedulers that integrate a flow swap in: ``FlowMatchHeunDiscreteScheduler``, or
UniPC / DPM-Solver with ``use_flow_sigmas=True, prediction_type="flow_prediction"``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.pipeline_utils import DiffusionPipeline, ImagePipelineOutput
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

import axial_rope as ar
from axial_rope.parallel import ContextParallel

from .diffusers_models import AxialDiT2DModel, AxialDiT3DModel
from .flow import T_SCALE, classifier_free_guidance

__all__ = ["AxialDiTPipeline", "AxialVideoDiTPipeline", "AxialVideoDiTPipelineOutput"]

OUTPUT_TYPES = ("pil", "np", "pt")


@dataclass
class AxialVideoDiTPipelineOutput(BaseOutput):
    """``frames``: ``[B, F, C, H, W]`` tensor ("pt"), ``[B, F, H, W, C]`` array ("np"), or lists of PIL images."""

    frames: torch.Tensor | np.ndarray | list


def _check_flow_scheduler(scheduler) -> None:
    flow = type(scheduler).__name__.startswith("FlowMatch")
    if not flow and getattr(scheduler.config, "prediction_type", None) != "flow_prediction":
        raise ValueError(
            f"scheduler {type(scheduler).__name__} does not integrate a rectified flow (velocity eps - x0); use a "
            "FlowMatch* scheduler, or UniPC / DPM-Solver with use_flow_sigmas=True, prediction_type='flow_prediction'"
        )


def _set_timesteps(scheduler, num_inference_steps: int, device: torch.device) -> torch.Tensor:
    """The scheduler's timesteps for ``num_inference_steps``; sigmas ``1, 1 - 1/n, ..., 1/n`` where it takes them."""
    if not isinstance(num_inference_steps, int) or num_inference_steps <= 0:
        raise ValueError(f"num_inference_steps must be a positive int, got {num_inference_steps!r}")
    if "sigmas" in inspect.signature(scheduler.set_timesteps).parameters:
        sigmas = np.linspace(1.0, 1.0 / num_inference_steps, num_inference_steps)
        scheduler.set_timesteps(sigmas=sigmas, device=device)
    else:
        scheduler.set_timesteps(num_inference_steps, device=device)
    return scheduler.timesteps


def _labels(class_labels: int | list[int] | torch.Tensor, per_label: int, num_classes: int, device) -> torch.Tensor:
    if not isinstance(per_label, int) or per_label <= 0:
        raise ValueError(f"the number of samples per label must be a positive int, got {per_label!r}")
    labels = torch.as_tensor(class_labels, dtype=torch.long).reshape(-1)
    if labels.numel() == 0 or labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"class_labels must be in [0, {num_classes}), got {class_labels!r}")
    return labels.repeat_interleave(per_label).to(device)


def _check_sizes(name: str, sizes: dict[str, int], patch: tuple[int, ...]) -> None:
    for (key, size), p in zip(sizes.items(), patch):
        if not isinstance(size, int) or size <= 0 or size % p:
            raise ValueError(f"{key} must be a positive multiple of the {name} patch {p}, got {size!r}")


def _check_output_type(output_type: str) -> None:
    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")


def denoise(
    pipe: DiffusionPipeline,
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    latents: torch.Tensor,
    num_inference_steps: int,
    generator: torch.Generator | list[torch.Generator] | None,
) -> torch.Tensor:
    """Integrate ``latents`` (noise at sigma 1) to data with ``pipe.scheduler``.

    ``velocity(x, t)`` returns ``eps - x_0`` ``[B, C, ...]`` for the model timestep ``t [B]`` in [0, 1000].
    """
    scheduler = pipe.scheduler
    _check_flow_scheduler(scheduler)
    timesteps = _set_timesteps(scheduler, num_inference_steps, latents.device)
    latents = latents * getattr(scheduler, "init_noise_sigma", 1.0)
    # schedulers count in their own num_train_timesteps; the models in [0, 1000]
    to_model = T_SCALE / scheduler.config.num_train_timesteps
    step_kwargs = {"generator": generator} if "generator" in inspect.signature(scheduler.step).parameters else {}
    for t in pipe.progress_bar(timesteps):
        x = scheduler.scale_model_input(latents, t) if hasattr(scheduler, "scale_model_input") else latents
        v = velocity(x, (t * to_model).float().expand(x.shape[0]))
        latents = scheduler.step(v, t, latents, **step_kwargs, return_dict=False)[0]
    return latents


def guided(
    model: torch.nn.Module,
    x: torch.Tensor,
    t: torch.Tensor,
    labels: torch.Tensor | None,
    null: int | None,
    guidance_scale: float,
    **kwargs,
) -> torch.Tensor:
    """The velocity ``[B, C, ...]`` of a diffusers model with :func:`models.flow.classifier_free_guidance`."""

    def prediction(*args, **kw) -> torch.Tensor:
        return model(*args, **kw).sample

    return classifier_free_guidance(prediction, x, t, labels, null, guidance_scale, **kwargs)[:, : x.shape[1]]


def _video_conditioning(cfg, class_labels, cond: torch.Tensor | None, per_video: int, device):
    """Checked labels ``[B]`` (or ``None``) and conditioning vectors ``[B, cond_dim]`` (or ``None``), each
    repeated ``per_video`` times; ``cond`` holds one vector per label, or per video without labels."""
    labels = None
    if cfg.num_classes > 0:
        if class_labels is None:
            raise ValueError(f"class_labels is required: the model has num_classes={cfg.num_classes}")
        labels = _labels(class_labels, per_video, cfg.num_classes, device)
    elif class_labels is not None:
        raise ValueError("class_labels is not used by this model (num_classes=0); pass cond")
    if cond is not None:
        n = len(labels) // per_video if labels is not None else len(cond)  # one per video
        if cond.shape != (n, cfg.cond_dim):
            raise ValueError(f"cond must have shape [{n}, cond_dim={cfg.cond_dim}], got {tuple(cond.shape)}")
        cond = cond.to(device).repeat_interleave(per_video, dim=0)
    return labels, cond


def _same_on_group(latents: torch.Tensor, cp: ContextParallel | None) -> torch.Tensor:
    """``latents`` as the first rank of ``cp.group`` holds them (a broadcast): ranks sharing a video must
    start from the same noise, whatever generator each was given."""
    if cp is None or cp.world == 1:
        return latents
    group = dist.group.WORLD if cp.group is None else cp.group
    latents = latents.clone()  # never the caller's tensor, overwritten in place
    dist.broadcast(latents, src=dist.get_global_rank(group, 0), group=group)
    return latents


class AxialDiTPipeline(DiffusionPipeline):
    """Class-conditional image sampling with :class:`~models.diffusers_models.AxialDiT2DModel` (pixel space).

    Args:
        transformer: the image DiT.
        scheduler: a flow scheduler; ``None``: ``FlowMatchEulerDiscreteScheduler()``.
    """

    model_cpu_offload_seq = "transformer"
    _optional_components = ["scheduler"]  # None: the default FlowMatchEulerDiscreteScheduler

    def __init__(self, transformer: AxialDiT2DModel, scheduler: FlowMatchEulerDiscreteScheduler | None = None):
        super().__init__()
        scheduler = FlowMatchEulerDiscreteScheduler() if scheduler is None else scheduler
        self.register_modules(transformer=transformer, scheduler=scheduler)
        self.image_processor = VaeImageProcessor(vae_scale_factor=1, do_resize=False)

    @torch.no_grad()
    def __call__(
        self,
        class_labels: int | list[int] | torch.Tensor,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int = 40,
        guidance_scale: float = 3.0,
        pos_mode: str | None = None,
        num_images_per_label: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
    ) -> ImagePipelineOutput | tuple:
        """Sample ``len(class_labels) * num_images_per_label`` images.

        Args:
            class_labels: class indices (one image each, times ``num_images_per_label``).
            height, width: pixels, multiples of the patch; default the training ``input_size``.
            guidance_scale: classifier-free guidance (1: conditional only).
            pos_mode: position scaling for sizes other than the training one: ``"none"``,
                ``"interpolate"``, ``"ntk"``, ``"yarn"``, ``"normalize"`` (see :mod:`models.dit`).
            generator: for the initial noise (and stochastic schedulers).
            latents: initial noise ``[B, 3, height, width]`` instead of drawing it.
            output_type: ``"pil"`` (list of images), ``"np"`` (``[B, H, W, 3]`` in [0, 1]), ``"pt"`` (``[B, 3, H, W]``).

        Returns:
            ``ImagePipelineOutput(images=...)``, or ``(images,)`` with ``return_dict=False``.
        """
        _check_output_type(output_type)
        cfg = self.transformer.config
        height, width = height or cfg.input_size, width or cfg.input_size
        _check_sizes("image", {"height": height, "width": width}, (cfg.patch_size, cfg.patch_size))
        device = self._execution_device
        labels = _labels(class_labels, num_images_per_label, cfg.num_classes, device)
        shape = (len(labels), cfg.in_channels, height, width)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=self.transformer.dtype)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
        null = self.transformer.null_label

        def velocity(x, t):
            return guided(self.transformer, x, t, labels, null, guidance_scale, pos_mode=pos_mode)

        images = denoise(
            self, velocity, latents.to(device=device, dtype=self.transformer.dtype), num_inference_steps, generator
        )
        images = self.image_processor.postprocess(images.float().clamp(-1, 1), output_type=output_type)
        self.maybe_free_model_hooks()
        return ImagePipelineOutput(images=images) if return_dict else (images,)


class AxialVideoDiTPipeline(DiffusionPipeline):
    """Class-conditional (or vector-conditioned) video sampling with :class:`~models.diffusers_models.AxialDiT3DModel`.

    Args:
        transformer: the video DiT.
        scheduler: a flow scheduler; ``None``: ``FlowMatchEulerDiscreteScheduler()``.
    """

    model_cpu_offload_seq = "transformer"
    _optional_components = ["scheduler"]  # None: the default FlowMatchEulerDiscreteScheduler

    def __init__(self, transformer: AxialDiT3DModel, scheduler: FlowMatchEulerDiscreteScheduler | None = None):
        super().__init__()
        scheduler = FlowMatchEulerDiscreteScheduler() if scheduler is None else scheduler
        self.register_modules(transformer=transformer, scheduler=scheduler)
        self.video_processor = VideoProcessor(vae_scale_factor=1, do_resize=False)

    @torch.no_grad()
    def __call__(
        self,
        class_labels: int | list[int] | torch.Tensor | None = None,
        num_frames: int = 8,
        height: int = 32,
        width: int = 32,
        num_inference_steps: int = 30,
        guidance_scale: float = 3.0,
        temporal_scaling: ar.scaling.Scaling | dict | None = None,
        cond: torch.Tensor | None = None,
        num_videos_per_label: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "np",
        return_dict: bool = True,
        context_parallel: ContextParallel | None = None,
    ) -> AxialVideoDiTPipelineOutput | tuple:
        """Sample videos of ``num_frames`` frames.

        Args:
            class_labels: class indices (configs with ``num_classes``), one video each times ``num_videos_per_label``.
            num_frames, height, width: sizes, multiples of the patch ``(p_t, p_y, p_x)``.
            guidance_scale: classifier-free guidance over the class label (1: conditional only).
            temporal_scaling: the t axis' scaling, e.g. ``ar.scaling.RIFLEx(k, test_length=num_frames)``
                to generate more frames than trained; ``None``: the model config's.
            cond: ``[B, cond_dim]`` conditioning vectors (configs with ``cond_dim``), shared by both guidance passes.
            latents: initial noise ``[B, 3, num_frames, height, width]``.
            output_type: ``"np"`` (``[B, F, H, W, 3]``), ``"pt"`` (``[B, F, 3, H, W]``), ``"pil"`` (lists of images).
            context_parallel: shard each video's tokens over ``context_parallel.group`` (e.g.
                ``ContextParallel(None, "ring")``: all ranks of the initialised default group). Every rank
                of the group calls the pipeline with the same arguments; the initial noise is the group's
                first rank's (broadcast), and every rank returns the whole videos.

        Returns:
            ``AxialVideoDiTPipelineOutput(frames=...)``, or ``(frames,)`` with ``return_dict=False``.
        """
        _check_output_type(output_type)
        cfg = self.transformer.config
        sizes = {"num_frames": num_frames, "height": height, "width": width}
        _check_sizes("video", sizes, tuple(cfg.patch_size))
        device = self._execution_device
        labels, cond = _video_conditioning(cfg, class_labels, cond, num_videos_per_label, device)
        batch = len(labels) if labels is not None else (len(cond) if cond is not None else num_videos_per_label)
        shape = (batch, cfg.in_channels, num_frames, height, width)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=self.transformer.dtype)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
        latents = _same_on_group(latents.to(device), context_parallel)
        null = self.transformer.null_label

        def velocity(x, t):
            kwargs = {"cond": cond, "temporal_scaling": temporal_scaling, "context_parallel": context_parallel}
            return guided(self.transformer, x, t, labels, null, guidance_scale, **kwargs)

        video = denoise(
            self, velocity, latents.to(device=device, dtype=self.transformer.dtype), num_inference_steps, generator
        )
        frames = self.video_processor.postprocess_video(video.float().clamp(-1, 1), output_type=output_type)
        self.maybe_free_model_hooks()
        return AxialVideoDiTPipelineOutput(frames=frames) if return_dict else (frames,)
