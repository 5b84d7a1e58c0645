"""Kandinsky 6 and Kandinsky 6 SR (diffusers ``Kandinsky6Transformer3DModel``, ``Kandinsky6SRTransformer3DModel``)
through axial_rope: their attention processors, one class for the family's record.

``Kandinsky6AttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_kandinsky6.py``) projects q from the
tokens and k, v from the tokens (self-attention) or ``encoder_hidden_states`` (the text; the other modality in the
fused blocks' video-audio cross-attention), normalises q and k by per-head ``nn.RMSNorm`` s in the model's dtype
(``query_norm``, ``key_norm``), rotates q by ``rotary_emb`` and k by ``rotary_emb_kv`` (rotation matrices ``[S, 1,
D/2, 2, 2]``, ``[[cos, -sin], [sin, cos]]`` per interleaved plane; its ``apply_rotary``, in float32, cast back), each
where passed, attends through diffusers' dispatcher (``attn_mask`` as passed) and projects out (``out_layer``). Its
attention module passes ``rotary_emb_kv = rotary_emb`` unless the block gives the keys their own (the cross-modal
attention with ``ca_rope``: the video's table for one side, the audio's for the other).

``Kandinsky6SRAttnProcessor`` (``transformer_kandinsky6_sr.py``; its module passes its arguments by position)
normalises float32 copies of q and k (cast back), rotates both by ``rotary_emb``, builds the NABLA block mask from the
rotated q and k and attends on the ``flex`` backend.

:class:`Kandinsky6RopeProcessor` does each step for step (by the attention module's class), the norm and the rotation
as one :func:`axial_rope.ops.norm_apply_rope` call where q and k are rotated by one table (self-attention) and the
norms are modules ``read_norm`` reads; q and k rotated by two tables (the cross-modal attention) take the norm modules
then a rotation each, unrotated ones the norm modules only, as stock. The matrices are the interleaved ``(cos, sin)``
of ``matrix_tables`` (:mod:`axial_rope.integrations.diffusers_hidream`), one table for the batch.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
from diffusers.models.transformers.transformer_kandinsky6_sr import Kandinsky6SRAttention, nabla_block_mask

from ..ops import apply_rope
from .diffusers_hidream import matrix_tables
from .diffusers_processors import RopeProcessor, Tables

__all__ = ["Kandinsky6RopeProcessor"]


def _tables(rope: torch.Tensor, backend: str | None) -> Tables:
    """The rotation by Kandinsky 6's matrices ``[S, 1, D/2, 2, 2]`` (one table for the batch): ``[1, S, D]``."""
    return matrix_tables(rope.unsqueeze(0), backend)


class Kandinsky6RopeProcessor(RopeProcessor):
    """Kandinsky 6's attention (self-, text- and cross-modal) and Kandinsky 6 SR's self-attention; ``bshd``."""

    def __call__(self, attn, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if isinstance(attn, Kandinsky6SRAttention):
            return self._sr(attn, hidden_states, *args, **kwargs)
        return self._k6(attn, hidden_states, *args, **kwargs)

    def _k6(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        rotary_emb: torch.Tensor | None = None,
        rotary_emb_kv: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        q = attn.to_query(hidden_states).unflatten(-1, (attn.num_heads, -1))  # [B, S, H, D]
        k, v = (proj(context).unflatten(-1, (attn.num_heads, -1)) for proj in (attn.to_key, attn.to_value))
        norm = self.qk_norm(attn, q, "bshd", ("query_norm", "key_norm"))
        if rotary_emb is not None and rotary_emb_kv is rotary_emb and norm is not None:  # one table: fused
            q, k = _tables(rotary_emb, self.backend).norm_rotate(q, k, norm, "bshd")
        else:
            q, k = attn.query_norm(q), attn.key_norm(k)
            for i, rope in ((0, rotary_emb), (1, rotary_emb_kv)):
                if rope is not None:  # q by its table, k by its own
                    t = _tables(rope, self.backend)
                    rotated = apply_rope((q, k)[i], t.cos, t.sin, "interleaved", "bshd", self.backend)
                    q, k = (rotated, k) if i == 0 else (q, rotated)
        out = dispatch_attention_fn(
            q, k, v, attn_mask=attn_mask, backend=self._attention_backend, parallel_config=self._parallel_config
        )
        return attn.out_layer(out.flatten(-2, -1))

    def _sr(self, attn, hidden_states: torch.Tensor, rotary_emb: torch.Tensor, sparse_params: dict) -> torch.Tensor:
        from diffusers.models.transformers import transformer_kandinsky6_sr as stock

        q, k, v = (proj(hidden_states).unflatten(-1, (attn.num_heads, -1))
                   for proj in (attn.to_query, attn.to_key, attn.to_value))  # fmt: skip
        dtype = q.dtype
        tables = _tables(rotary_emb, self.backend)
        norm = self.qk_norm(attn, q, "bshd", ("query_norm", "key_norm"))
        if norm is not None:  # fused: float32 inside, rounded once
            q, k = tables.norm_rotate(q, k, norm, "bshd")
        else:
            wide = torch.promote_types(dtype, torch.float32)  # stock: .float()
            q, k = attn.query_norm(q.to(wide)).to(dtype), attn.key_norm(k.to(wide)).to(dtype)
            q, k = tables(q, k, "bshd")
        if not torch.compiler.is_compiling():
            stock._warn_uncompiled_flex_attention()
        mask = nabla_block_mask(q.transpose(1, 2), k.transpose(1, 2), sparse_params["sta_mask"],
                                thr=sparse_params["threshold"])  # fmt: skip
        out = dispatch_attention_fn(
            q, k, v, attn_mask=mask, backend=AttentionBackendName.FLEX, parallel_config=self._parallel_config
        )
        return attn.out_layer(out.flatten(2, 3))
