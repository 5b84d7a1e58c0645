"""The Triton backend against the reference (under the interpreter on CPU, natively on CUDA) and the torch eager path.

``TRITON_INTERPRET=1`` must be set before triton is imported, and another test module
may import it first in the same process. So, run normally, this module spawns one
``pytest`` subprocess on itself with the variable set; in that subprocess
(``INTERPRETER`` true) it defines the interpreter tests instead. Interpreter tests use
float32/float16 (the interpreter computes bf16 wrongly) and tiny shapes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TOL, assert_close

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


def _check_against_reference(fn, inputs, dtype):
    """fn(*inputs, backend) with backend "triton" equals "reference", forward and backward."""
    with torch.no_grad():
        ref_outs = fn(*inputs, "reference")
    grads = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device, o.dtype) for o in ref_outs]
    ref_outs, ref_grads = _run(lambda *a: fn(*a, "reference"), inputs, grads)
    outs, out_grads = _run(lambda *a: fn(*a, "triton"), inputs, grads)
    for actual, expected in zip((*outs, *out_grads), (*ref_outs, *ref_grads)):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
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
        _check_against_reference(lambda q, b: (rope.apply(q, pos, backend=b),), (q,), torch.float32)

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

    @pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy evaluates the discarded branch
    def test_pass_through_channels_are_copied_exactly():
        # channels past rot_dim are copied, not computed as x * 1 + partner * 0 (an inf would turn into nan)
        rope = ar.AxialRoPE((2, 4))
        q, _ = _qk(10, "bshd", torch.float16, n_tokens=6)
        q[..., 7] = float("inf")
        out = rope.apply(q, ar.grid(2, 3), backend="triton")
        assert torch.equal(out[..., 6:], q[..., 6:])
        assert_close(out, rope.apply(q, ar.grid(2, 3), backend="reference"))

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
        assert abs(float(logits[0] - logits[1])) < 1e-4 * float(q.norm() * k.norm())

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_fused_norm_matches_norm_then_rotate(pairing, layout):
        rope = ar.AxialRoPE((4, 8), pairing=pairing)  # partial rotary: the norm spans all 20 channels
        q, k = _qk(20, layout, torch.float32, n_tokens=6)
        wq, wk = torch.randn(20) + 1, torch.randn(20) + 1

        def fn(q, k, wq, wk, backend):
            return rope.norm_and_rotate(q, k, ar.grid(2, 3), wq, wk, layout, backend=backend)

        _check_against_reference(fn, (q, k, wq, wk), torch.float32)

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
        q, k = _qk(10, layout, torch.float32, n_tokens=6, kv_heads=4 if per_head else 2)
        pos = torch.stack([ar.grid(2, 3), ar.grid(2, 3) * 2 + 1])  # per-sample positions
        grads = {}
        for backend in ("triton", "reference"):
            rope.learned_freqs.grad = None
            qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
            out = rope(qq, kk, pos, layout, backend=backend)
            (out[0].square().sum() + (out[1] * torch.linspace(-1, 1, 10)).sum()).backward()
            grads[backend] = (rope.learned_freqs.grad.clone(), qq.grad, kk.grad, *out)
        for a, b in zip(grads["triton"], grads["reference"]):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)

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

    def test_inplace_compiles_as_a_mutating_op():
        # the in-place op declares its mutation: the compiled graph reads q after the rotation
        rope = ar.AxialRoPE((4, 4), backend="triton")

        def fn(q, k, pos):
            before = q.sum()
            rope(q, k, pos, inplace=True)
            return q * 1, k * 1, before

        q, k = _qk(8, "bshd", torch.float32, n_tokens=6)
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
        w = torch.randn(8) + 1

        def block(q, k, pos):
            q1, k1 = rope(q, k, pos)
            q2, k2 = rope.norm_and_rotate(q1, k1, pos, w, w)
            q3, k3 = learned(q2, k2, pos)
            return (q3 * 2).sum() + k3.square().sum()

        compiled = torch.compile(block, fullgraph=True)
        q, k = _qk(8, "bshd", torch.float32, n_tokens=6)
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
            ar.AxialRoPE(4).apply(x, torch.arange(2.0), backend="triton")

    def _compile_for_sm90(kernel, pointers: dict, constexprs: dict, warps: int = 8) -> str:
        """PTX of ``kernel`` for an H100 (sm_90), built by triton's bundled ptxas: no GPU needed."""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        signature, attrs = {}, {}
        for i, name in enumerate(kernel.arg_names):  # launch-time specialisation: 16-byte aligned pointers/strides
            if name in constexprs:
                signature[name] = "constexpr"
            elif name in pointers or re.fullmatch(r"s_(q|k|o|gq|gk)[bsh]|s_p[bsh]_", name):
                signature[name] = pointers.get(name, "i32")
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                signature[name] = "fp32" if name == "eps" else "i32"
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]

    @pytest.mark.parametrize("pairing", PAIRINGS)
    def test_kernels_compile_for_sm90_with_vector_loads_and_no_spills(pairing):
        # the interpreter never compiles the GPU path (libdevice trig, layouts): check it here, without a GPU
        pytest.importorskip("triton")
        from axial_rope.ops import _triton as triton_backend
        from axial_rope.ops import _triton_kernels as kernels

        if triton_backend.INTERPRETED:
            pytest.skip("this process imported the kernels for the interpreter")

        bf16 = {n: "*bf16" for n in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "qw_ptr", "kw_ptr")}
        pointers = {**bf16, **{n: "*fp64" for n in ("pos_ptr", "freqs_ptr", "scale_ptr")}}
        flags = dict(N_AXES=3, PER_HEAD=False, HAS_SCALE=True, INTERLEAVED=pairing == "interleaved", F64=False)
        flags.update(FAST_TRIG=True, BLOCK_S=32, BLOCK_D=128, N=36, D=72, s_qd=1, s_kd=1, s_od=1, s_pd_=1)
        rope = dict(pointers, cos_ptr="*fp32", sin_ptr="*fp32")
        rope_flags = dict(flags, TABLE=False, HAS_K=True, CONJ=False)
        ptx = _compile_for_sm90(kernels.rope_kernel, rope, dict(rope_flags, INPLACE=False))
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx  # 16-byte accesses for head dim 72
        assert ".local" not in ptx  # no register spills, no slow-path trig
        assert "bar.sync" not in ptx or pairing == "interleaved"  # (the register swap may use shared memory)
        # in place: a barrier between a head row's loads (its channels and their partners) and its store
        ptx = _compile_for_sm90(kernels.rope_kernel, rope, dict(rope_flags, INPLACE=True))
        assert "bar.sync" in ptx and ".local" not in ptx
        ptx = _compile_for_sm90(kernels.norm_rope_kernel, pointers, dict(flags, HAS_QW=True, HAS_KW=True))
        assert ".local" not in ptx
        grads = {n: "*bf16" for n in ("gq_ptr", "gk_ptr", "dq_ptr", "dk_ptr")} | {
            "dqw_ptr": "*fp32",
            "dkw_ptr": "*fp32",
        }
        flags.update(HAS_QW=True, HAS_KW=False, s_gqd=1, s_gkd=1)
        assert "st.global" in _compile_for_sm90(kernels.norm_rope_bwd_kernel, pointers | grads, flags)
        # the gradient of learnable F, with its launch tile (1024 elements, 4 warps)
        names = kernels.freqs_grad_kernel.arg_names
        flags = {k: v for k, v in flags.items() if k in names} | dict(HAS_K=True, PER_HEAD=pairing == "half", BLOCK_S=8)
        ptx = _compile_for_sm90(kernels.freqs_grad_kernel, pointers | grads | {"out_ptr": "*fp32"}, flags, warps=4)
        assert ".local" not in ptx

