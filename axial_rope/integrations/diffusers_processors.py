"""Attention processors for diffusers' Flux, HunyuanVideo, Wan and CogVideoX transformers (LTX-Video: ``diffusers_ltx``).

Each processor reproduces the stock processor of its model family step for step
(projections, QK-norm, attention, output projection) and rotates q and k by the tables the
model passes it (``image_rotary_emb``, Wan's ``rotary_emb``) through :func:`axial_rope.apply_rope`,
on the library's backends (the fused Triton kernels on GPU). Where the block's norm modules are a
pair of RMSNorms or LayerNorms it can read (:func:`read_norm`: weights, biases and eps, per head or
across heads), the QK-norm and the rotation of the rotated tokens are one
:func:`axial_rope.ops.norm_apply_rope` call (one Triton launch each way), rounded once; other norms
are called as the stock processor calls them. The tables are the model's own, or
those of :class:`~axial_rope.integrations.diffusers_tables.RotaryTables` when the adapter scales
them: the processors hold no positions and no state, so they compile and export as the stock
ones do. Importing this module imports diffusers; install the processors with
:func:`axial_rope.integrations.diffusers.set_rope_processors`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn

from ..ops import QKNorm, apply_rope, norm_apply_rope

__all__ = [
    "PROCESSORS",
    "RopeProcessor",
    "Tables",
    "call_norm",
    "head_mask",
    "read_norm",
    "FluxRopeProcessor",
    "HunyuanVideoRopeProcessor",
    "WanRopeProcessor",
    "SkyReelsV2RopeProcessor",
    "CogVideoXRopeProcessor",
]


class Tables:
    """The ``(cos, sin)`` a processor is passed, as ``[S, D]`` channel tables of ``pairing`` (any stock layout; ``[B,
    S, D]`` for tables per item, as HiDream's), and the rotation of q and k by them.

    ``key_scale``: the keys' per-channel factor ``[S, D]`` that our tables module appends with Untwisting RoPE
    (:class:`~axial_rope.integrations.diffusers_tables.RotaryTables`), applied to the rotated keys; ``None``: none.
    """

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, backend: str | None, pairing: str = "interleaved",
                 key_scale: torch.Tensor | None = None):  # fmt: skip
        self.cos, self.sin, self.backend, self.pairing, self.key_scale = cos, sin, backend, pairing, key_scale

    @classmethod
    def passed(cls, tables, backend: str | None, pairing: str = "interleaved") -> Tables:
        cos, sin, *key_scale = tables  # Flux / HunyuanVideo / CogVideoX: [S, D]; Wan: [1, S, 1, D]
        flat = lambda t: t.reshape(-1, t.shape[-1])
        return cls(flat(cos), flat(sin), backend, pairing, flat(key_scale[0]) if key_scale else None)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
        rotate = lambda x: apply_rope(x, self.cos, self.sin, self.pairing, layout, self.backend)
        return rotate(q), self._scaled_keys(rotate(k), layout, slice(None))

    def norm_rotate(self, q: torch.Tensor, k: torch.Tensor, norm: QKNorm, layout: str, rows: slice = slice(None)):
        """q and k normalised as ``norm`` says, then rotated by the tables' ``rows`` (their tokens), in one call."""
        cos, sin = self.cos[..., rows, :], self.sin[..., rows, :]
        q, k = norm_apply_rope(q, k, cos, sin, norm, self.pairing, layout, self.backend)
        return q, self._scaled_keys(k, layout, rows)

    def _scaled_keys(self, k: torch.Tensor, layout: str, rows: slice) -> torch.Tensor:
        if self.key_scale is None:
            return k
        scale = self.key_scale[rows].unsqueeze(1 if layout == "bshd" else 0)  # [S, 1, D] / [1, S, D]: every head
        return (k * scale).to(k.dtype)


def call_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, or ``x`` where the stock module has no norm (``None``)."""
    return x if norm is None else norm(x)


def _norm_kinds() -> dict:
    from diffusers.models.normalization import FP32LayerNorm, RMSNorm

    return {torch.nn.RMSNorm: "rms", RMSNorm: "rms", torch.nn.LayerNorm: "layer", FP32LayerNorm: "layer"}


_KINDS = _norm_kinds()  # exact classes whose forward is the QKNorm of their fields (subclasses may do more)
_WEIGHT_OFFSETS: dict[type, float] = {}  # of those, the classes whose multiplier is ``offset + weight``


def register_norm(cls: type, kind: str, weight_offset: float = 0.0) -> None:
    """Let :func:`read_norm` read the norm modules of exactly ``cls`` (a family's processor module registers its own):
    its forward must be the ``kind`` norm (``"rms"``, ``"layer"``) of its fields (``weight``, ``bias``, ``eps``, the
    width ``normalized_shape`` or ``dim``), the multiplier ``weight_offset + weight`` (a zero-centred scale: Krea 2's
    ``1 + weight``)."""
    _KINDS[cls] = kind
    if weight_offset:
        _WEIGHT_OFFSETS[cls] = float(weight_offset)


def read_norm(norm_q, norm_k, heads: int, head_dim: int, dtype: torch.dtype) -> QKNorm | None:
    """The :class:`~axial_rope.ops.QKNorm` a block's ``norm_q`` and ``norm_k`` compute, read from their fields
    (weight, bias, eps; never called), or ``None`` when they are not one RMSNorm/LayerNorm pair over a head's
    ``head_dim`` channels or a token's ``heads * head_dim`` (the processor then calls them, as stock).

    ``dtype``: the input's (``torch.nn.RMSNorm`` with ``eps=None`` uses its machine epsilon).
    """
    kind = _KINDS.get(type(norm_q))
    if kind is None or type(norm_k) is not type(norm_q) or _hooked(norm_q) or _hooked(norm_k):
        return None
    widths = {getattr(m, "normalized_shape", getattr(m, "dim", None)) for m in (norm_q, norm_k)}
    eps = {m.eps for m in (norm_q, norm_k)}
    if len(widths) != 1 or len(eps) != 1:
        return None
    width, eps = widths.pop(), eps.pop()
    width = (width,) if isinstance(width, int) else tuple(width)
    span = {(head_dim,): "head", (heads * head_dim,): "heads"}.get(width)
    if span is None:
        return None
    eps = torch.finfo(dtype).eps if eps is None else float(eps)
    bias = lambda m: getattr(m, "bias", None)
    offset = _WEIGHT_OFFSETS.get(type(norm_q))
    weight = lambda m: m.weight if offset is None or m.weight is None else m.weight + offset
    return QKNorm(kind, weight(norm_q), weight(norm_k), bias(norm_q), bias(norm_k), eps, span)


def _hooked(norm) -> bool:
    """Whether calling ``norm`` does more than its fields say: a hook that brings its weights (accelerate's
    sequential CPU offload keeps them on the meta device between calls, diffusers' leaf-level group offloading on
    another device) or casts them (layerwise casting) runs in its forward, so it is called, not read. A norm without
    weights (CogView4's LayerNorms, ``elementwise_affine=False``) has none to bring: read."""
    return (
        hasattr(norm, "_hf_hook") or hasattr(norm, "_diffusers_hook") or bool(norm._forward_pre_hooks)
        or bool(norm._forward_hooks) or (norm.weight is not None and norm.weight.device.type == "meta")
    )  # fmt: skip


def head_mask(attn, mask: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor | None:
    """The stock processors' attention mask over ``seq`` keys, per head ``[B, H, -1, seq]`` (None stays None)."""
    if mask is None:
        return None
    mask = attn.prepare_attention_mask(mask, seq, batch)
    return mask.view(batch, attn.heads, -1, mask.shape[-1])


PROCESSORS: dict[str, type] = {}  # every processor of ours by class name, as family records name them


class RopeProcessor:
    """Shared plumbing: the backend, and diffusers' attention-backend attributes (set by ``set_attention_backend``).
    Each subclass registers itself in :data:`PROCESSORS` (a family record names it; the installer looks it up)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        PROCESSORS[cls.__name__] = cls

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

    @staticmethod
    def qk_norm(attn, x: torch.Tensor, layout: str, names: tuple[str, str] = ("norm_q", "norm_k")) -> QKNorm | None:
        """:func:`read_norm` of ``attn``'s modules ``names`` for heads shaped as ``x`` (4-D in ``layout``)."""
        heads = x.shape[2 if layout == "bshd" else 1]
        return read_norm(getattr(attn, names[0]), getattr(attn, names[1]), heads, x.shape[-1], x.dtype)

    def norm_then_rotate(self, attn, q: torch.Tensor, k: torch.Tensor, rotation: Tables | None, layout: str,
                         names: tuple[str, str] = ("norm_q", "norm_k")) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """q and k through ``attn``'s QK-norm modules ``names`` and then ``rotation`` (``None``: the norm alone), as the
        stock processors do: one fused call where :func:`read_norm` reads both modules (float32 inside, rounded
        once), else the modules called (a ``None`` module skipped) and the rotation after them."""
        norm = self.qk_norm(attn, q, layout, names)
        if rotation is not None and norm is not None:  # fused
            return rotation.norm_rotate(q, k, norm, layout)
        q, k = call_norm(getattr(attn, names[0]), q), call_norm(getattr(attn, names[1]), k)
        return (q, k) if rotation is None else rotation(q, k, layout)

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


class FluxRopeProcessor(RopeProcessor):
    """Flux (double- and single-stream blocks): text tokens first, then image tokens; ``bshd``."""

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        out = self.joint_attention(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        if encoder_hidden_states is None:
            return out
        txt, img = out.split_with_sizes(
            [encoder_hidden_states.shape[1], out.shape[1] - encoder_hidden_states.shape[1]], 1
        )
        img = attn.to_out[1](attn.to_out[0](img.contiguous()))
        return img, attn.to_add_out(txt.contiguous())

    def joint_attention(self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb):
        """Flux's projections, QK-norms, rotation and attention over ``[text, image]``: ``[B, S, H * D]``, before
        the output projections (FLUX.2's double-stream blocks share it: ``diffusers_flux2``)."""
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
        rotation = self.tables(image_rotary_emb)  # [S_txt + S_img, D]: every token, one rotation
        norm = self.qk_norm(attn, q, "bshd")
        added = self.qk_norm(attn, q, "bshd", ("norm_added_q", "norm_added_k")) if joint else None
        if rotation is not None and norm is not None and (added is not None or not joint):  # fused
            if joint:  # text first, as the tables' rows: each part by its own norm and rows, then one sequence
                n_txt = eq.shape[1]
                eq, ek = rotation.norm_rotate(eq, ek, added, "bshd", slice(None, n_txt))
                q, k = rotation.norm_rotate(q, k, norm, "bshd", slice(n_txt, None))
                q, k, v = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1), torch.cat([ev, v], dim=1)
            else:
                q, k = rotation.norm_rotate(q, k, norm, "bshd")
        else:
            q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
            if joint:  # text first, as the tables' rows (the ids are txt_ids then img_ids)
                eq, ek = call_norm(attn.norm_added_q, eq), call_norm(attn.norm_added_k, ek)
                q, k, v = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1), torch.cat([ev, v], dim=1)
            if rotation is not None:
                q, k = rotation(q, k, "bshd")
        return self._attend(q, k, v, attention_mask)


class HunyuanVideoRopeProcessor(RopeProcessor):
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
        rotation = self.tables(image_rotary_emb)  # [S_video, D]: the video tokens, first
        norm = self.qk_norm(attn, q, "bshd")
        if rotation is not None and norm is not None:  # fused for the video tokens; the text's norm as stock
            qv, kv = rotation.norm_rotate(q[:, :n_video], k[:, :n_video], norm, "bshd")
            qt, kt = call_norm(attn.norm_q, q[:, n_video:]), call_norm(attn.norm_k, k[:, n_video:])
            q, k = torch.cat([qv, qt], dim=1), torch.cat([kv, kt], dim=1)
        else:
            q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
            if rotation is not None:
                qv, kv = rotation(q[:, :n_video], k[:, :n_video], "bshd")
                q, k = torch.cat([qv, q[:, n_video:]], dim=1), torch.cat([kv, k[:, n_video:]], dim=1)
        if attn.add_q_proj is not None and encoder_hidden_states is not None:  # double-stream: text appended
            eq, ek, ev = (
                proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
            )
            eq, ek = call_norm(attn.norm_added_q, eq), call_norm(attn.norm_added_k, ek)
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


class WanRopeProcessor(RopeProcessor):
    """Wan self- and cross-attention: QK-norm over all heads at once, RoPE in self-attention (fused there); ``bshd``."""

    # the context-parallel config for cross-attention too: Wan leaves it out there (diffusers PR #12909), SkyReels-V2's
    # copy of the processor does not (transformer_skyreels_v2.py SkyReelsV2AttnProcessor)
    cross_parallel = False

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
        rotation = self.tables(rotary_emb)
        heads, head_dim = attn.heads, q.shape[-1] // attn.heads
        norm = None if rotation is None else read_norm(attn.norm_q, attn.norm_k, heads, head_dim, q.dtype)
        if norm is not None:  # RMSNorm over H * D channels and the rotation, fused
            q, k, v = (t.unflatten(2, (heads, -1)) for t in (q, k, v))  # [B, S, H, D]
            q, k = rotation.norm_rotate(q, k, norm, "bshd")
        else:
            q, k = attn.norm_q(q), attn.norm_k(k)  # RMSNorm over H * D channels
            q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))  # [B, S, H, D]
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
            out_img = self._attend(q, k_img, v_img, parallel=self.cross_parallel)
        out = self._attend(q, k, v, attention_mask, parallel=self.cross_parallel or encoder_hidden_states is None)
        if out_img is not None:
            out = out + out_img
        return attn.to_out[1](attn.to_out[0](out))


class SkyReelsV2RopeProcessor(WanRopeProcessor):
    """SkyReels-V2: Wan's attention (transformer_skyreels_v2.py), the context-parallel config in every attention."""

    cross_parallel = True


class CogVideoXRopeProcessor(RopeProcessor):
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
        attention_mask = head_mask(attn, attention_mask, batch, seq)
        if getattr(attn, "fused_projections", False):
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k, v = (t.unflatten(-1, (attn.heads, -1)).transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        rotation = self.tables(image_rotary_emb)  # [S_video, D]: the video tokens, after the text
        norm = None if attn.is_cross_attention else self.qk_norm(attn, q, "bhsd")
        if rotation is not None and norm is not None:  # fused for the video tokens; the text's norm as stock
            qv, kv = rotation.norm_rotate(q[:, :, n_txt:], k[:, :, n_txt:], norm, "bhsd")
            q = torch.cat([call_norm(attn.norm_q, q[:, :, :n_txt]), qv], dim=2)
            k = torch.cat([call_norm(attn.norm_k, k[:, :, :n_txt]), kv], dim=2)
        else:
            q, k = call_norm(attn.norm_q, q), call_norm(attn.norm_k, k)
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
