"""Multi-head attention with RoPE: QK-norm fused with the rotation, GQA, masks, causal flag, KV cache.

Everything positional goes through :class:`~axial_rope.AxialRoPE`; attention itself is
PyTorch's fused ``scaled_dot_product_attention``. Tokens are ``x [B, S, C]`` at
coordinates ``pos [S, n_axes]`` or ``[B, S, n_axes]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KVCache
from .init import deferred_init
from .ops import norm_rotate, rotate
from .ops.rotation import QKRotation, Rotation
from .parallel import ContextParallel, sequence_parallel_attention
from .rope import AxialRoPE
from .rotary import check_rotation
from .varlen import Segments, check_packed_attention, varlen_attention

__all__ = ["Attention", "QK_NORMS", "FACTOR_PLACEMENTS", "uniform_attention_factor", "xavier_linear"]

QK_NORMS = (None, "rms", "layer")
FACTOR_PLACEMENTS = ("rope", "softmax")


def xavier_linear(linear: nn.Linear) -> None:
    """DiT's init of a linear layer: xavier-uniform weight, zero bias."""
    nn.init.xavier_uniform_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def uniform_attention_factor(rope: AxialRoPE) -> float:
    """The attention factor of ``rope``'s scaling, one python float (it must be the same on every axis)."""
    try:
        return rope.attention_factor
    except ValueError as err:
        raise ValueError(
            f"attention factor in the softmax scale needs one factor for all axes: {err}; "
            "use factor_placement='rope' for per-axis factors"
        ) from err


