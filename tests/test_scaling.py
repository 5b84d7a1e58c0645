"""Frequency schedules against transformers' ``ROPE_INIT_FUNCTIONS`` and their own formulas.

transformers computes ``inv_freq`` in float32, so the comparison is relative 1e-6 (a few
float32 ulps); the attention factor is plain python arithmetic on both sides (1e-9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import axial_rope as ar
from axial_rope.scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, RIFLEx, YaRN, from_rope_parameters

transformers = pytest.importorskip("transformers")
from helpers import llama_config  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

# transformers forms inv_freq in float32: the exponent 2j / d rounded moves base ** exponent by up to
# ln(base) u, pow (1 ulp: 2 u), the reciprocal, the scaling's blends and divisions (<= 4 u) and the
# float32 result: (ln(base) + 8) u relative, with u = 2**-24 and bases up to 1e6: 1.3e-6
INV_RTOL = (math.log(1e6) + 8) * 2.0**-24
AF_TOL = 1e-9  # attention factors: float64 formulas on both sides, a few ulps of 2**-53


def hf_config(head_dim: int, rope_parameters: dict, max_position_embeddings: int) -> LlamaConfig:
    return llama_config(head_dim, rope_parameters, max_position_embeddings)


def hf_inv_freq(config: LlamaConfig, seq_len: int | None) -> tuple[torch.Tensor, float]:
    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[kind](config, seq_len=seq_len)


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = INV_RTOL) -> None:
    actual, expected = actual.double(), expected.double()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    rel = ((actual - expected).abs() / expected.abs()).max().item()
    assert rel <= rtol, f"max relative error {rel:.3g} > {rtol:g}\nactual={actual}\nexpected={expected}"


def ramp(n: int, lo: float, hi: float) -> list[float]:
    return [lo + (hi - lo) * i / max(n - 1, 1) for i in range(n)]


@dataclass
class Case:
    """One transformers config and the axial_rope method that should reproduce it."""

    id: str
    params: dict  # rope_parameters as a checkpoint's config.json holds them
    method: object  # the axial_rope.scaling method (None = default)
    head_dim: int = 64
    max_pos: int = 4096
    seq_len: int | None = None

    @property
    def dim(self) -> int:
        return int(self.head_dim * self.params.get("partial_rotary_factor", 1.0))


def _yarn(**kw) -> dict:
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024, **kw}


def _llama3(**kw) -> dict:
    base = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "original_max_position_embeddings": 1024}
    return {**base, "low_freq_factor": 1.0, "high_freq_factor": 4.0, **kw}


SHORT, LONG = ramp(32, 1.0, 1.5), ramp(32, 1.0, 12.0)


def _longrope(**kw) -> dict:
    base = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 1024}
    return {**base, "short_factor": SHORT, "long_factor": LONG, **kw}


CASES = [
    Case("default", {"rope_type": "default", "rope_theta": 10000.0}, None),
    Case("default-theta1e6-d128", {"rope_type": "default", "rope_theta": 1e6}, None, head_dim=128),
    Case("linear-2", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, Linear(2.0)),
    Case("linear-8-theta5e5", {"rope_type": "linear", "rope_theta": 500000.0, "factor": 8.0}, Linear(8.0)),
    Case(
        "linear-partial-0.5",
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.5},
        Linear(4.0),
    ),
    Case(
        "dynamic-below-max",
        {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
        DynamicNTK(2.0, 4096),
        seq_len=100,
    ),
    Case(
        "dynamic-at-max",
        {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
        DynamicNTK(2.0, 4096),
        seq_len=4096,
    ),
    Case(
        "dynamic-above-max",
        {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
        DynamicNTK(2.0, 4096),
        seq_len=10000,
    ),
    Case("dynamic-no-seq-len", {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 3.0}, DynamicNTK(3.0, 4096)),
    Case(
        "dynamic-above-max-d128",
        {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 4.0},
        DynamicNTK(4.0, 2048),
        head_dim=128,
        max_pos=2048,
        seq_len=20000,
    ),
    Case("yarn-truncate", _yarn(), YaRN(4.0, 1024)),
    Case("yarn-no-truncate", _yarn(truncate=False), YaRN(4.0, 1024, truncate=False)),
    Case("yarn-factor16-d128", _yarn(factor=16.0, rope_theta=1e6), YaRN(16.0, 1024), head_dim=128, max_pos=16384),
    Case(
        "yarn-mscale-all-dim",
        _yarn(factor=40.0, mscale=1.0, mscale_all_dim=0.707),
        YaRN(40.0, 1024, mscale=1.0, mscale_all_dim=0.707),
        max_pos=40960,
    ),
    Case(
        "yarn-mscale-equal",
        _yarn(factor=40.0, mscale=1.0, mscale_all_dim=1.0),
        YaRN(40.0, 1024, mscale=1.0, mscale_all_dim=1.0),
        max_pos=40960,
    ),
    Case("yarn-attention-factor", _yarn(attention_factor=0.75), YaRN(4.0, 1024, attention_factor=0.75)),
    Case("yarn-beta-16-2", _yarn(beta_fast=16.0, beta_slow=2.0), YaRN(4.0, 1024, beta_fast=16.0, beta_slow=2.0)),
    Case(
        "yarn-beta-64-0.5-no-truncate",
        _yarn(beta_fast=64.0, beta_slow=0.5, truncate=False),
        YaRN(4.0, 1024, beta_fast=64.0, beta_slow=0.5, truncate=False),
    ),
    Case(
        "yarn-partial-0.5",
        _yarn(partial_rotary_factor=0.5),
        YaRN(4.0, 1024),
        head_dim=128,
    ),
    Case("llama3-1-4", _llama3(), Llama3(8.0, 1024, 1.0, 4.0), max_pos=8192),
    Case("llama3-2-8", _llama3(low_freq_factor=2.0, high_freq_factor=8.0), Llama3(8.0, 1024, 2.0, 8.0), max_pos=8192),
    Case(
        "llama3-0.5-2-d128",
        _llama3(factor=32.0, low_freq_factor=0.5, high_freq_factor=2.0, original_max_position_embeddings=8192),
        Llama3(32.0, 8192, 0.5, 2.0),
        head_dim=128,
        max_pos=131072,
    ),
    Case("longrope-short-factor", _longrope(factor=4.0), LongRoPE(SHORT, LONG, 1024, factor=4.0), seq_len=512),
    Case("longrope-long-factor", _longrope(factor=4.0), LongRoPE(SHORT, LONG, 1024, factor=4.0), seq_len=3000),
    Case("longrope-at-original", _longrope(factor=4.0), LongRoPE(SHORT, LONG, 1024, factor=4.0), seq_len=1024),
    Case(
        "longrope-attention-factor",
        _longrope(factor=4.0, attention_factor=1.2),
        LongRoPE(SHORT, LONG, 1024, factor=4.0, attention_factor=1.2),
        seq_len=3000,
    ),
    # without factor transformers uses max_position_embeddings / original: equal lengths -> factor 1
    Case("longrope-no-factor-short", _longrope(), LongRoPE(SHORT, LONG, 1024), max_pos=1024, seq_len=100),
    Case("longrope-no-factor-long", _longrope(), LongRoPE(SHORT, LONG, 1024), max_pos=1024, seq_len=5000),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_inv_freq_matches_transformers(case: Case):
    config = hf_config(case.head_dim, case.params, case.max_pos)
    expected, expected_af = hf_inv_freq(config, case.seq_len)
    inv, af = ar.inv_freq(case.dim, case.params["rope_theta"], case.method, seq_len=case.seq_len)
    assert inv.dtype == torch.float64 and inv.shape == (case.dim // 2,)
    assert isinstance(af, float)
    assert_rel_close(inv, expected)
    assert af == pytest.approx(expected_af, rel=AF_TOL, abs=AF_TOL)


# dynamic needs max_position_embeddings, a config attribute outside rope_parameters (see the xfail below)
ROUND_TRIP = [c for c in CASES if c.params["rope_type"] != "dynamic"]


@pytest.mark.parametrize("case", ROUND_TRIP, ids=lambda c: c.id)
def test_from_rope_parameters_round_trip(case: Case):
    config = hf_config(case.head_dim, case.params, case.max_pos)
    method = from_rope_parameters(config.rope_parameters)  # the standardised dict, extra keys included
    assert method == case.method
    assert from_rope_parameters(case.params) == case.method  # the raw dict too
    expected, expected_af = hf_inv_freq(config, case.seq_len)
    inv, af = ar.inv_freq(case.dim, config.rope_parameters["rope_theta"], method, seq_len=case.seq_len)
    assert_rel_close(inv, expected)
    assert af == pytest.approx(expected_af, rel=AF_TOL, abs=AF_TOL)


def test_from_rope_parameters_legacy_type_key_and_default():
    assert from_rope_parameters({"type": "linear", "factor": 3.0}) == Linear(3.0)
    assert from_rope_parameters({"rope_type": "default", "rope_theta": 1e4}) is None
    assert from_rope_parameters({}) is None
    with pytest.raises(ValueError, match="rope_type 'su'"):
        from_rope_parameters({"rope_type": "su", "factor": 2.0})


MISSING_MAX_POS = [
    # transformers reads config.max_position_embeddings, which is not in rope_parameters
    Case("dynamic", {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}, DynamicNTK(2.0, 4096), seq_len=9000),
    # factor None: transformers uses max_position_embeddings / original_max_position_embeddings (Phi-3, DeepSeek)
    Case(
        "longrope-no-factor-max-4x",
        _longrope(),
        LongRoPE(SHORT, LONG, 1024, factor=4.0),
        max_pos=4096,
        seq_len=3000,
    ),
    Case("yarn-factor-none", _yarn(factor=None), YaRN(4.0, 1024), max_pos=4096),
]


@pytest.mark.parametrize("case", MISSING_MAX_POS, ids=lambda c: c.id)
def test_from_rope_parameters_with_max_position_embeddings(case: Case):
    config = hf_config(case.head_dim, case.params, case.max_pos)
    method = from_rope_parameters(config.rope_parameters, max_position_embeddings=case.max_pos)
    assert method == case.method
    expected, expected_af = hf_inv_freq(config, case.seq_len)
    inv, af = ar.inv_freq(case.dim, case.params["rope_theta"], method, seq_len=case.seq_len)
    assert_rel_close(inv, expected)
    assert af == pytest.approx(expected_af, rel=AF_TOL, abs=AF_TOL)


def test_longrope_without_factor_or_max_position_embeddings_has_no_attention_scaling():
    """``factor=None`` and no ``max_position_embeddings``: no attention scaling (transformers would derive 4.0)."""
    case = MISSING_MAX_POS[1]
    config = hf_config(case.head_dim, case.params, case.max_pos)
    _, expected_af = hf_inv_freq(config, case.seq_len)
    _, af = ar.inv_freq(case.dim, 1e4, from_rope_parameters(case.params), seq_len=case.seq_len)
    assert af == 1.0
    assert expected_af == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(1024)), rel=AF_TOL)


# -- formulas ------------------------------------------------------------------------------


def spectrum(dim: int, theta: float) -> torch.Tensor:
    return torch.tensor([theta ** (-2 * j / dim) for j in range(dim // 2)], dtype=torch.float64)


@pytest.mark.parametrize("dim", [4, 16, 64, 96])
@pytest.mark.parametrize("factor", [1.5, 4.0])
def test_ntk_variants_by_formula(dim: int, factor: float):
    theta = 10000.0
    inv, af = ar.inv_freq(dim, theta, NTK(factor))
    torch.testing.assert_close(inv, spectrum(dim, theta * factor ** (dim / (dim - 2))), rtol=1e-12, atol=0)
    inv_plain, af_plain = ar.inv_freq(dim, theta, NTK(factor, exponent=False))
    torch.testing.assert_close(inv_plain, spectrum(dim, theta * factor), rtol=1e-12, atol=0)
    assert af == af_plain == 1.0
    assert inv[0] == inv_plain[0] == 1.0  # pair 0 never moves
    assert (inv[1:] < inv_plain[1:]).all()  # the d/(d-2) exponent stretches more


def test_ntk_exponent_needs_dim_above_2():
    with pytest.raises(ValueError, match="dim must be > 2"):
        ar.inv_freq(2, 1e4, NTK(2.0))
    inv, _ = ar.inv_freq(2, 1e4, NTK(2.0, exponent=False))
    assert inv.tolist() == [1.0]


def test_ntk_plain_and_linear_match_diffusers():
    """diffusers' ``ntk_factor`` is theta * factor (no exponent) and ``linear_factor`` divides the spectrum."""
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    pos = torch.arange(0, 40, 3, dtype=torch.float64)
    for kwargs, method in (({"ntk_factor": 3.0}, NTK(3.0, exponent=False)), ({"linear_factor": 2.5}, Linear(2.5))):
        cos, sin = embeddings.get_1d_rotary_pos_embed(
            16, pos, theta=10000.0, use_real=True, freqs_dtype=torch.float64, **kwargs
        )
        inv, _ = ar.inv_freq(16, 10000.0, method)
        angles = (pos[:, None] * inv).repeat_interleave(2, dim=-1)
        # float64 on both sides, diffusers' tables rounded to float32 once: within 2**-24
        torch.testing.assert_close(cos.double(), angles.cos(), atol=1e-6, rtol=0)
        torch.testing.assert_close(sin.double(), angles.sin(), atol=1e-6, rtol=0)


