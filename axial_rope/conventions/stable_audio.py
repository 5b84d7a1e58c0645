"""Stable Audio (Stability AI) 1-D audio DiTs, as diffusers implements them: partial half-paired RoPE over time.

Both rotate the leading channels of each head, ``theta ** (-2j / r)`` over ``r`` rotary channels, half
pairing (``rotate_half``), the rest passing through; the positions are the token indices of the sequence the
blocks see, the prepended global (Stable Audio) or memory (Stable Audio 3) tokens first. Stable Audio's
pipeline computes the tables (``r = attention_head_dim / 2``) and passes them as ``rotary_embedding``; Stable
Audio 3's ``rotary_pos_emb`` returns the *angles* ``[S, r]`` (``r = head_dim / 2``), which the processor takes
the cosine and sine of: a table without amplitude, so scalings with an attention factor are refused.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import kind, size
from .llm import llama
from .tables import grid_positions, sequence_positions

__all__ = []

SOURCE = (
    "diffusers 0.42.1 `pipelines/stable_audio/pipeline_stable_audio.py` (`get_1d_rotary_pos_embed`), "
    "`models/attention_processor.py` `StableAudioAttnProcessor2_0`"
)
SOURCE_3 = "diffusers 0.42.1 `models/transformers/transformer_stable_audio3.py` `StableAudio3RotaryEmbedding`"


def _rotary_channels(config, head: int) -> int:
    """``head / 2`` rotary channels, an even number (the upstream schedule ``theta ** (-2j / r)`` needs it)."""
    if head % 4:
        raise ValueError(f"{kind(config)} config: the head dim {head} rotates head / 2 channels, which must be even")
    return head // 2


def _stable_audio_positions(config):
    def positions(rope, sizing, hidden_states):  # hidden_states [B, C, L]; the blocks see 1 global token + L
        return grid_positions((hidden_states.shape[-1] + 1,), rope, sizing, hidden_states.device)

    return positions


def _stable_audio_3_head(config) -> int:
    embed, heads = size(config, "embed_dim"), size(config, "num_heads")
    if embed % heads:
        raise ValueError(f"{kind(config)} config: embed_dim {embed} is not divisible by num_heads {heads}")
    return _rotary_channels(config, embed // heads)


def _angles(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-paired tables ``[S, r]`` -> the angles the processor takes the cosine and sine of (amplitude 1)."""
    return torch.atan2(sin, cos)


STABLE_AUDIO_TRAINED_SOURCE = (
    "huggingface.co/stabilityai/stable-audio-open-1.0 model card (up to 47 s at 44.1 kHz): the transformer's "
    "sample_size 1024 latents (x 2048 samples: 47.55 s), plus the global token"
)
register_diffusers(
    DiffusersFamily(
        name="stable_audio",
        classes=("StableAudioDiTModel",),
        rope=lambda c: llama(_rotary_channels(c, size(c, "attention_head_dim")), 10000.0),
        tables=("argument", "rotary_embedding"),  # get_1d_rotary_pos_embed(D / 2, L + 1) of the pipeline
        positions=_stable_audio_positions,
        grid_axes=(0,),
        time_axis=0,
        timing=Timing(noise=1.0),  # CosineDPMSolverMultistepScheduler: timestep = atan(sigma) / (pi / 2)
        max_diff=1.2e-8,  # float64 models: the rotation in float32 (the processor casts q, k); 1.13e-8 measured
        source=SOURCE,
        axes="t: `attention_head_dim / 2` channels half-paired (global token at 0), theta 10000",
        trained=(TrainedGrid("Stable Audio Open 1.0", (1025,), STABLE_AUDIO_TRAINED_SOURCE),),
        units=PipelineUnits(pixels=None),
    )
)

register_diffusers(
    DiffusersFamily(
        name="stable_audio_3",
        classes=("StableAudio3DiTModel",),
        rope=lambda c: llama(_stable_audio_3_head(c), 10000.0),
        tables=("module", "rotary_pos_emb"),  # StableAudio3RotaryEmbedding(seq_len, device): angles [S, r]
        timing=Timing(noise=1.0),  # rectified flow: timestep = sigma in [0, 1]
        positions=sequence_positions,
        layout=_angles,
        grid_axes=(0,),
        time_axis=0,
        amplitude=False,
        qk_norm="rms",  # StableAudio3SelfAttnProcessor: q_norm, k_norm (StableAudio3RMSNorm over D), then rotation
        max_diff=7e-9,  # float64 models, tables replaced at the training size
        source=SOURCE_3,
        axes="t: `head_dim / 2` channels half-paired (memory tokens first), theta 10000",
        # unknown: the training clip length is not published (docs `stable_audio_3.md`: the duration is a conditioning
        # input)
        trained=(),
        units=PipelineUnits(pixels=None),
    )
)