def _allow(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """Restrict an SDPA mask (bool: True = attend, or additive float) to ``allowed`` (bool)."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return torch.where(allowed, mask, torch.full_like(mask, float("-inf")))


def _check_context_parallel(mask, cache, rope: AxialRoPE | None, seq_len) -> None:
    """What a sequence-parallel call cannot take, refused before any work (and any collective)."""
    if cache is not None:
        raise ValueError("context_parallel does not take a KV cache (decoding is not sequence-parallel)")
    if mask is not None:
        raise ValueError(
            "context_parallel takes no mask: each rank holds only its shard of the keys; padding to a "
            "multiple of the ranks is masked by the ContextParallel itself (cp.for_length(S))"
        )
    if rope is not None and rope.length_dependent and seq_len is None:
        raise ValueError(
            "a length-dependent scaling under context_parallel needs seq_len= (the global length): "
            "each rank sees only its shard's positions and would pick a different frequency schedule"
        )


class Attention(nn.Module):
    """Multi-head self-attention with RoPE, optional per-head QK-norm, GQA, mask, causal flag and KV cache.

    Args:
        dim: model width ``C``.
        num_heads: query heads ``H``.
        rope: the rotary layout of a head (``rope.rot_dim <= head_dim``), or ``None`` for no positions.
        num_kv_heads: key/value heads (divides ``num_heads``; fewer = grouped-query attention).
        head_dim: ``D``; default ``dim // num_heads``.
        qkv_bias: bias on the q, k, v projections.
        fused_qkv: one ``qkv`` projection (DiT, timm) or three (``to_q``, ``to_k``, ``to_v``: diffusers).
        qk_norm: ``None``, ``"rms"`` or ``"layer"``: a norm over each head's ``D`` channels of q and k,
            before the rotation. ``"rms"`` goes through :meth:`AxialRoPE.norm_and_rotate` (one fused
            kernel where the backend has it).
        factor_placement: where a scaling method's attention factor goes: ``"rope"`` multiplies it into
            cos/sin (rotated channels only, logits scale by its square; transformers' placement), or
            ``"softmax"``: rotate by unit cos/sin and multiply the softmax scale by its square (all channels).
        causal: mask future tokens (language models).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        rope: AxialRoPE | None = None,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        out_bias: bool = True,
        fused_qkv: bool = True,
        qk_norm: str | None = None,
        norm_eps: float = 1e-6,
        factor_placement: str = "rope",
        causal: bool = False,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        if head_dim is None and dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads}), or pass head_dim")
        head_dim = dim // num_heads if head_dim is None else head_dim
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {QK_NORMS}, got {qk_norm!r}")
        if factor_placement not in FACTOR_PLACEMENTS:
            raise ValueError(f"factor_placement must be one of {FACTOR_PLACEMENTS}, got {factor_placement!r}")
        if rope is not None and rope.rot_dim > head_dim:
            raise ValueError(f"rope.rot_dim = sum(axes_dim) = {rope.rot_dim} exceeds head_dim = {head_dim}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope, self.qk_norm, self.factor_placement, self.causal = rope, qk_norm, factor_placement, causal
        q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
        self.fused_qkv = fused_qkv
        with deferred_init(self):  # built on meta, then reset_parameters (axial_rope.init)
            if fused_qkv:
                self.qkv = nn.Linear(dim, q_width + 2 * kv_width, bias=qkv_bias)
            else:
                self.to_q = nn.Linear(dim, q_width, bias=qkv_bias)
                self.to_k = nn.Linear(dim, kv_width, bias=qkv_bias)
                self.to_v = nn.Linear(dim, kv_width, bias=qkv_bias)
            if qk_norm is not None:
                norm = nn.RMSNorm if qk_norm == "rms" else nn.LayerNorm
                self.q_norm, self.k_norm = norm(head_dim, eps=norm_eps), norm(head_dim, eps=norm_eps)
            self.proj = nn.Linear(q_width, dim, bias=out_bias)

    def reset_parameters(self) -> None:
        """DiT's init of attention: xavier-uniform projections, zero biases; unit QK-norm weights."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                xavier_linear(module)
        if self.qk_norm is not None:
            self.q_norm.reset_parameters()
            self.k_norm.reset_parameters()

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, S, _ = x.shape
        H, Hk, D = self.num_heads, self.num_kv_heads, self.head_dim
        if self.fused_qkv:
            q, k, v = self.qkv(x).split([H * D, Hk * D, Hk * D], dim=-1)
        else:
            q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        return q.view(B, S, H, D), k.view(B, S, Hk, D), v.view(B, S, Hk, D)  # bshd

    def _rotation(self, pos, rope, seq_len, rotation) -> tuple[Rotation | QKRotation | None, float]:
        """The rotation of this call and the softmax gain (the attention factor squared, softmax placement)."""
        in_softmax = self.factor_placement == "softmax"
        if rotation is not None:
            if not isinstance(rotation, (Rotation, QKRotation)):
                raise TypeError(
                    "rotation must be an axial_rope.ops.Rotation (rope.rotation(pos)) or a QKRotation (queries and "
                    f"keys turned differently), got {type(rotation).__name__}"
                )
            if in_softmax:
                raise ValueError(
                    "factor_placement='softmax' needs the attention factor as a number: pass pos (and rope) "
                    "instead of rotation=, which carries it as a tensor"
                )
            return rotation, 1.0
        if rope is None:
            return None, 1.0
        rotation = rope.rotation(pos, seq_len=seq_len)
        if not in_softmax:
            return rotation, 1.0
        # softmax placement: unit-length rotation, the factor squared goes into the softmax scale
        return rotation.without_attention_factor(), uniform_attention_factor(rope) ** 2

    def _norm_and_rotate(
        self, q, k, rotation: Rotation | QKRotation | None, backend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, S, H, D], k [B, S, H_kv, D] -> normed, rotated (norm and rotation in one call for RMSNorm)."""
        if rotation is not None:
            check_rotation(rotation, q, k, "bshd")
        if self.qk_norm == "rms" and rotation is not None:  # one fused launch where the backend has it
            return norm_rotate(
                q, k, self.q_norm.weight, self.k_norm.weight, rotation, "bshd", backend, eps=self.q_norm.eps
            )
        if self.qk_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return (q, k) if rotation is None else rotate(q, k, rotation, "bshd", backend)

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        rope: AxialRoPE | None = None,
        rotation: Rotation | QKRotation | None = None,
        cache: KVCache | None = None,
        input_pos: torch.Tensor | None = None,
        cache_write: bool = True,
        seq_len: int | Sequence[int] | None = None,
        context_parallel: ContextParallel | None = None,
        segments: Segments | None = None,
    ) -> torch.Tensor:
        """Attend over the tokens of ``x`` (and, with a cache, over the cached ones).

        Args:
            x: ``[B, S, C]``.
            pos: coordinates ``[S, n_axes]`` or ``[B, S, n_axes]`` (1-D: ``[S]``); with a cache,
                defaults to ``input_pos``.
            mask: SDPA mask broadcastable to ``[B, H, S, S_k]`` (bool: True = attend; or additive float).
            rope: replaces the module's rope for this call (any rope-like object, e.g. ``rope.at_time(t)``).
            rotation: instead of ``pos`` and a rope, the rotation itself (``rope.rotation(pos, ...)``), e.g.
                computed once per forward by a model and passed to every block; a
                :class:`~axial_rope.ops.rotation.QKRotation` turns the queries by its ``query`` and the keys by its
                ``key`` (a cache then holds keys turned by ``key``: roll it with ``cache.advance(n, rotation.key)``).
            cache: a :class:`KVCache`; the new keys are rotated once, written at ``input_pos``, and
                the queries attend to every slot written so far (causal: those ``<= input_pos``).
            input_pos: int ``[S]``, cache slots of the new tokens (needed with ``cache``).
            cache_write: ``False``: read without writing (:meth:`KVCache.peek`): the queries attend to the
                cached slots and to the new tokens (causal: those before them), and the cache is left as it was;
                ``mask`` then spans ``S_max + S`` keys (the slots, then the new tokens).
            seq_len: length per axis for length-dependent scaling (see :meth:`AxialRoPE.forward`).
            context_parallel: a :class:`~axial_rope.parallel.ContextParallel`: ``x [B, L, C]`` and ``pos``
                are this rank's shard (``cp.shard(x)``, ``cp.positions(pos)``: global coordinates) of a
                sequence of ``cp.seq_len`` tokens, and attention spans the whole sequence across the
                group (ring or Ulysses). Collective: every rank of the group calls it. No mask or cache.
            segments: a packed sequence's boundaries (:class:`~axial_rope.varlen.Segments`): the ``B * S``
                tokens of ``x`` hold several items end to end and each attends within its own item
                (:func:`~axial_rope.varlen.varlen_attention`, the device's fastest path). No mask or cache.

        Returns:
            ``[B, S, C]`` (with ``context_parallel``: ``[B, L, C]``, this rank's rows).
        """
        if x.ndim != 3:
            raise ValueError(f"x must be [B, S, C], got shape {tuple(x.shape)}")
        B, S, _ = x.shape
        rope = self.rope if rope is None else rope
        if cache is not None and input_pos is None:
            raise ValueError("a KV cache needs input_pos, the int [S] slots of the new tokens")
        if pos is None and cache is not None:
            pos = input_pos
        if rope is not None and pos is None and rotation is None:
            raise ValueError("pos (or rotation=) is required when the attention has a rope")
        if rotation is not None:
            rope = None  # the rotation replaces the rope for this call
        if context_parallel is not None:
            _check_context_parallel(mask, cache, rope, seq_len)
        if segments is not None:
            excluded = {"mask": mask, "cache": cache, "context_parallel": context_parallel}
            check_packed_attention(x, pos, segments, rope=rope, seq_len=seq_len, **excluded)
        backend = getattr(rope if rope is not None else self.rope, "backend", None)
        rotation, gain = self._rotation(pos, rope, seq_len, rotation)
        q, k, v = self._project(x)
        q, k = self._norm_and_rotate(q, k, rotation, backend)
        if segments is not None:  # packed: [B * S] tokens of several items, attention within each
            scale = gain / math.sqrt(self.head_dim)
            out = varlen_attention(*(t.flatten(0, 1) for t in (q, k, v)), segments, causal=self.causal, scale=scale)
            return self.proj(out.reshape(B, S, self.num_heads * self.head_dim))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D] for SDPA
        if context_parallel is not None:  # S is this rank's L; rotation above used its global positions
            scale = gain / math.sqrt(self.head_dim)
            out = sequence_parallel_attention(q, k, v, context_parallel, causal=self.causal, scale=scale)
            return self.proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))
        is_causal = False
        if cache is not None and not cache_write:  # the slots, then the new tokens: [B, H_kv, S_max + S, D]
            k, v, filled = cache.peek(k, v)
            k, v = k.to(q.dtype), v.to(q.dtype)
            visible = filled[None, :].expand(S, -1)  # [S, S_max + S]
            if self.causal:  # every written slot is earlier; among the new tokens, those up to each query
                new = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
                visible = visible & torch.cat([visible[:, : cache.max_seq_len], new], dim=1)
            mask = _allow(mask, visible)
        elif cache is not None:
            k, v = cache.update(input_pos, k, v)  # [B, H_kv, S_max, D], keys rotated when written
            k, v = k.to(q.dtype), v.to(q.dtype)  # a cache kept in another dtype is read in the model's
            visible = cache.filled[None, :].expand(S, -1)  # [S, S_max]: never-written slots stay hidden
            if self.causal:
                slots = torch.arange(cache.max_seq_len, device=x.device)
                visible = visible & (slots[None, :] <= input_pos[:, None])
            mask = _allow(mask, visible)
        elif self.causal and mask is None:
            is_causal = True
        elif self.causal:
            mask = _allow(mask, torch.ones(S, S, dtype=torch.bool, device=x.device).tril())
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            scale=gain / math.sqrt(self.head_dim),
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        return self.proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"qk_norm={self.qk_norm!r}, factor_placement={self.factor_placement!r}, causal={self.causal}"
        )
