"""Bria-Fibo 2 (diffusers ``BriaFibo2Transformer2DModel``) through axial_rope: its attention processor.

``BriaFibo2AttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_bria_fibo2.py``) projects q from the
tokens and k, v from the tokens (self-attention) or the text encoder's states (its injection blocks), normalises q
and k by per-head RMSNorms, rotates both by the complex ``freqs_cis`` ``[B, S, D/2]`` where it is passed (a complex
product in float32, cast back), widens a ``[B, S]`` mask to ``[B, 1, 1, S]``, attends and projects out.
:class:`BriaFibo2RopeProcessor` does the same step for step, the norm and the rotation as one
:func:`axial_rope.ops.norm_apply_rope` call where the norms are modules ``read_norm`` reads; the complex table is
the interleaved ``(cos, sin)`` pair of ``complex_tables`` (:mod:`axial_rope.integrations.diffusers_qwen_image`).
"""

from __future__ import annotations

import torch

from .diffusers_processors import RopeProcessor
from .diffusers_qwen_image import complex_tables

__all__ = ["BriaFibo2RopeProcessor"]


class BriaFibo2RopeProcessor(RopeProcessor):
    """Bria-Fibo 2's self-attention (rotated by ``freqs_cis``) and cross-attention to the text; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        freqs_cis: torch.Tensor | None = None,
    ) -> torch.Tensor:
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        q, k, v = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        q, k, v = (t.unflatten(-1, (attn.heads, -1)) for t in (q, k, v))  # [B, S, H, D]
        rotation = None if freqs_cis is None else complex_tables(freqs_cis, self.backend)  # [B, S, D]
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")
        if attention_mask is not None and attention_mask.ndim == 2:  # [B, S] -> [B, 1, 1, S]
            attention_mask = attention_mask[:, None, None, :]
        return attn.to_out[0](self._attend(q, k, v, attention_mask))
