"""xPos (Sun et al. 2022, arXiv 2212.10554) against its formulas, transcribed here in float64.

The paper's Eq. for the decay base, ``zeta_i = (i / (D/2) + gamma) / (1 + gamma)``; torchscale's ``XPOS``
buffer ``(arange(0, D, 2) + gamma D) / ((1 + gamma) D)`` (the same numbers); queries scaled by
``zeta ** (n / scale_base)``, keys by ``zeta ** (-n / scale_base)``, so each plane's logit term carries
``zeta ** ((m - n) / scale_base)``. And the rolling cache refused.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from rotation_oracle import planes

import axial_rope as ar
from axial_rope import ops
from axial_rope.cache import KVCache
from axial_rope.methods import xpos_rotation, xpos_zeta

GAMMA, BASE = 0.4, 8.0


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_zeta_is_the_papers_and_torchscales():
    D = 12
    paper = torch.tensor([(i / (D / 2) + GAMMA) / (1 + GAMMA) for i in range(D // 2)], dtype=torch.float64)
    torchscale = (torch.arange(0, D, 2, dtype=torch.float64) + GAMMA * D) / ((1 + GAMMA) * D)
    assert_close(xpos_zeta(D // 2, GAMMA), paper)
    assert_close(xpos_zeta(D // 2, GAMMA), torchscale)


def test_queries_and_keys_take_opposite_decays_and_logits_decay_with_distance():
    rope = ar.AxialRoPE(12, theta=100.0, pairing="half")
    pos = torch.arange(7, dtype=torch.float32)
    pair = xpos_rotation(rope.rotation(pos), gamma=GAMMA, scale_base=BASE)
    q, k = _seeded(1, 7, 2, 12, seed=1), _seeded(1, 7, 2, 12, seed=2)
    got_q, got_k = ops.rotate(q, k, pair, "bshd", "torch")
    zeta = torch.tensor([(i / 6 + GAMMA) / (1 + GAMMA) for i in range(6)], dtype=torch.float64)
    angle = pos.double()[:, None] * rope.freqs[0]  # [S, n]
    decay = zeta ** (pos.double()[:, None] / BASE)  # [S, n]
    want_q = planes(q, 6, "half") * torch.polar(decay, angle)[None, :, None]
    want_k = planes(k, 6, "half") * torch.polar(1 / decay, angle)[None, :, None]
    assert_close(torch.view_as_real(planes(got_q, 6, "half")), torch.view_as_real(want_q))
    assert_close(torch.view_as_real(planes(got_k, 6, "half")), torch.view_as_real(want_k))
    # each plane's logit term: RoPE's, times zeta ** ((m - n) / scale_base)
    zq, zk = planes(got_q, 6, "half")[0, :, 0], planes(got_k, 6, "half")[0, :, 0]  # [S, n]
    m, n = 6, 2
    rope_term = (
        planes(q, 6, "half")[0, m, 0] * planes(k, 6, "half")[0, n, 0].conj() * torch.exp(1j * (angle[m] - angle[n]))
    ).real
    assert_close((zq[m] * zk[n].conj()).real, rope_term * zeta ** ((m - n) / BASE))


def test_a_common_center_leaves_logits_unchanged_and_keeps_far_positions_finite():
    rope = ar.AxialRoPE(12, theta=100.0)
    q, k = _seeded(1, 4, 1, 12, seed=3).float(), _seeded(1, 4, 1, 12, seed=4).float()
    near = torch.arange(4, dtype=torch.float32)
    far = near + 1e5  # plane 0 at p = 1e5, scale_base 512: zeta ** 195 = 1e-106, out of float32's range

    def logits(pos, center):
        qr, kr = ops.rotate(q, k, xpos_rotation(rope.rotation(pos), center=center), "bshd")
        return torch.einsum("bshd,bthd->bst", qr.double(), kr.double())

    assert not torch.isfinite(logits(far, 0.0)).all()
    assert_close(logits(far, 1e5), logits(near, 0.0), torch.float32)
    assert_close(logits(near, 2.0), logits(near, 0.0), torch.float32)


def test_rolling_caches_are_refused_and_static_ones_hold_xpos_keys():
    rope = ar.AxialRoPE(8)
    pair = xpos_rotation(rope.rotation(torch.arange(4.0)))
    rolling = KVCache(1, 4, 1, 8, window=4, sinks=1)
    for given in (pair, pair.key):
        with pytest.raises(ValueError, match="xPos"):
            rolling.advance(2, given)
    static = KVCache(1, 8, 1, 8)
    assert static.advance(4, pair).tolist() == [0, 1, 2, 3]


def test_xpos_compiles_fullgraph_forward_and_backward():
    rope = ar.AxialRoPE(8, pairing="half")
    attention = ar.Attention(16, 2, causal=True)
    pos = torch.arange(6.0)

    def step(x):
        return attention(x, rotation=xpos_rotation(rope.rotation(pos), scale_base=BASE))

    x = _seeded(1, 6, 16, seed=5).float().requires_grad_()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert_close(compiled(x), step(x))
    (g,) = torch.autograd.grad(compiled(x).square().sum(), x)
    (g_eager,) = torch.autograd.grad(step(x).square().sum(), x)
    assert_close(g, g_eager)


def test_bad_arguments_are_refused_by_name():
    r = ar.AxialRoPE(8).rotation(torch.arange(4.0))
    for kwargs, name in (({"gamma": 0.0}, "gamma"), ({"scale_base": -1.0}, "scale_base"), ({"axis": 1}, "axis"),
                         ({"center": float("nan")}, "center")):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            xpos_rotation(r, **kwargs)
    with pytest.raises(TypeError, match="rotation"):
        xpos_rotation((r, r))
