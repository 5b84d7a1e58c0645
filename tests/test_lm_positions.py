"""The language model's position schemes (models/studies/length/positions): formulas against the papers, cached decoding
equal to recomputation for every scheme, and the invariances each scheme claims."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # models/ is not installed: import it from the repository root
    sys.path.insert(0, str(ROOT))

import axial_rope as ar  # noqa: E402
from models.gpt import GPT, GPTConfig  # noqa: E402
from models.studies.length.positions import (  # noqa: E402
    DualChunk,
    PositionTableError,
    StudyPositions,
    alibi_slopes,
    feature_map,
    fused_path,
    sinusoids,
    t5_bucket,
)
from models.studies.length.positions.dual_chunk import INTER, INTRA, SUCCESSIVE  # noqa: E402
from models.studies.length.positions.presets import StudyModel  # noqa: E402

TINY = GPTConfig(vocab_size=64, depth=2, num_heads=4, num_kv_heads=2, hidden_size=32, max_seq_len=16)
P = StudyPositions
SCHEMES = {  # (config, position scheme) pairs
    "rope": StudyModel(TINY, P()),
    "rope-yarn": StudyModel(replace(TINY, scaling=ar.scaling.YaRN(2.0, 8)), P()),
    "nope": StudyModel(TINY, P(position="nope")),
    "sinusoidal": StudyModel(TINY, P(position="sinusoidal")),
    "learned": StudyModel(TINY, P(position="learned")),
    "t5": StudyModel(TINY, P(position="t5", t5_buckets=8, t5_max_distance=6)),
    "alibi": StudyModel(TINY, P(position="alibi")),
    "linear-rope": StudyModel(TINY, P(attention="linear")),
    "linear-nope": StudyModel(TINY, P(attention="linear", position="nope")),
    "window": StudyModel(TINY, P(window=4)),
    "alibi-window": StudyModel(TINY, P(position="alibi", window=4)),
    "dual-chunk": StudyModel(TINY, P(dual_chunk=DualChunk(6, 2))),
}


def _randomized(spec: StudyModel, dtype=torch.float64) -> GPT:
    torch.manual_seed(0)
    model = spec.build().to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # larger logit gaps: an argmax tie cannot decide a test
    return model


@pytest.mark.parametrize("name", list(SCHEMES))
def test_cached_decoding_equals_full_recomputation_for_every_scheme(name):
    model = _randomized(SCHEMES[name])
    prompt = torch.randint(0, 64, (2, 5))
    cached, cached_logits = model.generate(prompt, 9, temperature=0, return_logits=True)
    full, full_logits = model.generate(prompt, 9, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, full)
    # float64, summed in other orders: within helpers.chain_bound(U64, 128, 10) = 1.1e-12 of the logits' scale (~10)
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-10, rtol=1e-10)
    plain = model(full[:, :-1])[:, -1]  # the reference recomputes: its last step is a plain forward
    torch.testing.assert_close(full_logits[:, -1], plain, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_every_scheme_trains(name):
    model = SCHEMES[name].build()
    idx = torch.randint(0, 64, (2, 12))
    loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.roll(-1, 1).flatten())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_fused_path_only_without_masks():
    fused = {name: fused_path(spec.positions)[0] for name, spec in SCHEMES.items()}
    assert fused == {
        "rope": True,
        "rope-yarn": True,
        "nope": True,
        "sinusoidal": True,
        "learned": True,
        "t5": False,
        "alibi": False,
        "linear-rope": False,
        "linear-nope": False,
        "window": False,
        "alibi-window": False,
        "dual-chunk": False,
    }
    assert "mask" in fused_path(SCHEMES["alibi"].positions)[1]


def test_config_refuses_combinations_that_mean_nothing():
    for bad, match in (
        ({"position": "xpos"}, "position must be one of"),
        ({"attention": "flash"}, "attention must be one of"),
        ({"position": "alibi", "dual_chunk": DualChunk(8, 2)}, "dual_chunk"),
        ({"attention": "linear", "position": "t5"}, "linear attention takes"),
        ({"attention": "linear", "window": 4}, "no sliding window"),
        ({"window": 0}, "window must be an int >= 1"),
    ):
        with pytest.raises(ValueError, match=match):
            P(**bad)
    with pytest.raises(ValueError, match="scaling needs position='rope'"):  # the scheme against the config
        GPT(replace(TINY, scaling=ar.scaling.Linear(2.0)), positions=P(position="alibi"))
    with pytest.raises(ValueError, match="max_seq_len must be an int >= 1"):
        replace(TINY, max_seq_len=0)
    with pytest.raises(ValueError, match="local_size"):
        DualChunk(8, 8)


# -- absolute positions -------------------------------------------------------------------------


def test_sinusoids_are_vaswanis_formula():
    pos = torch.tensor([0, 1, 7, 1000])
    table = sinusoids(pos, 8)
    for r, p in enumerate(pos.tolist()):
        for i in range(4):
            angle = p / 10000 ** (2 * i / 8)
            # float64 angles rounded once to float32: within 2**-24 = 6e-8
            assert table[r, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[r, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_learned_positions_raise_past_their_table():
    model = SCHEMES["learned"].build().eval()
    model(torch.zeros(1, 16, dtype=torch.long))  # the whole table: fine
    with pytest.raises(PositionTableError, match=r"rows 0..15 .*position 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(PositionTableError, match="position 19"):  # generate: before the prefill
        model.generate(torch.zeros(1, 10, dtype=torch.long), 10)


# -- relative biases ----------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("buckets,distance", [(32, 128), (8, 6), (16, 100)])
def test_t5_buckets_equal_transformers(bidirectional, buckets, distance):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-300, 300)[None, :] + torch.tensor([[0], [-1000], [1000]])
    golden = t5.T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
    assert torch.equal(t5_bucket(relative, bidirectional, buckets, distance), golden)


def test_t5_bias_is_one_table_shared_by_the_layers():
    model = SCHEMES["t5"].build()
    tables = [name for name, _ in model.named_parameters() if "table" in name]
    assert tables == ["bias.table.weight"] and model.bias.table.weight.shape == (8, 4)
    bias = model.bias(torch.arange(10), torch.arange(10))[0]  # [H, S, S]
    assert torch.equal(bias[:, 9, 0], bias[:, 9, 3])  # distances 9 and 6 share the last bucket (max 6)


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    assert alibi_slopes(16).tolist() == pytest.approx([2.0 ** (-i / 2) for i in range(1, 17)])  # float32: 6e-8 << 1e-6
    # not a power of two: the 4-head slopes, then the odd-numbered ones of 8 heads
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


def test_alibi_bias_is_minus_slope_times_distance():
    model = SCHEMES["alibi"].build()
    bias = model.bias(torch.arange(5, 9), torch.arange(9))[0]  # [H, 4, 9]
    slopes = alibi_slopes(4)
    for h in range(4):
        for i, q in enumerate(range(5, 9)):
            for k in range(q + 1):
                assert bias[h, i, k].item() == pytest.approx(-slopes[h].item() * (q - k))  # one float32 rounding


# -- linear attention ---------------------------------------------------------------------------


def test_linear_attention_score_depends_on_the_offset_only():
    rope = ar.AxialRoPE(16, pairing="half")
    gen = torch.Generator().manual_seed(0)
    q, k = feature_map(torch.randn(2, 1, 1, 1, 16, generator=gen, dtype=torch.float64))
    for m, n in ((5, 2), (40, 3), (7, 7)):
        scores = []
        for shift in (0, 1, 113, 10_000):
            rq = rope.rotate(q, torch.tensor([m + shift]))
            rk = rope.rotate(k, torch.tensor([n + shift]))
            scores.append((rq * rk).sum().item())
        # float64: angles up to 1e4 rad are off by 1e4 * 2**-53 = 1e-12 rad, the 8 planes' score by < 1e-10
        assert scores == pytest.approx([scores[0]] * len(scores), rel=1e-9, abs=1e-9)
    # and the score does change with the offset (so the check above is not vacuous)
    near = (rope.rotate(q, torch.tensor([3])) * rope.rotate(k, torch.tensor([2]))).sum()
    far = (rope.rotate(q, torch.tensor([30])) * rope.rotate(k, torch.tensor([2]))).sum()
    assert abs(near - far) > 1e-3


def test_linear_attention_is_su_et_al_eq_19():
    # out_m = sum_n (R_m phi(q_m)) . (R_n phi(k_n)) v_n / sum_n phi(q_m) . phi(k_n): a direct loop
    model = _randomized(StudyModel(replace(TINY, num_kv_heads=4, depth=1), P(attention="linear")))
    attention = model.layers[0].attention
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    q, k, v = attention._project(x)  # [1, S, H, D]
    rope = model.rope
    heads = []
    for h in range(4):
        rows = []
        for m in range(6):
            qm = feature_map(q[0, m, h])
            num = torch.zeros(8, dtype=torch.float64)
            den = torch.zeros((), dtype=torch.float64)
            for n in range(m + 1):
                kn = feature_map(k[0, n, h])
                rq = rope.rotate(qm.view(1, 1, 1, 8), torch.tensor([m])).flatten()
                rk = rope.rotate(kn.view(1, 1, 1, 8), torch.tensor([n])).flatten()
                num += (rq @ rk) * v[0, n, h]
                den += qm @ kn  # the normaliser: unrotated
            rows.append(num / den)
        heads.append(torch.stack(rows))
    expected = attention.proj(torch.stack(heads, 1).reshape(1, 6, 32))
    torch.testing.assert_close(attention(x, torch.arange(6)), expected)


# -- dual chunk attention -----------------------------------------------------------------------


def _paper_relative(i: int, j: int, c: int, w: int) -> int:
    """Dual Chunk Attention's relative position, read directly off An et al. 2024 (section 3)."""
    s = c - w  # chunk length
    if i // s == j // s:  # intra-chunk: P_q = i mod s
        q = i % s
    elif i // s == j // s + 1:  # successive chunk: P_q = s, s+1, ..., s+w-1, then c-1
        q = s + i % s if i % s < w else c - 1
    else:  # inter-chunk: P_q = c - 1 for every query
        q = c - 1
    return q - j % s  # P_k = j mod s


