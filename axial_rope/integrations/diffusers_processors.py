"""Attention processors for diffusers' Flux, HunyuanVideo, Wan and CogVideoX transformers (LTX-Video: ``diffusers_ltx``).

Each processor reproduces the stock processor of its model family step for step
(projections, QK-norm, attention, output projection) and rotates q and k by the tables the
model passes it (``image_rotary_emb``, Wan's ``rotary_emb``) through :func:`axial_rope.apply_rope`,
on the library's backends (the fused Triton kernels on GPU). The tables are the model's own, or
those of :class:`~axial_rope.integrations.diffusers_tables.RotaryTables` when the adapter scales
them: the processors hold no positions and no state, so they compile and export as the stock
ones do. Importing this module imports diffusers; install the processors with
:func:`axial_rope.integrations.diffusers.set_rope_processors`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn

from ..ops import apply_rope

__all__ = [
    "FluxRopeProcessor",
    "HunyuanVideoRopeProcessor",
    "WanRopeProcessor",
    "CogVideoXRopeProcessor",
]


class Tables:
    """The ``(cos, sin)`` a processor is passed, as ``[S, D]`` interleaved channel tables (any stock layout),
    and the rotation of q and k by them."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, backend: str | None):
        self.cos, self.sin, self.backend = cos, sin, backend

    @classmethod
    def passed(cls, tables, backend: str | None) -> Tables:
        cos, sin = tables  # Flux / HunyuanVideo / CogVideoX: [S, D]; Wan: [1, S, 1, D]
        return cls(cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]), backend)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
        rotate = lambda x: apply_rope(x, self.cos, self.sin, "interleaved", layout, self.backend)
        return rotate(q), rotate(k)


def _norm(norm, x: torch.Tensor) -> torch.Tensor:
    return x if norm is None else norm(x)


def _head_mask(attn, mask: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor | None:
    """The stock processors' attention mask over ``seq`` keys, per head ``[B, H, -1, seq]`` (None stays None)."""
    if mask is None:
        return None
    mask = attn.prepare_attention_mask(mask, seq, batch)
    return mask.view(batch, attn.heads, -1, mask.shape[-1])


class _RopeProcessor:
    """Shared plumbing: the backend, and diffusers' attention-backend attributes (set by ``set_attention_backend``)."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, backend: str | None = None, original=None):
        self.backend = backend
        if original is not None:  # keep the attention backend the user chose for the stock processor
            self._attention_backend = getattr(original, "_attention_backend", None)
            self._parallel_config = getattr(original, "_parallel_config", None)

    def tables(self, tables) -> Tables | None:
        """The rotation by the tables passed in; ``None`` when the stock processor would not rotate either."""
        return None if tables is None else Tables.passed(tables, self.backend)

    def _attend(self, q, k, v, mask=None, *, parallel: bool = True) -> torch.Tensor:
        """diffusers' attention of ``bshd`` q, k, v on the chosen backend, heads merged: ``[B, S, H * D]`` in q's dtype.

        ``parallel``: pass the context-parallel config (diffusers leaves it out of cross-attention).
        """
        out = dispatch_attention_fn(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config if parallel else None,
        )
        return out.flatten(2, 3).to(q.dtype)


class FluxRopeProcessor(_RopeProcessor):
    """Flux (double- and single-stream blocks): text tokens first, then image tokens; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        if attn.fused_projections:
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)  # [B, S, H * D] each
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in (q, k, v))  # [B, S, H, D]
        joint = attn.added_kv_proj_dim is not None
        if joint:  # double-stream block: text tokens have their own projections and norms
            if attn.fused_projections:
                eq, ek, ev = attn.to_added_qkv(encoder_hidden_states).chunk(3, dim=-1)
            else:
                eq = attn.add_q_proj(encoder_hidden_states)
                ek, ev = attn.add_k_proj(encoder_hidden_states), attn.add_v_proj(encoder_hidden_states)
            eq, ek, ev = (t.unflatten(-1, (-1, attn.head_dim)) for t in (eq, ek, ev))
        q, k = _norm(attn.norm_q, q), _norm(attn.norm_k, k)
        if joint:  # text first, as the tables' rows (the ids are txt_ids then img_ids)
            eq, ek = _norm(attn.norm_added_q, eq), _norm(attn.norm_added_k, ek)
            q, k, v = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1), torch.cat([ev, v], dim=1)
        rotation = self.tables(image_rotary_emb)  # [S_txt + S_img, D]: every token, one rotation
        if rotation is not None:
            q, k = rotation(q, k, "bshd")

        out = self._attend(q, k, v, attention_mask)
        if encoder_hidden_states is None:
            return out
        txt, img = out.split_with_sizes(
            [encoder_hidden_states.shape[1], out.shape[1] - encoder_hidden_states.shape[1]], 1
        )
        img = attn.to_out[1](attn.to_out[0](img.contiguous()))
        return img, attn.to_add_out(txt.contiguous())


