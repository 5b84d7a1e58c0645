"""CogView4 and GLM-Image (diffusers ``CogView4Transformer2DModel``, ``GlmImageTransformer2DModel``) through
axial_rope: their attention processors.

Both stock processors (diffusers 0.42.1 ``models/transformers/transformer_cogview4.py`` ``CogView4AttnProcessor``,
``transformer_glm_image.py`` ``GlmImageAttnProcessor``) project ``[text, image]`` to q, k, v, normalise q and k by
per-head LayerNorms without affine weights (``qk_norm="layer_norm"``) cast to the text's dtype, rotate the image
tokens by the half-paired ``(cos, sin)`` ``[S_img, D]`` (``apply_rotary_emb(..., use_real_unbind_dim=-2)``), build
the joint mask from the text's padding mask (``mix @ mix^T > 0`` in q's dtype, as stock), attend and project out,
returning ``(image, text)``. CogView4 attends through ``F.scaled_dot_product_attention``; GLM-Image through diffusers'
dispatcher and, where passed, its ``GlmImageLayerKVCache`` (the rotated keys and the values stored in ``"write"``
mode, the stored ones prepended in ``"read"`` mode). :class:`CogView4RopeProcessor` and :class:`GlmImageRopeProcessor`
do the same step for step, the image tokens' norm and rotation as one :func:`axial_rope.ops.norm_apply_rope` call
where the norms are modules ``read_norm`` reads (the text's norm is called as stock). ``CogView4TrainingAttnProcessor``
(packed variable-length batches) is not reproduced: the record does not replace it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .diffusers_processors import RopeProcessor, Tables, call_norm

__all__ = ["CogView4RopeProcessor", "GlmImageRopeProcessor"]


def _joint_mask(text_mask: torch.Tensor | None, n_img: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Stock's mask over ``[text, image]`` from the text's ``[B, S_txt]`` padding mask: ``[B, 1, S, S]`` of 0 and 1 in
    ``dtype`` (a pair of tokens is 1 where both are kept)."""
    if text_mask is None:
        return None
    if text_mask.dim() != 2:
        raise ValueError(f"the text attention mask must be [batch, text tokens], got shape {tuple(text_mask.shape)}")
    kept = text_mask.float()
    mix = torch.cat([kept, kept.new_ones(kept.shape[0], n_img)], dim=1).unsqueeze(2)  # [B, S, 1]
    return (mix @ mix.transpose(1, 2) > 0).unsqueeze(1).to(dtype)


class CogView4RopeProcessor(RopeProcessor):
    """CogView4: text tokens first (normalised, not rotated), image tokens after; ``bshd`` inside, ``bhsd`` attention."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb)
        mask = _joint_mask(attention_mask, hidden_states.shape[1], q.dtype)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)  # [B, S, H * D]
        return self.project_out(attn, out, encoder_hidden_states.shape[1])

    def joint_qkv(self, attn, hidden_states, encoder_hidden_states, image_rotary_emb):
        """q, k, v ``[B, S_txt + S_img, H, D]``: every token normalised, the image tokens rotated."""
        dtype, n_txt = encoder_hidden_states.dtype, encoder_hidden_states.shape[1]
        x = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        q, k, v = (proj(x).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        rotation = None if image_rotary_emb is None else Tables.passed(image_rotary_emb, self.backend, "half")
        norm = self.qk_norm(attn, q, "bshd")
        if rotation is not None and norm is not None:  # fused for the image tokens; the text's norm as stock
            qi, ki = rotation.norm_rotate(q[:, n_txt:].to(dtype), k[:, n_txt:].to(dtype), norm, "bshd")
            qt, kt = call_norm(attn.norm_q, q[:, :n_txt]).to(dtype), call_norm(attn.norm_k, k[:, :n_txt]).to(dtype)
            return torch.cat([qt, qi], dim=1), torch.cat([kt, ki], dim=1), v
        q, k = call_norm(attn.norm_q, q).to(dtype), call_norm(attn.norm_k, k).to(dtype)
        if rotation is not None:
            qi, ki = rotation(q[:, n_txt:], k[:, n_txt:], "bshd")
            q, k = torch.cat([q[:, :n_txt], qi], dim=1), torch.cat([k[:, :n_txt], ki], dim=1)
        return q, k, v

    @staticmethod
    def project_out(attn, out: torch.Tensor, n_txt: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = attn.to_out[1](attn.to_out[0](out))
        txt, img = out.split([n_txt, out.shape[1] - n_txt], dim=1)
        return img, txt


class GlmImageRopeProcessor(CogView4RopeProcessor):
    """GLM-Image: CogView4's steps, attention through diffusers' dispatcher, and its per-layer KV cache."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        kv_cache=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb)
        if kv_cache is not None and kv_cache.mode == "write":  # the condition images' rotated keys, kept
            kv_cache.store(k, v)
        elif kv_cache is not None and kv_cache.mode == "read":  # prepended to this forward's keys
            k, v = kv_cache.get(k, v)
        mask = _joint_mask(attention_mask, hidden_states.shape[1], q.dtype)
        out = self._attend(q, k, v, mask)
        return self.project_out(attn, out, encoder_hidden_states.shape[1])
