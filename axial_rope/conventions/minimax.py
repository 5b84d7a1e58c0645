"""MiniMax: MiniMax-H3 (packed video, audio and text) and MiniMax Music 3 (1-D audio), as diffusers implements them.

Both pair channels by halves (``rotate_half``) over a leading rotary part of the head, the rest passing through.
MiniMax-H3 gives each of ``(t, h, w)`` the same ``F = rope_freq_dim`` frequencies ``theta ** (-2j / 2F)``, laid
out ``t, h, w`` over ``3F`` planes, at the coordinates its pipeline packs into ``position_ids`` (aspect-normalised
spatial cells, a non-uniform frame clock, text and audio rows on the time axis): per-axis spectra to scale, no
token grid to size. MiniMax Music 3 rotates ``rotary_dim`` channels by the token index (the timestep token at 0).
Both run time from noise at 0 to data at 1.
"""

from __future__ import annotations

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, Timing, builds_rope, register_diffusers
from .fields import field, size
from .llm import llama
from .tables import sequence_positions

__all__ = []

H3_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_minimax_h3.py` `MiniMaxH3RotaryPosEmbed`"
MUSIC3_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_minimax_music3.py` `MiniMaxMusic3RotaryEmbedding`"


@builds_rope
def _minimax_h3(config) -> AxialRoPE:
    """``(t, h, w)`` with ``2 rope_freq_dim`` channels each, half pairing over the ``6 rope_freq_dim`` rotary ones."""
    freq_dim, head = size(config, "rope_freq_dim"), size(config, "attention_head_dim")
    if 6 * freq_dim > head:
        raise ValueError(f"MiniMaxH3 config: 6 rope_freq_dim = {6 * freq_dim} rotary channels exceed the head ({head})")
    return AxialRoPE((2 * freq_dim,) * 3, theta=field(config, "rope_theta"), pairing="half")


def _position_ids(config):
    def positions(rope, sizing, position_ids):  # [S, 3]: (t, h, w) of every packed row, as the pipeline gives them
        return position_ids.float(), rope.scaling

    return positions


def _music3(config) -> AxialRoPE:
    rotary, head = size(config, "rotary_dim"), size(config, "attention_head_dim")
    if rotary % 2 or rotary > head:
        raise ValueError(f"MiniMaxMusic3 config: rotary_dim {rotary} must be even and at most the head dim {head}")
    return llama(rotary, 10000.0)  # MiniMaxMusic3RotaryEmbedding's theta is fixed at 10000


register_diffusers(
    DiffusersFamily(
        name="minimax_h3",
        classes=("MiniMaxH3Transformer3DModel",),
        rope=_minimax_h3,
        tables=("module", "rope"),  # MiniMaxH3RotaryPosEmbed(position_ids): (cos, sin) [S, 6 F]
        timing=Timing(noise=0.0, clean=1.0),  # MiniMaxH3Scheduler: timestep = 1 - sigma, 1 is clean
        positions=_position_ids,
        grid_axes=(),  # positions are the pipeline's coordinates: scaling, no mode
        time_axis=0,
        qk_norm="rms",  # MiniMaxH3AttnProcessor: norm_q, norm_k (RMSNorm over D), then _apply_rotary_emb
        max_diff=2e-9,  # float64 models, tables replaced; the float32 tables
        source=H3_SOURCE,
        axes="(t, h, w): 2 `rope_freq_dim` channels each, half-paired, `rope_theta`; packed pipeline coordinates",
        # unknown: grid_axes=(): the positions are the pipeline's packed coordinates, no token grid to size
        trained=(),
    )
)

register_diffusers(
    DiffusersFamily(
        name="minimax_music3",
        classes=("MiniMaxMusic3Transformer1DModel",),
        rope=_music3,
        tables=("module", "rotary_emb"),  # MiniMaxMusic3RotaryEmbedding(seq_len, device): (cos, sin) [S, r]
        timing=Timing(noise=0.0, clean=1.0),  # flow-matching time from 0 (noise) to 1 (data)
        positions=sequence_positions,
        grid_axes=(0,),
        time_axis=0,
        max_diff=2e-9,  # float64 models, tables replaced; the float32 tables
        source=MUSIC3_SOURCE,
        axes="t: `rotary_dim` channels half-paired (timestep token at 0), theta 10000",
        # unknown: the transformer's training sequence length is not published (docs `minimax_music3.md`)
        trained=(),
        units=PipelineUnits(pixels=None),
    )
)
