"""Tiny random Cosmos 3 Omni and LongCat-AudioDiT transformers and their inputs at any size: :data:`ENTRIES` holds a
:class:`~models.tiny_diffusers_common.Tiny` per class name (configs after diffusers' own model tests,
``tests/models/transformers/test_models_transformer_cosmos3.py`` and ``..._longcat_audio_dit.py``).

Cosmos 3 packs one sequence per call (no batch): a prompt of 5 text tokens (the understanding pathway), then a
``frames x h x w`` token video and ``2 frames`` sound latents (the generation pathway), at the positions its pipeline
computes (``pipelines/cosmos/pipeline_cosmos3_omni.py``: fps-modulated time, the modality margin). LongCat-AudioDiT
reads ``h x w`` as a sequence of ``h * w`` latent frames (``video=False``).
"""

from __future__ import annotations

import inspect

import diffusers
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_text_tokens, get_3d_mrope_ids_vae_tokens

from models.tiny_diffusers_common import B, Tiny

__all__ = ["COSMOS3", "ENTRIES"]

COSMOS3 = dict(
    head_dim=16, hidden_act="relu2", hidden_size=32, intermediate_size=32, latent_channel=2, latent_patch_size=2,
    num_attention_heads=2, num_key_value_heads=1, patch_latent_dim=8, qk_norm_for_text=False, rope_axes_dim=[4, 2, 2],
    vocab_size=32, sound_gen=True, sound_dim=2, unified_3d_mrope_temporal_modality_margin=15000,
)  # fmt: skip
TEXT = 5  # prompt tokens: the understanding pathway
FPS = 16.0  # the video's frame rate: its frames 24 / 16 = 1.5 time steps apart (fps modulation)


class Cosmos3OmniTransformer(diffusers.Cosmos3OmniTransformer):
    """Cosmos 3 returning its vision and sound predictions as one flat tensor, so that the generic checks'
    ``model(**inputs)[0]`` compares both; named as the stock class, whose record the adapter finds."""

    def forward(self, *args, return_dict: bool = True, **kwargs):
        vision, sound, _ = super().forward(*args, return_dict=False, **kwargs)
        return (torch.cat([p.flatten() for p in (*vision, *(sound or ()))]),)

    # the stock arguments by name, as code inspecting the forward (the adapter's timestep hook) reads them
    forward.__signature__ = inspect.signature(diffusers.Cosmos3OmniTransformer.forward)


def _cosmos3(depth):
    return Cosmos3OmniTransformer(**COSMOS3, num_hidden_layers=depth)


def _segments(h: int, w: int, frames: int) -> tuple[torch.Tensor, int]:
    """The pipeline's ``position_ids [3, N]`` of the text, the ``frames x h x w`` video and the ``2 frames`` sound
    latents, and the generation pathway's start (``und_len``)."""
    text, offset = get_3d_mrope_ids_text_tokens(TEXT, 0, use_float_positions=True)
    start = offset + COSMOS3["unified_3d_mrope_temporal_modality_margin"]  # vision and sound share the time origin
    vision, _ = get_3d_mrope_ids_vae_tokens(frames, h, w, start, fps=FPS, base_fps=24.0, temporal_compression_factor=4)
    sound, _ = get_3d_mrope_ids_vae_tokens(2 * frames, 1, 1, start, fps=25.0, base_fps=24.0,
                                           temporal_compression_factor=1)  # fmt: skip
    return torch.cat([text, vision.float(), sound.float()], dim=1), TEXT


def _cosmos3_inputs(h, w, frames, g):
    position_ids, und_len = _segments(h, w, frames)
    n_vision, n_sound = frames * h * w, 2 * frames
    vision = torch.arange(und_len, und_len + n_vision)
    sound = torch.arange(und_len + n_vision, und_len + n_vision + n_sound)
    t = float(torch.randint(1, 1000, (), generator=g))  # UniPC's timestep, one per step for every noisy token
    return dict(
        input_ids=torch.randint(0, 32, (und_len,), generator=g), text_indexes=torch.arange(und_len),
        position_ids=position_ids, und_len=und_len, sequence_length=und_len + n_vision + n_sound,
        vision_tokens=[torch.randn(1, 2, frames, 2 * h, 2 * w, generator=g)], vision_token_shapes=[(frames, h, w)],
        vision_sequence_indexes=vision, vision_mse_loss_indexes=vision, vision_timesteps=torch.full((n_vision,), t),
        vision_noisy_frame_indexes=[torch.arange(frames)],
        sound_tokens=[torch.randn(2, n_sound, generator=g)], sound_token_shapes=[(n_sound, 1, 1)],
        sound_sequence_indexes=sound, sound_mse_loss_indexes=sound, sound_timesteps=torch.full((n_sound,), t),
        sound_noisy_frame_indexes=[torch.arange(n_sound)], return_dict=False,
    )  # fmt: skip


def _longcat_audio(depth):
    model = diffusers.LongCatAudioDiTTransformer(
        dit_dim=16, dit_depth=depth, dit_heads=2, dit_text_dim=8, latent_dim=4, text_conv=False, ff_mult=2.0
    )
    # its adaLN, final norm and output projection start at zero (the output would be 0 whatever the rotation):
    # random ones, so that attention counts
    for layer in (model.adaln_global_mlp.mlp[-1], model.norm_out.linear, model.proj_out):
        torch.nn.init.normal_(layer.weight, std=0.5)
        torch.nn.init.normal_(layer.bias, std=0.5)
    return model


def _longcat_audio_inputs(h, w, frames, g):  # texts of 5 and 3 tokens; the second audio 2 frames shorter
    length = h * w
    return dict(
        hidden_states=torch.randn(B, length, 4, generator=g), encoder_hidden_states=torch.randn(B, 5, 8, generator=g),
        encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2], dtype=torch.bool),
        timestep=torch.rand(B, generator=g),
        attention_mask=torch.tensor([[True] * length, [True] * (length - 2) + [False] * 2]),
        latent_cond=torch.randn(B, length, 4, generator=g), return_dict=False,
    )  # fmt: skip


ENTRIES = {
    "Cosmos3OmniTransformer": Tiny(model=_cosmos3, inputs=_cosmos3_inputs, grid=(2, 2, 3)),
    "LongCatAudioDiTTransformer": Tiny(model=_longcat_audio, inputs=_longcat_audio_inputs, grid=(1, 3, 4), video=False),
}
