"""LoL's multi-head RoPE jitter (arXiv 2601.16914) as a fixed per-head ``F``, against the reading this library
implements (``axial_rope/methods/lol.py``), transcribed here in float64: head ``h`` has the base
``theta (1 + j_h)`` on the jittered axes, ``j_h = strength * U[-1, 1]`` from a seeded generator; every head
turns by its own ``F`` (grouped query heads by their key head's), relative per head, compiled."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from rotation_oracle import oracle

import axial_rope as ar
from axial_rope import ops
from axial_rope.methods import lol_frequencies, lol_jitter, lol_rope, phase_concentration, sink_alignment

AXES, THETA = (4, 6, 6), (100.0, 50.0, 50.0)


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_jitter_is_uniform_in_plus_minus_strength_from_its_seed():
    u = torch.rand(6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(lol_jitter(6, 0.8, seed=5), 0.8 * (2 * u - 1))
    assert not torch.equal(lol_jitter(6, 0.8, seed=5), lol_jitter(6, 0.8, seed=6))
    assert lol_jitter(1000, 0.8).abs().max() <= 0.8


def test_each_head_has_its_own_base_on_the_jittered_axes():
    jitter = torch.tensor([0.0, 0.5, -0.3], dtype=torch.float64)
    freqs = lol_frequencies(AXES, THETA, jitter, axes=(0,)).freqs  # [3, 3, 8]
    for h, j in enumerate(jitter.tolist()):
        want = torch.zeros(3, 8, dtype=torch.float64)
        start = 0
        for a, (d, th) in enumerate(zip(AXES, THETA)):
            base = th * (1 + j) if a == 0 else th
            want[a, start : start + d // 2] = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            start += d // 2
        assert_close(freqs[h], want)
    assert torch.equal(freqs[0], ar.AxialRoPE(AXES, THETA).freqs)  # zero jitter: the plain rope


def test_heads_turn_by_their_own_frequencies_grouped_by_key_head_and_compile():
    rope = lol_rope(AXES, THETA, num_heads=2, strength=0.8, seed=1)  # one base per key head
    pos = ar.grid(3, 2, 2)
    q, k = _seeded(1, 12, 4, 18, seed=2).float(), _seeded(1, 12, 2, 18, seed=3).float()
    got_q, got_k = rope(q, k, pos)
    r = rope.rotation(pos)
    assert_close(got_q, oracle(q, r), torch.float32)
    assert_close(got_k, oracle(k, r), torch.float32)
    compiled = torch.compile(lambda q, k, pos: rope(q, k, pos), fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(q, k, pos), (got_q, got_k)):
        assert_close(got, want)


def test_jittered_heads_stop_turning_in_step_at_the_same_distance():
    plain, jittered = ar.AxialRoPE(16, 100.0), lol_rope(16, 100.0, num_heads=4)
    x = _seeded(1, 1, 1, 16, seed=4).expand(1, 2, 4, 16).contiguous()  # the same q and k content in every head
    far = torch.tensor([0.0, 201.0])  # a sink frame and a far one

    def per_head_logit(rope):
        qr, kr = rope(x, x, far)
        return (qr[0, 1] * kr[0, 0]).sum(-1) / (x[0, 0] * x[0, 0]).sum(-1)  # [H]

    same = per_head_logit(plain)
    assert_close(same, same[:1].expand(4))  # without jitter every head sees the sink alike
    assert per_head_logit(jittered).std() > 0.05
    shifted = per_head_logit(lol_rope(16, 100.0, num_heads=4))  # relative per head: a common shift changes nothing
    qr, kr = jittered(x, x, far + 37.0)
    assert_close((qr[0, 1] * kr[0, 0]).sum(-1) / (x[0, 0] * x[0, 0]).sum(-1), shifted, torch.float32)


def test_a_rolling_cache_re_indexes_each_head_by_its_own_frequencies():
    rope = lol_rope(8, 100.0, num_heads=2, seed=3)
    cache = ar.KVCache(1, 4, 2, 8, window=4, sinks=1)
    k = _seeded(1, 4, 2, 8, seed=5).float()  # [B, S, H_kv, D], written at positions 0 .. 3
    first = rope.rotation(torch.arange(4.0))
    slots = cache.advance(4, first)
    cache.update(slots, ops.rotate(k, None, first, "bshd")[0].transpose(1, 2), k.transpose(1, 2))
    cache.advance(1, first)  # drops position 1 (after the sink); positions 2, 3 move to 1, 2
    moved = rope.rotation(torch.tensor([1.0, 2.0]))
    assert_close(cache.k[:, :, 1:3].transpose(1, 2), oracle(k[:, 2:4], moved), torch.float32)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="jitter"):
        lol_frequencies(8, 100.0, torch.tensor([0.2, -1.0]))
    with pytest.raises(ValueError, match="jitter"):
        lol_frequencies(8, 100.0, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="strength"):
        lol_jitter(4, 1.0)
    with pytest.raises(ValueError, match="axes"):
        lol_frequencies(8, 100.0, torch.zeros(2), axes=(1,))
    with pytest.raises(ValueError, match="exactly one"):
        lol_rope(8, 100.0)


def _time_planes(jitter: torch.Tensor, d: int = 8, theta: float = 100.0) -> torch.Tensor:
    """Head h's time frequencies (theta (1 + j_h)) ** (-2i / d), i < d / 2: float64 [H, d / 2], transcribed."""
    i = torch.arange(d // 2, dtype=torch.float64)
    return torch.stack([(theta * (1 + float(j))) ** (-2 * i / d) for j in jitter])


def test_sink_diagnostics_are_their_formulas_and_see_the_jitter():
    """a_h(delta) = mean_j cos(delta F_hj); R(delta) = mean_j |mean_h exp(i delta F_hj)| over the time planes."""
    jitter = torch.tensor([-0.5, 0.0, 0.3], dtype=torch.float64)
    rope = lol_rope((8, 6, 6), 100.0, jitter=jitter)  # time axis jittered; y, x shared
    delta = torch.tensor([0.0, 7.0, 40.0, 333.0], dtype=torch.float64)
    f = _time_planes(jitter)  # [H, 4]
    angle = delta[:, None, None] * f[None]  # [T, H, 4]
    assert_close(sink_alignment(rope.freqs, delta), torch.cos(angle).mean(-1))
    want = torch.stack([torch.polar(torch.ones_like(angle[:, :, j]), angle[:, :, j]).mean(1).abs() for j in range(4)])
    assert_close(phase_concentration(rope.freqs, delta), want.mean(0))
    # heads sharing F turn alike: concentration 1 at every distance; the jitter spreads them far from the sinks
    shared = ar.AxialRoPE((8, 6, 6), theta=100.0)
    far = torch.arange(50.0, 400.0, 10.0)
    assert_close(phase_concentration(shared.freqs, far), torch.ones(len(far), dtype=torch.float64))
    assert phase_concentration(lol_rope((8, 6, 6), 100.0, num_heads=8).freqs, far).mean() < 0.8
    assert_close(phase_concentration(rope.freqs, delta, axis=1), torch.ones(4, dtype=torch.float64))  # y: shared
    assert torch.equal(sink_alignment(rope.freqs, torch.zeros(1))[0], torch.ones(3, dtype=torch.float64))


def test_sink_diagnostics_refuse_bad_input_by_name():
    rope = lol_rope((8, 6, 6), 100.0, num_heads=2)
    with pytest.raises(ValueError, match="freqs"):
        phase_concentration(rope.freqs[0, 0], torch.arange(3.0))
    with pytest.raises(ValueError, match="axis"):
        sink_alignment(rope.freqs, torch.arange(3.0), axis=3)
