"""FLUX.3 (diffusers ``Flux3Transformer2DModel``) through axial_rope: its attention processor.

Every FLUX.3 attention module (the per-mode blocks, the text blocks and the single-stream ones) is a
``Flux3Attention`` run by ``Flux3AttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_flux3.py``):
q, k, v from one sequence, per-head RMSNorms (``torch.nn.RMSNorm``) of float32 q and k, the interleaved rotation
by ``image_rotary_emb`` (``apply_rotary_emb``, float32), q and k cast back to v's dtype, attention, one output
projection. :class:`Flux3RopeProcessor` does the same step for step, the norm and the rotation as one
:func:`axial_rope.ops.norm_apply_rope` call where the norms are modules ``read_norm`` reads (float32 inside,
rounded once to the input's dtype: stock's casts). Where it calls the norm modules it casts q and k to at least
float32, as stock's ``.float()`` does for half inputs, but keeps a float64 model's float64 (stock rounds those to
float32 here; ours is the float64 arithmetic the fused call computes too).
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor

__all__ = ["Flux3RopeProcessor"]


class Flux3RopeProcessor(RopeProcessor):
    """FLUX.3's self-attention over one sequence, every token rotated; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if attn.fused_projections:
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)  # [B, S, H * D] each
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k, v = (t.unflatten(-1, (attn.heads, -1)) for t in (q, k, v))  # [B, S, H, D]
        rotation = self.tables(image_rotary_emb)  # [S, D]
        norm = self.qk_norm(attn, q, "bshd")
        if rotation is not None and norm is not None:  # fused: float32 inside, rounded once to v's dtype
            q, k = rotation.norm_rotate(q, k, norm, "bshd")
        else:
            wide = torch.promote_types(q.dtype, torch.float32)  # stock: .float()
            q, k = attn.norm_q(q.to(wide)), attn.norm_k(k.to(wide))
            if rotation is not None:
                q, k = rotation(q, k, "bshd")
            q, k = q.to(v.dtype), k.to(v.dtype)
        out = self._attend(q, k, v, attention_mask)
        return attn.to_out[1](attn.to_out[0](out))
