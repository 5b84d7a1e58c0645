"""Test helpers: the per-dtype tolerance table and a comparison that uses it, tiny transformers configs, and the
model set-up several test modules share."""

from __future__ import annotations

import pytest
import torch

U32, U64 = 2.0**-24, 2.0**-53  # unit roundoff of float32 and float64

# One tolerance per dtype (atol, rtol), used by every backend-vs-reference comparison, each from an error bound.
# A backend rotates a plane z = (a, b) by tables rounded once from float64 angles (u each) with two products
# and a sum per channel (a c - b s): |error| <= 4 u m (|a| + |b|) <= 6 u m |z| in the compute dtype, m <= 1.2
# the attention factor; RMSNorm first (norm_rotate_qk) adds (D / 2 + 8) u of |x_hat| (D <= 16 where it is
# checked). float64: 6 u |z| = 7e-16 |z|, so 1e-12 holds for |z| up to 1000 (the two sides form the same
# float64 angle products for axial F). float32: 6 * 1.2 * 2**-24 |z| = 4.3e-7 |z|, so an absolute 1e-5 holds
# for planes |z| < 20 (unit normals stay below 8) and the relative 1e-5 for the rest. float16 and bfloat16:
# the float32 result and the exact one are each rounded once, and may round to neighbours: 1 ulp apart,
# 2**-10 and 2**-7 relative, within 2e-3 and 1.6e-2 (2 ulps). On CUDA the Triton kernels' hardware cos/sin
# are within 2**-21.4 = 3.7e-7 (CUDA's __cosf/__sinf on [-pi, pi]): 9e-7 |z| in float32, within 1e-5 for
# |z| < 11. A wrong angle, pairing or sign is off by O(|z|).
TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def chain_bound(u: float, terms: int, stages: int, lam: float = 8.0) -> float:
    """Relative bound (to the outputs' scale) on two evaluations of one model that sum in other orders.

    Each stage (a projection, an attention or norm sum, ...) sums at most ``terms`` terms. A sum's
    rounding error is within ``lam sqrt(n) u sum |t_i|`` with probability at least
    ``1 - 2 n exp(-lam**2 / 2)`` (Higham & Mary 2019, probabilistic rounding error analysis; ``lam = 8``:
    above 1 - 3e-10 for n <= 1e4), and ``sum |t_i|`` of random-sign terms is about ``sqrt(n)`` times
    ``|sum t_i|`` (the scale); the stages' errors add: ``stages * lam * n * u``. The deterministic worst
    case (``n u`` of ``sum |t_i|`` per sum, every rounding aligned) is some sqrt(n) times looser.
    """
    return stages * lam * terms * u


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    atol, rtol = TOL[dtype or expected.dtype]
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=atol, rtol=rtol)


# transformers ``rope_parameters`` of the Llama family that the parity and the convention tests both check
LLAMA_ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
}


def text_config(config_cls, head_dim: int, rope_parameters: dict, num_key_value_heads: int = 2, **fields):
    """A tiny transformers text config (2 heads of ``head_dim``, one layer) whose RoPE reads as a real checkpoint's."""
    return config_cls(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=8,
        num_hidden_layers=1,
        vocab_size=8,
        rope_parameters=dict(rope_parameters),
        **fields,
    )


def llama_config(
    head_dim: int, rope_parameters: dict, max_position_embeddings: int = 4096, num_key_value_heads: int = 2
):
    """A tiny transformers ``LlamaConfig`` whose RoPE transformers reads exactly as a real checkpoint's."""
    from transformers import LlamaConfig

    return text_config(
        LlamaConfig, head_dim, rope_parameters, num_key_value_heads, max_position_embeddings=max_position_embeddings
    )


def qwen_vl_config(config_cls, rope_parameters: dict, head_dim: int):
    """A tiny Qwen-VL text config (``Qwen2VLTextConfig``, ...): one kv head, no special tokens."""
    return text_config(
        config_cls, head_dim, rope_parameters, 1, bos_token_id=None, eos_token_id=None, pad_token_id=None
    )


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every weight moved (seeded), in eval mode.

    adaLN-Zero starts with zero modulation and a zero final layer (the velocity is 0): moved, the
    outputs depend on input, time, label and position.
    """
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


def one_torch_thread():
    """A module-scoped autouse fixture that runs the module's tests on one torch thread.

    Tiny models gain nothing from threads, and OpenMP threads spin against other jobs on shared
    cores. Use it as ``_one_thread = one_torch_thread()`` at module level.
    """

    @pytest.fixture(scope="module", autouse=True)
    def _one_thread():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)

    return _one_thread