class HunyuanVideoRopeProcessor(_RopeProcessor):
    """HunyuanVideo: video tokens first and rotated, text tokens last and not rotated; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        single = attn.add_q_proj is None and encoder_hidden_states is not None
        n_video = hidden_states.shape[1]
        if single:  # single-stream block: one set of projections over [video, text]
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        q, k, v = (proj(hidden_states).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        q, k = _norm(attn.norm_q, q), _norm(attn.norm_k, k)
        rotation = self.tables(image_rotary_emb)  # [S_video, D]: the video tokens, first
        if rotation is not None:
            qv, kv = rotation(q[:, :n_video], k[:, :n_video], "bshd")
            q, k = torch.cat([qv, q[:, n_video:]], dim=1), torch.cat([kv, k[:, n_video:]], dim=1)
        if attn.add_q_proj is not None and encoder_hidden_states is not None:  # double-stream: text appended
            eq, ek, ev = (
                proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
            )
            eq, ek = _norm(attn.norm_added_q, eq), _norm(attn.norm_added_k, ek)
            q, k, v = torch.cat([q, eq], dim=1), torch.cat([k, ek], dim=1), torch.cat([v, ev], dim=1)

        out = self._attend(q, k, v, attention_mask)
        if encoder_hidden_states is None:
            return out, encoder_hidden_states
        n_txt = encoder_hidden_states.shape[1]
        out, txt = out[:, :-n_txt], out[:, -n_txt:]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            txt = attn.to_add_out(txt)
        return out, txt


class WanRopeProcessor(_RopeProcessor):
    """Wan self- and cross-attention: QK-norm over all heads at once (so not fused), RoPE in self-attention; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        context_img = None
        if attn.add_k_proj is not None:  # image-to-video: image tokens precede the 512 text tokens
            n_img = encoder_hidden_states.shape[1] - 512
            context_img, encoder_hidden_states = encoder_hidden_states[:, :n_img], encoder_hidden_states[:, n_img:]
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        if attn.fused_projections and not attn.is_cross_attention:
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        elif attn.fused_projections:
            q, (k, v) = attn.to_q(hidden_states), attn.to_kv(context).chunk(2, dim=-1)
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        q, k = attn.norm_q(q), attn.norm_k(k)  # RMSNorm over H * D channels
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))  # [B, S, H, D]
        rotation = self.tables(rotary_emb)
        if rotation is not None:
            q, k = rotation(q, k, "bshd")

        out_img = None
        if context_img is not None:
            if attn.fused_projections:
                k_img, v_img = attn.to_added_kv(context_img).chunk(2, dim=-1)
            else:
                k_img, v_img = attn.add_k_proj(context_img), attn.add_v_proj(context_img)
            k_img = attn.norm_added_k(k_img).unflatten(2, (attn.heads, -1))
            v_img = v_img.unflatten(2, (attn.heads, -1))
            out_img = self._attend(q, k_img, v_img, parallel=False)
        out = self._attend(q, k, v, attention_mask, parallel=encoder_hidden_states is None)
        if out_img is not None:
            out = out + out_img
        return attn.to_out[1](attn.to_out[0](out))


class CogVideoXRopeProcessor(_RopeProcessor):
    """CogVideoX: text tokens first (not rotated), video tokens after; LayerNorm QK-norm; ``bhsd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        n_txt = encoder_hidden_states.shape[1]
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)  # [B, S, C]
        batch, seq, _ = hidden_states.shape
        attention_mask = _head_mask(attn, attention_mask, batch, seq)
        if getattr(attn, "fused_projections", False):
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k, v = (t.unflatten(-1, (attn.heads, -1)).transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        q, k = _norm(attn.norm_q, q), _norm(attn.norm_k, k)
        rotation = self.tables(image_rotary_emb)  # [S_video, D]: the video tokens, after the text
        if rotation is not None:
            qv, kv = rotation(q[:, :, n_txt:], k[:, :, n_txt:], "bhsd")
            q = torch.cat([q[:, :, :n_txt], qv], dim=2)
            if not attn.is_cross_attention:
                k = torch.cat([k[:, :, :n_txt], kv], dim=2)

        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).flatten(2, 3)  # [B, S, H * D]
        out = attn.to_out[1](attn.to_out[0](out))
        txt, out = out.split([n_txt, seq - n_txt], dim=1)
        return out, txt
