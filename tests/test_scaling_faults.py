"""Scaling methods: serialisation through REGISTRY, rejected parameters, and transformers' config rules.

The rules are the ones listed in docs/scaling.md ("Validation rules"); where transformers
accepts a value the expected frequencies come from its ``ROPE_INIT_FUNCTIONS``.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import MISSING, dataclass, fields

import pytest
import torch

import axial_rope as ar
from axial_rope.scaling import (
    NTK,
    REGISTRY,
    DynamicNTK,
    Linear,
    Llama3,
    LongRoPE,
    RIFLEx,
    Scaling,
    YaRN,
    from_dict,
    from_rope_parameters,
)

INV_RTOL = (math.log(1e6) + 8) * 2.0**-24  # transformers computes in float32: the bound in tests/test_scaling.py

# -- every method in REGISTRY round-trips through to_dict / from_dict / JSON --------------------

# one valid value per annotation; a method with another field type needs an entry here
GENERIC = {"float": 1.25, "int": 4096, "bool": False, "tuple[float, ...]": [1.0, 1.5, 2.0]}
FIELDS = {"watershed": 0.5}  # fields with a narrower range than their annotation's (TimeAwareNTK: a time in (0, 1])


def example(cls: type[Scaling], *, optional: bool) -> Scaling:
    """``cls`` with its required fields set (and, if ``optional``, its ``None`` fields too)."""
    values = {}
    for f in fields(cls):
        if f.default is MISSING or (optional and f.default is None):
            values[f.name] = FIELDS.get(f.name, GENERIC[f.type.split(" | ")[0]])
    return cls(**values)


EXAMPLES = [
    (f"{kind}-{opt}", example(cls, optional=opt == "all"))
    for kind, cls in REGISTRY.items()
    for opt in ("required", "all")
]
EXAMPLES += [
    ("ntk-plain", NTK(3, exponent=False)),
    ("yarn-full", YaRN(40.0, 1024, beta_fast=16, beta_slow=2.0, mscale=0.0, mscale_all_dim=0.707, truncate=False)),
    ("llama3-custom", Llama3(32.0, 8192, 0.5, 2.0)),
    ("longrope-ints", LongRoPE([1, 2], (3, 4.5), 4096, factor=4)),
    ("dynamic", DynamicNTK(2.0, 64)),
    ("riflex", RIFLEx(4, 40)),
]


@pytest.mark.parametrize("method", [m for _, m in EXAMPLES], ids=[i for i, _ in EXAMPLES])
def test_round_trip_exact(method: Scaling):
    data = method.to_dict()
    assert data["rope_type"] == method.rope_type and REGISTRY[method.rope_type] is type(method)
    before = json.dumps(data)
    back = from_dict(data)
    assert json.dumps(data) == before  # the input is not modified
    assert type(back) is type(method) and back == method and hash(back) == hash(method)
    via_json = json.loads(json.dumps(data))
    assert from_dict(via_json) == method and from_dict(via_json).to_dict() == data
    # from_rope_parameters reads the same dict (plus transformers' extra keys) through the same REGISTRY
    assert from_rope_parameters(via_json | {"rope_theta": 1e4, "partial_rotary_factor": 1.0}) == method


@pytest.mark.parametrize("kind", list(REGISTRY))
def test_from_dict_names_unknown_and_missing_keys(kind: str):
    data = example(REGISTRY[kind], optional=False).to_dict()
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['bogus'\]; valid keys are \[.*'\w+'"):
        from_dict(data | {"bogus": 1})
    for f in fields(REGISTRY[kind]):
        if f.default is MISSING:
            with pytest.raises(ValueError, match=f"missing required field.*'{f.name}'"):
                from_dict({k: v for k, v in data.items() if k != f.name})


@pytest.mark.parametrize("data", [{"rope_type": "nope", "factor": 2.0}, {"factor": 2.0}, ["linear"]])
def test_from_dict_unknown_rope_type(data):
    with pytest.raises(ValueError, match="rope_type"):
        from_dict(data)


def test_a_new_method_is_one_class():
    """Subclassing registers it: from_dict, to_dict, from_rope_parameters and the field checks follow."""

    @dataclass(frozen=True)
    class Shift(Scaling):
        rope_type = "test-shift"
        factor: float
        steps: int = 1

        def __call__(self, dim, theta, seq_len):
            return ar.scaling.base_inv_freq(dim, theta) / self.factor, 1.0

    try:
        assert from_dict(json.loads(json.dumps(Shift(2.0, 3).to_dict()))) == Shift(2.0, 3)
        assert from_rope_parameters({"rope_type": "test-shift", "factor": 2.0, "rope_theta": 1e4}) == Shift(2.0)
        with pytest.raises(TypeError, match="steps must be an int"):
            Shift(2.0, 1.5)
    finally:
        del REGISTRY["test-shift"]


# -- bad parameters ------------------------------------------------------------------------------


def test_yarn_beta_order():
    with pytest.raises(ValueError, match=r"beta_fast \(1.0\) must be >= beta_slow \(32.0\)"):
        YaRN(4.0, 1024, beta_fast=1.0, beta_slow=32.0)
    YaRN(4.0, 1024, beta_fast=8.0, beta_slow=8.0)  # equal: a zero-width ramp, which transformers widens


@pytest.mark.parametrize("name", ["mscale", "mscale_all_dim"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), "1"])
def test_yarn_mscale_must_be_a_number_at_least_zero(name: str, value):
    with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0"):
        YaRN(4.0, 1024, **{name: value})


def test_yarn_mscale_zero_means_unset_as_in_transformers():
    method = YaRN(40.0, 1024, mscale=0.0, mscale_all_dim=0.707)
    assert method.attention_scale() == pytest.approx(0.1 * math.log(40.0) + 1.0, rel=1e-12)
    expected_inv, expected_af = hf(64, {"rope_type": "yarn", **method.to_dict()}, 40960)
    inv, af = ar.inv_freq(64, 1e4, method)
    assert_rel_close(inv, expected_inv)
    assert af == pytest.approx(expected_af, rel=1e-9)


# factor < 1: transformers' _validate_{linear,dynamic,yarn,longrope,llama3}_rope_parameters only log a warning
WARN_BELOW_ONE = {
    "linear": lambda f: Linear(f),
    "dynamic": lambda f: DynamicNTK(f, 64),
    "yarn": lambda f: YaRN(f, 1024),
    "llama3": lambda f: Llama3(f, 1024),
    "longrope": lambda f: LongRoPE([1.0] * 32, [2.0] * 32, 1024, factor=f),
}


@pytest.mark.parametrize("kind", list(WARN_BELOW_ONE))
def test_factor_below_one_warns_where_transformers_warns(kind: str):
    with pytest.warns(UserWarning, match=r"factor=0.5 < 1"):
        method = WARN_BELOW_ONE[kind](0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WARN_BELOW_ONE[kind](1.0)  # factor 1: no warning
    # transformers computes with it; so do we, to the same frequencies
    params = {k: v for k, v in method.to_dict().items() if k != "max_position_embeddings"}
    expected_inv, expected_af = hf(64, params | {"rope_theta": 1e4}, 64 if kind == "dynamic" else 4096, seq_len=100)
    inv, af = ar.inv_freq(64, 1e4, method, seq_len=100)
    assert_rel_close(inv, expected_inv)
    assert af == pytest.approx(expected_af, rel=1e-9)


@pytest.mark.parametrize("exponent", [True, False])
def test_ntk_factor_below_one_is_an_error(exponent: bool):
    with pytest.raises(ValueError, match=r"NTK: factor=0.5 < 1"):
        NTK(0.5, exponent=exponent)


@pytest.mark.parametrize(
    "make",
    [lambda v: NTK(2.0, exponent=v), lambda v: YaRN(4.0, 1024, truncate=v)],
    ids=["ntk-exponent", "yarn-truncate"],
)
@pytest.mark.parametrize("value", ["yes", 1, 0, None], ids=["str", "one", "zero", "none"])
def test_flags_must_be_bool(make, value):
    with pytest.raises(TypeError, match="must be a bool"):
        make(value)


@pytest.mark.parametrize("theta", [1.0, 0.5])
@pytest.mark.parametrize(
    "method",
    [YaRN(4.0, 1024), NTK(2.0), NTK(2.0, exponent=False), DynamicNTK(2.0, 64)],
    ids=["yarn", "ntk", "ntk-plain", "dynamic"],
)
def test_theta_must_exceed_one_for_log_and_base_growth(method: Scaling, theta: float):
    with pytest.raises(ValueError, match=r"theta must be > 1"):
        ar.inv_freq(16, theta, method, seq_len=200)
    ar.inv_freq(16, theta, Linear(2.0))  # only theta > 0 is needed without a log or a grown base


def test_longrope_original_length_one_divides_by_log_zero():
    with pytest.raises(ValueError, match="original_max_position_embeddings must be an int >= 2"):
        LongRoPE([1.0], [1.0], 1, factor=2.0)


INT_FIELDS = [(kind, f.name) for kind, cls in REGISTRY.items() for f in fields(cls) if f.type == "int"]


@pytest.mark.parametrize(("kind", "name"), INT_FIELDS, ids=[f"{k}.{n}" for k, n in INT_FIELDS])
def test_int_fields(kind: str, name: str):
    cls = REGISTRY[kind]
    data = example(cls, optional=False).to_dict() | {"rope_type": kind}
    for bad in (4096.5, True, "4096", float("inf"), None):
        with pytest.raises(TypeError, match=f"{name} must be an int, got"):
            from_dict(data | {name: bad})
    for bad in (0, -3, 0.0):
        with pytest.raises(ValueError, match=f"{name} must be an int >= "):
            from_dict(data | {name: bad})
    for good in (4096.0, torch.tensor(4096), 4096):  # integral floats (JSON) and integer-likes become int
        method = from_dict(data | {name: good})
        assert type(getattr(method, name)) is int and method == from_dict(data | {name: 4096})


def test_longrope_factor_lists_must_be_lists_of_numbers():
    with pytest.raises(TypeError, match="short_factor must be a list of numbers"):
        LongRoPE("1.0", [1.0], 1024)
    with pytest.raises(ValueError, match="every entry of long_factor"):
        LongRoPE([1.0], [1.0, "2"], 1024)


# -- from_rope_parameters ----------------------------------------------------------------------------

YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 1024}


@pytest.mark.parametrize(
    ("params", "unknown"),
    [
        (YARN | {"beta_fats": 16.0}, "beta_fats"),
        ({"rope_type": "linear", "factr": 2.0}, "factr"),
        ({"type": "dynamic", "factor": 2.0, "max_position_embedding": 64}, "max_position_embedding"),
        ({"rope_tpye": "yarn", "factor": 4.0}, "rope_tpye"),  # would otherwise read as 'default'
        ({"rope_type": "default", "factor": 2.0}, "factor"),
        ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "short_mscale": 1.2}, "short_mscale"),
    ],
)
def test_unknown_keys_are_named(params: dict, unknown: str):
    with pytest.raises(ValueError, match=rf"unknown key\(s\) \[.*'{unknown}'.*\]; valid keys are"):
        from_rope_parameters(params, max_position_embeddings=4096)


def test_config_keys_that_are_not_fields_are_accepted():
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24], "mrope_interleaved": True}
    assert from_rope_parameters(mrope) is None
    transformers = pytest.importorskip("transformers")
    config = transformers.Ministral3Config(
        hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, intermediate_size=8,
        num_hidden_layers=1, vocab_size=16, pad_token_id=None,
    )  # fmt: skip
    # its rope_parameters carry llama_4_scaling_beta and max_position_embeddings besides the yarn fields
    method = from_rope_parameters(config.rope_parameters)
    assert method == YaRN(16.0, 16384, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    expected_inv, expected_af = ROPE_INIT()["yarn"](config)
    inv, af = ar.inv_freq(64, config.rope_parameters["rope_theta"], method)
    assert_rel_close(inv, expected_inv)
    assert af == pytest.approx(expected_af, rel=1e-9)


def test_none_is_default_rope():
    assert from_rope_parameters(None) is None
    assert from_rope_parameters(None, max_position_embeddings=4096) is None
    with pytest.raises(TypeError, match="rope_parameters must be a dict or None"):
        from_rope_parameters([("rope_type", "linear")])


RAW_WITHOUT_ORIGINAL = {
    "yarn": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
    "longrope": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 32, "long_factor": [3.0] * 32},
}


@pytest.mark.parametrize("kind", list(RAW_WITHOUT_ORIGINAL))
def test_missing_original_length_is_filled_from_max_position_embeddings(kind: str):
    """transformers' standardize_rope_params sets original_max_position_embeddings = max_position_embeddings."""
    params = RAW_WITHOUT_ORIGINAL[kind]
    with pytest.raises(ValueError, match="needs original_max_position_embeddings.*pass max_position_embeddings="):
        from_rope_parameters(params)
    method = from_rope_parameters(params, max_position_embeddings=2048)
    assert method.original_max_position_embeddings == 2048
    for seq_len in (100, 5000):
        expected_inv, expected_af = hf(64, params, 2048, seq_len=seq_len)
        inv, af = ar.inv_freq(64, params["rope_theta"], method, seq_len=seq_len)
        assert_rel_close(inv, expected_inv)
        assert af == pytest.approx(expected_af, rel=1e-9)


