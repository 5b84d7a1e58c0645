"""Lumina-Next (diffusers ``LuminaNextDiT2DModel``) through axial_rope: its attention processor.

``LuminaAttnProcessor2_0`` (diffusers 0.42.1 ``models/attention_processor.py``; each block's self-attention ``attn1``
and cross-attention to the text ``attn2``) projects q from the tokens and k, v from ``encoder_hidden_states`` (the
tokens themselves in ``attn1``), normalises q and k by LayerNorms **across heads** (``norm_q`` over ``H * D``,
``norm_k`` over ``H_kv * D``: ``qk_norm="layer_norm_across_heads"``), splits the heads (k and v into ``kv_heads``),
rotates q by ``query_rotary_emb`` and k by ``key_rotary_emb`` where passed (complex ``freqs_cis`` ``[1, S, D/2]``:
``apply_rotary_emb(use_real=False)``, interleaved pairs, in float32, cast back), scales the logits by ``attn.scale``
(``sqrt(log_base(S))`` times it with ``base_sequence_length``) where the keys are rotated, repeats k and v to the query
heads, attends under the ``[B, S_kv]`` mask by ``F.scaled_dot_product_attention`` and returns ``[B, S, H, D]`` (the
block gates, merges and projects).

:class:`LuminaNextRopeProcessor` does the same step for step, the norm and the rotation as one
:func:`axial_rope.ops.norm_apply_rope` call where q and k are rotated by one table (``attn1``) and the norms are
LayerNorms ``read_norm`` reads (each over its own tensor's heads: k's are ``kv_heads``). The cross-attention rotates
its queries only (no key to pair with): the norm modules called, then the rotation of q.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..ops import QKNorm, apply_rope
from . import diffusers_processors
from .diffusers_processors import RopeProcessor, call_norm
from .diffusers_qwen_image import complex_tables

__all__ = ["LuminaNextRopeProcessor"]


def _read_norms(attn, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> QKNorm | None:
    """``norm_q`` over the query's ``heads`` and ``norm_k`` over the key's ``kv_heads`` as one QKNorm across heads (each
    read by ``read_norm`` as a pair with itself), or ``None`` (then they are called)."""
    read = diffusers_processors.read_norm  # (looked up at each call: tests replace it)
    qn = read(attn.norm_q, attn.norm_q, heads, head_dim, dtype)
    kn = read(attn.norm_k, attn.norm_k, kv_heads, head_dim, dtype)
    if qn is None or kn is None or type(attn.norm_q) is not type(attn.norm_k):
        return None
    if (qn.kind, qn.eps, qn.span) != (kn.kind, kn.eps, "heads") or kn.span != "heads":
        return None
    return QKNorm(qn.kind, qn.q_weight, kn.k_weight, qn.q_bias, kn.k_bias, qn.eps, "heads")


class LuminaNextRopeProcessor(RopeProcessor):
    """Lumina-Next's self-attention (q and k rotated) and cross-attention (q rotated); ``bshd``, ``[B, S, H, D]`` out."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        query_rotary_emb: torch.Tensor | None = None,
        key_rotary_emb: torch.Tensor | None = None,
        base_sequence_length: int | None = None,
    ) -> torch.Tensor:
        if hidden_states.ndim == 4:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)
        batch, seq, _ = hidden_states.shape
        q = attn.to_q(hidden_states)
        k, v = attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states)
        head_dim = q.shape[-1] // attn.heads
        kv_heads = k.shape[-1] // head_dim
        dtype = q.dtype
        split = lambda x, h: x.view(batch, -1, h, head_dim)  # noqa: E731  # [B, S, H, D]

        fuse = query_rotary_emb is not None and query_rotary_emb is key_rotary_emb
        norm = _read_norms(attn, attn.heads, kv_heads, head_dim, dtype) if fuse else None
        if norm is not None:  # across each tensor's heads, then one table for both: fused
            q, k, v = split(q, attn.heads), split(k, kv_heads), split(v, kv_heads)
            q, k = complex_tables(query_rotary_emb, self.backend).norm_rotate(q, k, norm, "bshd")
        else:
            q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
            q, k, v = split(q, attn.heads), split(k, kv_heads), split(v, kv_heads)
            for name, table in (("q", query_rotary_emb), ("k", key_rotary_emb)):
                if table is not None:
                    t = complex_tables(table, self.backend)
                    rotated = apply_rope(q if name == "q" else k, t.cos, t.sin, t.pairing, "bshd", self.backend)
                    q, k = (rotated, k) if name == "q" else (q, rotated)
        q, k = q.to(dtype), k.to(dtype)

        if key_rotary_emb is None:
            softmax_scale = None
        elif base_sequence_length is not None:
            softmax_scale = math.sqrt(math.log(seq, base_sequence_length)) * attn.scale
        else:
            softmax_scale = attn.scale
        n_rep = attn.heads // kv_heads
        if n_rep >= 1:
            k = k.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            v = v.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
        mask = attention_mask.bool().view(batch, 1, 1, -1).expand(-1, attn.heads, seq, -1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                             scale=softmax_scale)  # fmt: skip
        return out.transpose(1, 2).to(dtype)
