"""FLUX.2 (diffusers ``Flux2Transformer2DModel``) through axial_rope: its attention processor.

FLUX.2 has two attention modules (diffusers 0.42.1 ``models/transformers/transformer_flux2.py``): the double-stream
``Flux2Attention`` (``Flux2AttnProcessor``: Flux's joint attention over ``[text, image]``, each stream by its own
per-head RMSNorms, every token rotated by the one table, then the output projections, also without text) and the
single-stream ``Flux2ParallelSelfAttention`` (``Flux2ParallelSelfAttnProcessor``: one projection to q, k, v and the
MLP's input, per-head RMSNorm, rotation, attention, and one output projection of the attention and the MLP's SwiGLU
side by side). :class:`Flux2RopeProcessor` reproduces both step for step, the QK-norm and the rotation of each part
as one :func:`axial_rope.ops.norm_apply_rope` call where its norms are modules it can read. One class serves both
modules, as the adapter installs one processor class per family; ``Flux2ParallelSelfAttention.forward`` calls its
processor with ``(hidden_states, attention_mask, image_rotary_emb)`` positionally, which the parallel path reads as
such.
"""

from __future__ import annotations

import torch

from .diffusers_processors import FluxRopeProcessor

__all__ = ["Flux2RopeProcessor"]


class Flux2RopeProcessor(FluxRopeProcessor):
    """FLUX.2's double-stream (text first, then image) and parallel single-stream attention; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        if hasattr(attn, "to_qkv_mlp_proj"):  # Flux2ParallelSelfAttention: (hidden_states, mask, tables) positional
            return self.parallel(attn, hidden_states, encoder_hidden_states, attention_mask)
        out = self.joint_attention(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        txt = None
        if encoder_hidden_states is not None:
            n_txt = encoder_hidden_states.shape[1]
            txt, out = out.split_with_sizes([n_txt, out.shape[1] - n_txt], 1)
            txt = attn.to_add_out(txt)
        out = attn.to_out[1](attn.to_out[0](out))
        return out if txt is None else (out, txt)

    def parallel(self, attn, hidden_states, attention_mask, image_rotary_emb) -> torch.Tensor:
        """The single-stream block: attention and the MLP from one projection, one output projection."""
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        # the QKV and MLP parts by their global ratio (a column-sharded projection keeps it), as stock
        qkv_dim, mlp_dim = 3 * attn.inner_dim, attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))  # [B, S, H, D]
        rotation = self.tables(image_rotary_emb)  # [S, D]: every token
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")
        out = self._attend(q, k, v, attention_mask)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))
