"""PRX (diffusers ``PRXTransformer2DModel``) through axial_rope: its attention processor.

``PRXAttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/transformer_prx.py``) projects the image tokens to q,
k, v (one ``img_qkv_proj``) and the text to keys and values only (``txt_kv_proj``), normalises the image's q and k by
per-head RMSNorms (``norm_q``, ``norm_k``: diffusers ``RMSNorm`` over D) and the text's keys by ``norm_added_k``,
rotates the image's q and k by the per-item rotation matrices ``[B, 1, S_img, D/2, 2, 2]`` (``[[cos, -sin], [sin,
cos]]`` per interleaved plane; its ``apply_rope``, in float32, cast back), attends with the image queries over
``[text, image]`` keys under the text's padding mask (``[B, S_txt]`` widened to ``[B, 1, 1, S]``) through diffusers'
dispatcher, and projects out. :class:`PRXRopeProcessor` does the same step for step, the image's norm and rotation
as one :func:`axial_rope.ops.norm_apply_rope` call where its norms are modules ``read_norm`` reads (the text's key
norm is called as stock); the matrices are the interleaved ``(cos, sin)`` of ``matrix_tables``
(:mod:`axial_rope.integrations.diffusers_hidream`).
"""

from __future__ import annotations

import torch

from .diffusers_hidream import matrix_tables
from .diffusers_processors import RopeProcessor

__all__ = ["PRXRopeProcessor"]


class PRXRopeProcessor(RopeProcessor):
    """PRX's attention of the image queries over ``[text, image]`` keys, the image tokens rotated; ``bhsd`` inside."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        if encoder_hidden_states is None:
            raise ValueError("PRXRopeProcessor requires 'encoder_hidden_states' containing text tokens, as the stock one")
        batch, n_img, _ = hidden_states.shape
        n_txt = encoder_hidden_states.shape[1]
        heads = lambda x, n: x.reshape(batch, x.shape[1], n, attn.heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # noqa: E731
        q, k, v = heads(attn.img_qkv_proj(hidden_states), 3)  # [B, H, S_img, D] each
        tk, tv = heads(attn.txt_kv_proj(encoder_hidden_states), 2)  # [B, H, S_txt, D] each
        # [B, 1, S, D/2, 2, 2] -> [B, S, 1, D/2, 2, 2], as matrix_tables reads them
        rotation = None if image_rotary_emb is None else matrix_tables(image_rotary_emb.transpose(1, 2), self.backend)
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bhsd")
        tk = attn.norm_added_k(tk)  # the text's keys: normalised, not rotated
        k, v = torch.cat((tk, k), dim=2), torch.cat((tv, v), dim=2)  # [B, H, S_txt + S_img, D]

        mask = None
        if attention_mask is not None:  # the text's padding, every image token: [B, 1, 1, S]
            if attention_mask.dim() != 2:
                raise ValueError(f"Unsupported attention_mask shape: {attention_mask.shape}")
            if attention_mask.shape[-1] != n_txt:
                raise ValueError(f"attention_mask last dim {attention_mask.shape[-1]} must equal text length {n_txt}")
            image = torch.ones((batch, n_img), dtype=torch.bool, device=q.device)
            mask = torch.cat([attention_mask.to(device=q.device, dtype=torch.bool), image], dim=-1)[:, None, None, :]
        out = self._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        out = attn.to_out[0](out)
        if len(attn.to_out) > 1:  # dropout
            out = attn.to_out[1](out)
        return out
