"""NucleusMoE-Image (diffusers ``NucleusMoEImageTransformer2DModel``) through axial_rope: its attention processor.

``NucleusMoEAttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/transformer_nucleusmoe_image.py``): the image
tokens' q (``heads``), k and v (``inner_kv_dim // head_dim`` heads: grouped-query attention), per-head RMSNorms
(``norm_q``, ``norm_k``: diffusers ``RMSNorm`` over D), both rotated by the image's complex table; the text gives keys
and values only (no text query): ``add_k_proj``, ``add_v_proj``, the key normalised by ``norm_added_k`` and rotated by
the text's table (or the cached text keys and values, already so, where passed); image keys first, then text, each
k and v head repeated over its group of query heads, attention under the joint mask through diffusers' dispatcher,
the output projection. ``image_rotary_emb = (img_freqs, txt_freqs)``: complex ``[S, D/2]`` each (a complex product of
float32 copies, cast back). :class:`NucleusRopeProcessor` does the same step for step, the image tokens' norm and
rotation as one :func:`axial_rope.ops.norm_apply_rope` call (k with its fewer heads) where the norms are modules
``read_norm`` reads; the text keys, which have no queries to pair with in that call, are normalised as stock and
rotated by :func:`axial_rope.apply_rope`. The complex tables are the interleaved ``(cos, sin)`` pairs of
``complex_tables`` (:mod:`axial_rope.integrations.diffusers_qwen_image`).
"""

from __future__ import annotations

import torch

from ..ops import apply_rope
from .diffusers_processors import RopeProcessor, call_norm
from .diffusers_qwen_image import complex_tables

__all__ = ["NucleusRopeProcessor"]


class NucleusRopeProcessor(RopeProcessor):
    """NucleusMoE-Image's attention of the image queries over ``[image, text]`` keys; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        cached_txt_key: torch.Tensor | None = None,
        cached_txt_value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        head_dim = attn.inner_dim // attn.heads
        kv_heads = attn.inner_kv_dim // head_dim
        q = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
        k, v = (proj(hidden_states).unflatten(-1, (kv_heads, -1)) for proj in (attn.to_k, attn.to_v))
        img, txt = (None, None) if image_rotary_emb is None else (complex_tables(f, self.backend) for f in image_rotary_emb)
        q, k = self.norm_then_rotate(attn, q, k, img, "bshd")

        if cached_txt_key is not None and cached_txt_value is not None:  # the text's keys, normalised and rotated
            k, v = torch.cat([k, cached_txt_key], dim=1), torch.cat([v, cached_txt_value], dim=1)
        elif encoder_hidden_states is not None:  # text keys and values, no text query
            tk, tv = (proj(encoder_hidden_states).unflatten(-1, (kv_heads, -1)) for proj in (attn.add_k_proj,
                                                                                           attn.add_v_proj))  # fmt: skip
            tk = call_norm(attn.norm_added_k, tk)
            if txt is not None:
                tk = apply_rope(tk, txt.cos, txt.sin, txt.pairing, "bshd", self.backend)
            k, v = torch.cat([k, tk], dim=1), torch.cat([v, tv], dim=1)
        groups = attn.heads // kv_heads
        if groups > 1:  # each k, v head repeated over its group of query heads
            k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        out = attn.to_out[0](self._attend(q, k, v, attention_mask))
        if len(attn.to_out) > 1:  # dropout
            out = attn.to_out[1](out)
        return out
