"""Queries and keys turned differently (``QKRotation``): each side by its own rotation, through ``ops.rotate``,
``ops.norm_rotate``, ``Attention(rotation=)`` and the rolling cache, against the float64 contract
(``tests/rotation_oracle.py``), forward and backward, compiled and exported; what stays relative; bad pairs.

The kinds are the methods issue 44 names: keys whose high-frequency planes are damped on some tokens
(Untwisting RoPE), keys on another stride (CRPA), opposite per-token decays (xPos), per-head key ``F`` (LoL's
jitter) and another key ``F``. float64 throughout: both sides form the same float64 angle products, so they agree
to a few ulps of ``|x|`` (helpers.TOL's float64 row, 1e-12).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close
from rotation_oracle import logits, oracle

import axial_rope as ar
from axial_rope import ops
from axial_rope.cache import KVCache
from axial_rope.ops import QKRotation, Rotation

B, H, HK, D = 2, 4, 2, 12  # 5 planes (rot_dim 10) and 2 pass-through channels
KINDS = ("damped keys", "key positions", "xpos", "per-head key F", "other key F")


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rope(pairing="interleaved"):
    return ar.AxialRoPE((4, 6), theta=100.0, pairing=pairing)


def _xpos(rotation: Rotation, sign: float) -> torch.Tensor:
    """xPos's per-token decay ``zeta ** (sign * t / gamma)`` per plane ``[1, S, n]`` (t: the first axis)."""
    zeta = torch.linspace(0.6, 0.95, rotation.n_pairs, dtype=torch.float64)
    return zeta ** (sign * rotation.pos[..., :1].double() / 4.0)


