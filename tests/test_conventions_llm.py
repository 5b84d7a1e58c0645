"""Language-model conventions against the installed transformers (5.24.0): Llama (scaled), GPT-NeoX partial
rotary, p-RoPE (proportional), Gemma 3 per-layer bases, Llama 4 NoPE + chunked layers.

transformers forms its frequencies and angles in float32. At positions near 1e6 each convention is
compared, per entry, with upstream's own frequencies in float64 (they are float32 roundings of ours:
``|angle| * 2**-23``) and with upstream's float32 tables (``|angle| * 8 * 2**-24``): tight on the
low-frequency planes, and an O(1) error (wrong plane, pairing or base) fails everywhere.
"""

from __future__ import annotations

import math

import pytest
import torch
from conventions_support import (
    EPS32,
    angle_gap,
    assert_close,
    check_documented,
    exact_planes,
    float32_angle_bound,
    max_diff,
    rotation_bound,
    seeded,
    upstream_table_bound,
)
from helpers import LLAMA_ROPE_PARAMETERS, llama_config

import axial_rope as ar
from axial_rope import conventions as conv

transformers = pytest.importorskip("transformers")
FAR = 1e6 + torch.arange(6, dtype=torch.float64) * 37.0


def planes_of(table: torch.Tensor, pairing: str) -> torch.Tensor:
    n = table.shape[-1] // 2
    return table[..., :n] if pairing == "half" else table[..., 0::2]


def check_far(name: str, rope: ar.AxialRoPE, inv_freq: torch.Tensor, tables, theta: float) -> None:
    """``tables(position_ids [1, S] long) -> (cos, sin)`` channel tables from upstream, at FAR.

    Upstream's float32 ``base ** (2j / D)`` rounds the exponent (one ulp of x moves the power by
    ``ln(base)`` ulps), the power and the reciprocal: ``(ln(base) + 3)`` ulps of each frequency.
    """
    cos, sin = exact_planes(rope, FAR[:, None])  # [S, n] float64
    angle = FAR[:, None] * inv_freq.double()  # upstream's float32 frequencies, float64 products
    ulps = math.log(theta) + 3
    gap = angle_gap(cos, sin, angle.cos(), angle.sin())
    assert bool((gap <= angle.abs() * ulps * EPS32 + 1e-9).all()), name  # F: upstream's, to float32 rounding
    ref_cos, ref_sin = tables(FAR.long()[None])
    ref_cos, ref_sin = (planes_of(t[0].double(), rope.pairing) for t in (ref_cos, ref_sin))
    bound = float32_angle_bound(angle, ulps + 2)  # and the float32 product and cos/sin
    assert bool((angle_gap(cos, sin, ref_cos, ref_sin) <= bound).all()), name


def check_llama_like(name: str, rope, embed, apply, D: int, starts=(0, 7), kv_heads: int = 1) -> tuple:
    """Tables and rotation at two per-sample offsets (Llama's ``apply_rotary_pos_emb`` contract).

    Returns the tables' difference from upstream and its bound (``upstream_table_bound``)."""
    S = 6
    position_ids = torch.stack([torch.arange(s, s + S) for s in starts])
    cos, sin = embed(torch.zeros(1), position_ids)
    pos = position_ids[..., None].float()
    ours = rope.cos_sin(pos)
    diff, bound = max_diff((ours[0], cos), (ours[1], sin)), upstream_table_bound(rope, pos)
    assert diff <= bound, (diff, bound)
    q, k = seeded(2, 2, S, D, seed=1), seeded(2, kv_heads, S, D, seed=2)
    want_q, want_k = apply(q, k, cos, sin)
    got_q, got_k = rope(q, k, pos, layout="bhsd")
    assert_close(got_q, want_q, rotation_bound(q, bound))
    assert_close(got_k, want_k, rotation_bound(k, bound))
    return diff, bound


LLAMA_PARAMS = {
    "default": LLAMA_ROPE_PARAMETERS["default"],
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": LLAMA_ROPE_PARAMETERS["yarn"],
    "llama3": LLAMA_ROPE_PARAMETERS["llama3"],
}


