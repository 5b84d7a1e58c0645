"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models"; Qwen2.5-1M).

A RoPE model trained at context ``c`` runs on longer text without training by never
showing attention a relative position it has not seen. The sequence is cut into chunks
of ``s = c - w`` tokens (``w``: the local window, Qwen's ``local_size``). Every key gets
its position inside its chunk, ``j mod s``; the query gets one of three indices,
chosen by where the key is (the paper's section 3):

- intra-chunk (key in the query's chunk): ``i mod s``, so the relative position is the
  true distance ``i - j < s``;
- successive-chunk (key in the previous chunk): ``min(s + (i mod s), c - 1)``, the true
  distance while it is at most ``w``-ish, capped so that no distance exceeds ``c - 1``;
- inter-chunk (any earlier chunk): ``c - 1``, the largest trained distance, for all.

The three score blocks are merged into one softmax. Here that is one explicit score
matrix (no fused kernel: see :func:`models.gpt_positions.fused_path`); vLLM runs three
flash-attention calls and merges them by their log-sum-exp. Keys are rotated once at
``j mod s``, when written, so the :class:`~axial_rope.cache.KVCache` works unchanged.
The paper caps at ``c - 1``; vLLM's Qwen2.5-1M code clamps the successive index at ``c``
(one position more); this module follows the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from axial_rope.attention import Attention

__all__ = ["DualChunk", "DualChunkAttention"]

INTRA, SUCCESSIVE, INTER = 0, 1, 2  # which of the three query indices a (query, key) pair uses


@dataclass(frozen=True)
class DualChunk:
    """Dual Chunk Attention's sizes, Qwen's names: ``chunk_size`` = c (the trained context), ``local_size`` = w."""

    chunk_size: int = 256
    local_size: int = 64

    def __post_init__(self):
        for name in ("chunk_size", "local_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DualChunk: {name} must be an int >= 1, got {value!r}")
        if self.local_size >= self.chunk_size:
            raise ValueError(f"DualChunk: local_size ({self.local_size}) must be < chunk_size ({self.chunk_size})")

    @property
    def chunk_len(self) -> int:
        """``s = c - w``: tokens per chunk."""
        return self.chunk_size - self.local_size

    def key_index(self, k_pos: torch.Tensor) -> torch.Tensor:
        """The position a key is rotated at: ``j mod s``."""
        return k_pos % self.chunk_len

    def query_indices(self, q_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(intra, successive, inter)`` positions of the queries ``q_pos [S]``, each ``[S]``."""
        s, c = self.chunk_len, self.chunk_size
        inner = q_pos % s
        return inner, (inner + s).clamp(max=c - 1), torch.full_like(q_pos, c - 1)

    def regions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """``[S, S_k]`` int: :data:`INTRA`, :data:`SUCCESSIVE` or :data:`INTER` for each (query, key) pair."""
        gap = q_pos[:, None] // self.chunk_len - k_pos[None, :] // self.chunk_len  # chunks between them
        region = torch.full(gap.shape, INTER, dtype=torch.long, device=q_pos.device)
        region[gap == 1] = SUCCESSIVE
        region[gap <= 0] = INTRA  # same chunk (keys ahead of the query are masked by causality)
        return region


class DualChunkAttention(Attention):
    """Causal softmax attention with DCA's position indices; the same parameters as :class:`Attention`.

    So a trained RoPE model's weights load into a DCA model unchanged (training-free).
    """

    def __init__(self, *args, dual_chunk: DualChunk, **kwargs):
        super().__init__(*args, **kwargs)
        if self.rope is None:
            raise ValueError("Dual Chunk Attention remaps RoPE positions: it needs a rope")
        self.dual_chunk = dual_chunk

    def scores(self, q, k, q_pos, k_pos, seq_len=None) -> torch.Tensor:
        """Logits ``[B, H, S, S_k]`` of unrotated ``q [B, S, H, D]`` against rotated keys ``k [B, H_kv, S_k, D]``."""
        dc, rope = self.dual_chunk, self.rope
        k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # GQA: kv head h // group
        k_t = k.transpose(-1, -2)
        region = dc.regions(q_pos, k_pos)  # [S, S_k]
        logits = None
        for which, index in enumerate(dc.query_indices(q_pos)):  # INTRA, SUCCESSIVE, INTER in turn
            block = rope.rotate(q, index, "bshd", seq_len=seq_len).transpose(1, 2) @ k_t  # [B, H, S, S_k]
            logits = block if logits is None else torch.where(region == which, block, logits)
        return logits / math.sqrt(self.head_dim)

    def forward(self, x, pos=None, *, mask=None, rope=None, cache=None, input_pos=None, seq_len=None, **unused):
        """As :meth:`Attention.forward` (1-D integer positions ``[S]``), with DCA's indices; no context parallel."""
        if unused.get("context_parallel") is not None or rope is not None:
            raise ValueError("DualChunkAttention takes neither context_parallel nor a per-call rope")
        if cache is not None and input_pos is None:
            raise ValueError("a KV cache needs input_pos, the int [S] slots of the new tokens")
        B, S, _ = x.shape
        q_pos = input_pos if pos is None else pos  # [S] absolute positions
        q, k, v = self._project(x)  # [B, S, H, D]
        if self.qk_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        k = self.rope.rotate(k, self.dual_chunk.key_index(q_pos), "bshd", seq_len=seq_len)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, H_kv, S, D]
        allowed = None
        if cache is not None:
            k, v = cache.update(input_pos, k, v)  # [B, H_kv, S_max, D]; keys rotated at j mod s when written
            k, v = k.to(q.dtype), v.to(q.dtype)
            k_pos = torch.arange(cache.max_seq_len, device=x.device)
            allowed = cache.filled[None, :].expand(S, -1)  # never-written slots stay hidden
        else:
            k_pos = q_pos
        causal = k_pos[None, :] <= q_pos[:, None]  # [S, S_k]
        allowed = causal if allowed is None else allowed & causal
        logits = self.scores(q, k, q_pos, k_pos, seq_len)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # softmax in at least float32, never less
        if mask is not None:  # an extra SDPA-style mask: bool (True = attend) or additive
            logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
        logits = logits.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(logits, dim=-1).to(v.dtype)
        out = weights @ v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # [B, H, S, D]
        return self.proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))
