"""Per-head rotations: ``apply_rope`` with per-head tables (``[S, H, r]``, ``[B, S, H, r]``, grouped heads) and a
per-head ``F`` serving grouped heads (``H_F`` dividing q's and k's heads), on the reference and torch backends,
forward and backward in float64 against the contract (``tests/rotation_oracle.py``); relative invariance per head;
3-D tables read by their shape or refused; head counts that do not divide refused naming the argument.

float64 throughout: the backends and the oracle rotate by the same float64 tables or angles, so they agree to a
few ulps (helpers.TOL's float64 row).
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from rotation_oracle import logits, oracle, table_oracle

import axial_rope as ar
from axial_rope import ops
from axial_rope.ops import Rotation

BACKENDS, PAIRINGS, LAYOUTS = ("reference", "torch"), ("interleaved", "half"), ("bshd", "bhsd")
B, S, H, D = 2, 5, 4, 12


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _tables(shape, seed):
    """Channel tables of ``shape`` (``[..., r]``) in the pairing-free form: each plane's pair of channels equal."""
    angle = _seeded(*shape[:-1], shape[-1] // 2, seed=seed)
    amp = 0.5 + torch.rand(angle.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return (amp * angle.cos()).repeat_interleave(2, -1), (amp * angle.sin()).repeat_interleave(2, -1)


def _same_planes(table: torch.Tensor, pairing: str) -> torch.Tensor:
    """The interleaved-built table in ``pairing``'s channel layout (``half``: planes then their copy)."""
    planes = table[..., 0::2]
    return table if pairing == "interleaved" else torch.cat([planes, planes], -1)


TABLE_SHAPES = {  # name -> (table shape, x heads)
    "[S, H, r]": ((S, H, 10), H),
    "[B, S, H, r]": ((B, S, H, 10), H),
    "[1, S, H, r]": ((1, S, H, 10), H),
    "[S, H_t, r] grouped": ((S, 2, 10), H),
    "[B, S, H_t, r] grouped, full width": ((B, S, 2, D), H),
    "[B, S, 1, r]": ((B, S, 1, 8), H),
}


@pytest.mark.parametrize("name", TABLE_SHAPES)
@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rope_per_head_tables_forward_and_backward(name, pairing, layout, backend):
    shape, heads = TABLE_SHAPES[name]
    cos, sin = (_same_planes(t, pairing) for t in _tables(shape, seed=1))
    x = _seeded(B, S, heads, D, seed=2)
    to = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(1, 2))
    canonical = [t if t.ndim == 4 else t[None] for t in (cos, sin)]  # [B|1, S, H_t, r]
    expected = table_oracle(x, *canonical, pairing)
    leaves = [t.clone().requires_grad_() for t in (x, cos, sin)]
    out = to(ar.apply_rope(to(leaves[0]), leaves[1], leaves[2], pairing, layout, backend=backend))
    assert_close(out, expected)
    grad = _seeded(*out.shape, seed=3)
    (out * grad).sum().backward()
    ref = [t.clone().requires_grad_() for t in (x, cos, sin)]
    ref_out = table_oracle(ref[0], *(t if t.ndim == 4 else t[None] for t in ref[1:]), pairing)
    (ref_out * grad).sum().backward()
    for ours, theirs in zip(leaves, ref):
        assert_close(ours.grad, theirs.grad)


def test_per_head_tables_turn_each_head_by_its_own_table():
    # the check above can fail: head h of x turns by table head h // 2, not by head 0 nor by head h % 2
    cos, sin = _tables((S, 2, 10), seed=4)
    x = _seeded(1, S, H, D, seed=5)
    out = ar.apply_rope(x, cos, sin)
    for h in range(H):
        assert_close(out[:, :, h], ar.apply_rope(x[:, :, h : h + 1], cos[:, h // 2], sin[:, h // 2])[:, :, 0])
    assert (out[:, :, 1] - ar.apply_rope(x, cos[:, 1], sin[:, 1])[:, :, 1]).abs().max() > 0.1


def test_three_dimensional_tables_read_by_their_shape_or_refused():
    x = _seeded(2, 3, 6, D)  # B = 2, S = 3, H = 6
    shared, _ = _tables((2, 3, 10), seed=6)  # [B, S, r]: fits only as a batch of shared tables
    per_head, _ = _tables((3, 6, 10), seed=7)  # [S, H, r]: only per head
    assert_close(ar.apply_rope(x, shared, shared), ar.apply_rope(x, shared[:, :, None], shared[:, :, None]))
    assert_close(ar.apply_rope(x, per_head, per_head), ar.apply_rope(x, per_head[None], per_head[None]))
    square = _seeded(2, 2, 4, D)  # B = S = 2 and 2 divides H = 4: [2, 2, r] is both readings
    table, _ = _tables((2, 2, 10), seed=8)
    with pytest.raises(ValueError, match=r"read as \[B, S, r\] and as \[S, H, r\] both fit .* pass \[B, S, 1, r\]"):
        ar.apply_rope(square, table, table)
    assert ar.apply_rope(square, table[:, :, None], table[:, :, None]).shape == square.shape  # said with 4-D
    assert ar.apply_rope(square, table[None], table[None]).shape == square.shape
    one, _ = _tables((1, 1, 10), seed=9)  # S = 1: both readings are the same rotation
    assert ar.apply_rope(_seeded(1, 1, 4, D), one, one).shape == (1, 1, 4, D)


def test_per_head_tables_whose_heads_do_not_divide_are_refused():
    x = _seeded(1, S, H, D)
    bad = {
        (S, 3, 10): r"cos/sin of shape \(5, 3, 10\) are for 3 heads, x has 4 heads: expected x's heads or a divisor",
        (1, S, 8, 10): r"cos/sin of shape \(1, 5, 8, 10\) are for 8 heads, x has 4 heads",
        (1, S + 1, 2, 10): r"cos/sin have 6 positions \(shape \(1, 6, 2, 10\)\), x has S=5",
        (3, S, 2, 10): r"cos/sin batch 3 \(shape \(3, 5, 2, 10\)\) must be 1 or x's batch 1",
        (1, S, 2, 14): r"cos/sin width r=14 must be even, > 0 and <= head_dim=12",
    }
    for shape, message in bad.items():
        t, _ = _tables(shape, seed=10)
        with pytest.raises(ValueError, match=message):
            ar.apply_rope(x, t, t)


def _grouped_rotation(heads_f: int = 2) -> Rotation:
    """A per-head F ``[H_F, 2, 5]``: one base jittered per head (LoL's per-head base, arXiv 2601.16914)."""
    base = ar.AxialRoPE((4, 6), theta=100.0).freqs
    jitter = torch.linspace(1.0, 1.4, heads_f, dtype=torch.float64)[:, None, None]
    return Rotation(ar.grid(1, 5)[None].double(), base * jitter, None, "interleaved")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("heads", [(4, 2, 2), (4, 4, 4), (4, 2, 1), (6, 3, 3)])
def test_per_head_frequencies_serve_grouped_heads(backend, layout, heads):
    hq, hk, hf = heads
    r = _grouped_rotation(hf)
    q, k = _seeded(B, S, hq, D, seed=11), _seeded(B, S, hk, D, seed=12)
    learned = torch.nn.Parameter(r.freqs.clone())
    to = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(1, 2))
    leaves = [q.clone().requires_grad_(), k.clone().requires_grad_()]
    out_q, out_k = ops.rotate(to(leaves[0]), to(leaves[1]), r._replace(freqs=learned), layout, backend)
    assert_close(to(out_q), oracle(q, r))
    assert_close(to(out_k), oracle(k, r))
    ((to(out_q) * _seeded(B, S, hq, D, seed=13)).sum() + (to(out_k) * _seeded(B, S, hk, D, seed=14)).sum()).backward()
    ref = [q.clone().requires_grad_(), k.clone().requires_grad_()]
    ref_f = torch.nn.Parameter(r.freqs.clone())
    ref_q, ref_k = ops.rotate(ref[0], ref[1], r._replace(freqs=ref_f), "bshd", "reference")
    ((ref_q * _seeded(B, S, hq, D, seed=13)).sum() + (ref_k * _seeded(B, S, hk, D, seed=14)).sum()).backward()
    assert_close(leaves[0].grad, ref[0].grad), assert_close(leaves[1].grad, ref[1].grad)
    # F's gradient: float64 sums over B * S * heads terms in other orders, within 1e-12 of their size
    torch.testing.assert_close(learned.grad, ref_f.grad, rtol=1e-12, atol=1e-12 * float(ref_f.grad.abs().max()))


def test_grouped_per_head_frequencies_keep_each_head_relative():
    # query head h and its key head h // 2 turn by one F: logits depend on position differences only
    q, k = _seeded(1, S, 4, D, seed=15), _seeded(1, S, 2, D, seed=16)
    r = _grouped_rotation(2)
    shifted = r._replace(pos=r.pos + 1000.0)
    torch.testing.assert_close(logits(*ops.rotate(q, k, shifted)), logits(*ops.rotate(q, k, r)), rtol=1e-9, atol=1e-9)
    # with F per query head (4) the key heads cannot follow: refused, naming k
    with pytest.raises(ValueError, match="per-head frequencies are for 4 heads, k has 2 heads"):
        ar.AxialRoPE.from_frequencies(ar.frequencies.Frequencies(_grouped_rotation(4).freqs))(q, k, ar.grid(1, 5))


def test_learned_per_head_frequencies_per_key_head_with_grouped_queries():
    # AxialRoPE(learnable=True, num_heads=H_kv) now serves grouped-query attention: q head h learns with F[h // 2]
    rope = ar.AxialRoPE((4, 6), learnable=True, num_heads=2)
    with torch.no_grad():
        rope.learned_freqs[1] *= 1.5
    q, k = _seeded(1, S, 4, D, seed=17).float(), _seeded(1, S, 2, D, seed=18).float()
    out_q, out_k = rope(q, k, ar.grid(1, 5))
    rotation = rope.rotation(ar.grid(1, 5))
    assert_close(out_q, oracle(q, rotation).float()), assert_close(out_k, oracle(k, rotation).float())
    out_q.sum().backward()
    assert rope.learned_freqs.grad is not None and rope.learned_freqs.grad[1].abs().sum() > 0


def test_grouped_tables_and_frequencies_compile_fullgraph_forward_and_backward():
    cos, sin = _tables((1, S, 2, 10), seed=19)
    r = _grouped_rotation(2)

    def block(x, q, k):
        y = ar.apply_rope(x, cos, sin, "half", backend="torch")
        q, k = ops.rotate(q, k, r, "bhsd", "torch")
        return y.square().sum() + (q * 2).sum() + k.square().sum()

    inputs = (_seeded(B, S, H, D, seed=20), _seeded(B, H, S, D, seed=21), _seeded(B, 2, S, D, seed=22))
    results = []
    for fn in (block, torch.compile(block, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_() for t in inputs]
        loss = fn(*leaves)
        loss.backward()
        results.append((loss, *(t.grad for t in leaves)))
    for a, b in zip(*results):  # float64: the same operations, summed in the same order
        assert_close(a, b)