def _pair(kind: str, pos: torch.Tensor, pairing: str = "interleaved") -> QKRotation:
    r = _rope(pairing).rotation(pos)
    if kind == "damped keys":  # the last three tokens are a reference image: its high-frequency planes damped
        factor = torch.ones(1, pos.shape[0], r.n_pairs, dtype=torch.float64)
        factor[:, -3:, :2] = 0.25
        return QKRotation(r, r._replace(attention_factor=factor))
    if kind == "key positions":
        return QKRotation(r, r._replace(pos=r.pos * 2 + 1))
    if kind == "xpos":
        return QKRotation(r._replace(attention_factor=_xpos(r, 1.0)), r._replace(attention_factor=_xpos(r, -1.0)))
    if kind == "per-head key F":  # the queries' F shared, one F per key head (the second jittered)
        jitter = torch.tensor([1.0, 1.3], dtype=torch.float64)[:, None, None]
        return QKRotation(r, r._replace(freqs=r.freqs * jitter))
    return QKRotation(r, r._replace(freqs=r.freqs * 1.5))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_each_side_turns_by_its_own_rotation(kind, backend, layout):
    pos = ar.grid(2, 3)
    pair = _pair(kind, pos, "half" if layout == "bhsd" else "interleaved")
    q, k = _seeded(B, 6, H, D, seed=1), _seeded(B, 6, HK, D, seed=2)
    to = (lambda x: x) if layout == "bshd" else (lambda x: x.transpose(1, 2))
    got_q, got_k = ops.rotate(to(q), to(k), pair, layout, backend)
    assert_close(to(got_q), oracle(q, pair.query))
    assert_close(to(got_k), oracle(k, pair.key))
    assert (oracle(k, pair.query) - oracle(k, pair.key)).abs().max() > 0.1  # the key side is not the query's
    assert ops.rotate(to(q), None, pair, layout, backend)[1] is None
    query = pair.query  # the table-free entry takes the key side as a keyword
    by_key = ops.rotate_qk(to(q), to(k), *query[:4], layout, backend, key=pair.key)
    assert torch.equal(by_key[0], got_q) and torch.equal(by_key[1], got_k)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_the_reference_and_finite_differences(kind):
    pos = ar.grid(2, 3)
    pair = _pair(kind, pos)
    learned = torch.nn.Parameter(pair.query.freqs.float())  # an F shared by both sides: both contributions
    if kind in ("damped keys", "key positions", "xpos"):
        pair = QKRotation(pair.query._replace(freqs=learned), pair.key._replace(freqs=learned))
    q, k = _seeded(B, 6, H, D, seed=3), _seeded(B, 6, HK, D, seed=4)
    grads = {}
    for backend in ("reference", "torch"):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        learned.grad = None
        got_q, got_k = ops.rotate(qq, kk, pair, "bshd", backend)
        (got_q * _seeded(*got_q.shape, seed=5)).sum().add((got_k * _seeded(*got_k.shape, seed=6)).sum()).backward()
        grads[backend] = (qq.grad, kk.grad, learned.grad)
    for ours, ref in zip(grads["torch"], grads["reference"]):
        if ref is not None:  # F's gradient: float64 sums of 2 x 48 terms in other orders, within 1e-12 relative
            torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12 * float(ref.abs().max()))
    fn = lambda q, k: ops.rotate(q, k, pair, "bshd", "torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q[:1].clone().requires_grad_(), k[:1].clone().requires_grad_()))


def _shifted_logits(kind: str, shift: float) -> torch.Tensor:
    """Logits with every query and key position moved by ``shift`` (the key placement moved with them)."""
    pair = _pair(kind, ar.grid(2, 3) + shift)
    if kind == "key positions":
        query, key = _pair(kind, ar.grid(2, 3))
        pair = QKRotation(query._replace(pos=query.pos + shift), key._replace(pos=key.pos + shift))
    q, k = _seeded(1, 6, H, D, seed=7), _seeded(1, 6, HK, D, seed=8)
    return logits(*ops.rotate(q, k, pair, "bshd", "torch"))


@pytest.mark.parametrize("kind", ["damped keys", "key positions", "xpos"])
def test_what_stays_relative_under_a_common_shift(kind):
    # amplitudes (damped keys), other key positions (shifted with the queries') and xPos's opposite decays
    # (z ** ((m - n) / g)) keep every logit
    base = _shifted_logits(kind, 0.0)
    for shift in (3.0, 250.0):
        torch.testing.assert_close(_shifted_logits(kind, shift), base, rtol=1e-10, atol=1e-10)


def test_what_does_not_stay_relative():
    # the checks above can fail: another key F, per head or not (no common angle), and xPos without the key's decay
    for kind in ("other key F", "per-head key F"):
        assert (_shifted_logits(kind, 3.0) - _shifted_logits(kind, 0.0)).abs().max() > 0.1
    pos = ar.grid(2, 3)
    one_sided = []
    for shift in (0.0, 3.0):
        r = _rope().rotation(pos + shift)
        pair = QKRotation(r._replace(attention_factor=_xpos(r, 1.0)), r)
        q, k = _seeded(1, 6, H, D, seed=7), _seeded(1, 6, HK, D, seed=8)
        one_sided.append(logits(*ops.rotate(q, k, pair)))
    assert (one_sided[1] - one_sided[0]).abs().max() > 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_norm_rotate_normalises_then_turns_each_side(kind):
    pair = _pair(kind, ar.grid(2, 3))
    q, k = _seeded(B, 6, H, D, seed=9), _seeded(B, 6, HK, D, seed=10)
    wq, wk = 1 + _seeded(D, seed=11) / 4, 1 + _seeded(D, seed=12) / 4
    rms = lambda x, w: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    for backend in ("reference", "torch"):
        got_q, got_k = ops.norm_rotate(q, k, wq, wk, pair, "bshd", backend)
        assert_close(got_q, oracle(rms(q, wq), pair.query))
        assert_close(got_k, oracle(rms(k, wk), pair.key))


def _attention(qk_norm):
    torch.manual_seed(0)
    return ar.layers.Attention(32, H, num_kv_heads=HK, head_dim=D, qk_norm=qk_norm).double()


@pytest.mark.parametrize("qk_norm", [None, "rms"])
def test_attention_takes_a_qk_rotation(qk_norm):
    pair = _pair("per-head key F", ar.grid(2, 3))
    attn = _attention(qk_norm)
    x = _seeded(B, 6, 32, seed=13)
    q, k, v = attn.qkv(x).split([H * D, HK * D, HK * D], dim=-1)
    q, k, v = q.view(B, 6, H, D), k.view(B, 6, HK, D), v.view(B, 6, HK, D)
    if qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = oracle(q, pair.query), oracle(k, pair.key)
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=True)
    expected = attn.proj(out.transpose(1, 2).reshape(B, 6, H * D))
    assert_close(attn(x, rotation=pair), expected)


