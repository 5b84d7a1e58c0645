"""Decoding helpers of the reference language model: next-token sampling and the sampling loop.

:class:`~models.gpt.GPT` decodes through :func:`decode` with a ``feed`` that runs the model on new
tokens (cached, rolling or recomputed); :func:`prefill_chunks` splits a prompt for rolling caches.
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_sampling", "decode", "prefill_chunks", "sample"]


def check_sampling(temperature: float, top_k: int | None) -> None:
    """``temperature``: a finite number >= 0 (0: greedy); ``top_k``: ``None`` or an int >= 1.

    A negative temperature would sample the least likely tokens, ``top_k=0`` keep no token at all.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None (every token) or an int >= 1, got {top_k!r}")


def sample(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Next tokens ``[B, 1]`` from logits ``[B, V]``: greedy at ``temperature == 0``, else top-k sampling."""
    check_sampling(temperature, top_k)
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=generator)


def prefill_chunks(length: int, window: int, sinks: int) -> list[tuple[int, int]]:
    """``(start, n)`` of a prompt fed to rolling caches: the first chunk up to the window, the rest ``window - sinks``
    (as many as a full window can take)."""
    first = min(length, window)
    return [(0, first)] + [(i, min(window - sinks, length - i)) for i in range(first, length, window - sinks)]


def decode(idx, logits, max_new_tokens, feed, sampling, return_logits):
    """Sample a token from ``logits``, feed it (``feed(token [B, 1]) -> logits [B, V]``), ``max_new_tokens`` times."""
    tokens, steps = idx, []
    for i in range(max_new_tokens):
        steps.append(logits)
        nxt = sample(logits, *sampling)  # [B, 1]
        tokens = torch.cat([tokens, nxt], dim=1)
        if i + 1 < max_new_tokens:
            logits = feed(nxt)
    return (tokens, torch.stack(steps, dim=1)) if return_logits else tokens