@pytest.mark.parametrize("name", list(LLAMA_PARAMS))
@pytest.mark.parametrize("head_dim", [64, 24])
def test_llama(name, head_dim):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = llama_config(head_dim, LLAMA_PARAMS[name], 4096, num_key_value_heads=1)
    embed = LlamaRotaryEmbedding(config)
    rope = ar.rope_from_config(config)
    same = conv.llama(head_dim, LLAMA_PARAMS[name]["rope_theta"], LLAMA_PARAMS[name], max_position_embeddings=4096)
    assert torch.equal(rope.freqs, same.freqs) and rope.pairing == same.pairing == "half"
    check_documented("llama", *check_llama_like("llama", rope, embed, apply_rotary_pos_emb, head_dim))
    check_far("llama", rope, embed.inv_freq, lambda ids: embed(torch.zeros(1), ids), LLAMA_PARAMS[name]["rope_theta"])


@pytest.mark.parametrize(("head_dim", "factor"), [(64, 0.25), (32, 0.5), (16, 1.0)])
def test_gpt_neox(head_dim, factor):
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    config = GPTNeoXConfig(hidden_size=2 * head_dim, num_attention_heads=2, intermediate_size=8, num_hidden_layers=1,
                           vocab_size=8, rotary_pct=factor)  # fmt: skip
    embed = neox.GPTNeoXRotaryEmbedding(config)
    rope = conv.gpt_neox(head_dim, 10000.0, factor)
    assert rope.rot_dim == int(head_dim * factor)
    assert torch.equal(ar.rope_from_config(config).freqs, rope.freqs)
    check_documented(
        "gpt_neox", *check_llama_like("gpt_neox", rope, embed, neox.apply_rotary_pos_emb, head_dim, kv_heads=2)
    )
    check_far("gpt_neox", rope, embed.inv_freq, lambda ids: embed(torch.zeros(1), ids), 10000.0)


@pytest.mark.parametrize(("head_dim", "p", "factor"), [(32, 0.25, 1.0), (64, 0.5, 2.0), (16, 1.0, 1.0)])
def test_p_rope_proportional(head_dim, p, factor):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    params = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": p, "factor": factor}
    config = llama_config(head_dim, params, num_key_value_heads=1)
    embed = LlamaRotaryEmbedding(config)
    rope = conv.p_rope(head_dim, 1e6, p, factor)
    assert int(rope.frequency_model.unrotated.sum()) == head_dim // 2 - int(p * head_dim // 2)
    assert torch.equal(ar.rope_from_config(config).freqs, rope.freqs)
    check_documented("p_rope", *check_llama_like("p_rope", rope, embed, apply_rotary_pos_emb, head_dim))
    check_far("p_rope", rope, embed.inv_freq, lambda ids: embed(torch.zeros(1), ids), 1e6)


def gemma3_config(head_dim: int = 32):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim, intermediate_size=8,
        num_hidden_layers=6, vocab_size=8, sliding_window=16, max_position_embeddings=4096,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    )  # fmt: skip


def test_gemma_local_and_global_bases():
    from transformers.models.gemma3 import modeling_gemma3 as gemma3

    config = gemma3_config()
    embed = gemma3.Gemma3RotaryEmbedding(config)
    layers = conv.gemma(config.layer_types, config.rope_parameters, 32, sliding_window=16)
    from_config = ar.configs.layers_from_config(config)
    assert [layer.attention for layer in layers] == list(config.layer_types)
    assert [layer.window for layer in from_config] == [
        16 if t == "sliding_attention" else None for t in config.layer_types
    ]
    worst = (0.0, 0.0)  # (difference, bound)
    for layer, loaded in zip(layers, from_config):
        assert torch.equal(layer.rope.freqs, loaded.rope.freqs)
        tables = lambda x, ids, kind=layer.attention: embed(x, ids, kind)  # noqa: E731
        diff, bound = check_llama_like("gemma", layer.rope, tables, gemma3.apply_rotary_pos_emb, 32)
        worst = (max(worst[0], diff), max(worst[1], bound))
        inv = getattr(embed, f"{layer.attention}_inv_freq")
        theta = config.rope_parameters[layer.attention]["rope_theta"]
        check_far("gemma", layer.rope, inv, lambda ids, t=tables: t(torch.zeros(1), ids), theta)
    check_documented("gemma", *worst)
    assert layers[0].rope is layers[1].rope  # one rope per layer type
    with pytest.raises(ValueError, match="layer_type"):
        ar.rope_from_config(config)


