"""Tiny random diffusers transformers of the video and audio families (Mochi, LTX-2, Kandinsky, MiniMax, SANA-WM,
AnyFlow, ACE-Step, Stable Audio) and their inputs at any size: :data:`ENTRIES` holds a
:class:`~models.tiny_diffusers_common.Tiny` per class name.

A 1-D (audio) model reads ``h x w`` as a sequence of ``h * w`` latent frames; its ``frames`` are ignored
(``video=False``).
"""

from __future__ import annotations

import diffusers
import torch
from diffusers.models.embeddings import get_1d_rotary_pos_embed

from models.tiny_diffusers_common import B, Tiny

__all__ = ["ENTRIES"]


def _stable_audio(depth):
    return diffusers.StableAudioDiTModel(
        sample_size=8, in_channels=4, num_layers=depth, attention_head_dim=8, num_attention_heads=2,
        num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=16, time_proj_dim=8,
        global_states_input_dim=8, cross_attention_input_dim=8,
    )  # fmt: skip


def _stable_audio_inputs(h, w, frames, g):  # the pipeline's tables: rotary half the head over the L + 1 tokens
    length = h * w
    return dict(
        hidden_states=torch.randn(B, 4, length, generator=g), timestep=torch.rand(1, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 8, generator=g), global_hidden_states=torch.randn(B, 1, 8, generator=g),
        rotary_embedding=get_1d_rotary_pos_embed(4, length + 1, use_real=True, repeat_interleave_real=False),
        encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2], dtype=torch.bool), return_dict=False,
    )  # fmt: skip


def _stable_audio_3(depth):
    return diffusers.StableAudio3DiTModel(
        io_channels=4, embed_dim=16, depth=depth, num_heads=2, cond_token_dim=8, global_cond_dim=8,
        local_add_cond_dim=3, timestep_features_dim=8, ff_mult=2.0, num_memory_tokens=2,
    )  # fmt: skip


def _stable_audio_3_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, 4, h * w, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 8, generator=g), global_hidden_states=torch.randn(B, 8, generator=g),
        encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2], dtype=torch.bool), return_dict=False,
    )  # fmt: skip


def _music3(depth):
    return diffusers.MiniMaxMusic3Transformer1DModel(
        in_channels=4, condition_dim=8, num_layers=depth, num_attention_heads=2, attention_head_dim=8,
        ff_inner_dim=16, rotary_dim=4, fourier_embedding_dim=8,
    )  # fmt: skip


def _music3_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, 4, h * w, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, h * w, 8, generator=g), return_dict=False,
    )  # fmt: skip


def _minimax_h3(depth):
    return diffusers.MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=depth, num_refiner_layers=1,
        ffn_dim=32, in_channels=4, audio_in_channels=4, patch_size=(1, 2, 2), text_dim=8, freq_dim=8,
        time_embed_hidden_dim=16, time_embed_dim=16, rope_freq_dim=2,
    )  # fmt: skip


def _minimax_h3_inputs(h, w, frames, g):
    """The packed sequence of the pipeline: 5 text rows (time = row), 2 audio rows per video frame (time after the
    text, pinned to the width grid's ends), then the video rows (an aspect-normalised ``h x w`` grid per frame, frame
    times spaced by 5/3 x (1, 4, 4, ...)); video and audio at two noise levels."""
    text, audio = 5, 2 * frames
    n_video = frames * h * w
    side = (h * w) ** 0.5
    ys = ((1 - h / side) / 2 + torch.arange(h, dtype=torch.float64) / side) * 32
    xs = ((1 - w / side) / 2 + torch.arange(w, dtype=torch.float64) / side) * 32
    spans = torch.tensor([0.0] + [5 / 3 * (1 if i == 0 else 4) for i in range(frames - 1)], dtype=torch.float64)
    video = torch.stack(torch.meshgrid(text + spans.cumsum(0), ys, xs, indexing="ij"), -1).reshape(-1, 3)
    zeros = torch.zeros(audio, dtype=torch.float64)
    audio_pos = torch.stack([text + torch.arange(audio, dtype=torch.float64), zeros,
                             torch.where(torch.arange(audio) % 2 == 0, xs[0], xs[-1])], -1)  # fmt: skip
    text_pos = torch.zeros(text, 3, dtype=torch.float64)
    text_pos[:, 0] = torch.arange(text)
    position_ids = torch.cat([text_pos, audio_pos, video])
    tags = torch.tensor([1] * text + [2] * audio + [0] * n_video)
    return dict(
        hidden_states=torch.randn(B, n_video, 16, generator=g), audio_hidden_states=torch.randn(B, audio, 4, generator=g),
        encoder_hidden_states=torch.randn(B, text, 8, generator=g), timestep=torch.tensor([0.3, 0.6]),
        timestep_indices=(tags == 2).long(), token_tags=tags, position_ids=position_ids,
        video_indices=torch.arange(text + audio, text + audio + n_video), audio_indices=torch.arange(text, text + audio),
        text_indices=torch.arange(text), return_dict=False,
    )  # fmt: skip


