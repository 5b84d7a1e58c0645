"""ACE-Step 1.5 (diffusers ``AceStepTransformer1DModel``): 1-D RoPE over the patched audio frames, half pairing.

The model builds its tables in a module-level function (``_ace_step_rotary_freqs(seq_len, ...)``:
``get_1d_rotary_pos_embed(head_dim, arange(seq_len), rope_theta)``, halves concatenated) and hands them to each
block as its ``position_embeddings`` argument, so the adapter replaces that argument of every block (tables
``("block argument", name)``) by the tables of the block's ``hidden_states`` ``[B, S, hidden]``: positions
``0 .. S - 1``.
"""

from __future__ import annotations

import torch

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, Timing, register_diffusers
from .fields import field, size
from .tables import grid_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/ace_step_transformer.py` `_ace_step_rotary_freqs`"


def _positions(config):
    def positions(rope, sizing, hidden_states):  # the block's [B, S, hidden]
        pos, scaling = grid_positions((hidden_states.shape[1],), rope, sizing, hidden_states.device)
        return pos, scaling, hidden_states.dtype

    return positions


def _layout(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    return cos.to(dtype), sin.to(dtype)  # the stock tables are cast to the activations' dtype


register_diffusers(
    DiffusersFamily(
        name="ace_step",
        classes=("AceStepTransformer1DModel",),
        rope=lambda c: AxialRoPE((size(c, "head_dim"),), theta=float(field(c, "rope_theta")), pairing="half"),
        tables=("block argument", "position_embeddings"),
        positions=_positions,
        layout=_layout,
        grid_axes=(0,),
        time_axis=0,
        stock=("AceStepAttnProcessor2_0",),
        processor="AceStepRopeProcessor",
        blocks=("layers.",),
        qk_norm="rms",  # AceStepAttnProcessor2_0: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb
        timing=Timing(noise=1.0),  # its timestep is the flow time in [0, 1]: 1 pure noise
        max_diff=2e-8,  # float64 models, tables replaced: 1.2e-8 measured (upstream float32 tables)
        source=SOURCE,
        axes="(t): `head_dim`, `rope_theta`",
        # unknown: ACE-Step 1.5 generates 10 s to 10 min (docs `ace_step.md`); the clip lengths it was trained on are
        # not published
        trained=(),
        units=PipelineUnits(pixels=None),
    )
)
