"""AnyFlow (diffusers ``AnyFlowTransformer3DModel``) through axial_rope: its self-attention processor.

``AnyFlowAttnProcessor`` (diffusers 0.42.1 ``models/transformers/transformer_anyflow.py``) projects q from the tokens
and k, v from ``encoder_hidden_states`` (the tokens where none), normalises q and k by RMSNorms **across heads**
(``norm_q``, ``norm_k``: diffusers ``RMSNorm`` over ``H * D``), splits the heads (``[B, H, S, D]``), rotates q by
``rotary_emb["query"]`` and k by ``rotary_emb["key"]`` (complex ``[1, 1, S, D/2]`` tables, interleaved pairs, in
float64 where the device has it: its ``apply_rotary_emb``), attends through ``dispatch_attention_fn`` under the mask
and projects out.

:class:`AnyFlowRopeProcessor` does the same step for step, the norm and the rotation as one
:func:`axial_rope.ops.norm_apply_rope` call where q and k take one table (the model passes one for both), attend
the tokens themselves and the norms are modules ``read_norm`` reads; else the norm modules are called and each of q
and k turned by its own table. The cross-attention (``AnyFlowCrossAttnProcessor``, nothing rotated) keeps its stock
processor, and so does AnyFlow-FAR's causal processor (its record names none).
"""

from __future__ import annotations

import torch

from ..ops import apply_rope
from .diffusers_processors import RopeProcessor, call_norm
from .diffusers_qwen_image import complex_tables

__all__ = ["AnyFlowRopeProcessor"]


def _tables(freqs: torch.Tensor, backend: str | None):
    return complex_tables(freqs.reshape(-1, freqs.shape[-1]), backend)  # [1, 1, S, D/2]: one table for every item


class AnyFlowRopeProcessor(RopeProcessor):
    """AnyFlow's self-attention: RMSNorm across heads and the rotation by the complex tables; ``bhsd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask=None,
        rotary_emb: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        own = encoder_hidden_states is None
        context = hidden_states if own else encoder_hidden_states
        q, k, v = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        heads = lambda x: x.unflatten(2, (attn.heads, -1)).transpose(1, 2)  # noqa: E731  # [B, H, S, D]
        one_table = rotary_emb is not None and own and rotary_emb["query"] is rotary_emb["key"]
        norm = self.qk_norm(attn, heads(q), "bhsd") if one_table else None
        if norm is not None:  # across heads: float32 inside, rounded once
            q, k = _tables(rotary_emb["query"], self.backend).norm_rotate(heads(q), heads(k), norm, "bhsd")
        else:
            q, k = heads(call_norm(attn.norm_q, q)), heads(call_norm(attn.norm_k, k))
            if rotary_emb is not None:
                tq, tk = _tables(rotary_emb["query"], self.backend), _tables(rotary_emb["key"], self.backend)
                q = apply_rope(q, tq.cos, tq.sin, tq.pairing, "bhsd", self.backend)
                k = apply_rope(k, tk.cos, tk.sin, tk.pairing, "bhsd", self.backend)
        v = heads(v)
        out = self._attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask)
        return attn.to_out[1](attn.to_out[0](out))