def test_bad_pairs_are_refused_naming_the_field():
    pos = ar.grid(2, 3)
    r = _rope().rotation(pos)
    q, k = _seeded(1, 6, H, D), _seeded(1, 6, HK, D)
    bad = {
        r"rotation.key.pairing 'half' differs": r._replace(pairing="half"),
        r"rotation.key has 3 axes .* rotation.query has 2": ar.AxialRoPE((2, 4, 4)).rotation(ar.grid(1, 2, 3)),
        r"rotation.key turns n=3 planes \(rot_dim 6\), rotation.query n=5": ar.AxialRoPE((2, 4)).rotation(pos),
    }
    for message, key in bad.items():
        with pytest.raises(ValueError, match=message):
            ops.rotate(q, k, QKRotation(r, key))
        with pytest.raises(ValueError, match=message):
            _attention(None)(_seeded(1, 6, 32), rotation=QKRotation(r, key))
    with pytest.raises(TypeError, match="rotation.key must be an axial_rope.ops.Rotation, got tuple"):
        ops.rotate(q, k, QKRotation(r, tuple(r)))
    with pytest.raises(TypeError, match="rotation must be an axial_rope.ops.Rotation .* or a QKRotation"):
        _attention(None)(_seeded(1, 6, 32), rotation=(r, r))
    with pytest.raises(ValueError, match="rotation.key: pos has 4 positions, k has S=6"):
        _attention(None)(_seeded(1, 6, 32), rotation=QKRotation(r, _rope().rotation(ar.grid(2, 2))))
    three = r._replace(freqs=r.freqs.expand(3, *r.freqs.shape))
    with pytest.raises(ValueError, match="per-head frequencies are for 3 heads, k has 2 heads"):
        _attention(None)(_seeded(1, 6, 32), rotation=QKRotation(r, three))


def test_rolling_cache_rerotates_by_the_key_rotation_and_keeps_amplitudes():
    # keys written by a key rotation of their own (per-head F and a per-token amplitude); each roll re-indexes
    # the kept ones by the key F: every slot then holds its token's key turned for the slot's position, with the
    # amplitude it was written with. Rolled by the query's F instead, the keys are off.
    n, window, sinks = 5, 6, 2
    base = ar.AxialRoPE(2 * n, theta=50.0)
    key_freqs = base.freqs * torch.tensor([1.0, 1.2], dtype=torch.float64)[:, None, None]  # [HK, 1, n]
    raw = _seeded(1, HK, 14, D, seed=14)
    factor = 0.5 + torch.rand(1, 14, n, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    results = {}
    for roll_by in ("key", "query"):
        cache, kept, t = KVCache(1, 8, HK, D, window=window, sinks=sinks, dtype=torch.float64), [], 0
        for step in (4, 2, 3, 1, 2, 2):
            key_rot = Rotation(torch.zeros(1, step, 1), key_freqs, None, "interleaved")
            slots = cache.advance(step, key_rot if roll_by == "key" else base)
            key_rot = Rotation(slots[None, :, None].double(), key_freqs, factor[:, t : t + step], "interleaved")
            cache.update(slots, ops.rotate(raw[:, :, t : t + step], None, key_rot, "bhsd")[0], raw[:, :, t : t + step])
            dropped = len(kept) - int(slots[0])  # entries the roll dropped right after the sinks
            kept = kept[:sinks] + kept[sinks + dropped :] + list(range(t, t + step))
            t += step
        slot_pos = torch.arange(len(kept), dtype=torch.float64)[None, :, None]
        expected = oracle(
            raw[:, :, kept].transpose(1, 2), Rotation(slot_pos, key_freqs, factor[:, kept], "interleaved")
        )
        results[roll_by] = (cache.k[:, :, : len(kept)] - expected.transpose(1, 2)).abs().max()
    assert results["key"] < 1e-12 and results["query"] > 0.1


def test_compiled_and_exported_attention_with_a_qk_rotation():
    rope = _rope()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = _attention("rms")

        def forward(self, x, pos):
            r = rope.rotation(pos)
            key = r._replace(pos=r.pos * 2 + 1, freqs=r.freqs.expand(HK, *r.freqs.shape))
            return self.attn(x, rotation=QKRotation(r, key))

    block, x, pos = Block(), _seeded(B, 6, 32, seed=16), ar.grid(2, 3)
    eager = block(x, pos)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    xx = x.clone().requires_grad_()
    compiled(xx, pos).square().sum().backward()
    xe = x.clone().requires_grad_()
    block(xe, pos).square().sum().backward()
    assert_close(compiled(x, pos), eager)
    assert_close(xx.grad, xe.grad)
    exported = torch.export.export(block, (x, pos))
    assert_close(exported.module()(x, pos), eager)
