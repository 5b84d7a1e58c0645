"""The Triton backend against the reference (under the interpreter on CPU, natively on CUDA) and the torch eager path.

``TRITON_INTERPRET=1`` must be set before triton is imported, and another test module
may import it first in the same process. So, run normally, this module spawns one
``pytest`` subprocess on itself with the variable set; in that subprocess
(``INTERPRETER`` true) it defines the interpreter tests instead. Interpreter tests use
float32/float16 (the interpreter computes bf16 wrongly) and tiny shapes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import U32, assert_close

import axial_rope as ar

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
PAIRINGS, LAYOUTS = ["interleaved", "half"], ["bshd", "bhsd"]
# (axes_dim, head_dim): head dim 6 (3 axes of one plane), DiT-XL's 72, partial rotary (12 of 20 channels)
SHAPES = {"d6": ((2, 2, 2), 6), "d72": ((36, 36), 72), "partial": ((4, 8), 20)}


def _qk(head_dim, layout, dtype, *, n_tokens, batch=2, heads=4, kv_heads=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = lambda h: (batch, n_tokens, h, head_dim) if layout == "bshd" else (batch, h, n_tokens, head_dim)
    return torch.randn(shape(heads), generator=gen).to(dtype), torch.randn(shape(kv_heads), generator=gen).to(dtype)


def _run(fn, inputs, grads):
    """Outputs of ``fn(*inputs)`` and the gradients of ``sum(out * grad)`` w.r.t. the inputs."""
    inputs = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    outs = fn(*inputs)
    loss = sum((o.float() * g.float()).sum() for o, g in zip(outs, grads))
    leaves = [t for t in inputs if t is not None]
    return outs, torch.autograd.grad(loss, leaves)


def _norm_grad_bounds(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 error bounds of the gradients of x and of the weight w through RMSNorm-then-rotate (float64).

    Rotating the output's gradient g back mixes a plane's two channels: ``|g_y| <= 2 max |g|`` of the
    token. x's gradient ``(w g_y - x_hat mean(w g_y x_hat)) / rms``: the mean is a float32 sum of D terms,
    within ``(D + 8) u`` of ``sum |w g_y x_hat| / D`` (with the roundings of its factors), times ``|x_hat|``;
    the rest is within ``8 u |w g_y|``. The weight's: a float32 sum over the tokens and heads of
    ``g_y x_hat``, within ``(count + D / 2 + 12) u`` of ``sum |g_y x_hat|`` (u = 2**-24).
    """
    x, w, g = x.double(), w.double().abs(), g.double()
    D = x.shape[-1]
    rms = (x.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    x_hat = (x / rms).abs()
    g_y = 2 * g.abs().amax(-1, keepdim=True)
    mean = (D + 8) * U32 * (g_y * w * x_hat).sum(-1, keepdim=True) / D
    x_bound = (mean * x_hat + 8 * U32 * g_y * w) / rms
    count = x.numel() // D
    w_bound = (count + D / 2 + 12) * U32 * (g_y * x_hat).flatten(0, -2).sum(0)
    return x_bound, w_bound


def _check_against_reference(fn, inputs, dtype, norm_weights: bool = False):
    """fn(*inputs, backend) with backend "triton" equals "reference", forward and backward.

    Within ``helpers.TOL``, except, with ``norm_weights`` (inputs q, k, their RMSNorm weights), the
    gradients through the norm: within :func:`_norm_grad_bounds` and each side's rounding to the
    result's dtype (half an ulp each).
    """
    with torch.no_grad():
        ref_outs = fn(*inputs, "reference")
    grads = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device, o.dtype) for o in ref_outs]
    ref_outs, ref_grads = _run(lambda *a: fn(*a, "reference"), inputs, grads)
    outs, out_grads = _run(lambda *a: fn(*a, "triton"), inputs, grads)
    bounds = {}
    if norm_weights:
        (q, k, wq, wk), (gq, gk) = inputs, grads
        (bq, bwq), (bk, bwk) = _norm_grad_bounds(q, wq, gq), _norm_grad_bounds(k, wk, gk)
        bounds = {len(outs) + i: b for i, b in enumerate((bq, bk, bwq, bwk))}
    for i, (actual, expected) in enumerate(zip((*outs, *out_grads), (*ref_outs, *ref_grads))):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        if i in bounds:
            err = (actual.double() - expected.double()).abs()
            assert bool((err <= bounds[i] + torch.finfo(dtype).eps * expected.double().abs()).all()), i
        else:
            assert_close(actual, expected, dtype)


