"""ACE-Step 1.5 (diffusers ``AceStepTransformer1DModel``) through axial_rope: its attention processor.

``AceStepAttnProcessor2_0`` (diffusers 0.42.1 ``models/transformers/ace_step_transformer.py``; each layer's
self-attention ``self_attn`` and cross-attention to the condition ``cross_attn``) projects q (``heads``) and k, v
(``kv_heads``: grouped-query) to ``[B, S, H, D]``, normalises q and k by per-head RMSNorms (``norm_q``, ``norm_k``:
diffusers ``RMSNorm`` over D), rotates them in self-attention by ``image_rotary_emb`` (``(cos, sin)`` ``[S, D]``
tables of **half** pairing, channel ``i`` with ``i + D/2``, each angle twice: diffusers'
``apply_rotary_emb(use_real_unbind_dim=-2)`` in float32, cast back), and attends through ``dispatch_attention_fn``
with ``attn.scaling``, ``enable_gqa``, dropout in training and, on the flash backends, the padding mask and the
sliding window turned into their arguments; then projects out.

:class:`AceStepRopeProcessor` does the same step for step, the norm and the rotation of the self-attention as one
:func:`axial_rope.ops.norm_apply_rope` call (half pairing) where the norms are modules ``read_norm`` reads; the
cross-attention normalises only. The flash-backend branch is stock's, with stock's own helpers and constants.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.ace_step_transformer import (
    _FLASH_ATTENTION_BACKENDS,
    _FLASH_ATTENTION_VARLEN_BACKENDS,
    _get_current_attention_backend,
)

from .diffusers_processors import RopeProcessor, Tables

__all__ = ["AceStepRopeProcessor"]


class AceStepRopeProcessor(RopeProcessor):
    """ACE-Step's self-attention (rotated, half-paired) and cross-attention (normalised only); ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        is_cross = attn.is_cross_attention and encoder_hidden_states is not None
        kv_input = encoder_hidden_states if is_cross else hidden_states
        q = attn.to_q(hidden_states).unflatten(-1, (attn.heads, attn.head_dim))
        k = attn.to_k(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim))
        v = attn.to_v(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim))
        rotation = None
        if not is_cross and image_rotary_emb is not None:
            rotation = Tables.passed(image_rotary_emb, self.backend, "half")
        q, k = self.norm_then_rotate(attn, q, k, rotation, "bshd")  # fused where read_norm reads both norms

        attention_kwargs = None
        backend = _get_current_attention_backend(self)
        sliding_window = getattr(attn, "sliding_window", None)
        if backend in _FLASH_ATTENTION_BACKENDS:  # stock's arguments for the flash backends
            if attention_mask is not None:
                if attention_mask.ndim == 2:
                    padding_mask = attention_mask.to(torch.bool)
                elif attention_mask.ndim == 4:
                    keep_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
                    padding_mask = keep_mask.any(dim=(1, 2))
                else:
                    raise ValueError(
                        f"Unsupported ACE-Step attention mask shape for flash attention: {attention_mask.shape}"
                    )
                if not torch.all(padding_mask).item():
                    attention_mask = padding_mask
                    if backend not in _FLASH_ATTENTION_VARLEN_BACKENDS:
                        raise ValueError(
                            "ACE-Step flash attention received a padded attention mask. Use `flash_varlen` or "
                            "`flash_varlen_hub` for batched prompts with padding, or use an unpadded batch with `flash`."
                        )
                else:
                    attention_mask = None
            if not is_cross and sliding_window is not None and k.shape[1] > sliding_window:
                attention_kwargs = {"window_size": (sliding_window, sliding_window)}
        out = dispatch_attention_fn(
            q,
            k,
            v,
            attn_mask=attention_mask,
            dropout_p=attn.dropout if attn.training else 0.0,
            scale=attn.scaling,
            enable_gqa=attn.heads != attn.kv_heads,
            attention_kwargs=attention_kwargs,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        out = out.flatten(2, 3).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](out))
