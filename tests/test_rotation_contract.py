"""The rotation contract (docs/architecture.md): every rope-like object describes its rotation as a ``Rotation``
of tensors, rotates through ``ops.rotate`` with it, and keeps nothing between calls.

Each rope-like class is checked against an oracle written here from the contract alone (float64 complex
numbers: ``attention_factor * exp(i pos @ F)`` per plane), so a rope whose ``rotation()`` lied, or whose
calls bypassed it, fails. The reproductions of hidden state (tables keyed on a storage pointer, a memo
keyed on a tensor's identity) are tests too.
"""

from __future__ import annotations

import threading

import pytest
import torch

import axial_rope as ar
from axial_rope.ops import Rotation, rotate
from axial_rope.packing import Item, pack
from axial_rope.rotary import Rotary
from axial_rope.time_scaling import DyPE

# float64 throughout: the oracle and the backends compute the same products of float64 angles, so they agree to
# a few ulps of |x| (6 u |z| per rotation, u = 2**-53: helpers.TOL's float64 row)
TOL = 1e-12


def oracle(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x ``[B, S, H, D]`` rotated as the contract says, from the rotation's fields alone."""
    pos, freqs, factor, pairing = rotation.pos, rotation.freqs, rotation.attention_factor, rotation.pairing
    n = freqs.shape[-1]
    f = freqs.double() if freqs.ndim == 3 else freqs.double()[None]  # [1|H, R, n]
    angle = torch.einsum("bsr,hrn->bshn", pos.double(), f)  # [B|1, S, 1|H, n]
    amp = torch.ones_like(angle) if factor is None else factor.double().reshape(*factor.shape[:-1], 1, n)
    turn = torch.polar(amp.expand_as(angle), angle)
    if pairing == "interleaved":
        z = torch.complex(x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2]) * turn
        out = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(x[..., :n], x[..., n : 2 * n]) * turn
        out = torch.cat([z.real, z.imag], -1)
    return torch.cat([out, x[..., 2 * n :]], -1)


def _packed():
    rope = ar.AxialRoPE((8, 8), theta=100.0)
    items = []
    for h, w in ((4, 4), (6, 3), (2, 8)):  # each its own YaRN factor: per-token attention factors
        sized = ar.positions_for_size((h, w), 4, "yarn")
        items.append(Item(torch.randn(h * w, 4), sized.pos, (h, w), scaling=sized.scaling))
    p = pack(items)
    return p.rope(rope), p.pos


def _ropes():
    yield "plain", ar.AxialRoPE((8, 8), theta=100.0), ar.grid(3, 5)
    yield "half, partial", ar.AxialRoPE(12, pairing="half"), torch.arange(7)
    yield "yarn factor", ar.AxialRoPE((8, 8), scaling=(None, ar.scaling.YaRN(2.0, 4))), ar.grid(3, 5)
    yield "dynamic ntk", ar.AxialRoPE(16, scaling=ar.scaling.DynamicNTK(2.0, 4)), torch.arange(9)
    yield "learned per head", ar.AxialRoPE((8, 8), learnable=True, num_heads=2), ar.grid(3, 5)
    yield "convention per head", ar.conventions.ltx_video(2, 16), ar.grid(2, 3, 2)
    yield "timed", ar.AxialRoPE((8, 8), scaling=(None, DyPE(2.0, 4))).at_time(torch.tensor(0.3)), ar.grid(3, 5)
    packed, pos = _packed()
    yield "packed", packed, pos


ROPES = {name: (rope, pos) for name, rope, pos in _ropes()}


