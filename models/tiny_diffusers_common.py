"""What the tiny diffusers models share: the :class:`Tiny` record, the batch, Flux's and Wan's tiny configs and the
inputs of a Flux-style or latent-video model (``models/tiny_diffusers.py`` and its family modules build on them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import diffusers
import torch

import axial_rope as ar

__all__ = ["B", "COGVIDEOX", "Tiny", "WAN", "flux", "flux_inputs", "video_inputs"]

B = 2  # batch


@dataclass(frozen=True)
class Tiny:
    """A tiny model of one diffusers class and its inputs.

    Attributes:
        model: ``depth -> model``: ``depth`` blocks of each kind (depth 1 in the tests).
        inputs: ``(h, w, frames, generator) -> forward kwargs`` at an ``h x w`` token grid (``frames``
            latent frames; ignored by image models).
        grid: the default ``(frames, h, w)`` in tokens (images: ``frames`` 1).
        video: whether the model has a time axis (the tests then also double the frames).
        train_size: the default grid in the record's grid axes, as the rope counts it, where it is not ``(frames,
            h, w)`` (video), ``(h, w)`` or ``(h * w,)`` (1-D): OmniGen's one axis, its sequence of text, time and
            image tokens; an audio model's ``h * w`` latent frames and the tokens prepended to them.
        mode: the sizing mode the generic checks install at twice the grid: ``"yarn"`` for models whose own
            positions already interpolate (CogView4's fixed range, crop grids), where ``"interpolate"`` is stock.
        no_fullgraph: why the stock forward cannot be compiled whole (a host read of its inputs deciding the
            shapes; or, where the reason says so, the adapter's sizing reading the grid on the host): the compile
            checks of whole forwards skip the model; its repeated blocks still compile.
        no_dynamic: why the stock model recompiles per size itself (nothing the adapter adds): the dynamic-size
            compile check skips it.
        no_repeated: why the stock model's repeated blocks recompile among themselves (blocks of one class
            configured or called differently): the repeated-blocks compile check skips it.
        dtype: the dtype the generic checks run the model in: float64, or float32 where the stock model cannot run
            in float64.
        no_checkpointing: why the stock model fails activation checkpointing itself: the checkpointing check skips it.
    """

    model: Callable[[int], torch.nn.Module]
    inputs: Callable[..., dict]
    grid: tuple[int, int, int]
    video: bool = True
    train_size: tuple[int, ...] | None = None
    mode: str = "interpolate"
    no_fullgraph: str = ""
    no_dynamic: str = ""
    no_repeated: str = ""
    dtype: torch.dtype = torch.float64
    no_checkpointing: str = ""


def flux(depth: int = 1, heads: int = 2, axes_dims_rope: tuple[int, int, int] = (4, 6, 6)):
    """A Flux with ``depth`` double- and single-stream blocks of ``heads`` heads (head dim ``sum(axes_dims_rope)``);
    ``flux(1, 24, (16, 56, 56))`` has FLUX.1's block sizes."""
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=sum(axes_dims_rope),
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
        axes_dims_rope=axes_dims_rope,
    )  # fmt: skip


def flux_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, 5, 32, generator=g),
        pooled_projections=torch.randn(B, 32, generator=g), timestep=torch.rand(B, generator=g),
        img_ids=ar.grid(1, h, w), txt_ids=torch.zeros(5, 3), return_dict=False,
    )  # fmt: skip


def video_inputs(patch: int, text: int = 5, **extra):
    """Inputs of a video model reading a latent ``[B, 4, F, H, W]`` cut by ``(1, patch, patch)``."""

    def make(h, w, frames, g):
        more = {k: v(g) if callable(v) else v for k, v in extra.items()}
        return dict(
            hidden_states=torch.randn(B, 4, frames, patch * h, patch * w, generator=g),
            timestep=torch.rand(B, generator=g) * 1000, encoder_hidden_states=torch.randn(B, text, 16, generator=g),
            return_dict=False, **more,
        )  # fmt: skip

    return make


WAN = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
    freq_dim=32, ffn_dim=32, num_layers=1, qk_norm="rms_norm_across_heads",
)  # fmt: skip
COGVIDEOX = dict(
    num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=2, text_embed_dim=16,
    num_layers=1, sample_width=8, sample_height=8, sample_frames=9, patch_size=2, temporal_compression_ratio=4,
    max_text_seq_length=5, use_rotary_positional_embeddings=True,
)  # fmt: skip