def test_linear_by_formula():
    inv, af = ar.inv_freq(32, 500.0, Linear(3.0))
    torch.testing.assert_close(inv, spectrum(32, 500.0) / 3.0, rtol=1e-12, atol=0)
    assert af == 1.0


@pytest.mark.parametrize(("k", "test_length"), [(1, 21), (4, 50), (8, 129)])
def test_riflex_sets_only_pair_k_minus_1(k: int, test_length: int):
    inv, af = ar.inv_freq(16, 10000.0, RIFLEx(k, test_length))
    expected = spectrum(16, 10000.0)
    assert inv[k - 1].item() == pytest.approx(0.9 * 2 * math.pi / test_length, rel=1e-15)
    others = torch.arange(8) != k - 1
    torch.testing.assert_close(inv[others], expected[others], rtol=1e-14, atol=0)
    assert af == 1.0
    # the intrinsic pair completes less than one period over the generated length
    assert inv[k - 1].item() * test_length < 2 * math.pi


def test_riflex_k_beyond_pairs():
    with pytest.raises(ValueError, match="k=9"):
        ar.inv_freq(16, 1e4, RIFLEx(9, 10))


def test_llama3_bands_by_formula():
    """Long wavelengths divided by factor, short ones kept, the blend strictly between."""
    method = Llama3(8.0, 1024, 1.0, 4.0)
    inv, _ = ar.inv_freq(64, 500000.0, method)
    base = spectrum(64, 500000.0)
    wavelen = 2 * math.pi / base
    short, long = wavelen < 1024 / 4.0, wavelen > 1024 / 1.0
    assert short.any() and long.any() and (~short & ~long).any()
    torch.testing.assert_close(inv[short], base[short], rtol=1e-12, atol=0)
    torch.testing.assert_close(inv[long], base[long] / 8.0, rtol=1e-12, atol=0)
    mid = ~short & ~long
    assert ((inv[mid] < base[mid]) & (inv[mid] > base[mid] / 8.0)).all()


