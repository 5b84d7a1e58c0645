"""Qwen-Image (diffusers ``QwenImageTransformer2DModel``) through axial_rope: its attention processor.

Qwen-Image's double-stream blocks project the image and the text tokens apart, normalise each stream's q and k by
its own per-head RMSNorms (``norm_q``/``norm_k``, ``norm_added_q``/``norm_added_k``), rotate each stream by its own
complex table (``image_rotary_emb = (img_freqs, txt_freqs)``, ``[S, D/2]`` each) and attend over ``[text, image]``
(diffusers 0.42.1 ``models/transformers/transformer_qwenimage.py`` ``QwenDoubleStreamAttnProcessor2_0``).
:class:`QwenImageRopeProcessor` does the same step for step, with each stream's norm and rotation as one
:func:`axial_rope.ops.norm_apply_rope` call where its norms are modules ``read_norm`` reads
(:mod:`axial_rope.integrations.diffusers_processors`); the complex tables are the interleaved ``(cos, sin)`` pair
of :class:`Tables` (a complex product ``x * (c + i s)`` of the plane ``x = a + i b`` is the interleaved rotation
``(a c - b s, a s + b c)``).
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor, Tables, call_norm

__all__ = ["QwenImageRopeProcessor", "complex_tables"]


def complex_tables(freqs: torch.Tensor, backend: str | None) -> Tables:
    """The rotation by a complex ``freqs_cis`` ``[S, D/2]``: interleaved ``cos``, ``sin`` ``[S, D]`` (each plane's
    value twice), in the real dtype of ``freqs``."""
    planes = torch.view_as_real(freqs)  # [S, D/2, 2]: (cos, sin) of each plane
    cos, sin = (planes[..., i, None].expand(*freqs.shape, 2).flatten(-2) for i in (0, 1))
    return Tables(cos, sin, backend)


class QwenImageRopeProcessor(RopeProcessor):
    """Qwen-Image's joint attention: each stream normalised and rotated by its own table, text first; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is None:
            raise ValueError("QwenImageRopeProcessor needs encoder_hidden_states (the text stream), as the stock one")
        if attention_mask is not None:
            raise ValueError("QwenImageRopeProcessor takes no attention_mask, as the stock one: pass "
                             "encoder_hidden_states_mask, from which it builds the joint mask")  # fmt: skip
        if encoder_hidden_states_mask is not None:  # text as the mask says, every image token: [B, 1, 1, S]
            image = hidden_states.new_ones(hidden_states.shape[:2], dtype=torch.bool)
            attention_mask = torch.cat([encoder_hidden_states_mask, image], dim=1)[:, None, None, :]
        n_txt = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads
        img = [proj(hidden_states).unflatten(-1, (-1, head_dim)) for proj in (attn.to_q, attn.to_k, attn.to_v)]
        txt = [proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
               for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]  # fmt: skip  # [B, S, H, D] each

        if image_rotary_emb is not None:
            rotations = [complex_tables(freqs, self.backend) for freqs in image_rotary_emb]  # image, text
            norms = [self.qk_norm(attn, img[0], "bshd"), self.qk_norm(attn, txt[0], "bshd", ("norm_added_q",
                                                                                           "norm_added_k"))]  # fmt: skip
        if image_rotary_emb is not None and None not in norms:  # fused, each stream by its norms and table
            for stream, rotation, norm in zip((img, txt), rotations, norms):
                stream[0], stream[1] = rotation.norm_rotate(stream[0], stream[1], norm, "bshd")
        else:
            img[0], img[1] = call_norm(attn.norm_q, img[0]), call_norm(attn.norm_k, img[1])
            txt[0], txt[1] = call_norm(attn.norm_added_q, txt[0]), call_norm(attn.norm_added_k, txt[1])
            if image_rotary_emb is not None:
                for stream, rotation in zip((img, txt), rotations):
                    stream[0], stream[1] = rotation(stream[0], stream[1], "bshd")

        q, k, v = (torch.cat([t, i], dim=1) for t, i in zip(txt, img))  # [B, S_txt + S_img, H, D]
        out = self._attend(q, k, v, attention_mask)
        txt_out, img_out = out[:, :n_txt], out[:, n_txt:]
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)  # dropout
        return img_out, attn.to_add_out(txt_out.contiguous())
