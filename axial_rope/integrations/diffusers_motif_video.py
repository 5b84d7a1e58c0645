"""Motif-Video (diffusers ``MotifVideoTransformer3DModel``) through axial_rope: its attention processors, one class.

``MotifVideoAttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/transformer_motif_video.py``) projects the
tokens to q, k, v (with the text appended first where the module has no text projections of its own: the single
blocks), normalises q and k by per-head norms (``norm_q``, ``norm_k``: ``nn.RMSNorm`` or ``nn.LayerNorm`` over D in
the model's dtype, or none), rotates them by ``image_rotary_emb`` (``(cos, sin)`` ``[S, D]`` interleaved channel
tables; diffusers' ``apply_rotary_emb``, in float32, cast back), all but the appended text rows; in the dual-stream
blocks the text's own q, k, v (``add_*_proj``) are normalised by ``norm_added_q``, ``norm_added_k`` and appended
unrotated. It attends under ``attention_mask`` through diffusers' dispatcher and projects out (``to_out``, and
``to_add_out`` for the text). ``MotifVideoCrossAttnProcessor2_0`` (the text cross-attention) normalises the video's
queries and the text's keys, rotates the queries only, and attends under the mask's text columns.

:class:`MotifVideoRopeProcessor` does each step for step (by the attention module's class): the norm and the rotation
of the rotated rows as one :func:`axial_rope.ops.norm_apply_rope` call where the norms are modules ``read_norm``
reads; the appended text rows through the norm modules, as stock; the cross-attention's queries (with no keys to
pair with) through the norm module and then the rotation.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_motif_video import MotifVideoCrossAttention

from ..ops import apply_rope
from .diffusers_processors import RopeProcessor, Tables, call_norm

__all__ = ["MotifVideoRopeProcessor"]


class MotifVideoRopeProcessor(RopeProcessor):
    """Motif-Video's self-attention (joint with the text) and text cross-attention; ``bshd``."""

    def __call__(self, attn, hidden_states: torch.Tensor, *args, **kwargs):
        if isinstance(attn, MotifVideoCrossAttention):
            return self._cross(attn, hidden_states, *args, **kwargs)
        return self._self(attn, hidden_states, *args, **kwargs)

    def _norm_rotate(self, attn, q, k, tables: Tables | None):
        norm = self.qk_norm(attn, q, "bshd") if attn.norm_q is not None and attn.norm_k is not None else None
        if tables is not None and norm is not None:  # fused: float32 inside, rounded once
            return tables.norm_rotate(q, k, norm, "bshd")
        q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
        return (q, k) if tables is None else tables(q, k, "bshd")

    def _self(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb=None,
    ):
        appended = attn.add_q_proj is None and encoder_hidden_states is not None  # the text rows after the video's
        if appended:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        q, k, v = (proj(hidden_states).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        tables = self.tables(image_rotary_emb)
        if appended:  # the video rows rotated, the text rows normalised only
            n = q.shape[1] - encoder_hidden_states.shape[1]
            video = self._norm_rotate(attn, q[:, :n], k[:, :n], tables)
            text = self._norm_rotate(attn, q[:, n:], k[:, n:], None)
            q, k = (torch.cat(pair, dim=1) for pair in zip(video, text))
        else:
            q, k = self._norm_rotate(attn, q, k, tables)
        if attn.add_q_proj is not None and encoder_hidden_states is not None:  # the text's own, unrotated
            eq, ek, ev = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                          for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))  # fmt: skip
            eq, ek = call_norm(attn.norm_added_q, eq), call_norm(attn.norm_added_k, ek)
            q, k, v = torch.cat([q, eq], dim=1), torch.cat([k, ek], dim=1), torch.cat([v, ev], dim=1)
        out = self._attend(q, k, v, attention_mask)
        if encoder_hidden_states is not None:
            n_txt = encoder_hidden_states.shape[1]
            out, text_out = out[:, :-n_txt], out[:, -n_txt:]
            if attn.to_out is not None:
                out = attn.to_out[1](attn.to_out[0](out))
            if attn.to_add_out is not None:
                text_out = attn.to_add_out(text_out)
            return out, text_out
        if attn.to_out is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        return out

    def _cross(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb=None,
        image_embed_seq_len: int = 0,
    ) -> torch.Tensor:
        text = encoder_hidden_states[:, image_embed_seq_len:, :]
        mask = None
        if attention_mask is not None:  # the mask's text columns
            mask = attention_mask[:, :, :, image_embed_seq_len - encoder_hidden_states.shape[1] :]
        q = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        k, v = (proj(text).unflatten(2, (attn.heads, -1)) for proj in (attn.to_k, attn.to_v))
        q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
        tables = self.tables(image_rotary_emb)
        if tables is not None:  # the queries only
            q = apply_rope(q, tables.cos, tables.sin, tables.pairing, "bshd", self.backend)
        out = self._attend(q, k, v, mask)
        return attn.to_out[1](attn.to_out[0](out))
