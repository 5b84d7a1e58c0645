"""Krea 2 (diffusers ``Krea2Transformer2DModel``) through axial_rope: its attention processor.

``Krea2AttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_krea2.py``) projects q (``num_heads``
heads), k and v (``num_kv_heads``: grouped-query attention) and a sigmoid output gate from the tokens, normalises q
and k by ``Krea2RMSNorm`` over D (a zero-centred scale: ``F.rms_norm`` of float32 q, k with the multiplier
``1 + weight``, cast back), rotates both by the interleaved ``(cos, sin)`` ``[S, D]`` (``apply_rotary_emb``), repeats
each k and v head over its group of query heads, attends under the text padding mask through diffusers'
dispatcher, gates and projects out. :class:`Krea2RopeProcessor` does the same step for step, the norm and the
rotation as one :func:`axial_rope.ops.norm_apply_rope` call (k with its fewer heads) where the norms are modules
``read_norm`` reads: this module registers ``Krea2RMSNorm`` with it (an RMSNorm whose multiplier is ``1 + weight``).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

from .diffusers_processors import RopeProcessor, register_norm

__all__ = ["Krea2RopeProcessor"]

register_norm(Krea2RMSNorm, "rms", weight_offset=1.0)  # F.rms_norm(x.float(), (dim,), weight + 1, eps), cast back


class Krea2RopeProcessor(RopeProcessor):
    """Krea 2's gated self-attention over ``[text, image]``, every token rotated, k and v of ``num_kv_heads`` heads;
    ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        q = attn.to_q(hidden_states).unflatten(-1, (attn.num_heads, attn.head_dim))
        k, v = (proj(hidden_states).unflatten(-1, (attn.num_kv_heads, attn.head_dim)) for proj in (attn.to_k, attn.to_v))
        gate = attn.to_gate(hidden_states)
        rotation = self.tables(image_rotary_emb)  # [S, D]
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")
        groups = attn.num_heads // attn.num_kv_heads
        if groups > 1:  # each k, v head repeated over its group of query heads
            k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        out = self._attend(q, k, v, attention_mask)
        return attn.to_out[0](out * torch.sigmoid(gate))
