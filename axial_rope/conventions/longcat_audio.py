"""LongCat-AudioDiT (diffusers ``AudioDiTRotaryEmbedding``): 1-D RoPE over the audio latents and over the text.

``rotary_embed(hidden_states, seq_len)`` builds ``theta ** (-2j / D)`` (``theta`` fixed at 100000, ``D`` the head
dim ``dit_dim / dit_heads``) over the token indices ``0 .. seq_len - 1``, halves concatenated (half pairing), and
casts the tables to the activations' dtype. The transformer calls it twice per forward: once for the audio latents
(self-attention, and the queries of the cross-attention) and once for the text (the cross-attention's keys), each
from index 0. A sized forward sizes both calls by the audio's length, read from the forward's ``hidden_states`` (the
record's ``grid``), so that the cross-attention's queries and keys keep one spacing and one spectrum.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, register_diffusers
from .fields import kind, size
from .llm import llama
from .tables import at_index, grid_coordinates, grid_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_longcat_audio_dit.py` `AudioDiTRotaryEmbedding`"
THETA = 100000.0  # LongCatAudioDiTTransformer builds AudioDiTRotaryEmbedding(dim_head, 2048, base=100000.0)


def _rope(config):
    dim, heads = size(config, "dit_dim"), size(config, "dit_heads")
    if dim % heads or (dim // heads) % 2:
        raise ValueError(f"{kind(config)} config: dit_dim {dim} / dit_heads {heads} must be an even head dim")
    return llama(dim // heads, THETA)


def _positions(config):
    def positions(rope, sizing, hidden_states, seq_len=None):  # hidden_states [B, L, C]: the audio or the text
        n = hidden_states.shape[1] if seq_len is None else seq_len
        if sizing is None:
            pos, scaling = grid_positions((n,), rope, None, hidden_states.device)
            return pos, scaling, hidden_states.dtype
        # both calls on the audio's coordinates (sizing.grid: its length); the text's indices past the audio's end
        # continue at the audio's last spacing (at_index)
        (coords,), scaling = grid_coordinates((int(sizing.grid[0]),), sizing, device=hidden_states.device)
        index = torch.arange(n, device=hidden_states.device)
        return at_index(coords, index)[:, None], scaling, hidden_states.dtype

    return positions


def _layout(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    return cos.to(dtype), sin.to(dtype)  # [S, D] each, in the activations' dtype as the stock tables are


register_diffusers(
    DiffusersFamily(
        name="longcat_audio",
        classes=("LongCatAudioDiTTransformer",),
        rope=_rope,
        tables=("module", "rotary_embed"),  # rotary_embed(hidden_states, seq_len) -> (cos, sin) [S, D], twice
        timing=Timing(noise=0.0, clean=1.0),
        positions=_positions,
        layout=_layout,
        grid_axes=(0,),
        time_axis=0,
        # the self-attention's only: the cross-attention turns q by the audio's table, k by the text's (nothing to fuse)
        stock=("AudioDiTSelfAttnProcessor",),
        processor="LongCatAudioRopeProcessor",
        blocks=("blocks.",),
        qk_norm="rms across heads",  # AudioDiTSelfAttnProcessor: q_norm, k_norm (RMSNorm over H * D), then rotation
        # LongCatAudioDiTPipeline: FlowMatchEulerDiscreteScheduler(invert_sigmas=True), timestep = t / 1000 from 0
        # (pure noise) towards 1 (clean)
        grid=(("hidden_states",), lambda c: lambda hidden_states: torch.tensor([hidden_states.shape[1]])),
        max_diff=3e-7,  # float64 models, tables replaced: 2.0e-7 measured (upstream float32 tables)
        source=SOURCE,
        axes="t: `dit_dim / dit_heads` channels half-paired, theta 100000; the text's keys from index 0",
        # unknown: neither arXiv:2603.29339 nor the model card states the training clip length; the pipeline's 30 s
        # (`max_wav_duration`, 351 latent frames at 24 kHz / 2048) caps generation, it is not a training size
        trained=(),
        units=PipelineUnits(pixels=None),
    )
)
