"""Ideogram 4 (diffusers ``Ideogram4Transformer2DModel``) through axial_rope: its attention processor.

``Ideogram4AttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_ideogram4.py``) normalises q and k by
per-head RMSNorms, rotates them by the half-paired ``(cos, sin)`` ``[B, S, D]`` of ``Ideogram4MRoPE``
(``x cos + rotate_half(x) sin``: channels ``i`` and ``i + D/2`` form a plane), attends under the block-diagonal
segment mask and projects out. :class:`Ideogram4RopeProcessor` does the same step for step, the norm and the
rotation as one :func:`axial_rope.ops.norm_apply_rope` call (``pairing="half"``) where the norms are modules
``read_norm`` reads. Stock multiplies q by the float32 tables in q's dtype, so a half-precision q leaves it as
float32; ours keeps q's dtype (v's), which the attention needs anyway.
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor, Tables

__all__ = ["Ideogram4RopeProcessor"]


class Ideogram4RopeProcessor(RopeProcessor):
    """Ideogram 4's self-attention over the packed ``[padding, text, image]`` sequence, every token rotated; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        shape = (attn.num_heads, attn.head_dim)
        q, k, v = (proj(hidden_states).unflatten(-1, shape) for proj in (attn.to_q, attn.to_k, attn.to_v))
        rotation = Tables(*image_rotary_emb, self.backend, pairing="half")  # [B, S, D] per item
        norm = self.qk_norm(attn, q, "bshd")
        if norm is not None:  # fused
            q, k = rotation.norm_rotate(q, k, norm, "bshd")
        else:
            q, k = rotation(attn.norm_q(q), attn.norm_k(k), "bshd")
        out = self._attend(q, k, v, attention_mask)
        return attn.to_out[0](out)
