"""Mochi (diffusers ``MochiRoPE``): learned frequencies that mix the three axes, one set per head."""

from __future__ import annotations

import math

import torch

from ..frequencies import Frequencies
from ..positions import positions_for_size
from ..rope import AxialRoPE
from ._registry import Convention, DiffusersFamily, PipelineUnits, builds_rope, register, register_diffusers
from .fields import size

__all__ = ["mochi", "mochi_positions"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_mochi.py` `MochiRoPE`"


@builds_rope
def mochi(
    num_attention_heads: int = 24,
    attention_head_dim: int = 128,
    pos_frequencies: torch.Tensor | None = None,
    *,
    learnable: bool = False,
) -> AxialRoPE:
    """Mochi from its config and its ``pos_frequencies`` parameter ``[3, H, D/2]`` (axes ``t, y, x``).

    Plane ``j`` of head ``h`` turns by ``sum_a pos[a] * pos_frequencies[a, h, j]``: a dense per-head
    ``F`` (``[H, 3, D/2]``), interleaved planes, ``bshd``. Without ``pos_frequencies`` it starts from
    zeros, as the untrained model does; ``learnable=True`` makes it a trainable parameter.
    """
    shape = (3, num_attention_heads, attention_head_dim // 2)
    if pos_frequencies is None:
        pos_frequencies = torch.zeros(shape)
    if tuple(pos_frequencies.shape) != shape:
        raise ValueError(f"mochi: pos_frequencies must have shape {shape}, got {tuple(pos_frequencies.shape)}")
    F = pos_frequencies.detach().to(torch.float64).permute(1, 0, 2)  # [H, 3, D/2]
    return AxialRoPE.from_frequencies(Frequencies(F), pairing="interleaved", learnable=learnable)


def mochi_positions(
    frames: int, height: int, width: int, *, base_height: int = 192, base_width: int = 192, dtype=torch.float32
) -> torch.Tensor:
    """Mochi's token coordinates ``(t, y, x)`` for a ``frames x height x width`` token grid.

    Time is the frame index; y and x are the centres of ``height`` (``width``) equal cells spanning
    ``[-n s / 2, n s / 2]`` with ``s = sqrt(base_height * base_width / (height * width))``, so every
    resolution covers the same area: ``s (i + 1/2 - n / 2)``.
    """
    s = math.sqrt(base_height * base_width / (height * width))
    t = torch.arange(frames, dtype=torch.float64)
    y = s * (torch.arange(height, dtype=torch.float64) + 0.5 - height / 2)
    x = s * (torch.arange(width, dtype=torch.float64) + 0.5 - width / 2)
    return torch.stack(torch.meshgrid(t, y, x, indexing="ij"), dim=-1).reshape(-1, 3).to(dtype)


def _example() -> AxialRoPE:
    gen = torch.Generator().manual_seed(0)
    return mochi(2, 16, torch.randn(3, 2, 8, generator=gen) * 0.3)


register(
    Convention(
        name="mochi",
        family="mochi",
        source=SOURCE,
        axes="(t, y, x) mixed in every plane: learned `pos_frequencies` [3, H, D/2]; per head",
        pairing="interleaved",
        positions="frame index; y, x cell centres scaled to the 192 x 192 base area",
        max_diff=5e-06,
        example=_example,
    )
)


def _diffusers_positions(config):
    def positions(rope, sizing, pos_frequencies, num_frames, height, width, device=None, dtype=None):
        # MochiRoPE(pos_frequencies, frames, height, width): frames at their index (sized with mode), y and x the
        # cell centres over the base area, which the model keeps at every resolution itself
        yx = mochi_positions(1, height, width, dtype=torch.float32).to(pos_frequencies.device)[:, 1:]  # [h w, 2]
        if sizing is None:
            t = torch.arange(num_frames, dtype=torch.float32, device=yx.device)
        else:  # position modes only (the record has no spectrum): F stays the model's
            t = positions_for_size((num_frames,), sizing.train_size, sizing.mode, device=yx.device).pos[:, 0]
        hw = yx.shape[0]
        tt = t[:, None, None].expand(num_frames, hw, 1)
        return torch.cat([tt, yx.expand(num_frames, hw, 2)], dim=-1).flatten(0, 1), None  # [F h w, 3], unscaled

    return positions


register_diffusers(
    DiffusersFamily(
        name="mochi",
        classes=("MochiTransformer3DModel",),
        rope=lambda c: mochi(size(c, "num_attention_heads"), size(c, "attention_head_dim")),
        tables=("module", "rope"),  # rope(pos_frequencies, frames, height, width) -> (cos, sin) [S, H, D/2]
        positions=_diffusers_positions,
        # F is the learned pos_frequencies [3, H, D/2] passed in each forward: the rotation turns by it, [H, 3, D/2]
        frequencies=lambda c: lambda pos_frequencies, *rest, **kw: pos_frequencies.float().permute(1, 0, 2),
        layout=lambda cos, sin: (cos[..., ::2], sin[..., ::2]),  # [S, H, D] interleaved -> per plane [S, H, D/2]
        grid_axes=(0,),  # mode sizes time; y and x already span the base area at every resolution
        spectrum=False,
        blocks=("transformer_blocks.",),
        qk_norm="rms",  # MochiAttnProcessor2_0: norm_q/k, norm_added_q/k (MochiRMSNorm over D), then the rotation
        max_diff=2e-6,  # float64 models, tables replaced: 1.6e-6 measured (stock: float32 angles up to 100 rad)
        source=SOURCE,
        axes="(t, y, x) mixed in every plane by the learned `pos_frequencies` [3, H, D/2], per head",
        # unknown: Mochi 1 (480 x 848, 163 frames: docs `mochi.md`) sizes time alone (grid_axes (0,)), which
        # PipelineUnits.tokens cannot return
        trained=(),
        units=PipelineUnits(16, frames=(6, 1)),
    )
)
