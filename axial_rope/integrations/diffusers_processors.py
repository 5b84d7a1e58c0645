"""Attention processors for diffusers' Flux, HunyuanVideo, Wan and CogVideoX transformers (LTX-Video: ``diffusers_ltx``).

Each processor reproduces the stock processor of its model family step for step
(projections, QK-norm, attention, output projection) and hands the rotary step to
:class:`~axial_rope.AxialRoPE`; where the QK-norm is a per-head RMSNorm, norm and
rotation run as one call to :meth:`~axial_rope.AxialRoPE.norm_and_rotate`.

Positions reach the processors through a :class:`RopeState` that a forward hook on
the transformer (or on its rotary module) fills in for every forward: ``pos`` is
``[S_rope, 3]``, one row per rotated token, in the order the tokens are rotated; a
time-dependent rope is recorded bound to the forward's sampling time (:attr:`RopeState.time`).
Importing this module imports diffusers; install the processors with
:func:`axial_rope.integrations.diffusers.set_rope_processors`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
from torch.utils.weak import WeakIdKeyDictionary

from ..ops import apply_rope
from ..positions import grid, positions_for_size
from ..rope import AxialRoPE

__all__ = [
    "RopeState",
    "FluxRopeProcessor",
    "HunyuanVideoRopeProcessor",
    "WanRopeProcessor",
    "CogVideoXRopeProcessor",
]


class RopeState:
    """What the processors of one transformer share: the rotary layout and the positions of each forward.

    Positions (and the rope for them) are recorded against the very tables
    (``image_rotary_emb``) the stock model computes for that forward and passes to every
    processor, and looked up by their identity: activation checkpointing, which recomputes
    a block in backward after later forwards have run, gets the positions of the forward
    it recomputes, not the latest ones.

    Args:
        rope: the :class:`~axial_rope.AxialRoPE` every processor rotates with.
        use_tables: rotate with the tables the model passes in (``image_rotary_emb``)
            instead of positions; only exact when ``rope`` is unscaled.
        sizing: ``(train_sizes, mode)``: positions and scaling of each forward's token grid
            come from :func:`axial_rope.positions_for_size` (grid axes only).

    Attributes:
        time: the sampling time (0-d tensor, noise level in ``[0, 1]``) of the forward being run.
    """

    def __init__(self, rope: AxialRoPE, *, use_tables: bool = False, sizing: tuple | None = None):
        self.rope, self.use_tables, self.sizing = rope, use_tables, sizing
        self.time: torch.Tensor | None = None
        # the tables' first tensor -> (positions [S_rope, n_axes], rope); entries go when the tables are freed
        self._positions = WeakIdKeyDictionary()

    def record(self, tables, pos: torch.Tensor, rope: AxialRoPE | None = None) -> None:
        """Record the positions ``[S_rope, n_axes]`` (and rope) of the forward that computed ``tables``.

        The processors are not submodules, so ``transformer.to(device)`` does not reach the
        rope's frequency buffers; they follow the positions' device here, once per move.
        """
        if self.rope.freqs.device != pos.device:
            self.rope.to(pos.device)
        if tables is None:
            return
        rope = self.rope if rope is None else rope
        if rope.time_dependent:  # bound to this forward's time: F(t) once for all its layers (and recomputes)
            if self.time is None:
                raise RuntimeError("a time-dependent scaling reads each forward's `timestep`; this forward got none")
            rope = rope.at_time(self.time)
        self._positions[_key(tables)] = (pos, rope)

    def record_grid(self, tables, sizes: tuple[int, ...], device) -> None:
        """Record a token grid ``sizes`` (t, y, x), sized by :attr:`sizing` when set."""
        if self.sizing is None:
            return self.record(tables, grid(*sizes, device=device))
        sized = positions_for_size(sizes, *self.sizing, device=device)
        self.record(tables, sized.pos, self.rope.with_scaling(sized.scaling))

    def record_ids(self, tables, ids: torch.Tensor) -> None:
        """Record Flux ids ``[S, 3]`` (index, y, x); with :attr:`sizing`, the y/x grid of the image is sized.

        The image grid is ``max + 1`` of the integer y and x ids; each id ``i`` becomes the
        coordinate :func:`~axial_rope.positions_for_size` gives grid index ``i`` (text ids, 0,
        stay 0 in every mode allowed here).
        """
        if self.sizing is None:
            return self.record(tables, ids)
        yx = ids[:, 1:].round().long()
        if bool((yx < 0).any()) or not torch.equal(yx.to(ids.dtype), ids[:, 1:]):
            raise ValueError("sizing Flux positions needs integer y/x ids >= 0 (an image grid)")
        h, w = (int(v) + 1 for v in yx.amax(0))
        sized = positions_for_size((h, w), *self.sizing, dtype=ids.dtype, device=ids.device)
        axes = sized.pos.view(h, w, 2)
        pos = torch.stack([ids[:, 0], axes[:, 0, 0][yx[:, 0]], axes[0, :, 1][yx[:, 1]]], dim=-1)
        self.record(tables, pos, self.rope.with_scaling((None, *sized.scaling)))

    def recorded(self, tables) -> tuple[torch.Tensor | None, AxialRoPE | None]:
        """The positions and rope recorded with ``tables`` (``(None, None)`` when none were)."""
        return self._positions.get(_key(tables), (None, None))

    @property
    def scaled(self) -> bool:
        return self.sizing is not None or any(s is not None for s in self.rope.scaling)

    def rotation(self, tables, n_tokens: int, device: torch.device) -> Rotation | None:
        """How to rotate ``n_tokens`` tokens: by the positions recorded with ``tables``, or by the tables.

        ``tables`` is the stock ``(cos, sin)`` argument; ``None`` means the stock processor
        would not rotate in this call (e.g. Wan's cross-attention), so neither do we.
        """
        if tables is None:
            return None
        pos, rope = (None, None) if self.use_tables else self._positions.get(_key(tables), (None, None))
        if pos is not None and pos.shape[0] == n_tokens:
            return Rotation(rope, pos=pos.to(device))
        if self.scaled:
            found = "none" if pos is None else f"{pos.shape[0]}"
            raise RuntimeError(
                f"axial_rope processors with scaling need the positions of the {n_tokens} rotated tokens, but "
                f"{found} were recorded with the rotary tables passed in; call the transformer itself (not its "
                "attention blocks alone), so that its position hook sees every forward"
            )
        cos, sin = tables
        # Flux/HunyuanVideo/CogVideoX: [S, D]; Wan: [1, S, 1, D]
        cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
        return Rotation(self.rope, tables=(cos, sin))


def _key(tables) -> torch.Tensor:
    """The tensor that identifies one forward's tables: their first (cos, or Wan's complex table)."""
    return tables[0] if isinstance(tables, (tuple, list)) else tables


class Rotation:
    """One rotation of a slice of tokens, either from positions or from full-width tables ``[S, r]``."""

    def __init__(self, rope: AxialRoPE, *, pos: torch.Tensor | None = None, tables=None):
        self.rope, self.pos, self.tables = rope, pos, tables

    def slice(self, start: int, stop: int | None) -> Rotation:
        if self.pos is not None:
            return Rotation(self.rope, pos=self.pos[start:stop])
        cos, sin = self.tables
        return Rotation(self.rope, tables=(cos[start:stop], sin[start:stop]))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pos is not None:
            return self.rope(q, k, self.pos, layout)
        cos, sin = self.tables
        backend = self.rope.backend
        return (
            apply_rope(q, cos, sin, "interleaved", layout, backend),
            apply_rope(k, cos, sin, "interleaved", layout, backend),
        )

    def norm_and_rotate(self, q, k, norm_q, norm_k, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``norm_q(q)``, ``norm_k(k)`` then rotation; one fused call when both norms are per-head RMSNorms."""
        fused_q, fused_k = _rms_params(norm_q, q), _rms_params(norm_k, k)
        if self.pos is not None and fused_q is not None and fused_k is not None and fused_q[1] == fused_k[1]:
            return self.rope.norm_and_rotate(q, k, self.pos, fused_q[0], fused_k[0], layout, eps=fused_q[1])
        q = q if norm_q is None else norm_q(q)
        k = k if norm_k is None else norm_k(k)
        return self(q, k, layout)


