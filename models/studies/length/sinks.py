"""Attention mass on the first token, per layer: the attention sink StreamingLLM reports, measured.

StreamingLLM (Xiao et al. 2024, arXiv:2309.17453) finds that trained language models put a large share of
every query's attention on the first tokens whatever they hold, so evicting them from a rolling cache breaks
the model. The streaming page found no sink effect on this project's byte models (4 sinks change the loss
by about 1e-5 nats/byte); this measures the cause directly: for each attention call of one forward, the
mean over batch, heads and queries at positions ``>= 1`` of the softmax weight on key 0, next to what uniform
attention over the visible keys would give (``mean 1 / (i + 1)``).

The attention calls are observed through a :class:`torch.overrides.TorchFunctionMode` (PyTorch's extension
point for intercepting its functions): each ``scaled_dot_product_attention`` call's probabilities are
recomputed from its ``q``, ``k``, mask and scale, and the call itself runs unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["FirstKeyMass", "first_key_mass"]


def _probabilities(q, k, attn_mask=None, is_causal=False, scale=None, enable_gqa=False) -> torch.Tensor:
    """``[B, H, S, S_k]``: the softmax weights SDPA applies (float32)."""
    q, k = q.float(), k.float()
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    S, S_k = scores.shape[-2:]
    if is_causal:
        scores = scores.masked_fill(~torch.ones(S, S_k, dtype=torch.bool, device=q.device).tril(), -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
    return scores.softmax(-1)


class FirstKeyMass(TorchFunctionMode):
    """Inside ``with FirstKeyMass() as spy:``, ``spy.mass`` and ``spy.uniform`` get one value per attention call."""

    def __init__(self):
        super().__init__()
        self.mass: list[float] = []
        self.uniform: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k = args[0], args[1]
            options = {n: kwargs[n] for n in ("attn_mask", "is_causal", "scale", "enable_gqa") if n in kwargs}
            with torch.no_grad():
                p = _probabilities(q, k, **options)[:, :, 1:]  # [B, H, S - 1, S_k]: queries past the first
                visible = (p > 0).sum(-1).float()  # keys each query sees
                self.mass.append(float(p[..., 0].mean()))
                self.uniform.append(float((1 / visible).mean()))
        return func(*args, **kwargs)


@torch.no_grad()
def first_key_mass(model, inputs: torch.Tensor, **kw) -> dict[str, list[float]]:
    """``{"mass": [layers], "uniform": [layers]}``: per attention call of ``model(inputs, **kw)`` (one per layer),
    the mean attention weight on key 0 over queries ``1 ..`` and what uniform attention would put there."""
    with FirstKeyMass() as spy:
        model(inputs, **kw)
    return {"mass": spy.mass, "uniform": spy.uniform}
