"""Multi-head attention with RoPE, one straight path: project -> norm + rotate -> attend -> output.

The rotation is one :class:`~axial_rope.ops.rotation.Rotation` (or :class:`~axial_rope.ops.rotation.QKRotation`)
per call, built from ``pos`` and the rope where the caller gives positions; QK-norm is fused with it. The attend step
is one record of :mod:`axial_rope.attend` (SDPA, a KV cache, a packed sequence, a sharded one). Tokens are
``x [B, S, C]`` at coordinates ``pos [S, n_axes]`` or ``[B, S, n_axes]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .attend import Cached, Sdpa, Sharded, Varlen, attend_record
from .init import deferred_init
from .ops import norm_rotate, rotate
from .ops.rotation import QKRotation, Rotation
from .rope import AxialRoPE
from .rotary import check_rotation

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

    def rotation_for(
        self,
        pos: torch.Tensor | None = None,
        *,
        rope: AxialRoPE | None = None,
        seq_len: int | Sequence[int] | None = None,
        rotation: Rotation | QKRotation | None = None,
    ) -> tuple[Rotation | QKRotation | None, float]:
        """The rotation of one call and its softmax gain: ``rotation`` as given, else built from ``pos`` by ``rope``
        (default the module's); ``None`` without a rope. The gain is 1, or the attention factor squared where
        ``factor_placement="softmax"`` puts it into the softmax scale (the rotation then at unit amplitude)."""
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
        rope = self.rope if rope is None else rope
        if rope is None:
            return None, 1.0
        if pos is None:
            raise ValueError("pos (or rotation=) is required when the attention has a rope")
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
        rotation: Rotation | QKRotation | None = None,
        attend: Sdpa | Cached | Varlen | Sharded | None = None,
        rope: AxialRoPE | None = None,
        seq_len: int | Sequence[int] | None = None,
        **attend_options,
    ) -> torch.Tensor:
        """Attend over the tokens of ``x``: project, norm and rotate q and k, attend, project out.

        Args:
            x: ``[B, S, C]`` (with :class:`~axial_rope.attend.Sharded`: this rank's ``[B, L, C]``).
            pos: coordinates ``[S, n_axes]`` or ``[B, S, n_axes]`` (1-D: ``[S]``), turned into the rotation by
                ``rope`` (default the module's); with a cache, defaults to its ``input_pos``.
            rotation: the rotation itself instead of ``pos`` (``rope.rotation(pos, ...)``, computed once per forward
                by a model and passed to every block); a :class:`~axial_rope.ops.rotation.QKRotation` turns the
                queries by its ``query`` and the keys by its ``key`` (a cache then holds keys turned by ``key``: roll
                it with ``cache.advance(n, rotation.key)``).
            attend: the attend step, one of :mod:`axial_rope.attend`'s records: ``Sdpa(mask)`` (the default),
                ``Cached(cache, input_pos, write, mask)``, ``Varlen(segments)``, ``Sharded(cp)``.
            rope: replaces the module's rope for this call (any rope-like object, e.g. ``rope.at_time(t)``).
            seq_len: length per axis for length-dependent scaling (see :meth:`AxialRoPE.forward`).
            attend_options: the keyword form of ``attend`` (:func:`~axial_rope.attend.attend_record`): ``mask=`` is
                ``Sdpa(mask)``; ``cache=``, ``input_pos=``, ``cache_write=`` (and ``mask=``) are
                ``Cached(cache, input_pos, cache_write, mask)``; ``segments=`` is ``Varlen(segments)``;
                ``context_parallel=`` is ``Sharded(context_parallel)``.

        Returns:
            ``[B, S, C]`` (sharded: ``[B, L, C]``, this rank's rows).
        """
        if x.ndim != 3:
            raise ValueError(f"x must be [B, S, C], got shape {tuple(x.shape)}")
        B, S, _ = x.shape
        attend = attend_record(attend, **attend_options)  # one record: the paths exclude each other by construction
        if pos is None and isinstance(attend, Cached):
            pos = attend.input_pos
        call_rope = None if rotation is not None else (self.rope if rope is None else rope)  # what builds it
        attend.check(x, pos, call_rope, seq_len)  # before any work, and before any collective
        rotation, gain = self.rotation_for(pos, rope=rope, seq_len=seq_len, rotation=rotation)
        q, k, v = self._project(x)  # [B, S, H, D], [B, S, H_kv, D] x 2
        backend = getattr(self.rope if call_rope is None else call_rope, "backend", None)
        q, k = self._norm_and_rotate(q, k, rotation, backend)
        out = attend(q, k, v, causal=self.causal, scale=gain / math.sqrt(self.head_dim))  # [B, S, H, D]
        return self.proj(out.reshape(B, S, self.num_heads * self.head_dim))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"qk_norm={self.qk_norm!r}, factor_placement={self.factor_placement!r}, causal={self.causal}"
        )