def _rms_params(norm, x: torch.Tensor) -> tuple[torch.Tensor | None, float] | None:
    """``(weight, eps)`` of a per-head RMSNorm over ``x``'s last axis that the fused op reproduces, else None."""
    head_dim = x.shape[-1]
    if isinstance(norm, torch.nn.RMSNorm) and tuple(norm.normalized_shape) == (head_dim,):
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        return norm.weight, float(eps)
    if isinstance(norm, DiffusersRMSNorm) and norm.bias is None and tuple(norm.dim) == (head_dim,):
        return norm.weight, float(norm.eps)
    return None


def _norm(norm, x: torch.Tensor) -> torch.Tensor:
    return x if norm is None else norm(x)


def _head_mask(attn, mask: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor | None:
    """The stock processors' attention mask over ``seq`` keys, per head ``[B, H, -1, seq]`` (None stays None)."""
    if mask is None:
        return None
    mask = attn.prepare_attention_mask(mask, seq, batch)
    return mask.view(batch, attn.heads, -1, mask.shape[-1])


class _RopeProcessor:
    """Shared plumbing: the state, and diffusers' attention-backend attributes (set by ``set_attention_backend``)."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, state: RopeState, original=None):
        self.state = state
        if original is not None:  # keep the attention backend the user chose for the stock processor
            self._attention_backend = getattr(original, "_attention_backend", None)
            self._parallel_config = getattr(original, "_parallel_config", None)

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
        n_txt = eq.shape[1] if joint else 0
        rotation = self.state.rotation(image_rotary_emb, n_txt + q.shape[1], q.device)
        if rotation is None:
            q, k = _norm(attn.norm_q, q), _norm(attn.norm_k, k)
            if joint:
                eq, ek = _norm(attn.norm_added_q, eq), _norm(attn.norm_added_k, ek)
        else:
            q, k = rotation.slice(n_txt, None).norm_and_rotate(q, k, attn.norm_q, attn.norm_k, "bshd")
            if joint:
                eq, ek = rotation.slice(0, n_txt).norm_and_rotate(eq, ek, attn.norm_added_q, attn.norm_added_k, "bshd")
        if joint:
            q, k, v = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1), torch.cat([ev, v], dim=1)

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
        rotation = self.state.rotation(image_rotary_emb, n_video, q.device)
        if rotation is None:
            q, k = _norm(attn.norm_q, q), _norm(attn.norm_k, k)
        else:  # norm is per token, so norming [video] and [text] apart is the stock norm of [video, text]
            qv, kv = rotation.norm_and_rotate(q[:, :n_video], k[:, :n_video], attn.norm_q, attn.norm_k, "bshd")
            if single:
                qt, kt = _norm(attn.norm_q, q[:, n_video:]), _norm(attn.norm_k, k[:, n_video:])
                qv, kv = torch.cat([qv, qt], dim=1), torch.cat([kv, kt], dim=1)
            q, k = qv, kv
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
        rotation = self.state.rotation(rotary_emb, q.shape[1], q.device)
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
        rotation = self.state.rotation(image_rotary_emb, seq - n_txt, q.device)
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