def test_truncate_null_means_no_truncation_as_in_transformers():
    params = YARN | {"truncate": None}
    method = from_rope_parameters(params)
    assert method == YaRN(4.0, 1024, truncate=False)
    expected_inv, _ = hf(64, params, 4096)
    assert_rel_close(ar.inv_freq(64, 1e4, method)[0], expected_inv)
    truncated, _ = ar.inv_freq(64, 1e4, YaRN(4.0, 1024))
    assert not torch.allclose(truncated, expected_inv.double(), rtol=1e-4)  # the case tells the two apart


def test_dynamic_length_may_come_from_the_dict():
    params = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
    assert from_rope_parameters(params) == DynamicNTK(2.0, 64)
    with pytest.raises(ValueError, match="'dynamic' needs max_position_embeddings"):
        from_rope_parameters({"rope_type": "dynamic", "factor": 2.0})


# -- DynamicNTK (stateless) against transformers' stateful dynamic update -----------------------------


def test_dynamic_ntk_against_transformers_cache():
    """transformers keeps f(c), c the longest length since the last one below L; DynamicNTK uses f(max(l, L)).

    They agree when l < L or l >= c and differ for l in [L, c): the rule docs/scaling.md states.
    """
    pytest.importorskip("transformers")
    from helpers import llama_config
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    L, dim = 64, 16
    embed = LlamaRotaryEmbedding(llama_config(dim, {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}, L))
    method = DynamicNTK(2.0, L)
    longest = L  # c: transformers' max_seq_len_cached
    for length in (100, 150, 80, 200, 40, 70, 64, 90, 30, 64):
        embed(torch.zeros(1), torch.arange(length)[None])
        longest = L if length < L else max(longest, length)
        ours = ar.inv_freq(dim, 1e4, method, seq_len=length)[0]
        hf_inv = embed.inv_freq.double()
        if length < L or length >= longest:
            assert_rel_close(ours, hf_inv)
        else:
            assert_rel_close(ar.inv_freq(dim, 1e4, method, seq_len=longest)[0], hf_inv)  # pass c to match
            assert not torch.allclose(ours, hf_inv, rtol=1e-3)


# -- helpers ---------------------------------------------------------------------------------------


def ROPE_INIT():  # noqa: N802
    return pytest.importorskip("transformers.modeling_rope_utils").ROPE_INIT_FUNCTIONS


def hf(head_dim: int, params: dict, max_pos: int, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """transformers' inv_freq and attention factor for a Llama config with these rope_parameters."""
    from helpers import llama_config

    config = llama_config(head_dim, {k: v for k, v in params.items() if k != "max_position_embeddings"}, max_pos)
    return ROPE_INIT()[config.rope_parameters["rope_type"]](config, seq_len=seq_len)


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = INV_RTOL) -> None:
    actual, expected = actual.double(), expected.double()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    rel = ((actual - expected).abs() / expected.abs()).max().item()
    assert rel <= rtol, f"max relative error {rel:.3g} > {rtol:g}"