if INTERPRETER:  # ------------------------------------------------ inside the interpreter subprocess
    from axial_rope.ops import _triton as triton_backend
    from axial_rope.ops.backend import Call

    def test_kernels_were_loaded_for_the_interpreter():
        assert triton_backend.INTERPRETED
        assert triton_backend.BACKEND.supports(Call("rotate_qk", torch.device("cpu"), torch.float32)) is None

    @pytest.mark.parametrize("shape", SHAPES)
    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_rotate_qk_matches_reference_gqa(shape, pairing, layout):
        axes_dim, head_dim = SHAPES[shape]
        rope = ar.AxialRoPE(axes_dim, pairing=pairing)
        pos = ar.grid(*[2, 3, 2][: len(axes_dim)])
        q, k = _qk(head_dim, layout, torch.float32, n_tokens=pos.shape[0])
        _check_against_reference(lambda q, k, b: rope(q, k, pos, layout, backend=b), (q, k), torch.float32)

    @pytest.mark.parametrize("pairing", PAIRINGS)
    def test_float16_and_per_sample_positions(pairing):
        rope = ar.AxialRoPE((4, 8), pairing=pairing)
        pos = torch.stack([ar.grid(2, 3), ar.grid(2, 3) * 7 + 100])  # [B=2, S, 2]: one grid per sample
        q, k = _qk(12, "bshd", torch.float16, n_tokens=6)
        _check_against_reference(lambda q, k, b: rope(q, k, pos, backend=b), (q, k), torch.float16)

    def test_float64_inputs_compute_in_float64():
        rope = ar.AxialRoPE((4, 4), pairing="half")
        q, k = _qk(10, "bhsd", torch.float64, n_tokens=6)
        _check_against_reference(lambda q, k, b: rope(q, k, ar.grid(2, 3), "bhsd", backend=b), (q, k), torch.float64)

    def test_q_alone_and_attention_factor():
        rope = ar.AxialRoPE(8, scaling=ar.scaling.YaRN(4.0, 16))  # attention factor != 1 on every plane
        assert rope.scaled
        q, _ = _qk(8, "bshd", torch.float32, n_tokens=5)
        pos = torch.arange(5.0) * 9
        _check_against_reference(lambda q, b: (rope.rotate(q, pos, backend=b),), (q,), torch.float32)

    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_noncontiguous_views_and_zero_stride_grads(layout):
        # q and k are strided views into a fused qkv projection; the grads are expanded (stride 0)
        rope = ar.AxialRoPE((4, 4))
        qkv = torch.randn(2, 6, 3, 4, 10)  # [B, S, 3, H, D]
        q, k = qkv[:, :, 0], qkv[:, :, 1]
        if layout == "bhsd":
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        assert not q.is_contiguous()
        pos = ar.grid(2, 3)
        out_q, out_k = rope(q, k, pos, layout, backend="triton")
        ref_q, ref_k = rope(q, k, pos, layout, backend="reference")
        assert_close(out_q, ref_q), assert_close(out_k, ref_k)
        grad = torch.randn(10).expand(q.shape)
        for backend in ("triton", "reference"):
            qq = q.detach().requires_grad_(True)
            rope(qq, None, pos, layout, backend=backend)[0].backward(grad)
            if backend == "triton":
                got = qq.grad
        assert_close(got, qq.grad)

    @pytest.mark.parametrize("pairing", PAIRINGS)
    def test_unaligned_rows_fall_back_to_scalar_vectors(pairing):
        # rows one element past a vector boundary (odd offset and stride): the launcher picks VEC = 1
        from axial_rope.ops import _triton_launch as plans

        rope = ar.AxialRoPE((4, 8), pairing=pairing)
        buf = torch.randn(2, 6, 4, 21, generator=torch.Generator().manual_seed(0))
        q = buf[..., 1:]  # head dim 20, stride 21
        pos = ar.grid(2, 3)
        freqs, scale = rope.frequencies()
        assert (
            plans.plan_rope(q, None, q, None, pos[None], freqs, scale, pairing == "interleaved", "bshd", False).meta[
                "VEC"
            ]
            == 1
        )
        expected = rope.rotate(q, pos, backend="reference")
        assert_close(rope.rotate(q, pos, backend="triton"), expected)
        with torch.no_grad():
            assert rope.rotate(q, pos, backend="triton", inplace=True) is q
        assert_close(q, expected)
        assert torch.equal(buf[..., 0], torch.randn(2, 6, 4, 21, generator=torch.Generator().manual_seed(0))[..., 0])

    @pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy evaluates the discarded branch
    def test_pass_through_channels_are_copied_exactly():
        # channels past rot_dim are copied, not computed as x * 1 + partner * 0 (an inf would turn into nan)
        rope = ar.AxialRoPE((2, 4))
        q, _ = _qk(10, "bshd", torch.float16, n_tokens=6)
        q[..., 7] = float("inf")
        out = rope.rotate(q, ar.grid(2, 3), backend="triton")
        assert torch.equal(out[..., 6:], q[..., 6:])
        assert_close(out, rope.rotate(q, ar.grid(2, 3), backend="reference"))

    def test_far_positions_keep_relative_invariance_float32():
        # logits of q at m and k at n depend on n - m only, also at m ~ 1e6 (angles are never rounded to float32)
        rope = ar.AxialRoPE((8, 8))
        q, k = _qk(16, "bshd", torch.float32, n_tokens=2, batch=1, heads=1, kv_heads=1)
        near = torch.tensor([[3.0, 5.0], [0.0, 1.0]])
        far = near + torch.tensor([1.0e6, 2.0e6])
        logits = []
        for pos in (near, far):
            rq, rk = rope(q, k, pos, backend="triton")
            logits.append((rq[0, 0] * rk[0, 1]).sum().double())
        # bound: each float32 rotation is within 6 u |z| (helpers.TOL), so a logit within 12 u |q| |k| = 7e-7 |q| |k|
        assert abs(float(logits[0] - logits[1])) < 1e-4 * float(q.norm() * k.norm())

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_fused_norm_matches_norm_then_rotate(pairing, layout):
        rope = ar.AxialRoPE((4, 8), pairing=pairing)  # partial rotary: the norm spans all 20 channels
        q, k = _qk(20, layout, torch.float32, n_tokens=6)
        wq, wk = torch.randn(20) + 1, torch.randn(20) + 1

        def fn(q, k, wq, wk, backend):
            return rope.norm_and_rotate(q, k, ar.grid(2, 3), wq, wk, layout, backend=backend)

        _check_against_reference(fn, (q, k, wq, wk), torch.float32, norm_weights=True)

    def test_fused_norm_without_weights_float16():
        rope = ar.AxialRoPE((2, 2, 2))
        q, k = _qk(6, "bshd", torch.float16, n_tokens=4, kv_heads=4)
        pos = ar.grid(1, 2, 2)
        fn = lambda q, k, b: rope.norm_and_rotate(q, k, pos, backend=b)
        _check_against_reference(fn, (q, k), torch.float16)

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("per_head", [False, True])
    def test_learnable_freqs_gradient_matches_reference(pairing, layout, per_head):
        # dense mixed-axis F (RoPE-Mixed), shared or per head; GQA when shared; partial rotary
        rope = ar.AxialRoPE((4, 4), pairing=pairing, learnable=True, num_heads=4 if per_head else None)
        with torch.no_grad():
            rope.learned_freqs.add_(0.3 * torch.randn(rope.learned_freqs.shape))  # no longer axial: dense F
        # an equality, checked in float64 (F stays a float32 parameter, its gradient summed in float64 and
        # rounded once on each side: 2 * 2**-24 of it; the float64 sums, test_backends' bound with u = 2**-53,
        # are within 7e-12); outputs and q/k gradients: TOL's float64 row
        q, k = _qk(10, layout, torch.float64, n_tokens=6, kv_heads=4 if per_head else 2)
        pos = torch.stack([ar.grid(2, 3), ar.grid(2, 3) * 2 + 1])  # per-sample positions
        grads = {}
        for backend in ("triton", "reference"):
            rope.learned_freqs.grad = None
            qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
            out = rope(qq, kk, pos, layout, backend=backend)
            (out[0].square().sum() + (out[1] * torch.linspace(-1, 1, 10, dtype=torch.float64)).sum()).backward()
            grads[backend] = (rope.learned_freqs.grad.clone(), qq.grad, kk.grad, *out)
        f_grad, ref_f_grad = grads["triton"][0], grads["reference"][0]
        torch.testing.assert_close(f_grad, ref_f_grad, atol=1e-10, rtol=2 * 2.0**-24)
        for a, b in zip(grads["triton"][1:], grads["reference"][1:]):
            assert_close(a, b)

    def test_learnable_freqs_fused_norm_explicit_triton_refuses_the_missing_gradient():
        rope = ar.AxialRoPE((4, 4), learnable=True)
        q, k = _qk(8, "bshd", torch.float32, n_tokens=6)
        with pytest.raises(RuntimeError, match=r"backend 'triton'.*no gradient for \['freqs'\]"):
            rope.norm_and_rotate(q, k, ar.grid(2, 3), backend="triton")  # the fused kernel has no F gradient
        with torch.no_grad():  # without a gradient to give, the fused kernel serves
            out = rope.norm_and_rotate(q, k, ar.grid(2, 3), backend="triton")
        assert_close(out[0], rope.norm_and_rotate(q, k, ar.grid(2, 3), backend="reference")[0])

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_table_mode_partial_and_per_sample_tables(pairing, layout):
        rope = ar.AxialRoPE((2, 4), pairing=pairing)
        cos, sin = rope.cos_sin(torch.stack([ar.grid(2, 3), ar.grid(2, 3) + 5]))  # [B=2, S, 6] of head_dim 10
        x, _ = _qk(10, layout, torch.float32, n_tokens=6)
        fn = lambda x, b: (ar.apply_rope(x, cos, sin, pairing, layout, backend=b),)
        _check_against_reference(fn, (x,), torch.float32)

    def test_table_mode_tables_with_grad_refused_explicitly():
        cos, sin = ar.AxialRoPE(8).cos_sin(torch.arange(5.0))
        x, _ = _qk(8, "bshd", torch.float32, n_tokens=5)
        c, s = cos.clone().requires_grad_(True), sin.clone().requires_grad_(True)
        with pytest.raises(RuntimeError, match=r"no gradient for \['cos', 'sin'\]"):
            ar.apply_rope(x, c, s, backend="triton")

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_inplace_writes_into_strided_q_and_k(pairing, layout):
        # q and k are views into a fused qkv buffer: rotated where they lie, v untouched
        rope = ar.AxialRoPE((2, 4), pairing=pairing)  # partial rotary: 6 of 10 channels
        qkv = torch.randn(2, 6, 3, 4, 10, generator=torch.Generator().manual_seed(0))
        expected = rope(qkv[:, :, 0], qkv[:, :, 1], ar.grid(2, 3), "bshd", backend="reference")
        v = qkv[:, :, 2].clone()
        q, k = qkv[:, :, 0], qkv[:, :, 1]
        if layout == "bhsd":
            q, k, expected = q.transpose(1, 2), k.transpose(1, 2), [e.transpose(1, 2) for e in expected]
        with torch.no_grad():
            out = rope(q, k, ar.grid(2, 3), layout, backend="triton", inplace=True)
        assert out[0] is q and out[1] is k
        assert_close(q, expected[0]), assert_close(k, expected[1])
        assert torch.equal(qkv[:, :, 2], v)

    @pytest.mark.parametrize("pairing", PAIRINGS)
    def test_inplace_table_mode(pairing):
        rope = ar.AxialRoPE((4, 8), pairing=pairing)
        cos, sin = rope.cos_sin(ar.grid(2, 3))
        x, _ = _qk(12, "bhsd", torch.float16, n_tokens=6)
        expected = ar.apply_rope(x, cos, sin, pairing, "bhsd", backend="reference")
        assert ar.apply_rope(x, cos, sin, pairing, "bhsd", backend="triton", inplace=True) is x
        assert_close(x, expected, torch.float16)

    @pytest.mark.parametrize("pairing", PAIRINGS)
    def test_rolling_cache_rerotates_its_keys_in_place_through_triton(pairing):
        # a roll rotates the kept keys (a strided slice of the cache) in place: one launch per layer
        from axial_rope.cache import KVCache

        caches = {}
        for backend in ("triton", "reference"):
            rope = ar.AxialRoPE((4, 4), pairing=pairing, backend=backend)
            cache = caches[backend] = KVCache(1, 8, 2, 10, window=8, sinks=2, frame=2, time_axis=0)
            keys = torch.randn(1, 2, 14, 10, generator=torch.Generator().manual_seed(0))
            t = 0
            for n in (6, 2, 4, 2):
                slots = cache.advance(n, rope)
                cache.update(slots, keys[:, :, t : t + n], keys[:, :, t : t + n])
                t += n
        assert_close(caches["triton"].k, caches["reference"].k)
        assert torch.equal(caches["triton"].v, caches["reference"].v)

    def test_inplace_compiles_as_a_mutating_op():
        # the in-place op declares its mutation: the compiled graph reads q after the rotation
        rope = ar.AxialRoPE((4, 4), backend="triton")

        def fn(q, k, pos):
            before = q.sum()
            rope(q, k, pos, inplace=True)
            return q * 1, k * 1, before

        q, k = _qk(8, "bshd", torch.float64, n_tokens=6)  # float64: the compiled sum may add in another order
        q2, k2 = q.clone(), k.clone()
        with torch.no_grad():
            eager = fn(q, k, ar.grid(2, 3))
            compiled = torch.compile(fn, fullgraph=True)(q2, k2, ar.grid(2, 3))
        for a, b in zip(eager, compiled):
            assert_close(a, b)
        assert_close(q2, q), assert_close(k2, k)

    def test_compiles_fullgraph_forward_and_backward():
        # inductor over rotation, fused norm and a learnable F: the ops are opaque, with fakes and autograd
        rope = ar.AxialRoPE((4, 4), backend="triton")
        learned = ar.AxialRoPE((4, 4), learnable=True, backend="triton")
        # float64 (F stays a float32 parameter): inductor may sum the loss and the gradients in another order;
        # float64 sums of these few hundred O(10) terms are within 1e-11, TOL's float64 row 1e-12 (1 + |x|)
        w = torch.randn(8, dtype=torch.float64) + 1

        def block(q, k, pos):
            q1, k1 = rope(q, k, pos)
            q2, k2 = rope.norm_and_rotate(q1, k1, pos, w, w)
            q3, k3 = learned(q2, k2, pos)
            return (q3 * 2).sum() + k3.square().sum()

        compiled = torch.compile(block, fullgraph=True)
        q, k = _qk(8, "bshd", torch.float64, n_tokens=6)
        pos = ar.grid(2, 3)
        results = []
        for fn in (block, compiled):
            qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
            learned.learned_freqs.grad = None
            loss = fn(qq, kk, pos)
            loss.backward()
            results.append((loss, qq.grad, kk.grad, learned.learned_freqs.grad))
        for a, b in zip(*results):
            assert_close(a, b)

