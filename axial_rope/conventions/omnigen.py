"""OmniGen (diffusers ``OmniGenSuScaledRotaryEmbedding``): Phi-3's one-axis RoPE with LongRoPE over the sequence.

One axis, the whole head, half pairing, base ``rope_base``, scaled by LongRoPE (``rope_scaling``'s short and
long factors, ``long`` past ``original_max_position_embeddings``; cos and sin times ``sqrt(1 + ln(s) /
ln(L))``, ``s = max_position_embeddings / L``) at the pipeline's ``position_ids`` over text, the time token
and the image: the tables of the batch's first item, ``(cos, sin) [S, D]``. A scaling replaces the model's
LongRoPE; sized by ``mode``, the positions move and LongRoPE stays.
"""

from __future__ import annotations

from ..rope import AxialRoPE
from ..scaling import LongRoPE
from ._registry import DiffusersFamily, PipelineUnits, Timing, register_diffusers
from .fields import field, size
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_omnigen.py` `OmniGenSuScaledRotaryEmbedding`"


def _rope(config):
    head = size(config, "hidden_size") // size(config, "num_attention_heads")
    factors = field(config, "rope_scaling")
    original = field(config, "original_max_position_embeddings", 4096)
    longrope = LongRoPE(
        tuple(factors["short_factor"]), tuple(factors["long_factor"]), original,
        factor=field(config, "max_position_embeddings", 131072) / original,
    )  # fmt: skip
    return AxialRoPE((head,), theta=float(field(config, "rope_base", 10000)), scaling=longrope, pairing="half")


def _positions(config):
    def positions(rope, sizing, hidden_states, position_ids):  # position_ids [B, S]: the first item's are used
        pos, scaling = ids_positions(position_ids[0][:, None], rope, sizing, cols=(0,))
        own = rope.scaling[0] if isinstance(rope.scaling, tuple) else rope.scaling
        return pos, tuple(own if s is None else s for s in scaling)  # a sized axis keeps the model's LongRoPE

    return positions


register_diffusers(
    DiffusersFamily(
        name="omnigen",
        classes=("OmniGenTransformer2DModel",),
        rope=_rope,
        tables=("module", "rope"),  # rope(hidden_states, position_ids)
        timing=Timing(noise=1000.0),  # the flow-matching scheduler's timestep, sigma 1 -> 1000
        positions=_positions,
        grid_axes=(0,),
        time_axis=None,
        stock=("OmniGenAttnProcessor2_0",),
        blocks=("layers.",),
        max_diff=9e-9,  # float64 models, tables replaced: 8.4e-9 measured (upstream float32 tables)
        source=SOURCE,
        axes="(sequence,): the head, `rope_base`, LongRoPE (`rope_scaling`), half",
        # unknown: OmniGen (1024 x 1024: docs `omnigen.md`) rotates one axis over the packed text and image sequence,
        # not a token grid PipelineUnits.tokens returns
        trained=(),
        units=PipelineUnits(16),
    )
)
