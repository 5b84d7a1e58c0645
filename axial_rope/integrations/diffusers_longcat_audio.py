"""LongCat-AudioDiT (diffusers ``LongCatAudioDiTTransformer``) through axial_rope: its self-attention processor.

``AudioDiTSelfAttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_longcat_audio_dit.py``) projects q,
k, v, normalises q and k by RMSNorms **across heads** where ``attn.qk_norm`` (``q_norm``, ``k_norm``: diffusers
``RMSNorm`` over ``H * D``), splits the heads, rotates q and k by ``audio_rotary_emb`` (``(cos, sin)`` ``[S, D]``
tables of **half** pairing, each angle twice: its ``_apply_rotary_emb`` in float32, cast back), attends through
``dispatch_attention_fn`` under the mask, zeroes the masked rows' outputs and projects out.

:class:`LongCatAudioRopeProcessor` does the same step for step, the norm and the rotation as one
:func:`axial_rope.ops.norm_apply_rope` call (half pairing, span "heads") where the norms are modules ``read_norm``
reads. The cross-attention (``AudioDiTCrossAttnProcessor``) keeps its stock processor: its queries turn by the audio's
table and its keys by the text's, so there is no pair to fuse (the record swaps the self-attention's only).
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor, Tables

__all__ = ["LongCatAudioRopeProcessor"]


class LongCatAudioRopeProcessor(RopeProcessor):
    """LongCat-AudioDiT's self-attention: RMSNorm across heads and the half-paired rotation; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        audio_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        batch = hidden_states.shape[0]
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = attn.inner_dim // attn.heads
        heads = lambda x: x.view(batch, -1, attn.heads, head_dim)  # noqa: E731  # [B, S, H, D]
        rotation = None if audio_rotary_emb is None else Tables.passed(audio_rotary_emb, self.backend, "half")
        norm = self.qk_norm(attn, heads(q), "bshd", ("q_norm", "k_norm")) if attn.qk_norm else None
        if rotation is not None and norm is not None:  # across heads: float32 inside, rounded once
            q, k = rotation.norm_rotate(heads(q), heads(k), norm, "bshd")
        else:
            if attn.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = heads(q), heads(k)
            if rotation is not None:
                q, k = rotation(q, k, "bshd")
        v = heads(v)
        out = self._attend(q, k, v, attention_mask)  # (heads merged, q's dtype)
        if attention_mask is not None:
            out = out * attention_mask[:, :, None].to(out.dtype)
        return attn.to_out[1](attn.to_out[0](out))
