"""Kandinsky 5 (diffusers ``Kandinsky5Transformer3DModel``) through axial_rope: its attention processor.

``Kandinsky5AttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_kandinsky.py``) projects q from the
tokens and k, v from the tokens (self-attention) or the text (cross-attention), normalises q and k by per-head
``nn.RMSNorm`` s of float32 copies (``query_norm``, ``key_norm``; cast back), rotates them where ``rotary_emb`` is
passed by its rotation matrices ``[B, S, 1, D/2, 2, 2]`` (``[[cos, -sin], [sin, cos]]`` per interleaved plane, in
float32) and rounds the rotated q and k to **bfloat16** whatever the model's dtype (``apply_rotary``'s
``.to(torch.bfloat16)``, then ``.type_as``), builds the NABLA sparse mask from the rotated q and k where
``sparse_params`` are passed, attends through diffusers' dispatcher and projects out (``out_layer``).
:class:`Kandinsky5RopeProcessor` does the same step for step, the norm and the rotation as one
:func:`axial_rope.ops.norm_apply_rope` call where the norms are modules ``read_norm`` reads, then stock's bfloat16
round trip (:attr:`Kandinsky5RopeProcessor.rotated_dtype`): a bfloat16 model's q and k are rounded once instead of
twice, a float32 model's are bfloat16 values as stock's. Where it calls the norm modules it casts q and k to at least
float32, as stock's ``.float()`` does for half inputs, but keeps float64 (stock rounds those to float32 here); the
matrices are the interleaved ``(cos, sin)`` of ``matrix_tables`` (:mod:`axial_rope.integrations.diffusers_hidream`).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_kandinsky import nablaT_v2

from .diffusers_hidream import matrix_tables
from .diffusers_processors import RopeProcessor

__all__ = ["Kandinsky5RopeProcessor"]


class Kandinsky5RopeProcessor(RopeProcessor):
    """Kandinsky 5's self-attention (rotated) and cross-attention to the text (not rotated); ``bshd``."""

    # the dtype stock's apply_rotary rounds the rotated q and k to (and back from): None leaves them as rotated
    rotated_dtype: torch.dtype | None = torch.bfloat16

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        rotary_emb: torch.Tensor | None = None,
        sparse_params: dict | None = None,
    ) -> torch.Tensor:
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        q = attn.to_query(hidden_states).unflatten(-1, (attn.num_heads, -1))  # [B, S, H, D]
        k, v = (proj(context).unflatten(-1, (attn.num_heads, -1)) for proj in (attn.to_key, attn.to_value))
        dtype = q.dtype
        rotation = None if rotary_emb is None else matrix_tables(rotary_emb, self.backend)  # [B, S, D]
        norm = self.qk_norm(attn, q, "bshd", ("query_norm", "key_norm"))
        if rotation is not None and norm is not None:  # fused: float32 inside, rounded once
            q, k = rotation.norm_rotate(q, k, norm, "bshd")
        else:
            wide = torch.promote_types(dtype, torch.float32)  # stock: .float()
            q, k = attn.query_norm(q.to(wide)).to(dtype), attn.key_norm(k.to(wide)).to(dtype)
            if rotation is not None:
                q, k = rotation(q, k, "bshd")
        if rotation is not None and self.rotated_dtype is not None:  # stock's round trip through bfloat16
            q, k = q.to(self.rotated_dtype).to(dtype), k.to(self.rotated_dtype).to(dtype)
        mask = None
        if sparse_params is not None:  # NABLA's block mask, from the rotated q and k
            mask = nablaT_v2(q, k, sparse_params["sta_mask"], thr=sparse_params["P"])
        return attn.out_layer(self._attend(q, k, v, mask))
