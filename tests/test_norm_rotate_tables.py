"""QK-norm + rotation by cos/sin tables (``ops.norm_apply_rope``): every backend against the float64 reference.

The reference itself is checked against torch's ``nn.RMSNorm``/``nn.LayerNorm`` and diffusers'
``apply_rotary_emb`` (the stock norm-then-rotate of the processors). The Triton kernels run under the
interpreter in a subprocess of this module (``TRITON_INTERPRET=1`` must be set before triton is imported),
on tiny shapes in float64, float32 and float16 (the interpreter computes bfloat16 wrongly).

Claims of equality are checked in float64 (``helpers.TOL``'s float64 row: two float64 evaluations of the
same formula). float32 results are held to :func:`_bounds`, an error bound computed from the inputs.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import U32, assert_close

import axial_rope as ar
from axial_rope import ops
from axial_rope.ops import QKNorm

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
NORMS = list(itertools.product(("rms", "layer"), ("head", "heads")))  # (kind, span)
LAYOUTS, PAIRINGS = ("bshd", "bhsd"), ("interleaved", "half")
LEAVES = ("q", "k", "q_weight", "k_weight", "q_bias", "k_bias", "cos", "sin")


def _inputs(kind: str, span: str, layout: str, dtype: torch.dtype, *, seed: int = 0, batch: int = 2) -> dict:
    """q ``[B, S, 4, 10]`` and k with 2 heads (GQA) in ``layout``; weights and biases per span; tables ``[1, S, 8]``
    (partial rotary: 8 of 10 channels), unit-modulus from AxialRoPE. Weights, biases and tables are float32 (as
    parameters and the models' tables are), float64 with float64 q and k (every leaf float64: an equality)."""
    gen = torch.Generator().manual_seed(seed)
    S, D = 6, 10
    shape = lambda h: (batch, S, h, D) if layout == "bshd" else (batch, h, S, D)
    width = lambda h: D if span == "head" else h * D
    named = {
        "q": (3 * torch.randn(shape(4), generator=gen) + 0.5).to(dtype),  # an offset: LayerNorm's mean matters
        "k": torch.randn(shape(2), generator=gen).to(dtype),
        "q_weight": 1 + 0.2 * torch.randn(width(4), generator=gen),
        "k_weight": 1 + 0.2 * torch.randn(width(2), generator=gen),
        "q_bias": 0.1 * torch.randn(width(4), generator=gen),
        "k_bias": 0.1 * torch.randn(width(2), generator=gen),
    }
    named["cos"], named["sin"] = ar.AxialRoPE((4, 4)).cos_sin(ar.grid(2, 3) + 3.0)  # [S, 8] each
    named["cos"], named["sin"] = named["cos"][None], named["sin"][None]
    if dtype == torch.float64:
        named = {n: t.double() for n, t in named.items()}
    return named


def _call(backend: str, named: dict, kind: str, span: str, pairing: str, layout: str):
    norm = QKNorm(kind, named["q_weight"], named["k_weight"], named["q_bias"], named["k_bias"], 1e-6, span)
    return ops.norm_apply_rope(named["q"], named["k"], named["cos"], named["sin"], norm, pairing, layout, backend)


def _run(backend: str, named: dict, wanted, kind, span, pairing, layout):
    """Outputs and the gradients of the ``wanted`` leaves of ``sum(out * grad)`` (seeded output gradients)."""
    leaves = {n: t.detach().clone().requires_grad_(n in wanted) for n, t in named.items()}
    outs = _call(backend, leaves, kind, span, pairing, layout)
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    if not wanted:
        return outs, {}, weights
    loss = sum((o.double() * w).sum() for o, w in zip(outs, weights))
    return outs, dict(zip(wanted, torch.autograd.grad(loss, [leaves[n] for n in wanted]))), weights


def _rows(t: torch.Tensor, span: str, layout: str) -> torch.Tensor:
    """A tensor as rows of the norm: ``[B, S, H, D]``, or ``[B, S, 1, H * D]`` across heads (float64)."""
    t = (t if layout == "bshd" else t.transpose(1, 2)).double()
    return t.flatten(2)[:, :, None] if span == "heads" else t


def _bounds(named: dict, weights: list, kind: str, span: str, layout: str) -> dict:
    """float32 error bounds (float64 tensors) of the outputs, dq, dk and the parameters' and tables' gradients.

    Per row of ``n`` channels (a head, or a token's heads): the float32 mean and mean square are sums of n
    terms (``n u`` of their magnitudes each), so ``x_hat`` is within ``dx_hat = u ((n / 2 + 8) |x_hat| + n
    mean|x| rstd)``; ``z = x_hat w + b`` adds ``2 u |z|``, the rotation ``6 u`` of its plane (helpers.TOL), and
    a plane mixes two channels, so a channel's output is within twice the row's largest channel bound. Output
    gradients ``g`` turned back are within ``G = 2 max|g|`` per channel. ``dx = rstd (gh - mean(gh) - x_hat
    mean(gh x_hat))`` (``gh = w R^T g``): two more sums of n terms, ``(n + 8) u`` of their magnitudes, the
    error of x_hat carried through, and ``(n / 2 + 4) u`` of dx from rstd. Weights, biases and tables sum
    ``R`` rows' (or heads') products in float32: ``(R + n / 2 + 12) u`` of the sum of their magnitudes plus
    the x_hat and z errors carried in. A wrong formula is off by the gradient itself.
    """
    u, out, table = U32, {}, 0.0
    head_axis = 2 if layout == "bshd" else 1
    terms = 2 * (named["q"].shape[head_axis] + named["k"].shape[head_axis]) * named["q"].shape[0]  # per table entry
    row_max = lambda t: t.amax(-1, keepdim=True)
    for name, grad in (("q", weights[0]), ("k", weights[1])):
        x = _rows(named[name], span, layout)  # [B, S, H | 1, n]
        shape = _rows(named[name], "head", layout).shape  # [B, S, H, D]
        back = lambda t, x=x, shape=shape: t.expand(x.shape).reshape(shape)  # rows -> [B, S, H, D]
        n = x.shape[-1]
        w, b = named[f"{name}_weight"].double().abs(), named[f"{name}_bias"].double().abs()  # [n]
        mean = x.mean(-1, keepdim=True) if kind == "layer" else torch.zeros_like(x[..., :1])
        rstd = ((x - mean).square().mean(-1, keepdim=True) + 1e-6).rsqrt()
        x_hat = ((x - mean) * rstd).abs()
        dx_hat = u * ((n / 2 + 8) * x_hat + n * x.abs().mean(-1, keepdim=True) * rstd)
        z = x_hat * w + b
        dz = w * dx_hat + 2 * u * z
        out[name] = back(2 * row_max(dz) + 12 * u * row_max(z))
        G = 2 * row_max(_rows(grad, span, layout).abs())  # |R^T g| per channel
        gh = G * w
        sums = (gh * x_hat).sum(-1, keepdim=True)
        d_dx = (n + 8) * u * (sums / n * x_hat + (gh.sum(-1, keepdim=True) / n if kind == "layer" else 0))
        d_dx = d_dx + 8 * u * gh + dx_hat * sums / n + x_hat * (gh * dx_hat).sum(-1, keepdim=True) / n
        d_dx = rstd * (d_dx + (n / 2 + 4) * u * (gh + gh.sum(-1, keepdim=True) / n + x_hat * sums / n))
        out[f"d{name}"] = back(d_dx)
        rows = x.shape[0] * x.shape[1] * x.shape[2]
        out[f"{name}_weight"] = ((rows + n / 2 + 12) * u * G * x_hat + G * dx_hat).sum((0, 1, 2))
        out[f"{name}_bias"] = ((rows + 12) * u * G).expand_as(x).sum((0, 1, 2))
        per_channel = back(G * ((terms + n / 2 + 12) * u * z + dz))  # [B, S, H, D]
        table = table + 2 * per_channel.sum(2).amax(-1).sum(0)  # [S]: the tables are shared by the batch
    out["cos"] = out["sin"] = table[None, :, None]
    for key in ("q", "k", "dq", "dk"):
        out[key] = out[key] if layout == "bshd" else out[key].transpose(1, 2)
    return out


def _check_backend(backend: str, dtype: torch.dtype, kind: str, span: str, pairing: str, layout: str, *,
                   grads: bool = True, batch: int = 2) -> None:  # fmt: skip
    """``backend`` against the reference: equal in float64, within :func:`_bounds` in float32, within TOL (the
    float32 result rounded once) in float16 and bfloat16 (outputs only)."""
    named = _inputs(kind, span, layout, dtype, batch=batch)
    wanted = list(LEAVES) if grads and dtype in (torch.float64, torch.float32) else []
    outs, got, weights = _run(backend, named, wanted, kind, span, pairing, layout)
    ref_outs, ref, _ = _run("reference", named, wanted, kind, span, pairing, layout)
    for o, r in zip(outs, ref_outs):
        assert o.dtype == r.dtype == dtype and o.shape == r.shape
    if dtype in (torch.float16, torch.bfloat16):
        for o, r in zip(outs, ref_outs):
            assert_close(o, r)
        return
    if dtype == torch.float64:  # an equality: the same formula, every leaf and step float64
        for actual, expected in zip((*outs, *(got[n] for n in wanted)), (*ref_outs, *(ref[n] for n in wanted))):
            assert_close(actual, expected)
        return
    bounds = _bounds(named, weights, kind, span, layout)
    checks = list(zip(("q", "k"), outs, ref_outs)) + [(f"d{n}", got[n], ref[n]) for n in ("q", "k")]
    checks += [(n, got[n], ref[n]) for n in LEAVES[2:]]
    for name, actual, expected in checks:
        err = (actual.double() - expected.double()).abs()
        bound = bounds[name] + 2 * U32 * expected.double().abs()  # and each side's rounding to float32
        assert bool((err <= bound.expand_as(err)).all()), f"{name}: {float((err / bound).max()):.3g} x its bound"


if INTERPRETER:  # ------------------------------------------------ inside the interpreter subprocess
    ops.preload(triton=True)

    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("kind,span", NORMS)
    def test_triton_equals_reference_in_float64_forward_and_backward(kind, span, pairing, layout):
        _check_backend("triton", torch.float64, kind, span, pairing, layout)

    @pytest.mark.parametrize("kind,span", NORMS)
    def test_triton_float32_within_its_error_bound(kind, span):
        _check_backend("triton", torch.float32, kind, span, "interleaved", "bshd")

    @pytest.mark.parametrize("kind,span", NORMS)
    def test_triton_float16_is_the_float32_result_rounded_once(kind, span):
        _check_backend("triton", torch.float16, kind, span, "half", "bhsd")

    def test_triton_compiles_fullgraph_forward_and_backward():
        named = _inputs("layer", "heads", "bshd", torch.float64)
        leaves = {n: t.clone().requires_grad_(True) for n, t in named.items()}

        def step(q, k, q_weight, k_weight, q_bias, k_bias, cos, sin):
            norm = QKNorm("layer", q_weight, k_weight, q_bias, k_bias, 1e-6, "heads")
            q, k = ops.norm_apply_rope(q, k, cos, sin, norm, backend="triton")
            return q.square().sum() + (k * 2).sum()

        eager = torch.autograd.grad(step(**leaves), list(leaves.values()))
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        for a, b in zip(eager, torch.autograd.grad(compiled(**leaves), list(leaves.values()))):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)  # float64, the same kernels: to rounding