else:  # ------------------------------------------------------------------- the normal test process

    def test_kernels_under_interpreter():
        # this module's interpreter tests, and the generic backend grid of test_backends.py for triton
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(Path(__file__).parent))
        root = Path(__file__).parents[1]
        grid = f"{Path(__file__).parent / 'test_backends.py'}"
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(Path(__file__)), grid]
        cmd += ["-k", "not test_backends.py or triton"]
        result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        passed = re.search(r"(\d+) passed", result.stdout)
        assert passed and int(passed.group(1)) >= 80, result.stdout[-2000:]  # this module and the whole grid ran
        skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
        allowed = ("computes bfloat16 arithmetic wrongly", "has no in-place form")
        assert all(any(a in line for a in allowed) for line in skips), skips

    def test_cpu_tensors_without_interpreter_fall_back_to_torch():
        pytest.importorskip("triton")
        from axial_rope.ops import _triton as triton_backend
        from axial_rope.ops import select_backend
        from axial_rope.ops.backend import Call

        x = torch.randn(1, 2, 1, 4)
        if triton_backend.INTERPRETED:
            pytest.skip("this process imported the kernels for the interpreter")
        call = Call("rotate_qk", x.device, x.dtype)
        assert "TRITON_INTERPRET=1" in triton_backend.BACKEND.supports(call)
        assert select_backend(None, call).name == "torch"
        with pytest.raises(RuntimeError, match="triton"):
            ar.AxialRoPE(4).rotate(x, torch.arange(2.0), backend="triton")

    @pytest.mark.parametrize("pairing", PAIRINGS)
    def test_kernels_compile_for_sm90_with_vector_loads_and_no_spills(pairing):
        # the interpreter never compiles the GPU path (libdevice trig, layouts): compile every kernel for
        # sm_90 with the specialisation a real launch gets (Triton's own binder; tests/test_kernels_static.py
        # does the benchmark shapes), here on q and k sliced out of a fused qkv buffer of head dim 72
        pytest.importorskip("triton")
        from axial_rope.ops import _triton_launch as plans
        from scripts.kernel_static import facts_of

        if plans.INTERPRETED:
            pytest.skip("this process imported the kernels for the interpreter")
        rope = ar.AxialRoPE((24, 24, 24), pairing=pairing)
        freqs, scale = rope.frequencies()
        pos = ar.grid(4, 16, 16)[None]
        qkv = torch.empty(2, pos.shape[1], 3, 6, 72, device="meta", dtype=torch.bfloat16)
        q, k = qkv[:, :, 0], qkv[:, :, 1]  # strided views: token stride 3 * 6 * 72
        w = torch.empty(72, device="meta", dtype=torch.bfloat16)
        angles = (pos, freqs, scale, pairing == "interleaved", "bshd")
        launches = {
            "rope": plans.plan_rope(q, k, torch.empty_like(q), torch.empty_like(k), *angles, False, n_sm=132),
            "in place": plans.plan_rope(q, k, q, k, *angles, False, n_sm=132),
            "norm": plans.plan_norm_rope(q, k, w, w, torch.empty_like(q), torch.empty_like(k), 1e-6, *angles, n_sm=132),
            "norm backward": plans.plan_norm_rope_bwd(q, k, q, k, w, None, q, k, 1e-6, *angles, n_sm=132),
            "F gradient": plans.plan_freqs_grad(q, k, q, k, *angles, n_sm=132),
        }
        # interleaved: 72 channels = 9 vectors of 16 bytes; half: the second half starts 36 elements
        # (72 bytes) into the row, so 8-byte vectors
        width = 16 if pairing == "interleaved" else 8
        for name, launch in launches.items():
            facts = facts_of(launch)
            assert launch.meta["VEC"] * 2 == width, name
            weights = name.startswith("norm")  # bf16 norm weights: 2-byte loads, once per program
            assert facts.loads.get(width, 0) > 0 and (weights or 2 not in facts.loads), name
            assert facts.spill_bytes == 0, name  # no register spills (nor slow-path trig stacks)
            if name != "F gradient":
                assert facts.stores.get(width, 0) > 0 and 2 not in facts.stores, name
            if name in ("rope", "in place", "norm"):
                # each thread stores what it loaded (pairs split in registers, half pairs as two tiles):
                # no exchange between threads, so writing in place needs no barrier either
                assert facts.barriers == 0 and set(facts.stores) == {width}, name


