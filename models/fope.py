"""FoPE in the reference language model: a position scheme for :class:`models.gpt.GPT` (``positions=``).

``GPT(config, positions=FoPEPositions())`` replaces RoPE's rotation by FoPE's per-head tables
(:class:`axial_rope.methods.FourierRoPE`, arXiv 2412.17739) in every layer, with coefficients per key head that
train with the model; the projections keep :class:`~axial_rope.layers.Attention`'s parameter names, so a RoPE
model's weights load into a FoPE one (its coefficients starting at the identity: RoPE with the frequencies of
period longer than the training length clipped). A FoPE checkpoint's ``cos_coef``/``sin_coef`` load into
``layers.<i>.attention.fope``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from axial_rope.layers import Attention
from axial_rope.methods import FourierRoPE

from .gpt import GPTConfig, RoPEPositions

__all__ = ["FoPEAttention", "FoPEPositions"]


class FoPEAttention(Attention):
    """Causal softmax attention whose q and k turn by FoPE's tables; :class:`Attention`'s projections and norms.

    Args:
        dim, num_heads: as :class:`~axial_rope.layers.Attention` (its keyword arguments too; no rope).
        fope: the tables, one coefficient set per key head (``fope.num_kv_heads`` = ``num_kv_heads``).
    """

    def __init__(self, dim: int, num_heads: int, *, fope: FourierRoPE, **kwargs):
        super().__init__(dim, num_heads, None, **kwargs)
        if not isinstance(fope, FourierRoPE) or fope.num_kv_heads != self.num_kv_heads:
            raise ValueError(f"fope must be a FourierRoPE with num_kv_heads={self.num_kv_heads} coefficient sets")
        if fope.rot_dim > self.head_dim:
            raise ValueError(f"fope.rot_dim = {fope.rot_dim} exceeds head_dim = {self.head_dim}")
        self.fope = fope

    def reset_parameters(self) -> None:
        """:class:`Attention`'s init, then the coefficients' (identity plus noise)."""
        super().reset_parameters()
        if hasattr(self, "fope"):  # Attention's constructor resets before fope exists
            self.fope.reset_parameters()

    def forward(self, x, pos=None, *, mask=None, cache=None, input_pos=None, seq_len=None, **unused):
        """As :meth:`Attention.forward` for a causal language model: ``x [B, S, C]``, int positions ``pos [S]``
        (default ``input_pos``), an optional static :class:`~axial_rope.KVCache` written at ``input_pos``."""
        if unused.get("rope") is not None or unused.get("rotation") is not None:
            raise ValueError("FoPEAttention turns q and k by its FoPE tables: it takes no rope= or rotation=")
        if cache is not None and input_pos is None:
            raise ValueError("a KV cache needs input_pos, the int [S] slots of the new tokens")
        B, S, _ = x.shape
        pos = input_pos if pos is None else pos
        if pos is None:
            raise ValueError("FoPEAttention needs pos, the int [S] positions of the tokens")
        q, k, v = self._project(x)  # [B, S, H, D], [B, S, H_kv, D]
        if self.qk_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.fope(q, k, pos)  # per-head tables, grouped over the query heads
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, D] for SDPA
        is_causal = False
        if cache is not None:
            k, v = cache.update(input_pos, k, v)  # [B, H_kv, S_max, D]: keys turned when written
            k, v = k.to(q.dtype), v.to(q.dtype)
            slots = torch.arange(cache.max_seq_len, device=x.device)
            visible = cache.filled[None, :] & (slots[None, :] <= input_pos[:, None])  # [S, S_max]
            mask = visible if mask is None else mask & visible
        elif mask is None:
            is_causal = True
        else:
            mask = mask & torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=1 / math.sqrt(self.head_dim),
            enable_gqa=self.num_kv_heads != self.num_heads,
        )  # fmt: skip
        return self.proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))


class FoPEPositions(RoPEPositions):
    """The GPT's position scheme with FoPE instead of RoPE (:class:`~models.gpt.RoPEPositions`' calls).

    Args:
        num_inv_freq: frequencies kept (default: those with a full period within ``config.max_seq_len``).
        init_std: the coefficients' initial noise around the identity.
    """

    fixed_modules = (FourierRoPE,)  # reset by GPT.reset_parameters (its draws come before the linear layers')

    def __init__(self, *, num_inv_freq: int | None = None, init_std: float = 0.1):
        self.num_inv_freq, self.init_std = num_inv_freq, init_std

    def uses_rope(self, config: GPTConfig) -> bool:
        return False

    def make_attention(self, config: GPTConfig, rope, **kwargs) -> nn.Module:
        n_kv = config.num_kv_heads or config.num_heads
        clip = (
            {"num_inv_freq": self.num_inv_freq}
            if self.num_inv_freq
            else {"max_position_embeddings": config.max_seq_len}
        )
        fope = FourierRoPE(config.head_dim, n_kv, config.theta, init_std=self.init_std, **clip)
        return FoPEAttention(config.hidden_size, config.num_heads, fope=fope, **kwargs)

    def check(self, config: GPTConfig) -> None:
        if config.scaling is not None:
            raise ValueError(
                f"FoPE clips and mixes its own frequencies: a RoPE scaling does not apply ({config.scaling})"
            )

    def streaming_refusal(self, config: GPTConfig) -> str | None:
        return "FoPE tables, which are not rotations: a rolling cache cannot re-index keys turned by them"

    def __repr__(self) -> str:
        return f"FoPEPositions(num_inv_freq={self.num_inv_freq}, init_std={self.init_std})"
