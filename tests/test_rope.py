"""AxialRoPE and the PyTorch backends: properties, backend-vs-reference grid, autograd, spectra."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import TOL, assert_close
from hypothesis import given
from hypothesis import strategies as st

import axial_rope as ar
from axial_rope.ops import _common as common
from axial_rope.ops import _torch as torch_backend

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["bshd", "bhsd"]
PAIRINGS = ["interleaved", "half"]
# (axes_dim, head_dim): odd head dims on purpose, partial rotary included
SHAPES = [((8, 16, 16), 72), ((40, 40), 80), ((32, 32, 32), 96), ((6,), 6), ((2, 2), 6), ((16,), 24), ((8, 12), 80)]


def _qk(axes_dim, head_dim, layout, dtype, *, batch=2, heads=4, kv_heads=2, gen_seed=0):
    sizes = [3, 4, 5][: len(axes_dim)]
    pos = ar.grid(*sizes)
    S = pos.shape[0]
    gen = torch.Generator().manual_seed(gen_seed)
    shape = lambda h: (batch, S, h, head_dim) if layout == "bshd" else (batch, h, S, head_dim)  # noqa: E731
    q = torch.randn(shape(heads), generator=gen).to(dtype)
    k = torch.randn(shape(kv_heads), generator=gen).to(dtype)
    return q, k, pos


def _scores(q, k, layout="bshd"):
    # [B, H, S, S] float64 attention logits (MHA: same heads)
    if layout == "bshd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    return q.double() @ k.double().transpose(-1, -2)


# -- backends against the reference ------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("axes_dim,head_dim", SHAPES, ids=lambda v: str(v))
def test_torch_backend_matches_reference_forward(axes_dim, head_dim, pairing, layout, dtype):
    rope = ar.AxialRoPE(axes_dim, pairing=pairing)
    q, k, pos = _qk(axes_dim, head_dim, layout, dtype)
    q_ref, k_ref = rope(q, k, pos, layout, backend="reference")
    q_out, k_out = rope(q, k, pos, layout, backend="torch")
    assert q_out.dtype == dtype and q_out.shape == q.shape and k_out.shape == k.shape
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)
    # channels past rot_dim pass through bit for bit
    r = rope.rot_dim
    assert torch.equal(q_out[..., r:], q[..., r:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_torch_backend_matches_reference_backward(pairing, layout, dtype):
    rope = ar.AxialRoPE((8, 16, 16), pairing=pairing)
    q, k, pos = _qk((8, 16, 16), 72, layout, dtype)
    grads = {}
    for backend in ("reference", "torch"):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        q_out, k_out = rope(qq, kk, pos, layout, backend=backend)
        gen = torch.Generator().manual_seed(1)
        (q_out.float() * torch.randn(q_out.shape, generator=gen)).sum().backward(retain_graph=True)
        (k_out.float() * torch.randn(k_out.shape, generator=gen)).sum().backward()
        grads[backend] = (qq.grad, kk.grad)
    for got, want in zip(grads["torch"], grads["reference"]):
        assert_close(got, want)


def test_backward_is_rotation_by_minus_the_angle():
    # d(R x)/dx applied to g is R^T g = R(-pos) g: rotating the gradient back
    rope = ar.AxialRoPE((8, 8))
    pos = ar.grid(3, 5)
    x = torch.randn(1, 15, 2, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(1, 15, 2, 16, dtype=torch.float64)
    rope.rotate(x, pos).backward(g)
    assert_close(x.grad, rope.rotate(g, -pos))


@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck_float64_torch_backend(pairing, layout):
    rope = ar.AxialRoPE((4, 4), pairing=pairing)
    q, k, pos = _qk((4, 4), 10, layout, torch.float64, batch=1, heads=2, kv_heads=1)
    q.requires_grad_()
    k.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rope(a, b, pos, layout, backend="torch"), (q, k))


def test_apply_rope_table_matches_module_all_backends():
    rope = ar.AxialRoPE((16, 56, 56))
    q, _, pos = _qk((16, 56, 56), 128, "bshd", torch.float32)
    cos, sin = rope.cos_sin(pos)
    expected = rope.rotate(q, pos, backend="reference")
    for backend in ("reference", "torch"):
        assert_close(ar.apply_rope(q, cos, sin, backend=backend), expected)


def test_apply_rope_batched_tables_and_partial_width():
    rope = ar.AxialRoPE((8, 8), pairing="half")
    pos = torch.stack([ar.grid(2, 3), ar.grid(2, 3, offset=10)])  # [B=2, S=6, 2]
    x = torch.randn(2, 6, 3, 24)
    cos, sin = rope.cos_sin(pos)
    assert cos.shape == (2, 6, 16)
    out = ar.apply_rope(x, cos, sin, pairing="half")
    assert_close(out, rope.rotate(x, pos, backend="reference"))
    assert torch.equal(out[..., 16:], x[..., 16:])
    # each sample rotated by its own positions
    assert_close(out[1:], rope.rotate(x[1:], pos[1], backend="reference"))


def test_per_batch_positions_and_gqa():
    rope = ar.AxialRoPE((8, 8))
    pos = torch.stack([ar.grid(3, 3), ar.grid(3, 3, scale=0.5)])
    q = torch.randn(2, 9, 6, 16)
    k = torch.randn(2, 9, 2, 16)
    q_out, k_out = rope(q, k, pos)
    assert k_out.shape == (2, 9, 2, 16)
    for b in range(2):
        qb, kb = rope(q[b : b + 1], k[b : b + 1], pos[b], backend="reference")
        assert_close(q_out[b : b + 1], qb)
        assert_close(k_out[b : b + 1], kb)


def test_values_are_not_rotated_relative_scores_only():
    # the attention logits of rotated q, k at positions m, n depend on n - m only
    rope = ar.AxialRoPE((16, 16))
    q = torch.randn(1, 1, 1, 32, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 32, dtype=torch.float64)
    near = (rope.rotate(q, torch.tensor([[2.0, 3.0]])) * rope.rotate(k, torch.tensor([[0.0, 1.0]]))).sum()
    far = (rope.rotate(q, torch.tensor([[502.0, 33.0]])) * rope.rotate(k, torch.tensor([[500.0, 31.0]]))).sum()
    other = (rope.rotate(q, torch.tensor([[9.0, 3.0]])) * rope.rotate(k, torch.tensor([[0.0, 1.0]]))).sum()
    # float64: angles up to 502 rad are off by 502 * 2**-53 = 6e-14, so 16 planes of |q| |k| < 40 move the
    # score by < 1e-11; a score that depended on the absolute position would move by O(1)
    assert abs(float(near - far)) < 1e-9
    assert abs(float(near - other)) > 1e-3


# -- properties (hypothesis) --------------------------------------------------------

axes_dims = st.lists(st.sampled_from([2, 4, 6, 8]), min_size=1, max_size=3).map(tuple)
shifts = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@given(axes_dim=axes_dims, pairing=st.sampled_from(PAIRINGS), shift=shifts, seed=st.integers(0, 2**16))
def test_relative_invariance_under_shift(axes_dim, pairing, shift, seed):
    rope = ar.AxialRoPE(axes_dim, pairing=pairing)
    gen = torch.Generator().manual_seed(seed)
    n_axes, head_dim = len(axes_dim), sum(axes_dim) + 2
    pos = torch.randint(-50, 50, (5, n_axes), generator=gen).double()  # float64: pos + shift stays exact
    q = torch.randn(1, 5, 2, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 5, 2, head_dim, generator=gen, dtype=torch.float64)
    base = _scores(*rope(q, k, pos))
    shifted = _scores(*rope(q, k, pos + shift))
    # float64 bound: angles up to 1e4 rad are each off by 1e4 * 2**-53 = 1.1e-12, so a score (at most 13
    # planes, sum |q_p| |k_p| <= |q| |k| < 70 for these unit normals) moves by < 70 * 4 * 1.1e-12 = 3e-10
    torch.testing.assert_close(shifted, base, atol=1e-9, rtol=1e-9)


@given(axes_dim=axes_dims, pairing=st.sampled_from(PAIRINGS), seed=st.integers(0, 2**16))
def test_rotation_preserves_norm_and_minus_pos_inverts(axes_dim, pairing, seed):
    rope = ar.AxialRoPE(axes_dim, pairing=pairing)
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(7, len(axes_dim), generator=gen) * 100
    x = torch.randn(2, 7, 3, sum(axes_dim), generator=gen, dtype=torch.float64)
    y = rope.rotate(x, pos)
    # float64: each rotation is within 6 u |z| (helpers.TOL), 7e-16 |x|; two of them 1.4e-15 |x|
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(rope.rotate(y, -pos), x, atol=1e-10, rtol=1e-10)


@given(dim=st.sampled_from([2, 6, 16, 64]), theta=st.floats(2.0, 1e6), seed=st.integers(0, 2**16))
def test_one_axis_equals_textbook_1d_rope(dim, theta, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 9, 1, dim, generator=gen, dtype=torch.float64)
    pos = torch.arange(9, dtype=torch.float64)
    inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = pos[:, None] * inv  # [S, dim / 2]
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(angle), angle)[None, :, None]
    expected = torch.stack([z.real, z.imag], -1).flatten(-2)
    # float64: the two inverse frequencies may differ by a few ulps (other formula): angles below 8 rad move
    # by < 8 * 20 * 2**-53 = 2e-14
    torch.testing.assert_close(ar.AxialRoPE(dim, theta=theta).rotate(x, pos), expected, atol=1e-10, rtol=1e-10)


@given(axes_dim=axes_dims, pairing=st.sampled_from(PAIRINGS), seed=st.integers(0, 2**16))
def test_apply_rope_of_cos_sin_equals_apply(axes_dim, pairing, seed):
    rope = ar.AxialRoPE(axes_dim, pairing=pairing)
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 30, (4, len(axes_dim)), generator=gen).float()
    x = torch.randn(2, 4, 2, sum(axes_dim) + 4, generator=gen)
    out = ar.apply_rope(x, *rope.cos_sin(pos), pairing=pairing)
    assert_close(out, rope.rotate(x, pos))


# -- spectra, pairings, tables --------------------------------------------------------


def test_per_axis_spectrum_frequency_matrix():
    rope = ar.AxialRoPE((4, 8), theta=(100.0, 10000.0))
    freqs, scale = rope.frequencies()
    assert freqs.shape == (2, 6) and freqs.dtype == torch.float64
    torch.testing.assert_close(freqs[0, :2], ar.inv_freq(4, 100.0)[0], rtol=0, atol=0)
    torch.testing.assert_close(freqs[1, 2:], ar.inv_freq(8, 10000.0)[0], rtol=0, atol=0)
    assert (freqs[0, 2:] == 0).all() and (freqs[1, :2] == 0).all()
    assert (scale == 1).all()


def test_split_spectrum_is_one_spectrum_cut_into_sections():
    rope = ar.AxialRoPE((4, 6, 6), spectrum="split", pairing="half")
    freqs, _ = rope.frequencies()
    shared = ar.inv_freq(16)[0]
    torch.testing.assert_close(freqs.sum(0), shared, rtol=0, atol=0)
    assert rope.plane_axis == [0, 0, 1, 1, 1, 2, 2, 2]


def test_cycled_spectrum_deals_planes_round_robin_like_qwen3_vl():
    # Qwen3-VL mrope_section [24, 20, 20]: t, h, w cycle for 60 planes, then t takes the rest
    rope = ar.AxialRoPE((48, 40, 40), spectrum="cycled", pairing="half")
    assert rope.plane_axis[:6] == [0, 1, 2, 0, 1, 2]
    assert rope.plane_axis[57:] == [0, 1, 2, 0, 0, 0, 0]
    assert [rope.plane_axis.count(a) for a in range(3)] == [24, 20, 20]
    torch.testing.assert_close(rope.frequencies()[0].sum(0), ar.inv_freq(128)[0], rtol=0, atol=0)


def test_cos_sin_layout_per_pairing():
    pos = ar.grid(2, 2)
    inter, half = ar.AxialRoPE((4, 4)), ar.AxialRoPE((4, 4), pairing="half")
    c_i, _ = inter.cos_sin(pos)
    c_h, _ = half.cos_sin(pos)
    assert c_i.dtype == torch.float32 and c_i.shape == (4, 8)
    assert torch.equal(c_i[:, 0::2], c_i[:, 1::2])  # (2j, 2j+1) share a plane
    assert torch.equal(c_h[:, :4], c_h[:, 4:])  # (j, j + 4) share a plane
    assert torch.equal(c_i[:, 0::2], c_h[:, :4])  # same planes, other channels


def test_attention_factor_multiplies_cos_and_sin():
    yarn = ar.scaling.YaRN(4.0, 64)
    rope = ar.AxialRoPE(16, scaling=yarn)
    plain = ar.AxialRoPE(16)
    rope.freqs.copy_(plain.freqs)  # isolate the factor from the frequency change
    pos = torch.arange(5.0)
    cos, sin = rope.cos_sin(pos)
    c0, s0 = plain.cos_sin(pos)
    af = 0.1 * math.log(4.0) + 1
    assert_close(cos, c0 * af)
    assert_close(sin, s0 * af)


def test_length_dependent_scaling_follows_positions_or_seq_len():
    dyn = ar.scaling.DynamicNTK(2.0, 8)
    rope = ar.AxialRoPE(16, scaling=dyn)
    x = torch.randn(1, 32, 1, 16, dtype=torch.float64)
    short, long = torch.arange(8.0), torch.arange(32.0)
    # inside the trained length: the plain spectrum
    assert_close(rope.rotate(x[:, :8], short), ar.AxialRoPE(16).rotate(x[:, :8], short))
    # beyond: the base grows with the length seen (max(pos) + 1 = 32)
    theta = 10000 * (2.0 * 32 / 8 - 1) ** (16 / 14)
    assert_close(rope.rotate(x, long), ar.AxialRoPE(16, theta=theta).rotate(x, long))
    assert_close(rope.rotate(x[:, :8], short, seq_len=32), ar.AxialRoPE(16, theta=theta).rotate(x[:, :8], short))


def test_half_precision_module_keeps_float64_frequencies():
    rope = ar.AxialRoPE((8, 8)).to(torch.bfloat16)
    assert rope.freqs.dtype == torch.float64
    torch.testing.assert_close(rope.freqs, ar.AxialRoPE((8, 8)).freqs, rtol=0, atol=0)
    learned = ar.AxialRoPE((8, 8), learnable=True).half()
    assert learned.learned_freqs.dtype == torch.float32


# -- learnable frequencies (RoPE-Mixed) ------------------------------------------------


def test_learnable_frequencies_initialised_axial_and_get_gradients():
    rope = ar.AxialRoPE((8, 8), learnable=True)
    assert isinstance(rope.learned_freqs, torch.nn.Parameter)
    torch.testing.assert_close(rope.learned_freqs.double(), rope.freqs, rtol=1e-7, atol=0)  # float32: 2**-24 = 6e-8
    q = torch.randn(2, 6, 2, 16)
    k = torch.randn(2, 6, 2, 16)
    q_out, k_out = rope(q, k, ar.grid(2, 3))
    (q_out * k_out).sum().backward()
    grad = rope.learned_freqs.grad
    assert grad is not None and grad.shape == (2, 8)
    assert grad.abs().sum() > 0 and (grad[0, 4:] != 0).any()  # dense: off-axis entries learn too


def test_learnable_frequency_gradient_matches_finite_differences():
    rope = ar.AxialRoPE((4, 4), learnable=True)
    rope.learned_freqs.data = rope.learned_freqs.data.double()
    pos = ar.grid(2, 2).double()
    x = torch.randn(1, 4, 1, 8, dtype=torch.float64)

    def loss(freqs):
        cos, sin = common.plane_cos_sin(pos[None], freqs, None, torch.float64)  # [1, S, n]
        cos, sin = common.table_for_layout(cos, "bshd"), common.table_for_layout(sin, "bshd")
        return torch_backend.BACKEND.rotate_table(x, cos, sin, "interleaved", "bshd", inplace=False)

    assert torch.autograd.gradcheck(loss, (rope.learned_freqs.detach().clone().requires_grad_(),))


def test_per_head_learnable_frequencies():
    rope = ar.AxialRoPE((4, 4), learnable=True, num_heads=3)
    assert rope.learned_freqs.shape == (3, 2, 4)
    with torch.no_grad():
        rope.learned_freqs[1] *= 2
    pos = ar.grid(2, 2)
    x = torch.randn(1, 4, 3, 8)
    y = rope.rotate(x, pos)
    heads = [ar.AxialRoPE((4, 4)) for _ in range(3)]
    heads[1].freqs.mul_(2)
    for h in range(3):  # learned F is float32: angles |pos F| <= 2 rad here move by 2 u, inside TOL's rotation bound
        assert_close(y[:, :, h : h + 1], heads[h].rotate(x[:, :, h : h + 1], pos))
    cos, _ = rope.cos_sin(pos)
    assert cos.shape == (4, 3, 8)
    with pytest.raises(ValueError, match="per-head"):
        rope(x, torch.randn(1, 4, 1, 8), pos)


def test_apply_is_nn_modules_and_rotate_rotates_one_tensor():
    # the rotation of one tensor is `rotate`; `apply(fn)` is nn.Module's, untouched
    assert ar.AxialRoPE.apply is torch.nn.Module.apply
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), ar.AxialRoPE((2, 2)))
    seen = []
    model.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "AxialRoPE", "Sequential"]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'pos'"):
        model[1].rotate(torch.zeros(1, 2, 1, 4))


# -- in place --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_inplace_writes_into_strided_views(pairing, layout, dtype, backend):
    # q and k are views into a fused qkv buffer (partial rotary: 24 of 30 channels); v stays untouched
    rope = ar.AxialRoPE((8, 16), pairing=pairing)
    qkv = torch.randn(2, 12, 3, 4, 30, generator=torch.Generator().manual_seed(0)).to(dtype)  # [B, S, 3, H, D]
    pos = ar.grid(3, 4)
    q, k, v = (qkv[:, :, i] if layout == "bshd" else qkv[:, :, i].transpose(1, 2) for i in range(3))
    expected = rope(q, k, pos, layout, backend="reference")
    v_before = v.clone()
    out = rope(q, k, pos, layout, backend=backend, inplace=True)
    assert out[0] is q and out[1] is k
    # TOL's absolute and relative parts: bfloat16 results may round to the exact result's neighbour, 1 ulp =
    # 2**-7 of |x|, which an absolute 1.6e-2 alone misses for |x| >= 4
    assert_close(q, expected[0])
    assert_close(k, expected[1])
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_inplace_table_mode_across_chunks_equals_out_of_place(monkeypatch, pairing):
    monkeypatch.setattr(torch_backend, "CHUNK", 40)  # many chunks: each is read before it is written
    cos, sin = ar.AxialRoPE((4, 8), pairing=pairing).cos_sin(ar.grid(3, 4))
    x = torch.randn(2, 4, 12, 16).bfloat16()
    expected = ar.apply_rope(x, cos, sin, pairing, "bhsd", backend="torch")
    assert ar.apply_rope(x, cos, sin, pairing, "bhsd", backend="torch", inplace=True) is x
    assert torch.equal(x, expected)


def test_inplace_records_the_gradient_when_one_is_needed():
    rope = ar.AxialRoPE((4, 4))
    q0, k0, pos = _qk((4, 4), 8, "bshd", torch.float64)
    grads = {}
    for inplace in (False, True):
        leaf = q0.clone().requires_grad_(True)
        q = leaf * 1  # not a leaf: autograd records the in-place write
        out, _ = rope(q, None, pos, inplace=inplace)
        assert (out is q) == inplace
        (out * torch.linspace(-1, 1, 8, dtype=torch.float64)).sum().backward()
        grads[inplace] = leaf.grad
    # an equality, checked in float64: each gradient is the weights (|g| <= 1) rotated back, within 6 u |g| =
    # 1e-15 of the exact one (helpers.TOL); a missing or doubled rotation is off by O(1)
    torch.testing.assert_close(grads[True], grads[False], atol=1e-14, rtol=0)
    with pytest.raises(RuntimeError, match="leaf"):  # PyTorch's own rule for leaves that require grad
        rope(q0.clone().requires_grad_(True), None, pos, inplace=True)


def test_inplace_refuses_broadcast_views_and_q_as_k():
    rope = ar.AxialRoPE((4, 4))
    pos = ar.grid(2, 3)
    with pytest.raises(ValueError, match="broadcast view"):
        rope(torch.randn(1, 6, 1, 8).expand(2, 6, 4, 8), None, pos, inplace=True)
    q = torch.randn(1, 6, 2, 8)
    with pytest.raises(ValueError, match="twice"):
        rope(q, q, pos, inplace=True)
    cos, sin = rope.cos_sin(pos)
    with pytest.raises(ValueError, match="needs x .*broadcast view"):
        ar.apply_rope(torch.randn(1, 6, 1, 8).expand(1, 6, 3, 8), cos, sin, inplace=True)


@pytest.mark.slow
def test_inplace_compiles_fullgraph():
    rope = ar.AxialRoPE((4, 4), backend="torch")

    def fn(q, k, pos):
        rope(q, k, pos, inplace=True)
        return q + 0, k + 0

    q, k, pos = _qk((4, 4), 8, "bshd", torch.float32)
    expected = rope(q, k, pos, backend="reference")
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, pos)
    assert_close(got[0], expected[0]), assert_close(got[1], expected[1])
    assert_close(q, expected[0]), assert_close(k, expected[1])


# -- compile ---------------------------------------------------------------------------


@pytest.mark.slow
def test_torch_backend_compiles_fullgraph():
    rope = ar.AxialRoPE((8, 8, 8), backend="torch")
    q, k, pos = _qk((8, 8, 8), 32, "bshd", torch.float32)
    fn = torch.compile(lambda q, k, pos: rope(q, k, pos), fullgraph=True, backend="aot_eager")
    q_out, k_out = fn(q, k, pos)
    q_ref, k_ref = rope(q, k, pos, backend="reference")
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)


def test_tolerance_table_has_every_dtype():
    assert set(TOL) == set(DTYPES)