@pytest.mark.parametrize(("top", "entry"), [(None, False), (False, None), (False, True)])
def test_yarn_truncate_is_read_from_the_top_level_as_transformers_does(top, entry):
    """transformers' YaRN takes ``truncate`` from the top-level ``rope_parameters`` (default True), never from a
    layer type's entry (``_compute_yarn_parameters``): so does rope_from_config, to float32 rounding."""
    from transformers import Gemma3TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    sliding = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    sliding |= {} if entry is None else {"truncate": entry}
    params = {"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": sliding}
    params |= {} if top is None else {"truncate": top}
    config = Gemma3TextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=8,
        num_hidden_layers=6, vocab_size=8, sliding_window=16, max_position_embeddings=4096, rope_parameters=params,
    )  # fmt: skip
    stock, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu", layer_type="sliding_attention")
    rope = ar.rope_from_config(config, layer_type="sliding_attention")
    torch.testing.assert_close(rope.freqs[0].float(), stock, rtol=1e-6, atol=0)
    assert rope.attention_factor == pytest.approx(factor)
    truncate = True if top is None else top  # the value read; the entry's would turn other planes:
    other = ar.scaling.YaRN(4.0, 64, truncate=not truncate)(32, 10000.0, None)[0]
    assert (other.float() - stock).abs().max() > 1e-3


def llama4_config(**extra):
    from transformers import Llama4TextConfig

    return Llama4TextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=8,
        intermediate_size_mlp=8, num_hidden_layers=8, vocab_size=8, attention_chunk_size=16,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **extra,
    )  # fmt: skip


def test_llama4_nope_layers_and_chunks():
    from transformers.models.llama4 import modeling_llama4 as llama4

    config = llama4_config()
    layers = ar.configs.layers_from_config(config)
    assert [layer.rope is not None for layer in layers] == [bool(u) for u in config.no_rope_layers]
    assert [layer.attention for layer in layers] == list(config.layer_types)
    assert all(layer.window == 16 for layer in layers if layer.rope is not None)
    rope = layers[0].rope
    assert rope.pairing == "interleaved" and torch.equal(rope.freqs, ar.rope_from_config(config).freqs)
    embed = llama4.Llama4TextRotaryEmbedding(config)
    ids = torch.stack([torch.arange(6), torch.arange(9, 15)])
    cis = embed(torch.zeros(1), ids)  # complex [B, S, n]
    cos, sin = rope.cos_sin(ids[..., None].float())
    diff = max_diff((cos[..., 0::2], cis.real), (sin[..., 0::2], cis.imag))
    bound = upstream_table_bound(rope, ids[..., None].float())
    check_documented("llama4", diff, bound)
    q, k = seeded(2, 6, 2, 32, seed=1), seeded(2, 6, 1, 32, seed=2)  # Llama 4 rotates bshd
    want_q, want_k = llama4.apply_rotary_emb(q, k, cis)
    got_q, got_k = rope(q, k, ids[..., None].float(), layout="bshd")
    assert_close(got_q, want_q, rotation_bound(q, bound))
    assert_close(got_k, want_k, rotation_bound(k, bound))
    tables = lambda i: (
        embed(torch.zeros(1), i).real.repeat_interleave(2, -1),
        embed(torch.zeros(1), i).imag.repeat_interleave(2, -1),
    )  # noqa: E731
    check_far("llama4", rope, embed.inv_freq, tables, 500000.0)
    # NoPE layers: transformers' Llama4TextAttention scales queries by
    # log1p(floor((positions + 1) / floor_scale)) * attn_scale + 1 (modeling_llama4.py, attn_temperature_tuning)
    positions = torch.tensor([0, 8190, 8191, 100000])
    scale = layers[3].query_scale(positions)
    expected = torch.log1p(torch.floor((positions.float() + 1.0) / 8192)) * 0.1 + 1.0
    assert_close(scale, expected, 1e-7)  # values <= 1.1, float32 on both sides: a few roundings of 2**-24
    assert layers[0].query_scale(positions) is None
    explicit = conv.llama4(4, 32, config.rope_parameters, no_rope_layers=[1, 0, 1, 1], attention_chunk_size=None)
    assert [layer.rope is None for layer in explicit] == [False, True, False, False]
    assert all(layer.attention == "full_attention" for layer in explicit)
