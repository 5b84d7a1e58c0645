"""Z-Image (diffusers ``ZImageTransformer2DModel``) through axial_rope: its attention processor.

Every Z-Image attention (the image and caption refiners and the main layers) is a diffusers ``Attention`` run by
``ZSingleStreamAttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_z_image.py``): q, k, v from one
sequence, per-head RMSNorms (``qk_norm="rms_norm"``: diffusers ``RMSNorm`` over D), the rotation by the complex
``freqs_cis`` ``[B, S, D/2]`` (a complex product of float32 copies, cast back; the padding rows past an item's
length are zero, so its q and k are zero there), a ``[B, S]`` mask widened to ``[B, 1, 1, S]``, attention through
diffusers' dispatcher, the output projection. :class:`ZImageRopeProcessor` does the same step for step, the norm and
the rotation as one :func:`axial_rope.ops.norm_apply_rope` call where the norms are modules ``read_norm`` reads; the
complex table is the interleaved ``(cos, sin)`` pair of ``complex_tables``
(:mod:`axial_rope.integrations.diffusers_qwen_image`), whose zero rows zero those tokens as stock's do.
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor
from .diffusers_qwen_image import complex_tables

__all__ = ["ZImageRopeProcessor"]


class ZImageRopeProcessor(RopeProcessor):
    """Z-Image's self-attention over one (padded) sequence, every token rotated by its row; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,  # taken and unused, as stock
        attention_mask: torch.Tensor | None = None,
        freqs_cis: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = (proj(hidden_states).unflatten(-1, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        rotation = None if freqs_cis is None else complex_tables(freqs_cis, self.backend)  # [B, S, D]
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")
        if attention_mask is not None and attention_mask.ndim == 2:  # [B, S] -> [B, 1, 1, S]
            attention_mask = attention_mask[:, None, None, :]
        out = attn.to_out[0](self._attend(q, k, v, attention_mask))
        if len(attn.to_out) > 1:  # dropout
            out = attn.to_out[1](out)
        return out
