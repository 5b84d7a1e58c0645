"""Test helpers: the per-dtype tolerance table and a comparison that uses it."""

from __future__ import annotations

import torch

# One tolerance per dtype (atol, rtol), used by every backend-vs-reference comparison.
TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    atol, rtol = TOL[dtype or expected.dtype]
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=atol, rtol=rtol)


def llama_config(
    head_dim: int, rope_parameters: dict, max_position_embeddings: int = 4096, num_key_value_heads: int = 2
):
    """A tiny transformers ``LlamaConfig`` whose RoPE transformers reads exactly as a real checkpoint's."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=8,
        num_hidden_layers=1,
        vocab_size=8,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )
