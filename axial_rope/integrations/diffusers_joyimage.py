"""JoyImage Edit and JoyImage Edit Plus (diffusers ``JoyImageEditTransformer3DModel``,
``JoyImageEditPlusTransformer3DModel``) through axial_rope: their attention processors.

``JoyImageAttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_joyimage.py``) projects each stream
(the image's ``img_attn_qkv``, the text's ``txt_attn_qkv``) to q, k, v, normalises each stream's q and k by its own
per-head ``nn.RMSNorm`` s in the model's dtype (``img_attn_q_norm``, ``img_attn_k_norm``, ``txt_attn_q_norm``,
``txt_attn_k_norm``), rotates the image's q and k by ``image_rotary_emb[0]`` and the text's by
``image_rotary_emb[1]`` (each a ``(cos, sin)`` pair of ``[S, D]`` interleaved channel tables, or ``None``: not
rotated; its ``_apply_rotary_emb``, in float32, cast back), attends over ``[image, text]`` unmasked through diffusers'
dispatcher and projects each stream out. ``JoyImageEditPlusAttnProcessor``
(``transformer_joyimage_edit_plus.py``) does the same but rotates the image tokens only, by per-item tables ``[B, S,
D]`` (its ``_apply_rotary_emb_batched``), and passes ``attention_mask`` (``[B, 1, 1, S]``, the padding of the items'
images and of the text) to the dispatcher. :class:`JoyImageRopeProcessor` and :class:`JoyImageEditPlusRopeProcessor`
do the same step for step, each rotated stream's norm and rotation as one :func:`axial_rope.ops.norm_apply_rope` call
where its norms are modules ``read_norm`` reads.
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor, Tables

__all__ = ["JoyImageRopeProcessor", "JoyImageEditPlusRopeProcessor"]


class JoyImageRopeProcessor(RopeProcessor):
    """JoyImage Edit's joint attention of ``[image, text]``, each stream rotated by its own tables; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is None:
            raise ValueError("JoyImageAttnProcessor requires encoder_hidden_states (text stream)")
        vis, txt = (None, None) if image_rotary_emb is None else image_rotary_emb
        return self.joint(attn, hidden_states, encoder_hidden_states, self.tables(vis), self.tables(txt), None)

    def joint(self, attn, hidden_states, encoder_hidden_states, vis: Tables | None, txt: Tables | None, mask):
        """Both streams projected, normalised and (where their tables are given) rotated; the joint attention."""
        streams = []
        for x, prefix, tables in ((hidden_states, "img", vis), (encoder_hidden_states, "txt", txt)):
            q, k, v = (t.unflatten(-1, (attn.heads, -1)) for t in getattr(attn, f"{prefix}_attn_qkv")(x).chunk(3, -1))
            names = (f"{prefix}_attn_q_norm", f"{prefix}_attn_k_norm")
            norm = self.qk_norm(attn, q, "bshd", names)
            if tables is not None and norm is not None:  # fused: float32 inside, rounded once
                q, k = tables.norm_rotate(q, k, norm, "bshd")
            else:
                q, k = getattr(attn, names[0])(q), getattr(attn, names[1])(k)
                if tables is not None:
                    q, k = tables(q, k, "bshd")
            streams.append((q, k, v))
        q, k, v = (torch.cat(t, dim=1) for t in zip(*streams))  # [image, text]
        out = self._attend(q, k, v, mask)
        n = hidden_states.shape[1]
        return attn.img_attn_proj(out[:, :n]), attn.txt_attn_proj(out[:, n:])


class JoyImageEditPlusRopeProcessor(JoyImageRopeProcessor):
    """JoyImage Edit Plus's joint attention: the image tokens rotated by per-item tables, the padding mask."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb=None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is None:
            raise ValueError("JoyImageEditPlusAttnProcessor requires encoder_hidden_states")
        vis = None if image_rotary_emb is None else Tables(image_rotary_emb[0], image_rotary_emb[1], self.backend)  # [B, S, D]
        return self.joint(attn, hidden_states, encoder_hidden_states, vis, None, attention_mask)