@pytest.mark.parametrize("name", list(ROPES))
def test_each_rope_like_class_rotates_by_its_rotation(name):
    rope, pos = ROPES[name]
    assert isinstance(rope, Rotary)
    rotation = rope.rotation(pos)
    assert isinstance(rotation, Rotation) and rotation.pairing == rope.pairing
    p, f, factor = rotation.pos, rotation.freqs, rotation.attention_factor
    assert p.ndim == 3 and p.shape[1] == pos.shape[0] and f.ndim in (2, 3) and p.shape[-1] == f.shape[-2]
    assert factor is None or factor.shape[-1] == f.shape[-1] and factor.ndim in (1, 3)
    assert 2 * f.shape[-1] == rope.rot_dim
    heads = f.shape[0] if f.ndim == 3 else 2
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, pos.shape[0], heads, rope.rot_dim + 2, generator=g, dtype=torch.float64)
    k = torch.randn(1, pos.shape[0], heads, rope.rot_dim + 2, generator=g, dtype=torch.float64)
    got_q, got_k = rope(q, k, pos)
    for got, x in ((got_q, q), (got_k, k)):
        torch.testing.assert_close(got, oracle(x, rotation), rtol=TOL, atol=TOL)
    # the one entry: the same rotation through ops.rotate gives the same result, bit for bit
    assert torch.equal(rotate(q, k, rotation)[0], got_q)
    torch.testing.assert_close(rope.rotate(q, pos), got_q, rtol=0, atol=0)


def test_positions_rewritten_in_a_numpy_buffer_rotate_by_the_new_values():
    # the torch backend once reused tables keyed on a storage pointer and version: a new torch.from_numpy
    # over the same buffer got the previous step's rotation (off by 6.4)
    rope = ar.AxialRoPE((16, 16))
    x = torch.randn(1, 12, 2, 32, generator=torch.Generator().manual_seed(1))
    buffer = ar.grid(3, 4).numpy().copy()
    first = rope.rotate(x, torch.from_numpy(buffer))
    buffer += 5.0
    second = rope.rotate(x, torch.from_numpy(buffer))
    torch.testing.assert_close(second, rope.rotate(x, ar.grid(3, 4) + 5.0), rtol=0, atol=0)
    assert (second - first).abs().max() > 0.1


def test_data_edits_of_positions_and_of_the_frequencies_are_seen():
    rope = ar.AxialRoPE((16, 16))
    x = torch.randn(1, 12, 2, 32, generator=torch.Generator().manual_seed(2))
    pos = ar.grid(3, 4)
    before = rope.rotate(x, pos)
    pos.data.add_(3.0)  # an edit autograd's version counter does not see
    torch.testing.assert_close(rope.rotate(x, pos), rope.rotate(x, ar.grid(3, 4) + 3.0), rtol=0, atol=0)
    pos.data.sub_(3.0)
    rope.freqs.data.mul_(2.0)  # F doubled: the angles of positions doubled
    torch.testing.assert_close(rope.rotate(x, pos), ar.AxialRoPE((16, 16)).rotate(x, ar.grid(3, 4) * 2.0))
    assert (rope.rotate(x, pos) - before).abs().max() > 0.1


def test_a_packed_rope_shared_by_threads_gives_each_its_own_rotation():
    # PackedRoPE once memoised the last positions it saw: another thread's rotation came back
    packed, pos = _packed()
    x = torch.randn(1, pos.shape[0], 2, 16, generator=torch.Generator().manual_seed(3))
    shifts = [float(i) for i in range(6)]
    expected = {s: packed.rotate(x, pos + s) for s in shifts}
    results, errors = {}, []

    def work(s):
        try:
            for _ in range(50):
                out = packed.rotate(x, pos + s)
                if not torch.equal(out, expected[s]):
                    errors.append(s)
            results[s] = True
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(repr(err))

    threads = [threading.Thread(target=work, args=(s,)) for s in shifts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(results) == 6


def test_a_packed_rope_checks_positions_as_a_rope_does():
    packed, pos = _packed()
    x = torch.randn(1, pos.shape[0], 1, 16)
    with pytest.raises(TypeError, match="257 becomes 256"):
        packed.rotate(x, pos.bfloat16())
    bad = pos.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        packed.rotate(x, bad)


def test_rotation_carries_no_module_and_compiles():
    rope = ar.AxialRoPE((8, 8), scaling=(None, ar.scaling.YaRN(2.0, 4)))
    rotation = rope.rotation(ar.grid(3, 5))
    assert all(isinstance(t, torch.Tensor) or t is None or isinstance(t, str) for t in rotation)
    q = torch.randn(1, 15, 2, 16)
    fn = torch.compile(lambda q, r: rotate(q, None, r)[0], fullgraph=True, backend="eager")
    torch.testing.assert_close(fn(q, rotation), rotate(q, None, rotation)[0], rtol=1e-6, atol=1e-6)