# -- the torch backend's eager path ---------------------------------------------------------------

if not INTERPRETER:
    from axial_rope.ops import _common as common
    from axial_rope.ops import _torch as torch_backend

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
    @pytest.mark.parametrize("chunk", [7, 24, 1 << 18])  # a row larger than a chunk; chunks inside heads; one chunk
    def test_torch_eager_path_equals_expression_across_chunks(monkeypatch, pairing, layout, dtype, chunk):
        monkeypatch.setattr(torch_backend, "CHUNK", chunk)
        rope = ar.AxialRoPE((2, 4), pairing=pairing)
        pos = torch.stack([ar.grid(3, 3), ar.grid(3, 3) * 3])  # per-sample tables
        q, k = _qk(10, layout, dtype, n_tokens=9)  # partial rotary: 6 of 10 channels
        ref = rope(q, k, pos, layout, backend="reference")
        out = rope(q, k, pos, layout, backend="torch")
        assert_close(out[0], ref[0]), assert_close(out[1], ref[1])
        # the expression path on the same plane tables
        cos, sin = common.plane_cos_sin(pos, rope.freqs, None, common.compute_dtype(q))
        expr = torch_backend.rotate_expr(
            q, common.table_for_layout(cos, layout), common.table_for_layout(sin, layout), pairing
        )
        # TOL's absolute and relative parts: the complex multiplication and the expression round differently
        # (6 u |z|, helpers.TOL), so bfloat16 results may be neighbours, 1 ulp = 2**-7 of |x| apart
        assert_close(out[0], expr)

    def test_torch_eager_path_strided_inputs_zero_stride_grads_no_saved_activations():
        rope = ar.AxialRoPE((4, 4))
        qkv = torch.randn(2, 6, 3, 4, 10, dtype=torch.bfloat16)
        q = qkv[:, :, 0].transpose(1, 2).requires_grad_(True)  # [B, H, S, D] non-contiguous view
        pos = ar.grid(2, 3)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = rope(q, None, pos, "bhsd", backend="torch")[0]
        assert max(saved) < q.numel()  # only tables are kept for backward
        assert_close(out, rope(q, None, pos, "bhsd", backend="reference")[0])
        grad = torch.randn(10, dtype=torch.bfloat16).expand(out.shape)
        out.backward(grad)
        qq = q.detach().requires_grad_(True)
        rope(qq, None, pos, "bhsd", backend="reference")[0].backward(grad)
        assert_close(q.grad, qq.grad)

    def test_torch_eager_path_second_derivative():
        rope = ar.AxialRoPE((2, 4), pairing="half")
        q = torch.randn(1, 6, 2, 8, dtype=torch.float64, requires_grad=True)
        pos = ar.grid(2, 3)
        assert torch.autograd.gradgradcheck(lambda a: rope(a, None, pos, backend="torch")[0], (q,))

    def test_torch_learnable_freqs_get_gradient_through_tables():
        rope = ar.AxialRoPE((4, 4), learnable=True)
        # an equality, checked in float64: F's gradient is a float64 sum on both sides (within 2e-12: test_backends'
        # bound with u = 2**-53), rounded once to the float32 parameter (2 * 2**-24 of it). In float32 it would be a float32 sum of terms of size
        # |out|^2 that cancel (|R z|^2 does not depend on the angle): its bound (test_backends) is 7e-4, above the
        # 1e-4 once used
        q, k = _qk(8, "bshd", torch.float64, n_tokens=6)
        grads = []
        for backend in ("torch", "reference"):
            rope.learned_freqs.grad = None
            out = rope(q, k, ar.grid(2, 3), backend=backend)
            (out[0].square().sum() + out[1].sum()).backward()
            grads.append(rope.learned_freqs.grad.clone())
        assert grads[0].abs().max() > 1  # a gradient to check
        torch.testing.assert_close(grads[0], grads[1], atol=1e-10, rtol=2 * 2.0**-24)