def test_dual_chunk_scores_follow_the_papers_index_rules():
    c, w = 10, 3
    positions = P(dual_chunk=DualChunk(c, w))
    model = _randomized(StudyModel(replace(TINY, num_kv_heads=4, depth=1), positions))
    attention, rope = model.layers[0].attention, model.rope
    S = 30  # four chunks of 7: intra, successive and inter pairs
    q, k = torch.randn(2, 1, S, 4, 8, dtype=torch.float64)
    pos = torch.arange(S)
    k_rot = rope.rotate(k, positions.dual_chunk.key_index(pos)).transpose(1, 2)
    scores = attention.scores(q, k_rot, pos, pos)[0]  # [H, S, S]
    for i in range(S):
        for j in range(i + 1):
            rel = _paper_relative(i, j, c, w)
            assert 0 <= rel <= c - 1  # never a distance the model has not trained on
            # RoPE: rotating q by rel and k by 0 gives the score of any pair at relative position rel
            qr = rope.rotate(q[:, i : i + 1], torch.tensor([rel]))[0, 0]
            expected = (qr * k[0, j]).sum(-1) / math.sqrt(8)
            torch.testing.assert_close(scores[:, i, j], expected)
    regions = positions.dual_chunk.regions(pos, pos)
    assert {INTRA, SUCCESSIVE, INTER} == set(regions.tril().unique().tolist())


