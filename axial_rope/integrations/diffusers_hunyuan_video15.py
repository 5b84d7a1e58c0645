"""HunyuanVideo 1.5 (diffusers ``HunyuanVideo15Transformer3DModel``) through axial_rope: its attention processor.

HunyuanVideo 1.5's double-stream blocks normalise the video tokens' q and k by per-head RMSNorms and rotate them,
append the text tokens (their own projections and norms, not rotated) and attend under a mask built from the
text's padding (diffusers 0.42.1 ``models/transformers/transformer_hunyuan_video15.py``
``HunyuanVideo15AttnProcessor2_0``). :class:`HunyuanVideo15RopeProcessor` does the same step for step, with the
video tokens' norm and rotation as one :func:`axial_rope.ops.norm_apply_rope` call where the norms are modules it
can read (``read_norm`` in :mod:`axial_rope.integrations.diffusers_processors`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .diffusers_processors import RopeProcessor, call_norm

__all__ = ["HunyuanVideo15RopeProcessor"]


class HunyuanVideo15RopeProcessor(RopeProcessor):
    """HunyuanVideo 1.5: video tokens first and rotated, text tokens appended and not rotated; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        q, k, v = (proj(hidden_states).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        rotation = self.tables(image_rotary_emb)  # [S_video, D]
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")
        if encoder_hidden_states is not None:  # the text appended, its own projections and norms
            eq, ek, ev = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                          for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))  # fmt: skip
            eq, ek = call_norm(attn.norm_added_q, eq), call_norm(attn.norm_added_k, ek)
            q, k, v = torch.cat([q, eq], dim=1), torch.cat([k, ek], dim=1), torch.cat([v, ev], dim=1)

        # the mask over [video, text] (the video's entries True), each pair of tokens attending where both may
        batch, seq = q.shape[:2]
        mask = F.pad(attention_mask, (seq - attention_mask.shape[1], 0), value=True).bool()
        rows = mask.view(batch, 1, 1, seq).repeat(1, 1, seq, 1)
        out = self._attend(q, k, v, rows & rows.transpose(2, 3))
        if encoder_hidden_states is None:
            return out, encoder_hidden_states
        n_txt = encoder_hidden_states.shape[1]
        out, txt = out[:, :-n_txt], out[:, -n_txt:]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            txt = attn.to_add_out(txt)
        return out, txt
