"""Tiny random diffusers transformers carrying Wan's tables (SkyReels-V2, Wan VACE, Sana-Video, Wan-Animate,
ChronoEdit; Helios's frame-indexed Wan-like tables; JoyImage Edit and Edit Plus), configs after diffusers' model tests. :data:`ENTRIES`: a :class:`Tiny` per class name."""

from __future__ import annotations

import diffusers
import torch

from models.tiny_diffusers_common import WAN, B, Tiny, video_inputs

ENTRIES: dict[str, Tiny] = {}
WAN_BLOCK = dict(WAN, cross_attn_norm=True, rope_max_seq_len=32)
ENTRIES["SkyReelsV2Transformer3DModel"] = Tiny(
    lambda depth: diffusers.SkyReelsV2Transformer3DModel(**dict(WAN_BLOCK, num_layers=depth)),
    video_inputs(2),
    (3, 2, 3),
)


ENTRIES["WanVACETransformer3DModel"] = Tiny(
    lambda depth: diffusers.WanVACETransformer3DModel(
        **dict(WAN_BLOCK, num_layers=depth), vace_layers=[0], vace_in_channels=4
    ),
    lambda h, w, frames, g: dict(
        video_inputs(2)(h, w, frames, g), control_hidden_states=torch.randn(B, 4, frames, 2 * h, 2 * w, generator=g)
    ),
    (3, 2, 3),
)
ENTRIES["SanaVideoTransformer3DModel"] = Tiny(
    lambda depth: diffusers.SanaVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=depth,
        num_cross_attention_heads=2,
        cross_attention_head_dim=12,
        cross_attention_dim=24,
        caption_channels=16,
        sample_size=8,
        rope_max_seq_len=32,
    ),  # fmt: skip
    video_inputs(2, encoder_attention_mask=lambda g: torch.tensor([[1] * 5, [1] * 3 + [0] * 2])),
    (3, 2, 3),
)


def _wan_animate_inputs(h, w, frames, g):  # 2 C + 4 channels; a face video of 4 (frames - 1) frames
    return dict(
        video_inputs(2)(h, w, frames, g), hidden_states=torch.randn(B, 12, frames, 2 * h, 2 * w, generator=g),
        encoder_hidden_states_image=torch.randn(B, 3, 16, generator=g),
        pose_hidden_states=torch.randn(B, 4, frames - 1, 2 * h, 2 * w, generator=g),
        face_pixel_values=torch.randn(B, 3, 4 * (frames - 1), 16, 16, generator=g),
    )  # fmt: skip


ENTRIES["WanAnimateTransformer3DModel"] = Tiny(
    lambda depth: diffusers.WanAnimateTransformer3DModel(
        **dict(WAN_BLOCK, num_layers=depth, in_channels=12),
        latent_channels=4,
        image_dim=16,
        motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
        motion_encoder_size=16,
        motion_style_dim=8,
        motion_dim=4,
        motion_encoder_dim=16,
        face_encoder_hidden_dim=16,
        face_encoder_num_heads=2,
        inject_face_latents_blocks=1,
    ),  # fmt: skip
    _wan_animate_inputs,
    (3, 2, 3),
)
ENTRIES["ChronoEditTransformer3DModel"] = Tiny(  # 2 frames: the input image and the edit, at 0 and skip - 1
    lambda depth: diffusers.ChronoEditTransformer3DModel(**dict(WAN_BLOCK, num_layers=depth)),
    video_inputs(2),
    (2, 2, 3),
)


def _helios_inputs(h, w, frames, g):  # patch (1, 2, 2); short, mid and long histories before the new frames
    latent = lambda f: torch.randn(B, 4, f, 2 * h, 2 * w, generator=g)  # noqa: E731
    return dict(
        hidden_states=latent(frames), timestep=torch.rand(B, generator=g) * 1000,
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        indices_hidden_states=torch.arange(7, 7 + frames)[None],
        latents_history_short=latent(1), indices_latents_history_short=torch.tensor([[6]]),
        latents_history_mid=latent(2), indices_latents_history_mid=torch.tensor([[4, 5]]),
        latents_history_long=latent(4), indices_latents_history_long=torch.arange(4)[None], return_dict=False,
    )  # fmt: skip


ENTRIES["HeliosTransformer3DModel"] = Tiny(
    lambda depth: diffusers.HeliosTransformer3DModel(**dict(WAN, num_layers=depth), rope_dim=(4, 4, 4)),
    _helios_inputs,
    (3, 4, 6),
    no_dynamic="its long-history patch embedding makes one token of a tiny history: a size-1 guard, so sizes recompile",
)


ENTRIES["JoyImageEditTransformer3DModel"] = Tiny(  # frames: the items (a reference and the target)
    lambda depth: diffusers.JoyImageEditTransformer3DModel(
        in_channels=4, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=depth, rope_dim_list=[4, 6, 6]
    ),
    video_inputs(2),
    (2, 2, 3),
    no_dynamic="the stock tables are built from the sizes as Python ints (specialised), unscaled",
)


def _joyimage_plus_inputs(h, w, frames, g):  # patchified: the target and frames - 1 references of h x w tokens
    shapes = [(1, h, w)] * frames
    return dict(
        hidden_states=torch.randn(B, frames * h * w, 4, 1, 2, 2, generator=g),
        timestep=torch.rand(B, generator=g) * 1000, encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        encoder_hidden_states_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]), shape_list=[shapes] * B,
        return_dict=False,
    )  # fmt: skip


ENTRIES["JoyImageEditPlusTransformer3DModel"] = Tiny(
    lambda depth: diffusers.JoyImageEditPlusTransformer3DModel(
        in_channels=4, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=depth, rope_dim_list=[4, 6, 6]
    ),
    _joyimage_plus_inputs,
    (2, 2, 3),
)
