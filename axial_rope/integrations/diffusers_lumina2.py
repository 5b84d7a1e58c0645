"""Lumina-Image 2.0 (diffusers ``Lumina2Transformer2DModel``) through axial_rope: its attention processor.

Every Lumina 2 attention (the caption and image refiners and the main layers) is a diffusers ``Attention`` run by
``Lumina2AttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/transformer_lumina2.py``): q from the tokens, k
and v from ``encoder_hidden_states`` (the same tokens, as the blocks call it) with ``kv_heads`` heads (grouped-query
attention), per-head RMSNorms (``qk_norm="rms_norm"``: diffusers ``RMSNorm`` over D), the rotation by the complex
``image_rotary_emb`` ``[B, S, D/2]`` (``apply_rotary_emb(..., use_real=False)``: a complex product of float32 copies,
cast back; the rows past an item's length are zero, and so are its q and k there), the softmax scale (Lumina's
proportional attention where ``base_sequence_length`` is passed), k and v repeated to the query heads, the mask as
``[B, 1, 1, S]`` booleans, ``F.scaled_dot_product_attention`` and the output projection. :class:`Lumina2RopeProcessor`
does the same step for step, the norm and the rotation as one :func:`axial_rope.ops.norm_apply_rope` call (k with
its fewer heads) where the norms are modules ``read_norm`` reads; the complex table is the interleaved
``(cos, sin)`` pair of ``complex_tables`` (:mod:`axial_rope.integrations.diffusers_qwen_image`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .diffusers_processors import RopeProcessor
from .diffusers_qwen_image import complex_tables

__all__ = ["Lumina2RopeProcessor"]


class Lumina2RopeProcessor(RopeProcessor):
    """Lumina 2's self-attention over one (padded) sequence, every token rotated by its row, k and v of ``kv_heads``
    heads; ``bshd`` inside, ``bhsd`` attention."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
        base_sequence_length: int | None = None,
    ) -> torch.Tensor:
        batch, seq, _ = hidden_states.shape
        q, k, v = attn.to_q(hidden_states), attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states)
        head_dim, dtype = q.shape[-1] // attn.heads, q.dtype
        q = q.view(batch, -1, attn.heads, head_dim)
        k, v = (t.view(batch, -1, k.shape[-1] // head_dim, head_dim) for t in (k, v))  # [B, S, H_kv, D]
        rotation = None if image_rotary_emb is None else complex_tables(image_rotary_emb, self.backend)  # [B, S, D]
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")
        q, k = q.to(dtype), k.to(dtype)

        scale = attn.scale
        if base_sequence_length is not None:  # proportional attention
            scale = math.sqrt(math.log(seq, base_sequence_length)) * attn.scale
        repeats = attn.heads // k.shape[2]
        if repeats >= 1:  # each k, v head serves its group of query heads
            k, v = (t.unsqueeze(3).repeat(1, 1, 1, repeats, 1).flatten(2, 3) for t in (k, v))
        if attention_mask is not None:
            attention_mask = attention_mask.bool().view(batch, 1, 1, -1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=scale)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))
