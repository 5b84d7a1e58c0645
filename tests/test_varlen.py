"""Attention within items of a packed sequence (axial_rope.varlen): every path equals per-item SDPA, fwd and bwd.

The claim is equality, so it is checked in float64 (``TOL``): the paths differ only in which keys
each sum runs over (masked keys add exact zeros) and in summation order, each output a sum of at
most ``S + D < 32`` terms, so they differ by about ``2 * 32 * u`` of the terms' scale (|v| < 5),
with float64's ``u = 1.1e-16``, plus what ``exp`` makes of the scores' error (``D u |q| |k|``, with
``|q| |k| < 25``, relative to the weights): about 1.5e-13 in all, and ``TOL = 1e-12``. (The float32
1e-6 this module once used sat below the same bound in float32, 2e-5.) A token attending across
items is off by O(1).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import axial_rope as ar
from axial_rope import varlen
from axial_rope.varlen import Segments, choose_backend, last_choice, varlen_attention

LENGTHS = [5, 1, 7, 3]  # a one-token item included
TOL = 1e-12  # float64 error bound (module docstring)


def _qkv(heads=4, kv_heads=2, dim=8, dtype=torch.float64):
    T = sum(LENGTHS)
    return [torch.randn(T, h, dim, dtype=dtype, requires_grad=True) for h in (heads, kv_heads, kv_heads)]


def _per_item(q, k, v, causal=False):
    """The definition: SDPA on each item alone, [T, H, D] -> [T, H, D]."""
    outs, start = [], 0
    for n in LENGTHS:
        part = [t[start : start + n].transpose(0, 1)[None] for t in (q, k, v)]
        gqa = k.shape[1] != q.shape[1]
        outs.append(F.scaled_dot_product_attention(*part, is_causal=causal, enable_gqa=gqa)[0].transpose(0, 1))
        start += n
    return torch.cat(outs)


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device, out.dtype)
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("backend", ["loop", "dense", None])
@pytest.mark.parametrize("causal", [False, True])
def test_paths_equal_per_item_attention_forward_and_backward(backend, causal):
    q, k, v = _qkv()
    out = varlen_attention(q, k, v, Segments(LENGTHS), causal=causal, backend=backend)
    ref = _per_item(q, k, v, causal)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)
    for a, b in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


def test_loop_equals_the_dense_block_diagonal_mask():
    q, k, v = _qkv(kv_heads=4)
    seg = Segments(LENGTHS)
    mask = torch.block_diag(*[torch.ones(n, n, dtype=torch.bool) for n in LENGTHS])
    assert torch.equal(seg.dense_mask(), mask)
    dense = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), attn_mask=mask)
    torch.testing.assert_close(varlen_attention(q, k, v, seg), dense[0].transpose(0, 1), atol=TOL, rtol=TOL)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # eager on purpose
def test_flex_forward_on_cpu_equals_per_item(monkeypatch):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setitem(varlen._COMPILED, "flex", flex_attention)  # eager: the mask under test, no compile time
    q, k, v = _qkv()
    with torch.no_grad():
        for causal in (False, True):
            out = varlen_attention(q, k, v, Segments(LENGTHS), causal=causal, backend="flex")
            torch.testing.assert_close(out, _per_item(q, k, v, causal), atol=TOL, rtol=TOL)
    with pytest.raises(RuntimeError, match="no CPU backward"):
        varlen_attention(q, k, v, Segments(LENGTHS), backend="flex")


def test_choice_is_logged_with_its_reason_and_inspectable(caplog):
    q, k, v = _qkv()
    with caplog.at_level(logging.DEBUG, logger="axial_rope.varlen"):
        varlen_attention(q, k, v, Segments(LENGTHS))
    assert last_choice().name == "loop" and "FlexAttention has no CPU backward" in last_choice().reason
    assert "loop" in caplog.text
    for name in ("varlen", "flash_attn"):
        with pytest.raises(RuntimeError, match="CUDA"):
            choose_backend(q, backend=name)
    with pytest.raises(ValueError, match="one of"):
        choose_backend(q, backend="nope")


def test_cuda_choice_prefers_varlen_kernels_for_half_and_explains(monkeypatch):
    # the rule itself, on a description of a CUDA tensor (choose_backend reads device, dtype, requires_grad)
    q = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, requires_grad=True)
    monkeypatch.setattr(varlen, "_torch_varlen", lambda: object())
    assert choose_backend(q, requires_grad=True).name == "varlen"
    monkeypatch.setattr(varlen, "_torch_varlen", lambda: None)
    monkeypatch.setattr(varlen, "_flash_attn", lambda: None)
    choice = choose_backend(q, requires_grad=True)
    assert choice.name == "flex" and "flash_attn is not importable" in choice.reason


def test_segments_from_boundaries_and_ids_agree():
    seg = Segments(LENGTHS)
    assert seg.bounds == (0, 5, 6, 13, 16) and seg.cu_seqlens.dtype == torch.int32
    assert Segments.from_cu_seqlens(seg.cu_seqlens, 16).lengths == seg.lengths
    assert Segments.from_segment_ids(seg.segment_ids).lengths == seg.lengths


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Segments([3, 0, 2]), "item 1 is empty"),
        (lambda: Segments.from_cu_seqlens(torch.tensor([0, 3, 3, 5])), "item 1 is empty"),
        (lambda: Segments.from_cu_seqlens(torch.tensor([0, 3, 9]), total=6), "item 1 ends at 9, past the end"),
        (lambda: Segments.from_cu_seqlens(torch.tensor([0.0, 3.0])), "integer tensor"),
        (lambda: Segments.from_cu_seqlens(torch.tensor([0, 3]), total=5), "cover 3 tokens"),
        (lambda: Segments.from_segment_ids(torch.tensor([0, 0, 2, 2])), "item 1 is empty"),
        (lambda: Segments.from_segment_ids(torch.tensor([0, 1, 0])), "item 0 is not contiguous"),
    ],
)
def test_bad_boundaries_name_the_item(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_tensors_that_disagree_with_the_boundaries_name_the_item():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"item 3 \(tokens 13..15\) lies past its end"):
        varlen_attention(q[:14], k[:14], v[:14], Segments(LENGTHS))
    with pytest.raises(ValueError, match="2 past the last item"):
        varlen_attention(q, k, v, Segments([5, 1, 7, 1]))
    with pytest.raises(ValueError, match="on cpu, the segments .* on meta"):
        varlen_attention(q, k, v, Segments(LENGTHS, device="meta"))
    with pytest.raises(TypeError, match="share a dtype"):
        varlen_attention(q, k.float(), v.float(), Segments(LENGTHS))


def test_attention_with_segments_equals_each_item_alone():
    attn = ar.Attention(32, 4, ar.AxialRoPE((4, 4)), num_kv_heads=2, qk_norm="rms").eval().double()
    shapes = [(2, 3), (1, 1), (3, 4)]
    xs = [torch.randn(1, h * w, 32, dtype=torch.float64) for h, w in shapes]
    pos = [ar.grid(h, w) for h, w in shapes]
    seg = Segments([h * w for h, w in shapes])
    x = torch.cat(xs, 1).requires_grad_()
    out = attn(x, torch.cat(pos), segments=seg)
    ref = torch.cat([attn(xi, p) for xi, p in zip(xs, pos)], 1)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match="do not take a mask"):
        attn(x, torch.cat(pos), segments=seg, mask=torch.ones(19, 19, dtype=torch.bool))
    with pytest.raises(ValueError, match="pos"):
        attn(x, torch.cat(pos)[:-1], segments=seg)
