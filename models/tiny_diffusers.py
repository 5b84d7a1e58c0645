"""Tiny random diffusers transformers and their inputs at any latent size: the one place the tests, the
benchmarks and the compile report build them (configs after diffusers' own model tests; nothing downloaded).

``build(family)`` gives ``(model, inputs)`` at the family's default token grid; ``inputs(family, h, w,
frames=...)`` gives the same model's inputs at another one (an ``h x w`` token grid, ``frames`` latent frames
for video), seeded by the size so that repeated calls agree. A family is one :class:`Tiny` in :data:`TINY`,
keyed by the name of its diffusers class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import diffusers
import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed

import axial_rope as ar

__all__ = ["COGVIDEOX", "FAMILIES", "TINY", "Tiny", "WAN", "build", "flux", "inputs"]

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
    """

    model: Callable[[int], torch.nn.Module]
    inputs: Callable[..., dict]
    grid: tuple[int, int, int]
    video: bool = True


def flux(depth: int = 1, heads: int = 2, axes_dims_rope: tuple[int, int, int] = (4, 6, 6)):
    """A Flux with ``depth`` double- and single-stream blocks of ``heads`` heads (head dim ``sum(axes_dims_rope)``);
    ``flux(1, 24, (16, 56, 56))`` has FLUX.1's block sizes."""
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=sum(axes_dims_rope),
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
        axes_dims_rope=axes_dims_rope,
    )  # fmt: skip


def _flux_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, 5, 32, generator=g),
        pooled_projections=torch.randn(B, 32, generator=g), timestep=torch.rand(B, generator=g),
        img_ids=ar.grid(1, h, w), txt_ids=torch.zeros(5, 3), return_dict=False,
    )  # fmt: skip


def _video_inputs(patch: int, text: int = 5, **extra):
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


def _cogvideox_inputs(h, w, frames, g):  # patch 2; the pipeline's tables (crop (0, 0)-(h, w): integer positions)
    return dict(
        hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        image_rotary_emb=get_3d_rotary_pos_embed(16, ((0, 0), (h, w)), (h, w), frames), return_dict=False,
    )  # fmt: skip


TINY: dict[str, Tiny] = {
    "FluxTransformer2DModel": Tiny(flux, _flux_inputs, (1, 4, 6), video=False),
    "HunyuanVideoTransformer3DModel": Tiny(
        lambda depth: diffusers.HunyuanVideoTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=10,
            num_layers=depth,
            num_single_layers=depth,
            num_refiner_layers=1,
            patch_size=1,
            patch_size_t=1,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4),
        ),  # fmt: skip
        _video_inputs(
            1,
            encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]),
            pooled_projections=lambda g: torch.randn(B, 8, generator=g),
            guidance=torch.full((B,), 3000.0),
        ),  # fmt: skip
        (3, 4, 6),
    ),
    "WanTransformer3DModel": Tiny(
        lambda depth: diffusers.WanTransformer3DModel(
            **dict(WAN, num_layers=depth), cross_attn_norm=True, rope_max_seq_len=32
        ),  # fmt: skip
        _video_inputs(2),
        (3, 2, 3),
    ),
    "CogVideoXTransformer3DModel": Tiny(
        lambda depth: diffusers.CogVideoXTransformer3DModel(**dict(COGVIDEOX, num_layers=depth)),
        _cogvideox_inputs,
        (3, 4, 4),
    ),
}
# the names the tests have long used for these, and Wan's image-to-video variant (image tokens through extra
# k/v projections; Wan fixes the text length at 512)
ALIASES = {"flux": "FluxTransformer2DModel", "hunyuan_video": "HunyuanVideoTransformer3DModel",
           "wan": "WanTransformer3DModel", "cogvideox": "CogVideoXTransformer3DModel", "wan_i2v": "wan_i2v"}  # fmt: skip
TINY["wan_i2v"] = Tiny(
    lambda depth: diffusers.WanTransformer3DModel(**dict(WAN, num_layers=depth), image_dim=8, added_kv_proj_dim=24),
    _video_inputs(2, 512, encoder_hidden_states_image=lambda g: torch.randn(B, 3, 8, generator=g)),
    (2, 2, 2),
)
FAMILIES = tuple(ALIASES)

# the video and audio families (after Tiny, B and TINY exist: that module imports them)
from models.tiny_diffusers_videoaudio import TINY_VIDEOAUDIO  # noqa: E402

TINY.update(TINY_VIDEOAUDIO)


def _tiny(name: str) -> Tiny:
    key = ALIASES.get(name, name)
    if key not in TINY:
        raise ValueError(f"no tiny model for {name!r}; known: {sorted(TINY)} (and {sorted(ALIASES)})")
    return TINY[key]


def inputs(name: str, h: int, w: int, *, frames: int | None = None) -> dict:
    """The inputs of ``name``'s tiny model at an ``h x w`` token grid (``frames`` latent frames for video)."""
    tiny = _tiny(name)
    frames = tiny.grid[0] if frames is None else frames
    g = torch.Generator().manual_seed(1000 * frames + 10 * h + w)
    return tiny.inputs(h, w, frames, g)


def build(name: str, *, depth: int = 1, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """``name``'s tiny random transformer (``depth`` blocks of each kind) in eval mode and its default inputs."""
    tiny = _tiny(name)
    torch.manual_seed(seed)
    model = tiny.model(depth).eval()
    frames, h, w = tiny.grid
    return model, inputs(name, h, w, frames=frames)
