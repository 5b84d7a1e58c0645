"""Helios (diffusers ``HeliosTransformer3DModel``) through axial_rope: its attention processor.

``HeliosAttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_helios.py``) projects q, k, v
(``_get_qkv_projections``: the tokens, or the text for k and v; fused projections where ``fuse_projections`` made
them), normalises q and k by RMSNorms **across heads** (``norm_q``, ``norm_k``: ``nn.RMSNorm`` over ``H * D``, in the
model's dtype), splits the heads, rotates q and k where ``rotary_emb`` is passed (``[B, S, 2D]``: the cos table then
the sin table, interleaved planes; its ``apply_rotary_emb_transposed`` reads plane ``i``'s cosine at channel ``2i``
and its sine at ``2i + 1``), scales the history rows' keys (``is_amplify_history``: ``1 + sigmoid(history_key_scale)
(max_scale - 1)``, per head or one) in self-attention, attends through diffusers' dispatcher (the parallel config in
self-attention only) and projects out. :class:`HeliosRopeProcessor` does the same step for step, the norm and the
rotation as one :func:`axial_rope.ops.norm_apply_rope` call where tables are passed and the norms are modules
``read_norm`` reads (across heads); the tables are read as stock reads them: plane ``i``'s cosine from channel ``2i``
of the cos half and its sine from channel ``2i + 1`` of the sin half, each given to both channels of the plane.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_helios import _get_qkv_projections

from .diffusers_processors import RopeProcessor, Tables

__all__ = ["HeliosRopeProcessor"]


def helios_tables(freqs: torch.Tensor, backend: str | None) -> Tables:
    """Helios's ``[B, S, 2D]`` (cos, then sin) as interleaved ``[B, S, D]`` ``(cos, sin)`` channel tables, read as
    ``apply_rotary_emb_transposed`` reads them."""
    cos, sin = freqs.chunk(2, dim=-1)
    pair = lambda t: t[..., None].expand(*t.shape, 2).flatten(-2)  # noqa: E731
    return Tables(pair(cos[..., 0::2]), pair(sin[..., 1::2]), backend)


class HeliosRopeProcessor(RopeProcessor):
    """Helios's self-attention (rotated; the history keys amplified) and cross-attention to the text; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: torch.Tensor | None = None,
        original_context_length: int = None,
    ) -> torch.Tensor:
        q, k, v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        tables = None if rotary_emb is None else helios_tables(rotary_emb, self.backend)
        heads = lambda x: x.unflatten(2, (attn.heads, -1))  # noqa: E731
        norm = None if tables is None else self.qk_norm(attn, heads(q), "bshd")
        if norm is not None:  # fused, across heads: float32 inside, rounded once
            q, k = tables.norm_rotate(heads(q), heads(k), norm, "bshd")
        else:
            q, k = heads(attn.norm_q(q)), heads(attn.norm_k(k))
            if tables is not None:
                q, k = tables(q, k, "bshd")
        v = heads(v)
        if not attn.is_cross_attention and attn.is_amplify_history:
            history = hidden_states.shape[1] - original_context_length
            if history > 0:
                scale = 1.0 + torch.sigmoid(attn.history_key_scale) * (attn.max_scale - 1.0)
                if attn.history_scale_mode == "per_head":
                    scale = scale.view(1, 1, -1, 1)
                k = torch.cat([k[:, :history] * scale, k[:, history:]], dim=1)
        out = self._attend(q, k, v, attention_mask, parallel=encoder_hidden_states is None)
        return attn.to_out[1](attn.to_out[0](out))
