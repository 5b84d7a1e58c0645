"""The Triton backend on the rotations of issue 44, against the reference: per-head ``F`` serving grouped heads
(rotation, fused QK-norm, ``F``'s gradient), per-head and grouped tables, queries and keys turned differently
(``QKRotation``: one launch per tensor), in place, in a rolling cache and compiled (fullgraph).

As ``tests/test_triton.py``: run normally, the module spawns one ``pytest`` subprocess on itself with
``TRITON_INTERPRET=1`` (which must precede triton's import) and its interpreter tests run there, in float32 and
float16 (the interpreter computes bf16 wrongly) on tiny shapes; the normal process compiles the grouped kernels
for sm_90 without a GPU. Tolerances: ``helpers.TOL`` (float32: 1e-5 for planes below 20; float16: 2 ulps).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_close

import axial_rope as ar
from axial_rope import ops
from axial_rope.ops import QKRotation, Rotation

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
PAIRINGS, LAYOUTS = ["interleaved", "half"], ["bshd", "bhsd"]


def _seeded(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _qk(layout, dtype, heads=(4, 2), seed=0, head_dim=12, tokens=6):
    shape = lambda h: (2, tokens, h, head_dim) if layout == "bshd" else (2, h, tokens, head_dim)  # noqa: E731
    return _seeded(*shape(heads[0]), seed=seed, dtype=dtype), _seeded(*shape(heads[1]), seed=seed + 1, dtype=dtype)


def _compare(fn, inputs, dtype, params=()):
    """``fn(*inputs, backend)`` on triton equals reference: outputs, and the gradients of the inputs and of
    ``params`` (leaves fn closes over) for a seeded output gradient."""
    results = []
    for backend in ("triton", "reference"):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        for p in params:
            p.grad = None
        outs = [o for o in fn(*leaves, backend) if o is not None]
        loss = sum((o.float() * _seeded(*o.shape, seed=9 + i)).sum() for i, o in enumerate(outs))
        loss.backward()
        results.append((outs, [t.grad for t in leaves], [p.grad.clone() for p in params]))
    (outs, grads, pgrads), (ref_outs, ref_grads, ref_pgrads) = results
    for ours, ref in zip(outs + grads, ref_outs + ref_grads):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        assert_close(ours, ref, dtype)
    for ours, ref in zip(pgrads, ref_pgrads):  # F's gradient: float32 sums of 100s of terms, 1e-5 of their size
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def _grouped_freqs(heads: int, learnable: bool = False) -> torch.Tensor:
    base = ar.AxialRoPE((4, 6), theta=100.0).freqs  # [2, 5]
    freqs = base * torch.linspace(1.0, 1.4, heads, dtype=torch.float64)[:, None, None]
    return torch.nn.Parameter(freqs.float()) if learnable else freqs


if INTERPRETER:  # ------------------------------------------------ inside the interpreter subprocess

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("heads", [(4, 2, 2), (4, 2, 1), (6, 3, 3)])
    def test_grouped_per_head_frequencies_and_their_gradient(pairing, layout, heads):
        hq, hk, hf = heads
        freqs = _grouped_freqs(hf, learnable=True)
        pos = ar.grid(2, 3)[None]
        fn = lambda q, k, b: ops.rotate(q, k, Rotation(pos, freqs, None, pairing), layout, b)  # noqa: E731
        _compare(fn, _qk(layout, torch.float32, (hq, hk)), torch.float32, params=(freqs,))

    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_fused_norm_with_grouped_per_head_frequencies(layout):
        rotation = Rotation(ar.grid(2, 3)[None], _grouped_freqs(2), None, "half")
        fn = lambda q, k, b: ops.norm_rotate(q, k, None, None, rotation, layout, b)  # noqa: E731
        _compare(fn, _qk(layout, torch.float32), torch.float32)

    @pytest.mark.parametrize("shape", [(6, 4, 10), (2, 6, 2, 10), (1, 6, 4, 12), (6, 1, 8)])
    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
    def test_per_head_and_grouped_tables(shape, pairing, layout, dtype):
        angle = _seeded(*shape[:-1], shape[-1] // 2, seed=3)
        cos, sin = (t.repeat_interleave(2, -1) for t in (angle.cos(), angle.sin()))
        fn = lambda x, b: (ar.apply_rope(x, cos, sin, pairing, layout, backend=b),)  # noqa: E731
        _compare(fn, _qk(layout, dtype)[:1], dtype)

    def _pairs(pairing):
        r = ar.AxialRoPE((4, 6), theta=100.0, pairing=pairing).rotation(ar.grid(2, 3))
        damped = torch.ones(1, 6, 5, dtype=torch.float64)
        damped[:, 3:, :2] = 0.25  # a reference image's keys, high-frequency planes damped (tables path)
        yield QKRotation(r, r._replace(attention_factor=damped))
        yield QKRotation(r, r._replace(pos=r.pos * 2 + 1))  # other key positions (angles in the kernel)
        yield QKRotation(r, r._replace(freqs=_grouped_freqs(2)))  # a per-head key F

    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_qk_rotation_forward_backward_and_fused_norm(pairing, layout):
        for pair in _pairs(pairing):
            fn = lambda q, k, b, pair=pair: ops.rotate(q, k, pair, layout, b)  # noqa: E731
            _compare(fn, _qk(layout, torch.float32), torch.float32)
            fn = lambda q, k, b, pair=pair: ops.norm_rotate(q, k, None, None, pair, layout, b)  # noqa: E731
            _compare(fn, _qk(layout, torch.float16, seed=4), torch.float16)

    def test_qk_rotation_in_place_on_a_fused_qkv_buffer():
        pair = list(_pairs("interleaved"))[1]
        qkv = _seeded(2, 6, 3, 2, 12, seed=5)  # [B, S, 3, H, D]: q and k strided views
        expected = ops.rotate(qkv[:, :, 0], qkv[:, :, 1], pair, "bshd", "reference")
        v = qkv[:, :, 2].clone()
        q, k = qkv[:, :, 0], qkv[:, :, 1]
        with torch.no_grad():
            out = ops.rotate(q, k, pair, "bshd", "triton", inplace=True)
        assert out[0] is q and out[1] is k
        assert_close(q, expected[0]), assert_close(k, expected[1])
        assert torch.equal(qkv[:, :, 2], v)

    def test_rolling_cache_rolls_keys_by_the_key_rotation_through_triton():
        from axial_rope.cache import KVCache

        freqs = _grouped_freqs(2)[:, :1]  # [2, 1, 5]: one axis, one F per key head
        caches = {}
        for backend in ("triton", "reference"):
            cache = caches[backend] = KVCache(1, 8, 2, 12, window=6, sinks=2)
            keys, t = _seeded(1, 2, 12, 12, seed=6), 0
            for n in (4, 2, 3, 3):
                slots = cache.advance(n, Rotation(torch.zeros(1, n, 1), freqs, None, "half"))
                rotation = Rotation(slots[None, :, None].float(), freqs, None, "half")
                written = ops.rotate(keys[:, :, t : t + n], None, rotation, "bhsd", backend)[0]
                cache.update(slots, written, keys[:, :, t : t + n])
                t += n
        assert_close(caches["triton"].k, caches["reference"].k)

    def test_qk_rotation_and_grouped_tables_compile_fullgraph():
        # the Triton ops are opaque custom ops with fakes: fullgraph traces q's and k's launches and their backward
        pair = list(_pairs("interleaved"))[1]
        angle = _seeded(6, 2, 5, seed=7)
        cos, sin = (t.repeat_interleave(2, -1) for t in (angle.cos(), angle.sin()))

        def block(q, k):
            q, k = ops.rotate(q, k, pair, "bshd", "triton")
            return ar.apply_rope(q, cos, sin, backend="triton").square().sum() + k.sum()

        q, k = _qk("bshd", torch.float32)
        results = []
        for fn in (block, torch.compile(block, fullgraph=True, backend="aot_eager")):
            qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
            loss = fn(qq, kk)
            loss.backward()
            results.append((loss, qq.grad, kk.grad))
        for a, b in zip(*results):
            assert_close(a, b)

else:  # ------------------------------------------------------------------- the normal test process

    def test_kernels_under_interpreter():
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(Path(__file__).parent))
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(Path(__file__))]
        result = subprocess.run(
            cmd, cwd=Path(__file__).parents[1], env=env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        passed = re.search(r"(\d+) passed", result.stdout)
        assert passed and int(passed.group(1)) >= 50, result.stdout[-2000:]  # the interpreter tests all ran

    def test_grouped_kernels_compile_for_sm90_without_spills():
        # the interpreter never compiles the GPU path: the grouped per-head F (rotation, fused norm, F gradient)
        # and grouped tables compiled for sm_90 as a real launch would be, on meta tensors
        pytest.importorskip("triton")
        from axial_rope.ops import _triton_launch as plans
        from scripts.kernel_static import facts_of

        if plans.INTERPRETED:
            pytest.skip("this process imported the kernels for the interpreter")
        pos = ar.grid(4, 16, 16)[None]
        freqs = ar.AxialRoPE((24, 24, 24)).freqs.expand(2, 3, 36)  # [HF=2, A, n]: k's 2 heads, q's 8 grouped
        q = torch.empty(2, pos.shape[1], 8, 72, device="meta", dtype=torch.bfloat16)
        k = torch.empty(2, pos.shape[1], 2, 72, device="meta", dtype=torch.bfloat16)
        angles = (pos, freqs, None, True, "bshd")
        table = torch.empty(1, pos.shape[1], 2, 36, device="meta", dtype=torch.float32)  # [1, S, H_t = 2, n]
        launches = {
            "rope": plans.plan_rope(q, k, torch.empty_like(q), torch.empty_like(k), *angles, False, n_sm=132),
            "norm": plans.plan_norm_rope(
                q, k, None, None, torch.empty_like(q), torch.empty_like(k), 1e-6, *angles, n_sm=132
            ),  # fmt: skip
            "F gradient": plans.plan_freqs_grad(q, k, q, k, *angles, n_sm=132),
            "table": plans.plan_rope_table(q, torch.empty_like(q), table, table, True, "bshd", False, n_sm=132),
        }
        assert launches["table"].args[-1] == 4 and launches["table"].meta["PER_HEAD"]  # 4 heads per table head
        assert launches["rope"].args[-1] == 2  # HF
        for name, launch in launches.items():
            facts = facts_of(launch)
            assert facts.spill_bytes == 0, name
            assert facts.loads.get(16, 0) > 0, name  # 16-byte vector loads kept
