"""HunyuanDiT (diffusers ``HunyuanDiT2DModel`` and ``HunyuanDiT2DControlNetModel``) through axial_rope: its attention
processor.

``HunyuanAttnProcessor2_0`` (diffusers 0.42.1 ``models/attention_processor.py``; the self-attention ``attn1`` and the
cross-attention to the text ``attn2`` of every block, the ControlNet's copies of the blocks alike) runs the legacy
``Attention`` plumbing (``spatial_norm``, 4-D inputs, the mask through ``prepare_attention_mask`` per head,
``group_norm``, ``norm_cross``), projects q from the tokens and k, v from the tokens or the text, splits the heads
(``[B, H, S, D]``), normalises q and k by per-head LayerNorms (``norm_q``, ``norm_k``: ``nn.LayerNorm`` over D), rotates
q, and k where the module is no cross-attention, by ``image_rotary_emb`` (``(cos, sin)`` ``[S, D]`` interleaved
tables; diffusers' ``apply_rotary_emb`` in float32, cast back), attends by ``F.scaled_dot_product_attention``,
projects out and applies ``residual_connection`` and ``rescale_output_factor``.

:class:`HunyuanDiTRopeProcessor` does the same step for step, the norm and the rotation of the self-attention's q and
k as one :func:`axial_rope.ops.norm_apply_rope` call where the norms are modules ``read_norm`` reads; the
cross-attention rotates its queries only (no key to pair with): the norm modules called, then the rotation of q.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops import apply_rope
from .diffusers_processors import RopeProcessor, call_norm

__all__ = ["HunyuanDiTRopeProcessor"]


class HunyuanDiTRopeProcessor(RopeProcessor):
    """HunyuanDiT's self-attention (q and k rotated) and cross-attention to the text (q rotated); ``bhsd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)
        batch, seq, _ = hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, seq, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key, value = attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states)
        head_dim = key.shape[-1] // attn.heads
        heads = lambda x: x.view(batch, -1, attn.heads, head_dim).transpose(1, 2)  # noqa: E731  # [B, H, S, D]
        q, k, v = heads(query), heads(key), heads(value)

        rotation = self.tables(image_rotary_emb)
        if not attn.is_cross_attention:  # fused where read_norm reads both norms
            q, k = self.norm_then_rotate(attn, q, k, rotation, "bhsd")
        else:  # the queries rotated, the text's keys not: the norm modules, then the rotation of q
            q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
            if rotation is not None:
                q = apply_rope(q, rotation.cos, rotation.sin, rotation.pairing, "bhsd", self.backend)

        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(q.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        if input_ndim == 4:
            out = out.transpose(-1, -2).reshape(batch, channel, height, width)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor
