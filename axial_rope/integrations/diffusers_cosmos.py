"""Cosmos (diffusers ``CosmosTransformer3DModel``) through axial_rope: its attention processors, one class.

``CosmosAttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/transformer_cosmos.py``; the self-attention and,
without image context, the cross-attention to the text) projects q from the tokens and k, v from the tokens or the
text, normalises q and k by per-head norms (``norm_q``, ``norm_k``: diffusers ``RMSNorm`` over D), rotates them where
``image_rotary_emb`` is passed (``(cos, sin)`` ``[S, D]`` channel tables of **half** pairing, channel ``i`` with ``i +
D/2``: diffusers' ``apply_rotary_emb(use_real_unbind_dim=-2)``, in float32, cast back), repeats k and v along the
head dim by the ratio of q's head dim to theirs (1 in every config), attends through ``dispatch_attention_fn`` with
**no** backend or parallel config (the active backend; ``set_attention_backend`` does not reach it) under
``attention_mask`` and projects out. ``CosmosAttnProcessor2_5`` (the cross-attention of a ``CosmosAttention``, with
image context) takes ``(text, image)`` contexts and masks: the text branch as above, plus an image branch (``q_img``,
``k_img``, ``v_img``, their norms ``q_img_norm``, ``k_img_norm``, never rotated) whose output is added before the
output projection.

:class:`CosmosRopeProcessor` does each step for step (2.5's where the module is a ``CosmosAttention``), the norm and
the rotation as one :func:`axial_rope.ops.norm_apply_rope` call (half pairing) where tables are passed and the norms
are modules ``read_norm`` reads.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos import CosmosAttention

from .diffusers_processors import RopeProcessor, Tables

__all__ = ["CosmosRopeProcessor"]


def _attend(q, k, v, mask) -> torch.Tensor:
    """Stock's GQA repeat (along the head dim, by the ratio of head dims) and attention of ``bhsd`` q, k, v."""
    k = k.repeat_interleave(q.size(3) // k.size(3), dim=3)
    v = v.repeat_interleave(q.size(3) // v.size(3), dim=3)
    out = dispatch_attention_fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                dropout_p=0.0, is_causal=False)  # fmt: skip
    return out.flatten(2, 3).type_as(q)


class CosmosRopeProcessor(RopeProcessor):
    """Cosmos's self-attention (rotated) and cross-attention (to the text; 2.5's with image context); ``bhsd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
    ) -> torch.Tensor:
        v25 = isinstance(attn, CosmosAttention)
        img_context = img_mask = None
        if v25:
            if not isinstance(encoder_hidden_states, tuple):
                raise ValueError("Expected encoder_hidden_states as (text_context, img_context) tuple.")
            text_context, img_context = encoder_hidden_states if encoder_hidden_states else (None, None)
            mask, img_mask = attention_mask if attention_mask else (None, None)
        else:
            text_context, mask = encoder_hidden_states, attention_mask
        if text_context is None:
            text_context = hidden_states
        heads = lambda x: x.unflatten(2, (attn.heads, -1)).transpose(1, 2)  # noqa: E731  # [B, H, S, D]
        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(text_context)), heads(attn.to_v(text_context))
        tables = None if image_rotary_emb is None else Tables.passed(image_rotary_emb, self.backend, "half")
        norm = self.qk_norm(attn, q, "bhsd")
        if tables is not None and norm is not None:  # fused: float32 inside, rounded once
            q, k = tables.norm_rotate(q, k, norm, "bhsd")
        else:
            q, k = attn.norm_q(q), attn.norm_k(k)
            if tables is not None:
                q, k = tables(q, k, "bhsd")
        out = _attend(q, k, v, mask)
        if img_context is not None:  # 2.5's image branch: normalised, not rotated
            batch, dim_head = hidden_states.shape[0], attn.out_dim // attn.heads
            view = lambda x: x.view(batch, -1, attn.heads, dim_head).transpose(1, 2)  # noqa: E731
            q_img, k_img, v_img = view(attn.q_img(hidden_states)), view(attn.k_img(img_context)), view(attn.v_img(img_context))
            out = out + _attend(attn.q_img_norm(q_img), attn.k_img_norm(k_img), v_img, img_mask)
        return attn.to_out[1](attn.to_out[0](out))
