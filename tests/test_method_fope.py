"""FoPE (arXiv 2412.17739) against its served formula, transcribed here in float64 from vLLM's
``model_executor/layers/rotary_embedding/fope.py``: frequencies above ``2 pi / L`` kept, per key head
``cos_table = cos(p omega) @ C_cos`` and ``sin_table = sin(p omega) @ C_sin``, the clipped planes at cos 1 and
sin 0, both halves of a neox (``half``) head the same, ``x cos + rotate_neox(x) sin``; in the reference GPT,
trainable and cached."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_close

import axial_rope as ar
from axial_rope.methods import FourierRoPE, fope_inv_freq
from models.fope import FoPEAttention, FoPEPositions
from models.gpt import GPT, GPTConfig

R, THETA, L = 12, 100.0, 40


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _served(x, pos, cos_coef, sin_coef, rot_dim=R, theta=THETA, max_len=L):
    """vLLM's FoPE in float64: x ``[S, H, D]`` (query heads grouped by key head), coefficients ``[H_kv, m, m]``."""
    inv = 1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    inv = inv[inv > 2.0 * math.pi / max_len]
    freqs = pos.double()[:, None] * inv[None, :]  # [S, m]
    cos = torch.einsum("tD,hDd->thd", freqs.cos(), cos_coef.double())
    sin = torch.einsum("tD,hDd->thd", freqs.sin(), sin_coef.double())
    cos = torch.nn.functional.pad(cos, (0, rot_dim // 2 - cos.shape[-1]), value=1.0)
    sin = torch.nn.functional.pad(sin, (0, rot_dim // 2 - sin.shape[-1]), value=0.0)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # [S, H_kv, rot_dim]
    group = x.shape[1] // cos.shape[1]
    cos, sin = cos.repeat_interleave(group, 1), sin.repeat_interleave(group, 1)  # query head h: key head h // group
    rot, rest = x[..., :rot_dim].double(), x[..., rot_dim:].double()
    half = rot_dim // 2
    neox = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    return torch.cat([rot * cos + neox * sin, rest], -1)


def test_kept_frequencies_are_those_with_a_period_within_the_training_length():
    inv = THETA ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    assert_close(fope_inv_freq(R, THETA, max_position_embeddings=L), inv[inv > 2 * math.pi / L])
    assert fope_inv_freq(R, THETA, max_position_embeddings=L).numel() == 3  # periods 6.3, 13.5, 29; 63 .. 292 cut
    assert_close(fope_inv_freq(R, THETA, num_inv_freq=2), inv[:2])


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
def test_tables_and_turns_are_the_served_formula(heads):
    H, H_kv = heads
    fope = FourierRoPE(R, H_kv, THETA, max_position_embeddings=L).double()
    with torch.no_grad():
        fope.cos_coef.copy_(_seeded(H_kv, 3, 3, seed=1))
        fope.sin_coef.copy_(_seeded(H_kv, 3, 3, seed=2))
    pos = torch.tensor([0, 3, 17, 39, 80])  # 80: past the training length
    q, k = _seeded(1, 5, H, 14, seed=3), _seeded(1, 5, H_kv, 14, seed=4)
    got_q, got_k = fope(q, k, pos)
    assert_close(got_q[0], _served(q[0], pos, fope.cos_coef, fope.sin_coef))
    assert_close(got_k[0], _served(k[0], pos, fope.cos_coef, fope.sin_coef))
    got_bhsd = fope(q.transpose(1, 2), k.transpose(1, 2), pos, layout="bhsd")[0]
    assert_close(got_bhsd.transpose(1, 2), got_q)


def test_identity_coefficients_are_rope_with_the_long_periods_clipped():
    fope = FourierRoPE(R, 2, THETA, max_position_embeddings=L, pairing="interleaved", init_std=0.0).double()
    kept = ar.Frequencies.from_spectrum(R, THETA).masked([True] * 3 + [False] * 3)
    rope = ar.AxialRoPE.from_frequencies(kept, "interleaved")
    pos = torch.arange(9)
    q, k = _seeded(1, 9, 2, 12, seed=5), _seeded(1, 9, 2, 12, seed=6)
    for got, want in zip(fope(q, k, pos), rope(q, k, pos)):
        assert_close(got, want)


def test_loaded_coefficients_give_the_checkpoints_tables():
    cos_coef, sin_coef = _seeded(2, 3, 3, seed=7).float(), _seeded(2, 3, 3, seed=8).float()
    fope = FourierRoPE.from_coefficients(cos_coef, sin_coef, R, THETA, max_position_embeddings=L)
    assert torch.equal(fope.cos_coef, cos_coef) and torch.equal(fope.sin_coef, sin_coef)
    x = _seeded(1, 6, 4, 12, seed=9).float()
    got = fope(x, x[:, :, :2], torch.arange(6))[0]
    assert_close(got[0], _served(x[0], torch.arange(6), cos_coef, sin_coef), torch.float32)
    with pytest.raises(ValueError, match="m=3 frequencies"):
        FourierRoPE.from_coefficients(cos_coef, sin_coef, R, THETA, num_inv_freq=4)
    with pytest.raises(ValueError, match="cos_coef"):
        FourierRoPE.from_coefficients(cos_coef[0], sin_coef, R, THETA, max_position_embeddings=L)


def test_coefficients_learn_and_the_tables_compile_fullgraph():
    torch.manual_seed(0)
    fope = FourierRoPE(R, 2, THETA, max_position_embeddings=L)
    q, k = _seeded(2, 5, 4, 12, seed=10).float(), _seeded(2, 5, 2, 12, seed=11).float()
    pos = torch.arange(5)

    def loss(module):
        qr, kr = module(q, k, pos)
        return (qr.sum(2, keepdim=True) * kr).sum(-1).square().mean()

    compiled = torch.compile(fope, fullgraph=True, backend="aot_eager")
    grads = torch.autograd.grad(loss(fope), [fope.cos_coef, fope.sin_coef])
    grads_compiled = torch.autograd.grad(loss(compiled), [fope.cos_coef, fope.sin_coef])
    for g, gc in zip(grads, grads_compiled):
        assert g.abs().max() > 0
        assert_close(gc, g)


def test_meta_device_build_reproduces_the_seeded_one():
    torch.manual_seed(3)
    eager = FourierRoPE(R, 2, THETA, max_position_embeddings=L)
    with torch.device("meta"):
        meta = FourierRoPE(R, 2, THETA, max_position_embeddings=L)
    meta.to_empty(device="cpu")
    torch.manual_seed(3)
    meta.reset_parameters()
    assert torch.equal(meta.cos_coef, eager.cos_coef) and torch.equal(meta.sin_coef, eager.sin_coef)
    assert torch.equal(meta.inv_freq, eager.inv_freq) and meta.inv_freq.dtype == torch.float64


CONFIG = GPTConfig(vocab_size=32, depth=2, num_heads=4, num_kv_heads=2, hidden_size=48, max_seq_len=32)


def test_gpt_with_fope_trains_decodes_through_a_static_cache_and_refuses_rolling():
    torch.manual_seed(0)
    model = GPT(CONFIG, positions=FoPEPositions())
    assert model.rope is None and all(isinstance(b.attention, FoPEAttention) for b in model.layers)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    logits = model(idx)
    caches, steps = model.new_caches(2, 12), []
    for i in range(12):  # token by token through static caches: the same logits
        slots = [cache.advance(1) for cache in caches][0]
        steps.append(model(idx[:, i : i + 1], slots, caches))
    assert_close(torch.cat(steps, 1), logits, torch.float32)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    assert model.layers[0].attention.fope.cos_coef.grad.abs().max() > 0
    with pytest.raises(ValueError, match="FoPE"):
        model.generate(idx[:, :4], 2, window=8)


def test_gpt_with_fope_builds_on_the_meta_device_and_compiles_fullgraph():
    torch.manual_seed(4)
    eager = GPT(CONFIG, positions=FoPEPositions())
    with torch.device("meta"):
        meta = GPT(CONFIG, positions=FoPEPositions())
    meta.to_empty(device="cpu")
    torch.manual_seed(4)
    meta.reset_parameters()
    for (name, a), (_, b) in zip(eager.state_dict().items(), meta.state_dict().items()):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 32, (1, 10), generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(eager, fullgraph=True, backend="aot_eager")
    assert_close(compiled(idx), eager(idx), torch.float32)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="exactly one"):
        FourierRoPE(R, 2, THETA)
    with pytest.raises(ValueError, match="keeps no frequency"):
        FourierRoPE(R, 2, THETA, max_position_embeddings=4)
    with pytest.raises(ValueError, match="rot_dim"):
        FourierRoPE(7, 2, THETA, num_inv_freq=2)
    with pytest.raises(ValueError, match="pos"):
        FourierRoPE(R, 2, THETA, num_inv_freq=2).cos_sin(torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="num_kv_heads"):
        FoPEAttention(48, 4, num_kv_heads=2, fope=FourierRoPE(12, 1, THETA, num_inv_freq=2))
    with pytest.raises(ValueError, match="scaling"):
        GPT(GPTConfig(scaling=ar.scaling.Linear(2.0)), positions=FoPEPositions())
