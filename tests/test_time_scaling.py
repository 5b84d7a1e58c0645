"""Time-dependent scaling (axial_rope.time_scaling): DyPE and Lumina-Next's time-aware NTK.

The formulas are checked against direct float64 transcriptions (python ``math``, pair by pair), the
rope against its own per-axis spectra, compiled graphs against recompilation, and the diffusers
adapter against the stock model (t = 0) and the static method (kappa(t) = 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch
from conventions_support import float32_angle_bound
from helpers import assert_close

import axial_rope as ar
from axial_rope.rope import TimedRoPE
from axial_rope.scaling import NTK, Linear, RIFLEx, YaRN, from_dict
from axial_rope.time_scaling import DyPE, TimeAwareNTK, inv_freq_at

TIMES = [1.0, 0.9, 0.7071067811865476, 0.5, 0.25, 0.1, 0.0]


def f0(d: int, theta: float) -> list[float]:
    return [theta ** (-2 * j / d) for j in range(d // 2)]


def close(actual: torch.Tensor, expected: list[float], rtol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=0)


# -- formulas against float64 transcriptions --------------------------------------------------


@pytest.mark.parametrize("t", TIMES)
@pytest.mark.parametrize("lambdas", [(2.0, 2.0), (1.0, 1.0), (3.0, 0.5)])
def test_dype_linear_and_ntk_by_formula(t: float, lambdas):
    d, theta, s = 16, 100.0, 3.0
    kappa = lambdas[0] * t ** lambdas[1]
    linear = DyPE(s, 64, method="linear", lambda_s=lambdas[0], lambda_t=lambdas[1])
    close(inv_freq_at(d, theta, linear, t)[0], [f / s**kappa for f in f0(d, theta)])
    for exponent in (True, False):
        ntk = DyPE(s, 64, method="ntk", lambda_s=lambdas[0], lambda_t=lambdas[1], exponent=exponent)
        base = theta * s ** (kappa * (d / (d - 2) if exponent else 1.0))
        inv, factor = inv_freq_at(d, theta, ntk, t)
        close(inv, f0(d, base))
        assert factor == 1.0


def test_dype_ntk_is_the_authors_rule():
    # guyyariv/DyPE flux/transformer_flux.py: ntk_factor = base_ntk ** (2 t^2), base_ntk = s ** (d / (d - 2))
    d, theta, s = 56, 10000.0, 4.0
    for t in TIMES:
        theirs = theta * (s ** (d / (d - 2))) ** (2.0 * t**2.0)
        close(inv_freq_at(d, theta, DyPE(s, 64, method="ntk"), t)[0], f0(d, theirs), rtol=1e-11)


def dy_yarn(d: int, theta: float, s: float, length: int, kappa: float, fast=32.0, slow=1.0, truncate=True):
    """Dy-YaRN pair by pair: YaRN's ramp with both thresholds times kappa, low clipped to [0, d - 1]."""
    if kappa == 0:
        return f0(d, theta)

    def pair_index(turns):
        return d * math.log(length / (turns * kappa * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_index(fast), pair_index(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = min(max(low, 0), d - 1), min(high, d - 1)
    high = high + 0.001 if high == low else high
    out = []
    for j, f in enumerate(f0(d, theta)):
        ramp = min(max((j - low) / (high - low), 0.0), 1.0)
        out.append(f / s * ramp + f * (1 - ramp))
    return out


@pytest.mark.parametrize("t", TIMES)
@pytest.mark.parametrize("truncate", [True, False])
def test_dype_yarn_by_formula(t: float, truncate: bool):
    d, theta, s, length = 56, 10000.0, 4.0, 64
    method = DyPE(s, length, truncate=truncate)
    inv, factor = inv_freq_at(d, theta, method, t)
    close(inv, dy_yarn(d, theta, s, length, 2.0 * t**2, truncate=truncate), rtol=1e-9)
    assert factor == pytest.approx(0.1 * math.log(s) + 1)  # YaRN's, fixed in time


@pytest.mark.parametrize(
    "dype, static",
    [
        (DyPE(3.0, 64, method="linear"), Linear(3.0)),
        (DyPE(3.0, 64, method="ntk"), NTK(3.0)),
        (DyPE(3.0, 64, method="ntk", exponent=False), NTK(3.0, exponent=False)),
        (DyPE(3.0, 64), YaRN(3.0, 64)),
        (DyPE(8.0, 4096, beta_fast=16, beta_slow=2, attention_factor=1.3, truncate=False),
         YaRN(8.0, 4096, beta_fast=16, beta_slow=2, attention_factor=1.3, truncate=False)),
    ],
)  # fmt: skip
def test_dype_is_its_static_method_at_kappa_one_and_unscaled_at_zero(dype: DyPE, static):
    d, theta = 32, 10000.0
    inv, factor = inv_freq_at(d, theta, dataclasses.replace(dype, lambda_s=1.0), 1.0)  # kappa(1) = lambda_s
    expected, expected_factor = ar.inv_freq(d, theta, static)
    torch.testing.assert_close(inv, expected, rtol=1e-14, atol=0)
    assert factor == expected_factor
    at_zero, _ = inv_freq_at(d, theta, dype, 0.0)
    torch.testing.assert_close(at_zero, ar.inv_freq(d, theta)[0], rtol=1e-15, atol=0)


def lumina(head_dim: int, theta: float, s: float, tau: float) -> list[float]:
    """Lumina-Next's NextDiT.precompute_freqs_cis, one axis of its 2-D RoPE (tau: 0 = noise, 1 = clean)."""
    inter = [theta ** (-(4 * j) / head_dim) / s for j in range(head_dim // 4)]
    target_dim = tau * head_dim + 1
    grown = theta * s ** (head_dim / target_dim)
    timed = [grown ** (-(4 * j) / head_dim) for j in range(head_dim // 4)]
    return [max(a, b) for a, b in zip(inter, timed)]


@pytest.mark.parametrize("t", TIMES)
def test_time_aware_ntk_is_lumina_next(t: float):
    d, theta, s = 32, 10000.0, 2.0
    inv, factor = inv_freq_at(d, theta, TimeAwareNTK(s, head_dim=2 * d), t)
    close(inv, lumina(2 * d, theta, s, 1 - t))
    assert factor == 1.0
    # head_dim=None: the same rule with the axis' own width d in place of Lumina's head dim
    own = [max(f / s, (theta * s ** (d / ((1 - t) * d + 1))) ** (-2 * j / d)) for j, f in enumerate(f0(d, theta))]
    close(inv_freq_at(d, theta, TimeAwareNTK(s), t)[0], own)


@pytest.mark.parametrize("t", TIMES)
def test_time_aware_ntk_watershed_switches_as_diffusers_lumina(t: float):
    # diffusers LuminaText2ImgPipeline: linear_factor = s while 1 - t < watershed, then ntk_factor = s
    d, theta, s, watershed = 16, 10000.0, 2.0, 0.3
    inv, _ = inv_freq_at(d, theta, TimeAwareNTK(s, watershed=watershed), t)
    expected = [f / s for f in f0(d, theta)] if 1 - t < watershed else f0(d, theta * s)
    close(inv, expected)


# -- the rope: per axis, per call, bound per step ----------------------------------------------


def per_axis_rope():
    scaling = (RIFLEx(2, 12), DyPE(3.0, 8, method="ntk"), TimeAwareNTK(2.0, watershed=0.5))
    return ar.AxialRoPE((8, 12, 12), theta=(256.0, 100.0, 100.0), scaling=scaling)


@pytest.mark.parametrize("t", [1.0, 0.6, 0.3, 0.0])
def test_each_axis_follows_its_own_method(t: float):
    rope = per_axis_rope()
    freqs, scale = rope.frequencies(t=t)
    assert freqs.shape == (3, 16) and torch.equal(scale, torch.ones(16, dtype=torch.float64))
    torch.testing.assert_close(freqs[0, :4], ar.inv_freq(8, 256.0, RIFLEx(2, 12))[0], rtol=0, atol=0)
    torch.testing.assert_close(freqs[1, 4:10], inv_freq_at(12, 100.0, rope.scaling[1], t)[0], rtol=0, atol=0)
    torch.testing.assert_close(freqs[2, 10:], inv_freq_at(12, 100.0, rope.scaling[2], t)[0], rtol=0, atol=0)
    assert int((freqs != 0).sum()) == 16  # one axis per plane
    model = ar.frequencies.Frequencies.from_spectrum((8, 12, 12), (256.0, 100.0, 100.0), rope.scaling, t=t)
    assert torch.equal(model.freqs, freqs)


def test_rotation_at_t_equals_the_fixed_frequencies_of_t():
    rope = per_axis_rope()
    # an equality, in float64: the two compute F(t) on other paths (a last-bit difference, |angle| < 10 rad:
    # 1e-15 rad) and may rotate with other kernels (6 u |z| each, helpers.TOL): within TOL's float64 row
    q, k = torch.randn(2, 30, 2, 40, dtype=torch.float64), torch.randn(2, 30, 2, 40, dtype=torch.float64)
    pos = ar.grid(2, 3, 5)
    for t in (1.0, 0.4, 0.0):
        fixed = ar.AxialRoPE.from_frequencies(ar.Frequencies(*rope.frequencies(t=t)))
        expected = fixed(q, k, pos)
        for given in (t, torch.tensor(t), torch.full((2,), t, dtype=torch.float64)):  # number, 0-d, [B]
            out = rope(q, k, pos, t=given)
            if isinstance(given, float) or given.dtype == torch.float64:
                assert_close(out[0], expected[0])
                assert_close(out[1], expected[1])
                continue
            # a float32 t: F(t) follows t's dtype, so float32 angles (within float32_angle_bound of
            # sum |pos_a F_a|), each plane moved by that times |a| + |b| <= 2 max |x|
            angle = pos.double().abs() @ rope.frequencies(t=t)[0].abs()
            tol = 2 * float(q.abs().max()) * float(float32_angle_bound(angle.max()))
            torch.testing.assert_close(out[0], expected[0], atol=tol, rtol=0)
            torch.testing.assert_close(out[1], expected[1], atol=tol, rtol=0)
        timed = rope.at_time(torch.tensor(t, dtype=torch.float64))  # float64: F(t) itself (float32 t: above)
        assert isinstance(timed, TimedRoPE) and timed.rot_dim == rope.rot_dim
        assert_close(timed(q, k, pos)[0], expected[0])
        # F(t) computed on the same path as rope.frequencies(t=t), through the same table code: equal
        torch.testing.assert_close(timed.cos_sin(pos)[0], fixed.cos_sin(pos)[0], rtol=0, atol=0)
        w = torch.rand(40, dtype=torch.float64) + 0.5
        assert_close(timed.norm_and_rotate(q, k, pos, w, w)[0], fixed.norm_and_rotate(q, k, pos, w, w)[0])


def test_attention_factor_and_split_spectrum():
    rope = ar.AxialRoPE((16, 16), scaling=DyPE(4.0, 32), spectrum="split")
    assert rope.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    freqs, scale = rope.frequencies(t=0.5)
    torch.testing.assert_close(freqs.sum(0), inv_freq_at(32, 10000.0, DyPE(4.0, 32), 0.5)[0], rtol=0, atol=0)
    cos, _ = rope.cos_sin(torch.zeros(1, 2), t=0.5)
    torch.testing.assert_close(cos, torch.full((1, 32), rope.attention_factor), rtol=1e-6, atol=0)  # float32: 6e-8
    assert torch.all(scale == rope.attention_factor)


def test_ropes_without_time_ignore_t_and_at_time_returns_them():
    rope = ar.AxialRoPE((8, 8), scaling=NTK(2.0))
    q, pos = torch.randn(1, 6, 1, 16), ar.grid(2, 3)
    assert rope.at_time(0.3) is rope and not rope.time_dependent
    assert torch.equal(rope(q, q, pos, t=0.3)[0], rope(q, q, pos)[0])


def test_serialisation_round_trip():
    methods = [DyPE(4.0, 64, method="ntk", exponent=False, lambda_s=1.5), DyPE(2.0, 128, beta_fast=16.0),
               TimeAwareNTK(2.0, head_dim=64, watershed=0.3), TimeAwareNTK(3.0)]  # fmt: skip
    for method in methods:
        back = from_dict(json.loads(json.dumps(method.to_dict())))
        assert back == method and hash(back) == hash(method)
        rope = ar.AxialRoPE((8, 8), scaling=(None, method.to_dict()))
        assert rope.scaling == (None, method) and rope.time_dependent


# -- no recompilation per step ---------------------------------------------------------------------


class Compiles:
    """A torch.compile backend (aot_eager underneath) that counts the graphs it is given."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        self.count += 1
        return aot_eager(gm, example_inputs)


def test_rope_call_compiles_once_for_every_t():
    torch._dynamo.reset()
    rope = ar.AxialRoPE((8, 12, 12), scaling=(None, DyPE(3.0, 8), DyPE(3.0, 8, method="ntk")))
    # float64: the compiled graph may rotate with other kernels (helpers.TOL's float64 row)
    q, k = torch.randn(1, 20, 2, 32, dtype=torch.float64), torch.randn(1, 20, 2, 32, dtype=torch.float64)
    pos = ar.grid(1, 4, 5)
    backend = Compiles()
    step = torch.compile(lambda q, k, pos, t: rope(q, k, pos, t=t), backend=backend, fullgraph=True)
    outputs = []
    for t in (1.0, 0.8, 0.5, 0.2, 0.0):
        t = torch.tensor(t)
        out = step(q, k, pos, t)
        assert_close(out[0], rope(q, k, pos, t=t)[0])
        outputs.append(out[0])
    assert backend.count == 1
    assert all((a - b).abs().max() > 1e-4 for a, b in zip(outputs, outputs[1:]))  # t reaches the graph


def test_attention_with_a_rope_bound_per_step_compiles_once():
    # a sampler's step: rope.at_time(t) passed as rope= to the attention (as DiTBlock passes it on)
    torch._dynamo.reset()
    rope = ar.AxialRoPE((8, 8), scaling=(DyPE(2.0, 4), TimeAwareNTK(2.0)))
    attention = ar.Attention(32, 2, rope, qk_norm="rms").eval().double()  # float64: an equality
    x, pos = torch.randn(2, 12, 32, dtype=torch.float64), ar.grid(3, 4)
    backend = Compiles()

    def step(x, pos, t):
        return attention(x, pos, rope=rope.at_time(t))

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    with torch.no_grad():
        for t in (1.0, 0.75, 0.5, 0.25, 0.0):
            t = torch.tensor(t)
            # one attention layer, other summation orders: helpers.chain_bound(U64, 64, 5) = 3e-13
            torch.testing.assert_close(compiled(x, pos, t), step(x, pos, t), rtol=1e-10, atol=1e-10)
    assert backend.count == 1


# -- diffusers: the time read from each forward's timestep -------------------------------------


def tiny_flux():
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6),
    ).eval()  # fmt: skip
    h, w = 4, 6
    inputs = dict(
        hidden_states=torch.randn(2, h * w, 4), encoder_hidden_states=torch.randn(2, 5, 32),
        pooled_projections=torch.randn(2, 32), img_ids=ar.grid(1, h, w), txt_ids=torch.zeros(5, 3),
        return_dict=False,
    )  # fmt: skip
    from test_integrations_diffusers import _double

    return _double(model, inputs)


def run(model, inputs, timestep):
    with torch.no_grad():
        return model(**inputs, timestep=timestep)[0]


def test_flux_reads_sigma_from_its_timestep():
    from test_integrations_diffusers import TOL as STOCK_TOL

    from axial_rope.integrations.diffusers import set_rope_processors

    model, inputs = tiny_flux()
    zero, one = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    stock = run(model, inputs, zero)
    static = {}
    for method in ("ntk", "linear"):
        set_rope_processors(model, scaling=(None, NTK(3.0) if method == "ntk" else Linear(3.0), None))
        static[method] = run(model, inputs, one)
    for method in ("ntk", "linear"):
        dype = DyPE(3.0, 4, method=method, lambda_s=1.0)
        handle = set_rope_processors(model, scaling=(None, dype, None))
        # t = 0: unscaled, against stock (STOCK_TOL: upstream's float32 tables, test_integrations_diffusers)
        torch.testing.assert_close(run(model, inputs, zero), stock, rtol=STOCK_TOL, atol=STOCK_TOL)
        # the full factor: ours against ours, float64 frequencies a last bit apart: within 1e-10
        torch.testing.assert_close(run(model, inputs, one), static[method], rtol=1e-10, atol=1e-10)
        assert run(model, inputs, torch.full((2,), 0.5, dtype=torch.float64)).sub(stock).abs().max() > 1e-5
        handle.remove()


@pytest.mark.parametrize("family", ["flux", "hunyuan_video", "wan", "cogvideox"])
def test_each_family_maps_its_timestep_to_t(family: str):
    # pure noise (Flux: timestep 1; the others: 1000) gives the static factor, timestep 0 the stock model
    pytest.importorskip("diffusers")
    from test_integrations_diffusers import MODELS, _double
    from test_integrations_diffusers import TOL as STOCK_TOL

    from axial_rope.integrations.diffusers import set_rope_processors

    model, inputs = _double(*MODELS[family]())
    model.eval()
    batch, noise = inputs["hidden_states"].shape[0], 1.0 if family == "flux" else 1000.0

    def out(timestep: float) -> torch.Tensor:
        with torch.no_grad():
            return model(**(inputs | {"timestep": torch.full((batch,), timestep, dtype=torch.float64)}))[0]

    stock = out(0.0)
    set_rope_processors(model, scaling=(None, Linear(2.0), None))
    static = out(noise)
    set_rope_processors(model, scaling=(None, DyPE(2.0, 4, method="linear", lambda_s=1.0), None))
    torch.testing.assert_close(out(0.0), stock, rtol=STOCK_TOL, atol=STOCK_TOL)  # as above
    torch.testing.assert_close(out(noise), static, rtol=1e-10, atol=1e-10)


def test_video_families_divide_the_timestep_by_1000():
    diffusers = pytest.importorskip("diffusers")
    from test_integrations_diffusers import _double

    from axial_rope.integrations.diffusers import set_rope_processors

    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=32, ffn_dim=32, num_layers=1, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()  # fmt: skip
    inputs = dict(hidden_states=torch.randn(2, 4, 3, 4, 6), encoder_hidden_states=torch.randn(2, 5, 16))
    model, inputs = _double(model, inputs)  # float64: ours against ours, frequencies a last bit apart
    # t = 500 / 1000 = 1/2 and kappa = 4 t^2 = 1, the static factor: both exact in the float32 time buffer
    timestep = torch.tensor([500.0] * 2, dtype=torch.float64)

    def out():
        with torch.no_grad():
            return model(**inputs, timestep=timestep, return_dict=False)[0]

    set_rope_processors(model, scaling=(Linear(2.0), None, None))
    static = out()
    dype = DyPE(2.0, 3, method="linear", lambda_s=4.0)
    set_rope_processors(model, scaling=(dype, None, None))
    torch.testing.assert_close(out(), static, rtol=1e-10, atol=1e-10)
    set_rope_processors(model, scaling=(dype, None, None), noise_timestep=2000.0)
    assert out().sub(static).abs().max() > 1e-5  # t halved


def test_time_errors_are_clear():
    from axial_rope.integrations.diffusers import set_rope_processors

    rope = ar.AxialRoPE((8, 8), scaling=(None, DyPE(2.0, 4)))
    q, pos = torch.randn(1, 6, 1, 16), ar.grid(2, 3)
    with pytest.raises(ValueError, match=r"depends on the sampling time: pass t="):
        rope(q, q, pos)
    with pytest.raises(ValueError, match=r"pass t="):
        rope.frequencies()
    with pytest.raises(ValueError, match=r"noise level in \[0, 1\].*1000 t"):
        rope(q, q, pos, t=500.0)
    with pytest.raises(ValueError, match=r"noise level in \[0, 1\]"):
        rope(q, q, pos, t=torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="one time per call"):
        rope(q, q, pos, t=torch.tensor([0.5, 0.25]))
    with pytest.raises(TypeError, match="depends on the sampling time t"):
        ar.inv_freq(8, 10000.0, DyPE(2.0, 4))
    with pytest.raises(ValueError, match="learnable"):
        ar.AxialRoPE((8, 8), scaling=DyPE(2.0, 4), learnable=True)
    with pytest.raises(ValueError, match="method must be one of"):
        DyPE(2.0, 4, method="vision_yarn")
    with pytest.raises(ValueError, match=r"\['beta_fast'\] do\(es\) not apply to method='ntk'"):
        DyPE(2.0, 4, method="ntk", beta_fast=16.0)
    with pytest.raises(ValueError, match="factor=0.5 < 1"):
        TimeAwareNTK(0.5)
    with pytest.raises(ValueError, match="theta must be > 1"):
        ar.AxialRoPE(8, theta=1.0, scaling=DyPE(2.0, 4))  # checked when built, not mid-sampling
    model, inputs = tiny_flux()
    with pytest.raises(ValueError, match="noise_timestep"):
        set_rope_processors(model, scaling=NTK(2.0), noise_timestep=1000.0)
    set_rope_processors(model, scaling=(None, DyPE(2.0, 4), DyPE(2.0, 4)))
    with pytest.raises(ValueError, match="reads each forward's `timestep`"):
        model(**inputs)


def test_docs_scaling_examples_run():
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "scaling.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert any("at_time" in block for block in blocks)
    for block in blocks:
        exec(compile(block, "docs/scaling.md:example", "exec"), {})
