"""Causal linear attention with RoPE as Su et al. apply it (RoFormer, 2021, eq. 19).

Softmax attention is replaced by a positive feature map ``phi`` (``elu + 1``, Katharopoulos
et al. 2020): token ``m`` reads

    out_m = sum_{n<=m} (R_m phi(q_m)) . (R_n phi(k_n)) v_n  /  sum_{n<=m} phi(q_m) . phi(k_n)

The rotation goes *after* the feature map, so the numerator's score depends on ``m - n``
only; the normaliser stays unrotated, so it stays positive (a rotated one could vanish).
The weights need not sum to one: that is the paper's choice, kept here.

A full sequence is computed in the quadratic form (two masked ``S x S`` products); cached
decoding in the recurrent form, with :class:`LinearState` holding the running sums
``sum R_n phi(k_n) v_n^T`` and ``sum phi(k_n)``: constant memory per step, the point of
linear attention. Both give the same numbers (tests/test_lm_positions.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from axial_rope.attention import Attention

__all__ = ["LinearAttention", "LinearState", "feature_map"]


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1 > 0``: Katharopoulos et al.'s map, positive so that the normaliser is."""
    return F.elu(x) + 1


class LinearState(nn.Module):
    """The decoding state of one linear-attention layer: running sums over the tokens seen so far.

    ``kv [B, H, D, D]`` = sum of ``R_n phi(k_n) v_n^T``; ``z [B, H, D]`` = sum of ``phi(k_n)``;
    ``length``: how many tokens they hold (the next token's position). ``max_seq_len`` only
    bounds the positions, as a :class:`~axial_rope.cache.KVCache` of that length would.
    """

    def __init__(self, batch: int, num_heads: int, head_dim: int, max_seq_len: int, *, dtype=None, device=None):
        super().__init__()
        self.max_seq_len, self.length = max_seq_len, 0
        self.register_buffer("kv", torch.zeros(batch, num_heads, head_dim, head_dim, dtype=dtype, device=device))
        self.register_buffer("z", torch.zeros(batch, num_heads, head_dim, dtype=dtype, device=device))

    def check(self, input_pos: torch.Tensor) -> None:
        """The new tokens must continue the sequence: positions ``length, length + 1, ...``."""
        expected = torch.arange(self.length, self.length + input_pos.numel(), device=input_pos.device)
        if input_pos.ndim != 1 or not torch.equal(input_pos.long(), expected):
            raise ValueError(
                f"a linear-attention state holds the sums of positions 0..{self.length - 1}: the next tokens must be "
                f"at {self.length}, {self.length + 1}, ..., got {input_pos.tolist()}"
            )
        if self.length + input_pos.numel() > self.max_seq_len:
            raise ValueError(
                f"LinearState overflow: {self.length + input_pos.numel()} > max_seq_len {self.max_seq_len}"
            )

    def reset(self) -> None:
        self.kv.zero_()
        self.z.zero_()
        self.length = 0


class LinearAttention(Attention):
    """Causal linear attention, RoPE after the feature map (``rope=None``: no positions); :class:`Attention`'s
    parameters, so its projections, QK-norm and GQA; no mask (a window or bias has no place in the sums)."""

    def rotated_features(self, q, k, pos, seq_len=None):
        """``q [B, S, H, D]``, ``k [B, S, H_kv, D]`` -> ``phi(q), phi(k), R phi(q), R phi(k)``, each ``[B, H, S, D]``."""
        fq, fk = feature_map(q), feature_map(k)
        rq, rk = (fq, fk) if self.rope is None else self.rope(fq, fk, pos, "bshd", seq_len=seq_len)
        group = self.num_heads // self.num_kv_heads
        fq, rq = fq.transpose(1, 2), rq.transpose(1, 2)
        fk, rk = (t.transpose(1, 2).repeat_interleave(group, dim=1) for t in (fk, rk))
        return fq, fk, rq, rk

    def forward(self, x, pos=None, *, mask=None, rope=None, cache=None, input_pos=None, seq_len=None, **unused):
        """``x [B, S, C]`` at integer positions ``pos [S]``; ``cache``: a :class:`LinearState` (then ``pos``
        defaults to ``input_pos``, which must continue the state's sequence)."""
        if mask is not None or rope is not None or unused.get("context_parallel") is not None:
            raise ValueError("LinearAttention takes no mask, per-call rope or context_parallel")
        B, S, _ = x.shape
        pos = input_pos if pos is None else pos
        if pos is None:
            pos = torch.arange(S, device=x.device)
        q, k, v = self._project(x)
        if self.qk_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        fq, fk, rq, rk = self.rotated_features(q, k, pos, seq_len)
        v = v.transpose(1, 2).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # [B, H, S, D]
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        num = (rq @ rk.transpose(-1, -2)).masked_fill(~causal, 0) @ v  # [B, H, S, D]
        den = (fq @ fk.transpose(-1, -2)).masked_fill(~causal, 0).sum(-1)  # [B, H, S]
        if cache is not None:  # earlier tokens enter through the running sums
            cache.check(pos)
            num = num + rq @ cache.kv[:B]
            den = den + (fq * cache.z[:B, :, None]).sum(-1)
            cache.kv[:B] += rk.transpose(-1, -2) @ v
            cache.z[:B] += fk.sum(2)
            cache.length += S
        out = num / den[..., None]
        return self.proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))
