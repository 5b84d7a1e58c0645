"""The Triton kernels on CUDA: bf16 and large shapes against the reference (skipped without a GPU).

Run by ``scripts/gpu_check.sh`` (``-m gpu``); the interpreter tests of ``tests/test_triton.py``
cover the same code on CPU with float32/float16 and tiny shapes.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from test_triton import LAYOUTS, PAIRINGS, _check_against_reference, _qk

import axial_rope as ar


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [((16, 56, 56), 128), ((36, 36), 72), ((40, 40), 80), ((32, 32, 32), 96)])
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_gpu_matches_reference(dtype, shape, pairing):
    axes_dim, head_dim = shape
    rope = ar.AxialRoPE(axes_dim, pairing=pairing)
    pos = ar.grid(*[4, 16, 16][-len(axes_dim) :]).cuda()
    q, k = (t.cuda() for t in _qk(head_dim, "bshd", dtype, n_tokens=pos.shape[0], heads=8, kv_heads=2))
    assert ar.ops.select_backend(None, ar.ops.backend.Call("rotate_qk", q.device, q.dtype)).name == "triton"
    _check_against_reference(lambda q, k, b: rope(q, k, pos, backend=b), (q, k), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_fused_norm_bf16(layout):
    rope = ar.AxialRoPE((8, 28, 28))
    pos = ar.grid(2, 16, 16).cuda()
    q, k = (t.cuda() for t in _qk(64, layout, torch.bfloat16, n_tokens=pos.shape[0]))
    w = (torch.randn(64) + 1).cuda().to(torch.bfloat16)
    fn = lambda q, k, wq, wk, b: rope.norm_and_rotate(q, k, pos, wq, wk, layout, backend=b)
    # the weights' gradients are float32 sums over 4096 tokens and heads: held to their bound, not TOL's
    _check_against_reference(fn, (q, k, w, w), torch.bfloat16, norm_weights=True)


@pytest.mark.gpu
def test_gpu_far_positions_bf16_keep_relative_invariance():
    rope = ar.AxialRoPE(128, pairing="half")
    q, k = (t.cuda() for t in _qk(128, "bshd", torch.bfloat16, n_tokens=2, batch=1, heads=1, kv_heads=1))
    logits = []
    for offset in (0.0, 1.0e6):
        rq, rk = rope(q, k, (torch.tensor([7.0, 0.0]) + offset).cuda())
        logits.append((rq[0, 0].double() * rk[0, 1].double()).sum())
    # bound: each bfloat16 output is within 2**-8 of its plane (one rounding; float32 arithmetic adds 1e-6),
    # so the logit within 2 * 2**-8 |q| |k| = 7.8e-3 |q| |k|; a position-dependent logit moves by O(|q| |k|)
    assert abs(float(logits[0] - logits[1])) < 2e-2 * float(q.double().norm() * k.double().norm())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_far_positions_match_the_reference_elementwise(dtype):
    # float32 angles at 1e6 would be off by up to 0.06 rad: float32 outputs are held to 2e-5 (5000x
    # tighter), from the bound: angles reduced in float64 then rounded (2e-7 rad), hardware cos/sin within
    # 3.7e-7 (helpers.TOL) and the float32 rotation: 1.1e-6 |z|, < 1e-5 for these unit normals (|z| < 8).
    # bfloat16 outputs: that float32 result rounded once, so within one ulp of the exact result rounded
    # once, plus the float32 error (neighbours of a value near a rounding point)
    rope = ar.AxialRoPE((16, 56, 56))
    pos = ar.grid(4, 8, 8, offset=(1.0e6, 2.0e6, 3.0e6)).double().cuda()
    x = torch.randn(2, pos.shape[0], 4, 128, generator=torch.Generator().manual_seed(2)).to(dtype).cuda()
    out = rope.rotate(x, pos, backend="triton")
    exact = rope.rotate(x.double(), pos, backend="reference")
    if dtype == torch.float32:
        torch.testing.assert_close(out, exact.float(), atol=2e-5, rtol=0)
    else:
        rounded = exact.to(dtype)
        _, exponent = torch.frexp(rounded.float())
        ulp = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent - 8)
        assert ((out.float() - rounded.float()).abs() <= ulp + 1e-5).all()


@pytest.mark.gpu
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_gpu_inplace_equals_out_of_place_bf16(pairing):
    # many programs and warps at once: a store racing a partner's load would show here
    rope = ar.AxialRoPE((16, 56, 56), pairing=pairing)
    pos = ar.grid(8, 32, 32).cuda()
    qkv = torch.randn(2, pos.shape[0], 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)  # strided views into one buffer
    expected = rope(q, k, pos)
    v_before = v.clone()
    with torch.no_grad():
        rope(q, k, pos, inplace=True)
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1]) and torch.equal(v, v_before)


@pytest.mark.gpu
def test_gpu_compiles_fullgraph_with_inductor():
    rope = ar.AxialRoPE((16, 24, 24))
    pos = ar.grid(4, 8, 8).cuda()
    q, k = (t.cuda() for t in _qk(64, "bshd", torch.bfloat16, n_tokens=256))
    compiled = torch.compile(lambda q, k: rope(q, k, pos), fullgraph=True)
    results = []
    for fn in (compiled, lambda q, k: rope(q, k, pos)):  # the same kernels, compiled or eager
        qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        out = fn(qq, kk)
        (out[0].float().square().sum() + out[1].float().sum()).backward()
        results.append((*out, qq.grad, kk.grad))
    for a, b in zip(*results):
        assert_close(a, b)