# -- the torch backend's eager path ---------------------------------------------------------------

if not INTERPRETER:
    from axial_rope.ops import _torch as torch_backend
    from axial_rope.ops import common

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
        torch.testing.assert_close(out[0], expr, atol=TOL[dtype][0], rtol=0)

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
        q, k = _qk(8, "bshd", torch.float32, n_tokens=6)
        grads = []
        for backend in ("torch", "reference"):
            rope.learned_freqs.grad = None
            out = rope(q, k, ar.grid(2, 3), backend=backend)
            (out[0].square().sum() + out[1].sum()).backward()
            grads.append(rope.learned_freqs.grad.clone())
        torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-4)


# -- CUDA: native kernels, bf16, large shapes ------------------------------------------------------

if not INTERPRETER:

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
        _check_against_reference(fn, (q, k, w, w), torch.bfloat16)

    @pytest.mark.gpu
    def test_gpu_far_positions_bf16_keep_relative_invariance():
        rope = ar.AxialRoPE(128, pairing="half")
        q, k = (t.cuda() for t in _qk(128, "bshd", torch.bfloat16, n_tokens=2, batch=1, heads=1, kv_heads=1))
        logits = []
        for offset in (0.0, 1.0e6):
            rq, rk = rope(q, k, (torch.tensor([7.0, 0.0]) + offset).cuda())
            logits.append((rq[0, 0].double() * rk[0, 1].double()).sum())
        assert abs(float(logits[0] - logits[1])) < 2e-2 * float(q.double().norm() * k.double().norm())

    @pytest.mark.gpu
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    def test_gpu_far_positions_match_the_reference_elementwise(dtype):
        # float32 angles at 1e6 would be off by up to 0.06 rad: float32 outputs are held to 2e-5 (5000x
        # tighter), bfloat16 outputs to one unit in the last place of the exact result rounded once
        rope = ar.AxialRoPE((16, 56, 56))
        pos = ar.grid(4, 8, 8, offset=(1.0e6, 2.0e6, 3.0e6)).double().cuda()
        x = torch.randn(2, pos.shape[0], 4, 128, generator=torch.Generator().manual_seed(2)).to(dtype).cuda()
        out = rope.apply(x, pos, backend="triton")
        exact = rope.apply(x.double(), pos, backend="reference")
        if dtype == torch.float32:
            torch.testing.assert_close(out, exact.float(), atol=2e-5, rtol=0)
        else:
            rounded = exact.to(dtype)
            _, exponent = torch.frexp(rounded.float())
            ulp = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent - 8)
            assert ((out.float() - rounded.float()).abs() <= ulp).all()

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


# -- the benchmark script -----------------------------------------------------------------------

if not INTERPRETER:

    def test_bench_writes_json_markdown_and_chart(tmp_path):
        from scripts import bench

        bench.main(["--small", "--shapes", "dit", "--modes", "forward,backward", "--providers", "tables,in place"]
                   + ["--repeat", "1", "--out", str(tmp_path)])  # fmt: skip
        result = json.loads((tmp_path / "bench" / "cpu-small.json").read_text())
        rows = {(r["mode"], r["provider"]): r for r in result["rows"]}
        assert rows["forward", "copy"]["x_copy"] == 1.0
        assert rows["backward", "axial_rope torch (tables)"]["median_ms"] > 0
        assert rows["forward", "axial_rope torch (in place)"]["median_ms"] > 0  # in place: forward (inference) only
        assert ("backward", "axial_rope torch (in place)") not in rows
        assert (tmp_path / "img" / "bench_cpu-small.png").stat().st_size > 1000
        page = (tmp_path / "benchmarks.md").read_text()
        assert "| DiT-XL/2 (small) | forward | axial_rope torch (tables) |" in page
        assert "img/bench_cpu-small.png" in page and result["machine"]["torch"] in page
