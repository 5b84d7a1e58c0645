"""Moving q/k projection weights between pairings leaves attention unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import axial_rope as ar
from axial_rope.convert import pairing_permutation, permute_pairing


def _attention(x, wq, wk, wv, rope, num_heads, n_kv):
    B, S, _ = x.shape
    q = (x @ wq.T).unflatten(-1, (num_heads, -1))
    k = (x @ wk.T).unflatten(-1, (n_kv, -1))
    v = (x @ wv.T).unflatten(-1, (n_kv, -1))
    q, k = rope(q, k, torch.arange(S, dtype=torch.float32))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)


@pytest.mark.parametrize("rot_dim", [16, 10])
def test_converting_weights_and_pairing_keeps_attention_output(rot_dim):
    torch.manual_seed(0)
    num_heads, n_kv, head_dim, width = 4, 2, 16, 32
    x = torch.randn(2, 7, width, dtype=torch.float64)
    wq = torch.randn(num_heads * head_dim, width, dtype=torch.float64)
    wk = torch.randn(n_kv * head_dim, width, dtype=torch.float64)
    wv = torch.randn(n_kv * head_dim, width, dtype=torch.float64)
    meta = ar.AxialRoPE(rot_dim, pairing="interleaved")
    hf = ar.AxialRoPE(rot_dim, pairing="half")
    out = _attention(x, wq, wk, wv, meta, num_heads, n_kv)
    wq_hf = permute_pairing(wq, num_heads, rot_dim=rot_dim)
    wk_hf = permute_pairing(wk, n_kv, rot_dim=rot_dim)
    torch.testing.assert_close(_attention(x, wq_hf, wk_hf, wv, hf, num_heads, n_kv), out)
    # without converting the pairing too, the output changes
    assert not torch.allclose(_attention(x, wq_hf, wk_hf, wv, meta, num_heads, n_kv), out)
    # and the inverse permutation restores the original weights
    back = permute_pairing(wq_hf, num_heads, rot_dim=rot_dim, src="half", dst="interleaved")
    assert torch.equal(back, wq)


def test_permutation_matches_hf_llama_conversion_rule():
    # HF's Meta->HF rule: view(heads, D/2, 2, in).transpose(1, 2): rows (0, 2, 4, ..., 1, 3, 5, ...)
    assert pairing_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert pairing_permutation(8, src="half", dst="interleaved").tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert pairing_permutation(8, 4).tolist() == [0, 2, 1, 3, 4, 5, 6, 7]


def test_permute_pairing_bias_and_errors():
    bias = torch.arange(8.0)
    assert permute_pairing(bias, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    with pytest.raises(ValueError, match="num_heads"):
        permute_pairing(torch.zeros(10, 3), 3)
    with pytest.raises(ValueError, match="rot_dim"):
        pairing_permutation(8, 5)
    with pytest.raises(ValueError, match="src"):
        pairing_permutation(8, src="rotate_half")
