"""The measured cells of the survey table: relative-distance invariance, parameters, the fused kernel.

- :func:`invariance`: the first layer's query-key logit of held-out token pairs at positions
  ``(m, n)`` and at ``(m + shift, n + shift)``, ``shift = 1e6``; the largest change over pairs and
  heads (0 for a score that depends on ``m - n`` only, up to float32 rounding of the angles);
- :func:`position_parameters`: the parameters that exist for positions alone;
- :func:`sdpa_timings` and :func:`forward_time`: the cost of the explicit mask that biases,
  windows and DCA need, against SDPA's fused causal path (wall clock, one CPU thread).
"""

from __future__ import annotations

import math
import time

import torch

from ...gpt import GPT
from .positions import LinearAttention, PositionTableError, feature_map

__all__ = ["forward_time", "invariance", "pair_logits", "position_parameters", "sdpa_timings"]

SHIFT = 10**6


def _embed(model: GPT, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``tokens [P]`` at ``pos [P]`` -> the first attention's input ``[1, P, C]`` (absolute positions added)."""
    x = model.tok_embeddings(tokens)[None]
    if model.absolute is not None:
        x = model.absolute(x, pos)
    return model.layers[0].attention_norm(x)


@torch.no_grad()
def pair_logits(model: GPT, tok_q: torch.Tensor, tok_k: torch.Tensor, m: torch.Tensor, n: torch.Tensor):
    """``[P, H]``: layer 0's logit of query token ``tok_q[p]`` at ``m[p]`` against key ``tok_k[p]`` at ``n[p]``.

    The logit as the model's attention scores it: ``q . k / sqrt(D)`` plus the scheme's bias; for
    linear attention the numerator's weight ``(R_m phi(q)) . (R_n phi(k))``; for Dual Chunk
    Attention with its remapped indices.
    """
    attention = model.layers[0].attention
    q, _, _ = attention._project(_embed(model, tok_q, m))  # [1, P, H, D]
    _, k, _ = attention._project(_embed(model, tok_k, n))
    k = k.repeat_interleave(attention.num_heads // attention.num_kv_heads, dim=2)
    c = model.positions
    if isinstance(attention, LinearAttention):
        q, k = feature_map(q), feature_map(k)
        if model.rope is not None:
            q, k = model.rope.rotate(q, m), model.rope.rotate(k, n)
        return (q * k).sum(-1)[0]
    if c.dual_chunk is not None:
        k = model.rope.rotate(k, c.dual_chunk.key_index(n)).transpose(1, 2)  # [1, H, P, D]
        scores = attention.scores(q, k, m, n)  # [1, H, P, P]: every query against every key
        return scores[0].diagonal(dim1=-2, dim2=-1).T  # pair p: query p against key p
    if model.rope is not None:
        q, k = model.rope.rotate(q, m), model.rope.rotate(k, n)
    logits = (q * k).sum(-1)[0] / math.sqrt(attention.head_dim)  # [P, H]
    if model.bias is not None:
        logits = logits + model.bias(m, n)[0].diagonal(dim1=-2, dim2=-1).T
    return logits


def invariance(model: GPT, text: torch.Tensor, context: int, pairs: int = 256, seed: int = 0) -> dict:
    """``{"change", "scale"}``: max ``|logit(m + 1e6, n + 1e6) - logit(m, n)|`` over held-out token pairs with
    ``n < m < context`` (where every scheme has trained), and the mean ``|logit|`` for scale;
    ``{"change": None}`` where positions that far do not exist (a learned table)."""
    gen = torch.Generator().manual_seed(seed)
    n = torch.randint(0, context // 2, (pairs,), generator=gen)
    m = n + torch.randint(0, context // 2, (pairs,), generator=gen)
    start = torch.randint(0, len(text) - context, (1,), generator=gen)
    tok_q, tok_k = text[start + m].long(), text[start + n].long()
    near = pair_logits(model, tok_q, tok_k, m, n)
    try:
        far = pair_logits(model, tok_q, tok_k, m + SHIFT, n + SHIFT)
    except PositionTableError:
        return {"change": None, "scale": float(near.abs().mean())}
    return {"change": float((far - near).abs().max()), "scale": float(near.abs().mean())}


def position_parameters(model: GPT) -> int:
    """Parameters that only encode positions: a learned table, T5's bucket biases; RoPE, ALiBi, sinusoids: 0."""
    return sum(p.numel() for module in (model.absolute, model.bias) if module is not None for p in module.parameters())


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def sdpa_timings(length: int, heads: int = 4, head_dim: int = 32, repeats: int = 5) -> dict[str, float]:
    """Seconds per SDPA call ``[1, H, S, D]``: fused causal (no mask), an additive float mask, a boolean mask."""
    F = torch.nn.functional
    q, k, v = torch.randn(3, 1, heads, length, head_dim).unbind(0)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    bias = torch.zeros(1, heads, length, length).masked_fill(~causal, float("-inf"))
    return {
        "causal, no mask": _median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats),
        "additive float mask": _median_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), repeats),
        "boolean mask": _median_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=causal), repeats),
    }


@torch.no_grad()
def forward_time(model: GPT, length: int, repeats: int = 3) -> float:
    """Seconds for one forward of one window of ``length`` bytes (the model as the study evaluates it)."""
    idx = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(0))
    return _median_time(lambda: model(idx), repeats)
