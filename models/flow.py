"""Rectified flow (Liu et al. 2022; as SD3 trains it): the objective, guidance and an Euler sampler.

``x_t = (1 - t) x_0 + t eps`` for data ``x_0`` and Gaussian ``eps``; the model predicts
the velocity ``eps - x_0``. Sampling integrates ``dx/dt`` from ``t = 1`` (noise) to 0.
Models take ``t`` scaled to [0, T_SCALE = 1000], the range of DiT's timestep embedding.
The trainer (``models/training``), the studies (``models/studies``), the reference DiTs and the diffusers pipelines
(``models/pipeline.py``) all take these definitions from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

T_SCALE = 1000.0  # model timestep = T_SCALE * t


def logit_normal(n: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """``t = sigmoid(N(0, 1))`` ``[n]``: more weight on mid-range noise levels (SD3)."""
    return torch.sigmoid(torch.randn(n, generator=generator, device=device))


def noisy(x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``x_t`` for ``t [B]`` broadcast over the remaining axes of ``x0``; for video ``x0 [B, C, T, ...]``, ``t`` may
    be ``[B, T]``, one noise level per frame (diffusion forcing, Chen et al. 2024, arXiv:2407.01392)."""
    if t.ndim == 2:
        if x0.ndim < 3 or tuple(t.shape) != (x0.shape[0], x0.shape[2]):
            raise ValueError(f"per-frame t must be [B, T] of x0 [B, C, T, ...] {tuple(x0.shape)}, got {tuple(t.shape)}")
        t = t.view(t.shape[0], 1, t.shape[1], *([1] * (x0.ndim - 3)))  # [B, 1, T, 1, ...]
    else:
        t = t.view(-1, *([1] * (x0.ndim - 1)))
    return (1 - t) * x0 + t * noise


def target_velocity(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The velocity the model learns, ``eps - x_0`` (the same shape as ``x0``)."""
    return noise - x0


def flow_loss(
    model: Callable[..., torch.Tensor],
    x0: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    **model_kwargs,
) -> torch.Tensor:
    """Mean squared error of the predicted velocity at ``t [B]`` (video: or ``[B, T]``); ``model(x_t, 1000 t, **kw)``."""
    pred = model(noisy(x0, t, noise), t * T_SCALE, **model_kwargs)
    return (pred[:, : x0.shape[1]].float() - target_velocity(x0, noise).float()).square().mean()


def classifier_free_guidance(
    model: Callable[..., torch.Tensor],
    x: torch.Tensor,
    t: torch.Tensor,
    labels: torch.Tensor | None,
    null_label: int | None,
    scale: float,
    **model_kwargs,
) -> torch.Tensor:
    """Classifier-free guidance (Ho & Salimans 2022): ``uncond + scale * (cond - uncond)``.

    One batch of ``2B``: the conditional pass on ``labels`` and the unconditional one on
    ``null_label``; tensor keyword arguments (e.g. a conditioning vector ``cond [B, D]``)
    are repeated for both halves. ``scale == 1`` runs the conditional pass alone.

    Args:
        model: ``model(x, t, labels, **model_kwargs)`` -> ``[B, C', ...]`` with ``C' >= C``.
        x: ``[B, C, ...]``; t: ``[B]``; labels: ``[B]`` class labels.

    Returns:
        ``[B, C', ...]``: guided first ``C`` channels (the velocity); the remaining ones (a
        learned variance) from the conditional pass, as DiT's ``forward_with_cfg``.
    """
    if isinstance(scale, (int, float)) and not math.isfinite(scale):
        raise ValueError(f"the guidance scale must be a finite number, got {scale!r} (NaN or inf: blank samples)")
    if scale == 1.0:
        return model(x, t, labels, **model_kwargs)
    if labels is None or null_label is None:
        raise ValueError(
            f"guidance_scale {scale} needs class labels and a model trained with label dropout "
            "(a null label); pass guidance_scale=1.0 to sample without guidance"
        )
    both = torch.cat([labels, torch.full_like(labels, null_label)])
    kwargs = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) else v for k, v in model_kwargs.items()}
    cond, uncond = model(torch.cat([x, x]), torch.cat([t, t]), both, **kwargs).chunk(2)
    c = x.shape[1]
    guided = uncond[:, :c] + scale * (cond[:, :c] - uncond[:, :c])
    return torch.cat([guided, cond[:, c:]], dim=1)


def euler_times(steps: int, device=None) -> torch.Tensor:
    """``[steps + 1]`` times from 1 (noise) to 0 in equal steps: the grid of :func:`sample_euler`."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1 (Euler steps; 0 would return the noise), got {steps!r}")
    return torch.linspace(1.0, 0.0, steps + 1, device=device)


@torch.no_grad()
def sample_euler(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    noise: torch.Tensor,
    steps: int = 40,
) -> torch.Tensor:
    """Integrate from ``t = 1`` (``noise``) to ``t = 0`` in ``steps`` equal Euler steps.

    ``velocity(x, t_scaled)`` returns the predicted ``eps - x_0`` (``[B, C, ...]``,
    extra output channels ignored).
    """
    x = noise
    ts = euler_times(steps, noise.device)
    for t, t_next in zip(ts[:-1], ts[1:]):
        v = velocity(x, (t * T_SCALE).expand(x.shape[0]))[:, : x.shape[1]]
        x = x + (t_next - t) * v.to(x.dtype)
    return x