# -- every method uses the axis' own dim inside a multi-axis AxialRoPE ------------------------

AXES = (16, 48)
METHODS = {
    "linear": lambda d: Linear(2.0),
    "ntk": lambda d: NTK(2.0),
    "ntk-plain": lambda d: NTK(2.0, exponent=False),
    "dynamic": lambda d: DynamicNTK(2.0, 64),
    "yarn": lambda d: YaRN(4.0, 64, beta_fast=8.0),
    "llama3": lambda d: Llama3(4.0, 256),
    "riflex": lambda d: RIFLEx(3, 20),
    "longrope": lambda d: LongRoPE(ramp(d // 2, 1.0, 2.0), ramp(d // 2, 1.0, 6.0), 64, factor=4.0),
}


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("seq_len", [None, 200], ids=["no-len", "len200"])
def test_each_axis_uses_its_own_dim(name: str, seq_len: int | None):
    make = METHODS[name]
    shared = make(AXES[0]) == make(AXES[1])  # one object for all axes where it can be shared
    scaling = make(AXES[0]) if shared else tuple(make(d) for d in AXES)
    rope = ar.AxialRoPE(AXES, theta=(10000.0 if shared else (10000.0, 10000.0)), scaling=scaling)
    freqs, scale = rope.frequencies(seq_len)
    assert freqs.shape == (2, sum(AXES) // 2) and scale.shape == (sum(AXES) // 2,)
    col = 0
    for axis, dim in enumerate(AXES):
        inv, af = ar.inv_freq(dim, 10000.0, make(dim), seq_len=seq_len)
        cols = slice(col, col + dim // 2)
        torch.testing.assert_close(freqs[axis, cols], inv, rtol=1e-15, atol=0)
        assert (freqs[1 - axis, cols] == 0).all()  # axial: one non-zero per column
        torch.testing.assert_close(scale[cols], torch.full((dim // 2,), af, dtype=torch.float64))
        col += dim // 2
    # the exponent really differs per axis (a method applied with the total width would not match)
    if name in ("ntk", "yarn", "llama3"):
        wrong, _ = ar.inv_freq(sum(AXES), 10000.0, make(sum(AXES)), seq_len=seq_len)
        assert not torch.allclose(freqs[0, : AXES[0] // 2], wrong[: AXES[0] // 2])


def test_ntk_multi_axis_example_from_the_brief():
    freqs, _ = ar.AxialRoPE((16, 48), scaling=NTK(2)).frequencies()
    torch.testing.assert_close(freqs[0, :8], ar.inv_freq(16, 10000.0, NTK(2))[0], rtol=1e-15, atol=0)
    torch.testing.assert_close(freqs[1, 8:], ar.inv_freq(48, 10000.0, NTK(2))[0], rtol=1e-15, atol=0)
    torch.testing.assert_close(freqs[0, :8], spectrum(16, 10000.0 * 2 ** (16 / 14)), rtol=1e-12, atol=0)
    torch.testing.assert_close(freqs[1, 8:], spectrum(48, 10000.0 * 2 ** (48 / 46)), rtol=1e-12, atol=0)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("theta", [0.0, -10.0, float("nan"), float("inf")], ids=["zero", "negative", "nan", "inf"])
def test_non_positive_theta(theta: float):
    with pytest.raises(ValueError, match="theta"):
        ar.inv_freq(16, theta)
    with pytest.raises(ValueError, match="theta"):
        ar.inv_freq(16, theta, Linear(2.0))
    with pytest.raises(ValueError, match="theta"):
        ar.AxialRoPE((16, 16), theta=theta)


@pytest.mark.parametrize(
    "make",
    [
        lambda f: Linear(f),
        lambda f: NTK(f),
        lambda f: DynamicNTK(f, 1024),
        lambda f: YaRN(f, 1024),
        lambda f: Llama3(f, 1024),
        lambda f: YaRN(2.0, 1024, attention_factor=f),
        lambda f: LongRoPE([1.0, f], [1.0, 1.0], 1024),
        lambda f: LongRoPE([1.0, 1.0], [1.0, 1.0], 1024, factor=f),
    ],
    ids=["linear", "ntk", "dynamic", "yarn", "llama3", "yarn-attention-factor", "longrope-short", "longrope-factor"],
)
@pytest.mark.parametrize("factor", [0.0, -2.0], ids=["zero", "negative"])
def test_non_positive_factor(make, factor: float):
    with pytest.raises(ValueError, match=r"factor.*must be a finite number > 0, got -?[0-9.]+"):
        make(factor)


@pytest.mark.parametrize("dim", [15, 0, -4, 2.0], ids=["odd", "zero", "negative", "float"])
def test_bad_dim(dim):
    with pytest.raises(ValueError, match=f"dim must be a positive even int, got {dim}"):
        ar.inv_freq(dim)
    with pytest.raises(ValueError, match="dim"):
        ar.inv_freq(dim, 1e4, Linear(2.0))


def test_odd_axes_dim_in_axial_rope():
    with pytest.raises(ValueError, match=r"axes_dim must be positive even ints.*\(16, 15\)"):
        ar.AxialRoPE((16, 15))


@pytest.mark.parametrize(
    "scaling",
    ["yarn", {"rope_type": "linear", "factor": 2.0}, 2.0, [Linear(2.0)]],
    ids=["string", "dict", "number", "list"],
)
def test_wrong_scaling_type(scaling):
    with pytest.raises(TypeError, match="scaling must be None or"):
        ar.inv_freq(16, 1e4, scaling)


def test_wrong_scaling_type_in_axial_rope():
    with pytest.raises(TypeError, match="scaling"):
        ar.AxialRoPE((16, 16), scaling=("yarn", None))
    with pytest.raises(ValueError, match="scaling has 3 entries"):
        ar.AxialRoPE((16, 16), scaling=(None, None, None))


def test_longrope_factor_list_of_wrong_length():
    method = LongRoPE([1.0] * 8, [2.0] * 7, 1024)
    ar.inv_freq(16, 1e4, method, seq_len=100)  # short list fits the 8 pairs
    with pytest.raises(ValueError, match=r"long_factor has 7 entries, the axis has dim // 2 = 8 pairs"):
        ar.inv_freq(16, 1e4, method, seq_len=5000)
    with pytest.raises(ValueError, match=r"short_factor has 8 entries.*= 12 pairs"):
        ar.inv_freq(24, 1e4, method)
    with pytest.raises(ValueError, match="short_factor has 8 entries"):
        ar.AxialRoPE((16, 24), scaling=method)  # fits the first axis, not the second


def test_bad_seq_len():
    for seq_len in (0, -5, 1.5):
        with pytest.raises(ValueError, match="seq_len"):
            ar.inv_freq(16, 1e4, DynamicNTK(2.0, 64), seq_len=seq_len)


def test_llama3_factor_order_checked():
    with pytest.raises(ValueError, match="high_freq_factor"):
        Llama3(8.0, 1024, low_freq_factor=4.0, high_freq_factor=1.0)


def test_riflex_k_must_be_int():
    with pytest.raises(TypeError, match="k must be an int"):
        RIFLEx(2.5, 10)
