"""EasyAnimate (diffusers ``EasyAnimateTransformer3DModel``) through axial_rope: its attention processor.

``EasyAnimateAttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/transformer_easyanimate.py``) appends the
text before the video tokens where the module has no text projections (a single-stream block), projects q, k, v,
splits the heads (``[B, H, S, D]``), normalises q and k by per-head LayerNorms (``norm_q``, ``norm_k``:
``nn.LayerNorm`` over D, text rows included in a single-stream block); in an MMDiT block the text has its own
projections and norms (``add_*_proj``, ``norm_added_q``, ``norm_added_k``) and goes before the video tokens. It
rotates the rows after the text (``image_rotary_emb``: ``(cos, sin)`` ``[S, D]`` interleaved tables; diffusers'
``apply_rotary_emb`` in float32, cast back), the keys only where the module is no cross-attention, attends by
``F.scaled_dot_product_attention`` under ``attention_mask``, splits the text off and projects each part out.

:class:`EasyAnimateRopeProcessor` does the same step for step, the norm and the rotation of the video rows as one
:func:`axial_rope.ops.norm_apply_rope` call where tables are passed, the module is no cross-attention and the norms
are modules ``read_norm`` reads; the text rows are normalised by their norm modules, as stock.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .diffusers_processors import RopeProcessor, call_norm

__all__ = ["EasyAnimateRopeProcessor"]


class EasyAnimateRopeProcessor(RopeProcessor):
    """EasyAnimate's MMDiT and single-stream blocks: text rows first (not rotated), video rows after; ``bhsd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        mmdit = attn.add_q_proj is not None and encoder_hidden_states is not None
        n_txt = 0 if encoder_hidden_states is None else encoder_hidden_states.shape[1]
        if attn.add_q_proj is None and encoder_hidden_states is not None:  # single-stream: [text, video]
            hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        heads = lambda x: x.unflatten(2, (attn.heads, -1)).transpose(1, 2)  # noqa: E731  # [B, H, S, D]
        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        rotation = self.tables(image_rotary_emb)  # [S_video, D]: the rows after the text
        video = slice(0 if mmdit else n_txt, None)  # q's and k's rows to rotate (an MMDiT block's text comes later)
        norm = None if rotation is None or attn.is_cross_attention else self.qk_norm(attn, q, "bhsd")
        if norm is not None:  # fused for the video rows; the text rows' norm as stock
            qv, kv = rotation.norm_rotate(q[:, :, video], k[:, :, video], norm, "bhsd")
            if not mmdit:
                qv = torch.cat([call_norm(attn.norm_q, q[:, :, :n_txt]), qv], dim=2)
                kv = torch.cat([call_norm(attn.norm_k, k[:, :, :n_txt]), kv], dim=2)
            q, k = qv, kv
        else:
            q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
        if mmdit:  # the text's own projections and norms, before the video rows
            eq, ek, ev = (heads(p(encoder_hidden_states)) for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
            eq, ek = call_norm(attn.norm_added_q, eq), call_norm(attn.norm_added_k, ek)
            q, k, v = torch.cat([eq, q], dim=2), torch.cat([ek, k], dim=2), torch.cat([ev, v], dim=2)
        if rotation is not None and norm is None:  # unfused: the rotation after the norms, as stock
            qv, kv = rotation(q[:, :, n_txt:], k[:, :, n_txt:], "bhsd")
            q = torch.cat([q[:, :, :n_txt], qv], dim=2)
            if not attn.is_cross_attention:
                k = torch.cat([k[:, :, :n_txt], kv], dim=2)

        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is not None:
            txt, out = out[:, :n_txt], out[:, n_txt:]
            if getattr(attn, "to_out", None) is not None:
                out = attn.to_out[1](attn.to_out[0](out))
            if getattr(attn, "to_add_out", None) is not None:
                txt = attn.to_add_out(txt)
            return out, txt
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        return out, encoder_hidden_states
