"""LTX-Video (diffusers ``LTXVideoTransformer3DModel``) through axial_rope: its rope and processor.

LTX-Video builds one rotary table over the whole hidden size and rotates q and k before splitting
the heads, so each head has its own frequencies: the rope is
:func:`axial_rope.conventions.ltx_video` (per-head ``F``, interleaved, position map ``2 / base`` and
``- 1``). The QK-norm is an RMSNorm across all heads, which over the hidden size seen as one head is
the per-head norm of that head: norm and rotation are one :func:`axial_rope.ops.norm_apply_rope` call.

The processor rotates by the table it is passed, on the hidden size seen as one head, as the stock processor
does. Unscaled that is the model's own table: the stock result to float32 rounding, whereas the convention's float64
angles would reproduce it only to upstream's float32 angle error (up to ``theta * pi / 2 * 2**-24`` rad). Sized
(position modes only: the per-head schedule has no spectrum for the scaling methods), the adapter's tables module
computes it from the convention, with float64 angles.
"""

from __future__ import annotations

import torch

from ..conventions import ltx_video
from ..ops import apply_rope, norm_apply_rope
from .diffusers_processors import RopeProcessor, head_mask, read_norm

__all__ = ["LTXVideoRopeProcessor", "ltx_rope"]


def ltx_rope(model):
    """The LTX-Video convention of ``model``'s config (heads and head dim; the base grid is fixed upstream)."""
    rope = model.rope
    return ltx_video(
        model.config.num_attention_heads,
        model.config.attention_head_dim,
        base_num_frames=rope.base_num_frames,
        base_height=rope.base_height,
        base_width=rope.base_width,
        theta=rope.theta,
    )


class LTXVideoRopeProcessor(RopeProcessor):
    """LTX-Video self- and cross-attention: RMSNorm across heads, then rotation in self-attention; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        attention_mask = head_mask(attn, attention_mask, *context.shape[:2])
        q, k, v = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        # RMSNorm over H * D channels, then the model's table [B, S, H * D]: the hidden size as one head
        norm = None if image_rotary_emb is None else read_norm(attn.norm_q, attn.norm_k, 1, q.shape[-1], q.dtype)
        if norm is not None:  # fused
            cos, sin = image_rotary_emb
            q, k = norm_apply_rope(q[:, :, None], k[:, :, None], cos, sin, norm, "interleaved", "bshd", self.backend)
            q, k = q[:, :, 0], k[:, :, 0]
        else:
            q, k = attn.norm_q(q), attn.norm_k(k)
            if image_rotary_emb is not None:
                cos, sin = image_rotary_emb
                q, k = (apply_rope(t[:, :, None], cos, sin, "interleaved", "bshd", self.backend)[:, :, 0] for t in (q, k))
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))  # [B, S, H, D]
        return attn.to_out[1](attn.to_out[0](self._attend(q, k, v, attention_mask)))
