"""The QK-norm contract: how q and k are normalised before they are rotated, as data.

A :class:`QKNorm` describes the normalisation that attention blocks apply to q and k right before
the rotation (QK-norm; Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters"),
in the forms diffusion transformers use:

- ``kind="rms"``: ``y = x / sqrt(mean(x^2) + eps) * weight + bias`` (RMSNorm; Zhang & Sennrich 2019);
- ``kind="layer"``: ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` (LayerNorm, biased variance);
- ``span="head"``: the statistics of each head's ``D`` channels, weights and biases ``[D]`` (Flux,
  HunyuanVideo, CogVideoX's LayerNorm);
- ``span="heads"``: the statistics of each token's ``H * D`` channels, weights ``[H * D]`` (Wan's and
  LTX-Video's RMSNorm over the projection's width).

Tensors and plain values only, so ``torch.compile`` sees all of it. :func:`axial_rope.ops.norm_apply_rope`
takes one.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

__all__ = ["QKNorm", "NORM_KINDS", "SPANS", "check_norm"]

NORM_KINDS = ("rms", "layer")
SPANS = ("head", "heads")


class QKNorm(NamedTuple):
    """The normalisation of q and k before their rotation.

    Attributes:
        kind: ``"rms"`` (RMSNorm) or ``"layer"`` (LayerNorm).
        q_weight, k_weight: ``[D]`` (``span="head"``) or ``[H * D]`` of that tensor's heads (``"heads"``),
            or ``None`` (1).
        q_bias, k_bias: the same shapes, or ``None`` (0).
        eps: added to the mean square (``"rms"``) or the variance (``"layer"``).
        span: ``"head"`` (statistics per head) or ``"heads"`` (per token, over all its heads).
    """

    kind: str = "rms"
    q_weight: torch.Tensor | None = None
    k_weight: torch.Tensor | None = None
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    eps: float = 1e-6
    span: str = "head"


def check_norm(norm: QKNorm, q: torch.Tensor, k: torch.Tensor, layout: str) -> None:
    """``ValueError``/``TypeError`` naming the field when ``norm`` does not fit q and k (4-D, in ``layout``)."""
    if not isinstance(norm, QKNorm):
        raise TypeError(f"norm must be an axial_rope.ops.QKNorm, got {type(norm).__name__}")
    if norm.kind not in NORM_KINDS:
        raise ValueError(f"norm.kind must be one of {NORM_KINDS}, got {norm.kind!r}")
    if norm.span not in SPANS:
        raise ValueError(f"norm.span must be one of {SPANS}, got {norm.span!r}")
    if isinstance(norm.eps, bool) or not isinstance(norm.eps, numbers.Real) or not norm.eps >= 0:
        raise ValueError(f"norm.eps must be a real number >= 0, got {norm.eps!r}")
    head_axis = 2 if layout == "bshd" else 1
    for x_name, x in (("q", q), ("k", k)):
        width = x.shape[-1] * (x.shape[head_axis] if norm.span == "heads" else 1)
        expected = "H * D" if norm.span == "heads" else "D"
        for part in ("weight", "bias"):
            name, t = f"{x_name}_{part}", getattr(norm, f"{x_name}_{part}")
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"norm.{name} must be a floating-point torch.Tensor or None, got {type(t).__name__}")
            if t.device != x.device:
                raise ValueError(f"norm.{name} must be on {x_name}'s device {x.device}, got {t.device}")
            if tuple(t.shape) != (width,):
                raise ValueError(
                    f"norm.{name} must be [{expected}] = [{width}] for span={norm.span!r} and {x_name} of shape "
                    f"{tuple(x.shape)} (layout={layout!r}), got shape {tuple(t.shape)}"
                )