def test_dual_chunk_is_rope_within_one_chunk_and_loads_rope_weights():
    rope_model = _randomized(SCHEMES["rope"])
    dca = GPT(TINY, positions=P(dual_chunk=DualChunk(12, 4))).to(torch.float64).eval()
    dca.load_state_dict(rope_model.state_dict())  # the same parameters: training-free
    idx = torch.randint(0, 64, (2, 8))
    # 8 tokens = one chunk: plain RoPE, to the float32 softmax DualChunkAttention takes (float64 models too):
    # logits |s| < 44 here rounded to float32 move the weights by 2 u |s| relative, the float32 softmax adds
    # (S + 3) u (u = 2**-24): 6e-6 of the values' scale per layer, 1.2e-5 of the logits' after two layers
    expected = rope_model(idx)
    tol = 1.2e-5 * float(expected.detach().abs().max())
    torch.testing.assert_close(dca(idx), expected, atol=tol, rtol=0)
    long = torch.randint(0, 64, (2, 30))
    assert not torch.allclose(dca(long), rope_model(long))


def test_window_hides_tokens_further_back():
    model = _randomized(SCHEMES["window"])
    idx = torch.randint(0, 64, (1, 12))
    changed = idx.clone()
    changed[0, 3] = (idx[0, 3] + 1) % 64
    a, b = model(idx), model(changed)
    # with window 4 and 2 layers, token 3 reaches positions 3 .. 3 + 2 * 3 = 9 and no further
    torch.testing.assert_close(a[0, 10:], b[0, 10:])
    assert not torch.allclose(a[0, 9], b[0, 9])
