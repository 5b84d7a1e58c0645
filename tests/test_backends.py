"""Every registered backend, every operation, against the reference: forward and backward.

The grid reads the registry (``axial_rope.ops.backend.REGISTRY``), so a new backend is
tested here with no test edits. A backend that cannot run in this process (triton
without CUDA or the interpreter) is skipped with its own reason; the Triton backend runs
this grid under the interpreter from ``tests/test_triton.py``'s subprocess (float32 and
float16 there: the interpreter computes bfloat16 wrongly). Each case asks the backend
which gradients it gives (``supports``) and compares those; the dispatcher tests at the
end check that the gradients it does not give are never silently missing.

Tolerances: rotated tensors and their gradients are one rotation (and one RMSNorm) in the compute
dtype, held to ``helpers.TOL`` (the bound is written there). The gradients of the other leaves
(tables, positions, frequencies, attention factors, norm weights) are float32 sums over tokens and
heads when the rotation runs in float32: each is held to its own error bound, computed from the
inputs' magnitudes by :func:`_leaf_grad_bounds`.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from helpers import U32, assert_close

import axial_rope as ar
from axial_rope import ops
from axial_rope.ops.backend import OPS, REGISTRY, Call, load

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
PAIRINGS, LAYOUTS = ["interleaved", "half"], ["bshd", "bhsd"]
CANDIDATES = [name for name in REGISTRY if name != "reference"]
# the operations this grid covers (norm_rotate_table, QK-norm + tables: tests/test_norm_rotate_tables.py)
GRID_OPS = tuple(op for op in OPS if op != "norm_rotate_table")
# gradients each operation can be asked for, beyond the rotated tensors'
EXTRA_GRADS = {"rotate_table": ("cos", "sin"), "rotate_qk": ("freqs", "pos", "scale"), "norm_rotate_qk": ("freqs",)}


def _backend_or_skip(name: str, call: Call):
    backend, reason = load(name)
    if backend is None:
        pytest.skip(f"{name}: {reason}")
    reason = backend.supports(call)
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    if INTERPRETER and call.dtype == torch.bfloat16 and name == "triton":
        pytest.skip("the Triton interpreter computes bfloat16 arithmetic wrongly")
    return backend


def _inputs(op: str, dtype: torch.dtype, layout: str):
    """Leaf inputs of one call: rotated tensors in ``dtype``, positions/frequencies/tables in float64/32."""
    gen = torch.Generator().manual_seed(7)
    b, s, h, hk, d = 2, 6, 4, 2, 14  # partial rotary: 12 of 14 channels rotated; GQA 4 / 2
    shape = lambda heads: (b, s, heads, d) if layout == "bshd" else (b, heads, s, d)
    q, k = torch.randn(shape(h), generator=gen).to(dtype), torch.randn(shape(hk), generator=gen).to(dtype)
    rope = ar.AxialRoPE((4, 8), scaling=(ar.scaling.YaRN(2.0, 4), None))  # an attention factor on every plane
    pos = torch.stack([ar.grid(2, 3), ar.grid(2, 3) * 5 + 11]).double()  # [B, S, 2], per sample
    if op == "rotate_table":
        cos, sin = rope.cos_sin(pos)  # [B, S, 12]
        return {"x": q, "cos": cos, "sin": sin}
    freqs, scale = rope.frequencies()
    named = {"q": q, "k": k, "pos": pos, "freqs": freqs.float(), "scale": scale}
    if op == "norm_rotate_qk":
        named |= {"q_weight": 1 + 0.1 * torch.randn(d, generator=gen), "k_weight": None}
        del named["scale"]
    return named


def _run(op: str, backend: str, named: dict, pairing: str, layout: str):
    if op == "rotate_table":
        return (ar.apply_rope(named["x"], named["cos"], named["sin"], pairing, layout, backend),)
    if op == "rotate_qk":
        args = (named["pos"], named["freqs"], named["scale"], pairing, layout, backend)
        return ops.rotate_qk(named["q"], named["k"], *args)
    w = (named["q_weight"], named["k_weight"], 1e-6)
    return ops.norm_rotate_qk(named["q"], named["k"], *w, named["pos"], named["freqs"], None, pairing, layout, backend)


def _outputs_and_grads(op, backend, named, wanted, pairing, layout):
    leaves = {n: t.detach().clone().requires_grad_(n in wanted) for n, t in named.items() if t is not None}
    args = {n: leaves.get(n) for n in named}
    outs = _run(op, backend, args, pairing, layout)
    weights = [torch.linspace(-1, 1, o.shape[-1], dtype=torch.float64) for o in outs]
    loss = sum((o.double() * w).sum() for o, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, [leaves[n] for n in wanted]) if wanted else ()
    return outs, dict(zip(wanted, grads))


def _plane_abs(t: torch.Tensor, n: int, pairing: str) -> torch.Tensor:
    """``|a| + |b|`` of each of the first n planes, float64 ``[..., n]``."""
    t = t.double().abs()
    if pairing == "interleaved":
        return t[..., 0 : 2 * n : 2] + t[..., 1 : 2 * n : 2]
    return t[..., :n] + t[..., n : 2 * n]


def _leaf_grad_bounds(op: str, named: dict, pairing: str, layout: str) -> dict:
    """Error bounds of the float32 gradients of the leaves that are not rotated, per entry (float64).

    A rotation in float32 gives its tables the gradients ``g_c = sum g_a x_a + g_b x_b`` and ``g_s``
    (likewise), float32 sums of the ``N = 2 * (heads of q and k) + 2`` products of one token: each within
    ``N u A`` with ``A = sum_h (|g_a| + |g_b|)(|x_a| + |x_b|)`` (u = 2**-24, g the loss' weights). The
    rest is float64: the angle's gradient ``m (cos g_s - sin g_c)`` is within ``2 N u m A``; positions,
    frequencies and attention factors sum it with weights ``|F|``, ``|pos|`` and ``1 / m``. RMSNorm's
    float32 ``x_hat`` adds ``D / 2 + 8`` roundings to N; the norm weight's gradient is a float32 sum over
    the ``B S H`` tokens and heads of ``g_y x_hat``. A wrong formula is off by the gradient itself.
    """
    rotated = [named[n] for n in ("x", "q", "k") if n in named]
    D = rotated[0].shape[-1]
    n = (named["cos"].shape[-1] if op == "rotate_table" else named["freqs"].shape[-1]) // (
        2 if op == "rotate_table" else 1
    )
    bshd = [t if layout == "bshd" else t.transpose(1, 2) for t in rotated]  # [B, S, H, D]
    if op == "norm_rotate_qk":  # the rotated tensors are the normalised ones
        weights = (named["q_weight"], torch.ones(D))
        bshd = [t.double() * (t.double().square().mean(-1, keepdim=True) + 1e-6).rsqrt() * w.double()
                for t, w in zip(bshd, weights)]  # fmt: skip
    g = _plane_abs(torch.linspace(-1, 1, D, dtype=torch.float64), n, pairing)  # |g_a| + |g_b| per plane [n]
    A = sum((_plane_abs(t, n, pairing) * g).sum(2) for t in bshd)  # [B, S, n]
    N = 2 * sum(t.shape[2] for t in bshd) + 2 + (D / 2 + 8 if op == "norm_rotate_qk" else 0)
    if op == "rotate_table":  # channel tables: the plane's bound on both its channels (one gets the gradient)
        planes = N * U32 * A
        table = planes.repeat_interleave(2, -1) if pairing == "interleaved" else torch.cat([planes, planes], -1)
        return {"cos": table, "sin": table}
    m = named.get("scale", torch.ones(n, dtype=torch.float64)).double()
    angle = 2 * N * U32 * m * A  # the gradient of each angle, [B, S, n]
    pos, freqs = named["pos"].double().abs(), named["freqs"].double().abs()
    bounds = {
        "pos": angle @ freqs.T,  # [B, S, n_axes]
        "freqs": torch.einsum("bsa,bsn->an", pos, angle),
        "scale": (angle / m).sum((0, 1)),
    }
    if op == "norm_rotate_qk":
        x_hat = bshd[0] / named["q_weight"].double()  # the normalised q before its weight [B, S, H, D]
        g_y = torch.cat([torch.cat([g, g], -1) if pairing == "half" else g.repeat_interleave(2), torch.ones(D - 2 * n)])
        count = x_hat.shape[0] * x_hat.shape[1] * x_hat.shape[2]
        bounds["q_weight"] = (count + D / 2 + 12) * U32 * (g_y * x_hat.abs()).sum((0, 1, 2))
    return bounds


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", GRID_OPS)
@pytest.mark.parametrize("name", CANDIDATES)
def test_backend_matches_reference_forward_and_backward(name, op, dtype, pairing, layout):
    named = _inputs(op, dtype, layout)
    rotated = [n for n in ("x", "q", "k") if n in named]
    _backend_or_skip(name, Call(op, torch.device("cpu"), dtype, frozenset(rotated)))
    backend, _ = load(name)
    # every gradient the backend gives for this operation (rotated tensors always)
    wanted = rotated + [
        n
        for n in EXTRA_GRADS[op] + (("q_weight",) if op == "norm_rotate_qk" else ())
        if backend.supports(Call(op, torch.device("cpu"), dtype, frozenset([*rotated, n]))) is None
    ]
    outs, grads = _outputs_and_grads(op, name, named, wanted, pairing, layout)
    ref_outs, ref_grads = _outputs_and_grads(op, "reference", named, wanted, pairing, layout)
    for out, ref in zip(outs, ref_outs):
        assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
        assert_close(out, ref, dtype)
    bounds = _leaf_grad_bounds(op, named, pairing, layout)
    for n in wanted:
        if n in rotated:  # one rotation (and norm) backwards, in the compute dtype
            assert_close(grads[n], ref_grads[n], dtype)
            continue
        # float64/float32 leaves: float32 sums (bound above; float64 rotations also reduce float32 tables'
        # gradients in float32), and each side's rounding to a float32 leaf
        err = (grads[n].double() - ref_grads[n].double()).abs()
        bound = bounds[n] + 2 * U32 * ref_grads[n].double().abs()
        assert bool((err <= bound).all()), f"{n}: error {float((err / bound).max()):.3g} x its bound"


@pytest.mark.parametrize("name", CANDIDATES)
@pytest.mark.parametrize("op", GRID_OPS)
def test_backend_inplace_equals_out_of_place(name, op):
    if op == "norm_rotate_qk":
        pytest.skip("norm_rotate_qk has no in-place form")
    named = _inputs(op, torch.float32, "bshd")
    _backend_or_skip(name, Call(op, torch.device("cpu"), torch.float32, inplace=True))
    expected = _run(op, name, named, "half", "bshd")
    targets = {n: named[n].clone() for n in ("x", "q", "k") if n in named}
    if op == "rotate_table":
        out = (ar.apply_rope(targets["x"], named["cos"], named["sin"], "half", "bshd", name, inplace=True),)
    else:
        args = (named["pos"], named["freqs"], named["scale"], "half", "bshd", name)
        out = ops.rotate_qk(targets["q"], targets["k"], *args, inplace=True)
    for o, t, e in zip(out, targets.values(), expected):
        assert o is t and torch.equal(o, e)  # the same elementwise arithmetic, in either buffer: bit for bit


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("empty", ["tokens", "batch"])
@pytest.mark.parametrize("name", CANDIDATES)
def test_backend_returns_empty_results_for_empty_inputs(name, empty, layout):
    _backend_or_skip(name, Call("rotate_table", torch.device("cpu"), torch.float32))
    b, s = (2, 0) if empty == "tokens" else (0, 6)
    shape = (b, s, 3, 8) if layout == "bshd" else (b, 3, s, 8)
    x = torch.randn(shape)
    rope = ar.AxialRoPE((4, 4))
    pos = ar.grid(2, 3)[:s]
    cos, sin = rope.cos_sin(pos)
    assert ar.apply_rope(x, cos, sin, layout=layout, backend=name).shape == shape
    assert rope(x, x.clone(), pos, layout, backend=name)[0].shape == shape
    assert ar.apply_rope(x, cos, sin, layout=layout, backend=name, inplace=True) is x


# -- the precision policy ------------------------------------------------------------------------

ULP_BITS = {torch.bfloat16: 7, torch.float16: 10}  # explicit mantissa bits


def _ulps(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|actual - expected| in units of the last place of ``expected`` (both of one low-precision dtype)."""
    bits = ULP_BITS[expected.dtype]
    _, exponent = torch.frexp(expected.float())
    ulp = torch.ldexp(torch.ones_like(expected, dtype=torch.float32), exponent - 1 - bits)
    ulp = ulp.clamp(min=torch.finfo(expected.dtype).smallest_normal * 2.0**-bits)  # subnormals: fixed spacing
    return (actual.float() - expected.float()).abs() / ulp


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", CANDIDATES)
def test_low_precision_output_is_the_float32_result_rounded_once(name, dtype):
    _backend_or_skip(name, Call("rotate_qk", torch.device("cpu"), dtype))
    rope = ar.AxialRoPE((16, 24, 24), scaling=(ar.scaling.NTK(2.0), None, None))
    pos = ar.grid(3, 5, 7, offset=(0.0, 1e5, 0.0))
    x = torch.randn(2, pos.shape[0], 3, 72, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = rope.rotate(x, pos, backend=name)
    # bit for bit: the same backend on the float32 upcast of the same inputs, then one rounding
    assert torch.equal(out, rope.rotate(x.float(), pos, backend=name).to(dtype))
    # within one ulp of the exact result rounded once (the float64 reference, rounded once)
    exact = rope.rotate(x.double(), pos, backend="reference").to(dtype)
    assert _ulps(out, exact).max() <= 1


@pytest.mark.parametrize("name", CANDIDATES)
def test_far_positions_match_the_reference_to_float32_accuracy(name):
    # float32 angles at 1e6 are off by up to 0.06 rad (outputs off by ~0.1): this tolerance is 5000x tighter.
    # The bound it holds: float64 angles (2e6 * 2**-53 = 2e-10 rad), tables rounded once, then one float32
    # rotation: 6 u |z| (helpers.TOL) with |z| < 8 for these unit normals, 3e-6
    _backend_or_skip(name, Call("rotate_qk", torch.device("cpu"), torch.float32))
    rope = ar.AxialRoPE((32, 32), pairing="half")
    pos = ar.grid(4, 4, offset=(1.0e6, 2.0e6)).double()
    x = torch.randn(1, 16, 2, 64, generator=torch.Generator().manual_seed(1))
    out = rope.rotate(x, pos, backend=name)
    torch.testing.assert_close(out, rope.rotate(x.double(), pos, backend="reference").float(), atol=2e-5, rtol=0)


def test_reference_rounds_once_from_float64():
    rope = ar.AxialRoPE((8, 8))
    x = torch.randn(1, 6, 2, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    out = rope.rotate(x, ar.grid(2, 3), backend="reference")
    assert torch.equal(out, rope.rotate(x.double(), ar.grid(2, 3), backend="reference").bfloat16())


# -- the dispatcher ----------------------------------------------------------------------------


class _Declining:
    """A backend that serves CPU calls without gradients only (records what it was asked)."""

    name = "declining"

    def __init__(self):
        self.calls = []
        self.torch, _ = load("torch")

    def supports(self, call):
        return "it gives no gradients" if call.grads else None

    def rotate_table(self, *args, **kwargs):
        self.calls.append("rotate_table")
        return self.torch.rotate_table(*args, **kwargs)

    def rotate_qk(self, *args, **kwargs):
        self.calls.append("rotate_qk")
        return self.torch.rotate_qk(*args, **kwargs)

    def norm_rotate_qk(self, *args, **kwargs):
        self.calls.append("norm_rotate_qk")
        return self.torch.norm_rotate_qk(*args, **kwargs)


@pytest.fixture
def declining(monkeypatch):
    """One registry line (first, automatic on CPU) and a loaded module: all a new backend needs."""
    backend = _Declining()
    monkeypatch.delenv(ops.ENV_VAR, raising=False)
    monkeypatch.setattr(ops.backend, "REGISTRY", {"declining": ("_declining", ("cpu",)), **REGISTRY})
    monkeypatch.setitem(ops.backend._LOADED, "declining", (backend, None))
    return backend


def test_a_registered_backend_is_chosen_automatically_when_it_can_serve(declining):
    rope = ar.AxialRoPE((4, 4))
    q = torch.randn(1, 6, 2, 8)
    with torch.no_grad():
        out = rope.rotate(q, ar.grid(2, 3))
    assert declining.calls == ["rotate_qk"]
    assert_close(out, rope.rotate(q, ar.grid(2, 3), backend="reference"))


def test_automatic_choice_falls_back_quietly_when_a_gradient_is_missing(declining):
    rope = ar.AxialRoPE((4, 4))
    q = torch.randn(1, 6, 2, 8, requires_grad=True)
    out = rope.rotate(q, ar.grid(2, 3))  # "declining" cannot give q's gradient: torch serves
    out.sum().backward()
    assert declining.calls == [] and q.grad is not None


def test_explicit_choice_raises_with_the_backends_reason(declining):
    rope = ar.AxialRoPE((4, 4))
    q = torch.randn(1, 6, 2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="backend 'declining'.*rotate_qk: it gives no gradients"):
        rope.rotate(q, ar.grid(2, 3), backend="declining")


def test_inplace_with_a_gradient_is_out_of_place_then_copied_by_the_dispatcher(declining):
    rope = ar.AxialRoPE((4, 4))
    leaf = torch.randn(1, 6, 2, 8, requires_grad=True)
    q = leaf * 1
    with pytest.raises(RuntimeError, match="no gradients"):
        rope.rotate(q, ar.grid(2, 3), backend="declining", inplace=True)
    out = rope.rotate(q, ar.grid(2, 3), inplace=True)  # automatic: torch, out of place + copy_
    assert out is q
    out.sum().backward()
    assert leaf.grad is not None


def test_no_backend_imports_another():
    folder = Path(ops.__file__).parent
    modules = {spec[0] for spec in REGISTRY.values()}
    for module in modules:
        tree = ast.parse((folder / f"{module}.py").read_text())
        imported = {
            alias.name.lstrip(".")
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        } | {node.module.lstrip(".") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & (modules - {module}), f"{module} imports another backend: {imported & modules}"


def test_reference_shares_no_table_or_angle_code_with_the_fast_paths():
    source = (Path(ops.__file__).parent / "_reference.py").read_text()
    assert "common" not in source and "plane_cos_sin" not in source and "rope_angles" not in source
