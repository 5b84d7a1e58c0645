"""Rectified flow (Liu et al. 2022; as SD3 trains it): the objective and an Euler sampler.

``x_t = (1 - t) x_0 + t eps`` for data ``x_0`` and Gaussian ``eps``; the model predicts
the velocity ``eps - x_0``. Sampling integrates ``dx/dt`` from ``t = 1`` (noise) to 0.
Models take ``t`` scaled to [0, 1000], the range of DiT's timestep embedding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

T_SCALE = 1000.0


def logit_normal(n: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """``t = sigmoid(N(0, 1))`` ``[n]``: more weight on mid-range noise levels (SD3)."""
    return torch.sigmoid(torch.randn(n, generator=generator, device=device))


def noisy(x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``x_t`` for ``t [B]`` broadcast over the remaining axes of ``x0``."""
    t = t.view(-1, *([1] * (x0.ndim - 1)))
    return (1 - t) * x0 + t * noise


def flow_loss(
    model: Callable[..., torch.Tensor],
    x0: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    **model_kwargs,
) -> torch.Tensor:
    """Mean squared error of the predicted velocity at ``t [B]``; ``model(x_t, 1000 t, **kw)``."""
    pred = model(noisy(x0, t, noise), t * T_SCALE, **model_kwargs)
    return (pred[:, : x0.shape[1]].float() - (noise - x0).float()).square().mean()


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
    ts = torch.linspace(1.0, 0.0, steps + 1, device=noise.device)
    for t, t_next in zip(ts[:-1], ts[1:]):
        v = velocity(x, (t * T_SCALE).expand(x.shape[0]))[:, : x.shape[1]]
        x = x + (t_next - t) * v.to(x.dtype)
    return x