def _anyflow(depth):
    return diffusers.AnyFlowTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
        freq_dim=32, ffn_dim=32, num_layers=depth,
    )  # fmt: skip


def _anyflow_inputs(h, w, frames, g):  # per-frame latents [B, F, C, H, W], per-frame source and target timesteps
    t = torch.rand(B, 1, generator=g) * 1000
    return dict(
        hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g), timestep=t.repeat(1, frames),
        r_timestep=(t / 2).repeat(1, frames), encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        return_dict=False,
    )  # fmt: skip


def _sana_wm(depth):
    """GDN (linear-attention) blocks only (``softmax_every_n=0``: a softmax block is another code path, which
    compile_repeated_blocks would compile again); the zero-initialised key convolutions drawn small, or the keys the
    delta rule rotates would be zero and no rotation would reach the output."""
    model = diffusers.SanaWMTransformer3DModel(
        in_channels=4, num_layers=depth, hidden_size=32, num_attention_heads=2, patch_size=(1, 2, 2),
        softmax_every_n=0, linear_head_dim=16, caption_channels=16, mlp_ratio=2.0, use_chunk_plucker_post_attn=False,
        chunk_plucker_channels=4, image_size=16,
    )  # fmt: skip
    with torch.no_grad():
        for block in model.blocks:
            block.attn.conv_k.weight.normal_(0.0, 0.2)
    return model


def _sana_wm_inputs(h, w, frames, g):  # per-frame timesteps [B, 1, F]; the text mask is required
    return dict(
        hidden_states=torch.randn(B, 4, frames, 2 * h, 2 * w, generator=g),
        timestep=(torch.rand(B, 1, frames, generator=g) * 1000), encoder_hidden_states=torch.randn(B, 1, 5, 16, generator=g),
        encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]), return_dict=False,
    )  # fmt: skip


# train_size of a 1-D model counts the tokens its rope counts: the 3 x 4 = 12 latent frames of the default grid and
# the tokens prepended to them (Stable Audio's global token, Stable Audio 3's num_memory_tokens = 2 memory tokens,
# MiniMax Music 3's timestep token); tests/test_diffusers_training_size.py checks each against the stock model
ENTRIES: dict[str, Tiny] = {
    "StableAudioDiTModel": Tiny(
        model=_stable_audio, inputs=_stable_audio_inputs, grid=(1, 3, 4), video=False, train_size=(12 + 1,)
    ),
    "StableAudio3DiTModel": Tiny(
        model=_stable_audio_3, inputs=_stable_audio_3_inputs, grid=(1, 3, 4), video=False, train_size=(12 + 2,)
    ),
    "MiniMaxMusic3Transformer1DModel": Tiny(
        model=_music3, inputs=_music3_inputs, grid=(1, 3, 4), video=False, train_size=(12 + 1,)
    ),
    "MiniMaxH3Transformer3DModel": Tiny(model=_minimax_h3, inputs=_minimax_h3_inputs, grid=(2, 2, 3)),
    "AnyFlowTransformer3DModel": Tiny(model=_anyflow, inputs=_anyflow_inputs, grid=(3, 2, 3)),
    "SanaWMTransformer3DModel": Tiny(
        model=_sana_wm,
        inputs=_sana_wm_inputs,
        grid=(3, 2, 3),
        no_dynamic="its GLUMBConvTemp loops over row chunks whose count depends on the size",
    ),
}