else:  # ------------------------------------------------------------------- the normal test process

    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("pairing", PAIRINGS)
    @pytest.mark.parametrize("kind,span", NORMS)
    def test_torch_equals_reference_in_float64_forward_and_backward(kind, span, pairing, layout):
        _check_backend("torch", torch.float64, kind, span, pairing, layout)

    @pytest.mark.parametrize("kind,span", NORMS)
    def test_torch_float32_within_its_error_bound(kind, span):
        _check_backend("torch", torch.float32, kind, span, "half", "bhsd", batch=1)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
    def test_torch_low_precision_is_the_float32_result_rounded_once(dtype):
        _check_backend("torch", dtype, "layer", "heads", "interleaved", "bshd")

    @pytest.mark.parametrize("kind,span", NORMS)
    def test_reference_equals_torch_norm_modules_then_diffusers_rotation(kind, span):
        # the oracle against independent code: torch's nn.RMSNorm / nn.LayerNorm over D or H * D (float64, with
        # identity tables: an equality), then diffusers' apply_rotary_emb, the processors' stock rotation, which
        # computes in float32 (so within helpers.TOL's float32 row: one rotation of planes |z| < 20)
        from diffusers.models.embeddings import apply_rotary_emb

        named = _inputs(kind, span, "bshd", torch.float64)
        q, w, b = named["q"], named["q_weight"], named["q_bias"]
        module = torch.nn.RMSNorm(w.shape[0], eps=1e-6) if kind == "rms" else torch.nn.LayerNorm(w.shape[0], eps=1e-6)
        module = module.double()
        with torch.no_grad():
            module.weight.copy_(w)
        normed = (module(q.flatten(2) if span == "heads" else q) + b).view_as(q).detach()
        identity = dict(named, cos=torch.ones_like(named["cos"]), sin=torch.zeros_like(named["sin"]))
        assert_close(_call("reference", identity, kind, span, "interleaved", "bshd")[0], normed)
        cos, sin = named["cos"][0], named["sin"][0]
        rotated = apply_rotary_emb(normed[..., :8].transpose(1, 2), (cos, sin), sequence_dim=2).transpose(1, 2)
        expected = torch.cat([rotated, normed[..., 8:]], dim=-1)
        assert_close(_call("reference", named, kind, span, "interleaved", "bshd")[0], expected, torch.float32)

    def test_wan_layout_tables_and_channel_tables_agree():
        named = _inputs("rms", "heads", "bshd", torch.float32)
        flat = _call("torch", named, "rms", "heads", "interleaved", "bshd")
        wan = dict(named, cos=named["cos"][:, :, None], sin=named["sin"][:, :, None])  # [1, S, 1, r]
        for a, b in zip(flat, _call("torch", wan, "rms", "heads", "interleaved", "bshd")):
            assert torch.equal(a, b)

    @pytest.mark.parametrize(
        "change,match",
        [
            (dict(kind="batch"), r"norm.kind must be one of \('rms', 'layer'\), got 'batch'"),
            (dict(span="token"), r"norm.span must be one of \('head', 'heads'\), got 'token'"),
            (dict(eps=-1.0), r"norm.eps must be a real number >= 0, got -1.0"),
            (dict(q_weight=torch.ones(40)), r"norm.q_weight must be \[D\] = \[10\] for span='head'.*got shape \(40,\)"),
            (dict(k_bias=torch.ones(7)), r"norm.k_bias must be \[D\] = \[10\]"),
            (dict(q_weight=torch.ones(10, dtype=torch.int64)), r"norm.q_weight must be a floating-point"),
        ],
    )
    def test_bad_norm_is_refused_naming_the_field(change, match):
        named = _inputs("rms", "head", "bshd", torch.float32)
        norm = QKNorm("rms", named["q_weight"], named["k_weight"], None, None, 1e-6, "head")._replace(**change)
        with pytest.raises((ValueError, TypeError), match=match):
            ops.norm_apply_rope(named["q"], named["k"], named["cos"], named["sin"], norm)

    def test_bad_tables_are_refused():
        named = _inputs("rms", "head", "bshd", torch.float32)
        norm = QKNorm()
        per_head = named["cos"][:, :, None].expand(1, 6, 4, 8)
        with pytest.raises(ValueError, match=r"cos of 4 dimensions must be \[B\|1, S, 1, r\], got shape \(1, 6, 4, 8\)"):
            ops.norm_apply_rope(named["q"], named["k"], per_head, per_head, norm)
        with pytest.raises(ValueError, match="cos/sin have 5 positions, x has S=6 tokens"):
            ops.norm_apply_rope(named["q"], named["k"], named["cos"][:, :5], named["sin"][:, :5], norm)
        with pytest.raises(TypeError, match="q and k must have one dtype"):
            ops.norm_apply_rope(named["q"], named["k"].double(), named["cos"], named["sin"], norm)

    def test_torch_compiles_fullgraph_forward_and_backward():
        named = _inputs("rms", "heads", "bhsd", torch.float64)
        leaves = {n: t.clone().requires_grad_(True) for n, t in named.items()}

        def step(q, k, q_weight, k_weight, q_bias, k_bias, cos, sin):
            norm = QKNorm("rms", q_weight, k_weight, q_bias, k_bias, 1e-6, "heads")
            q, k = ops.norm_apply_rope(q, k, cos, sin, norm, "half", "bhsd", backend="torch")
            return q.square().sum() + (k * 2).sum()

        eager = torch.autograd.grad(step(**leaves), list(leaves.values()))
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        for a, b in zip(eager, torch.autograd.grad(compiled(**leaves), list(leaves.values()))):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)  # float64, the same ops: to rounding

    def test_explicit_triton_on_cpu_without_interpreter_says_why():
        pytest.importorskip("triton")
        from axial_rope.ops import _triton as triton_backend

        if triton_backend.INTERPRETED:
            pytest.skip("this process imported the kernels for the interpreter")
        named = _inputs("rms", "head", "bshd", torch.float32)
        with pytest.raises(RuntimeError, match="backend 'triton'.*norm_rotate_table.*TRITON_INTERPRET=1"):
            _call("triton", named, "rms", "head", "interleaved", "bshd")

    def test_comfy_kitchen_rms_rope_agrees_through_the_benchmarks_tables():
        # the peer of scripts/bench_norm_tables.py on the tables it is handed there (ComfyUI's freqs_cis built from
        # ours): per-head RMSNorm then interleaved rotation, float32; within helpers.TOL's float32 row (one norm
        # and one rotation of planes |z| < 20 on each side)
        ck = pytest.importorskip("comfy_kitchen")
        from scripts.bench_norm_tables import freqs_cis

        named = _inputs("rms", "head", "bshd", torch.float32)
        cos, sin = named["cos"][0, :, :8], named["sin"][0, :, :8]
        q, k = named["q"][..., :8].contiguous(), named["k"][..., :8].contiguous()
        w = named["q_weight"][:8].contiguous()
        theirs = ck.rms_rope(q, k, freqs_cis(cos, sin), w, w, 1e-6)
        ours = ops.norm_apply_rope(q, k, cos, sin, QKNorm("rms", w, w, eps=1e-6), backend="reference")
        for a, b in zip(theirs, ours):
            assert_close(a, b, torch.float32)

    def test_kernels_under_interpreter():
        pytest.importorskip("triton")
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(Path(__file__).parent))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(Path(__file__))]
        result = subprocess.run(cmd, cwd=Path(__file__).parents[1], env=env, capture_output=True, text=True,
                                timeout=900)  # fmt: skip
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        assert "25 passed" in result.stdout, result.stdout[-2000:]
