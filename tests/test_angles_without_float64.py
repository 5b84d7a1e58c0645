"""Angles on a device without float64 (Apple MPS, several NPUs): int64 fixed-point turns, checked on the CPU.

``AxialRoPE(..., angles="turns")`` takes the path a device without float64 takes automatically
(``angles="auto"``): ``F`` as float32 plus its turns in int64 (``axial_rope.ops.turns``). The claims: the
angles match float64's to float32 rounding of a reduced angle, relative invariance holds a million positions
out as on the float64 path, no float64 tensor is made in a forward call, and the choice is automatic where
float64 is missing.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import axial_rope as ar
from axial_rope.ops import _common as common
from axial_rope.ops import rope_angles
from axial_rope.ops.turns import fixed_turns, turn_angles
from axial_rope.packing import Item, pack
from axial_rope.time_scaling import DyPE

# The turn of an integer position is exact to W's rounding, 2**-49 turns per unit position (6.3e-9 rad at
# p = 1e6); the reduced angle in [-pi, pi) is then rounded to float32 twice (the int64 -> float32 conversion
# and the product by 2 pi / 2**48): 2 * ulp(pi) / 2 = 2.4e-7 rad. Fractional positions add |r f| 2**-24 with
# |r f| <= 1 here. 4e-7 rad bounds all of it.
ANGLE_TOL = 4e-7


def _wrapped(a: torch.Tensor) -> torch.Tensor:
    """An angle difference brought into [-pi, pi]."""
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


@pytest.mark.parametrize(
    "pos",
    [
        ar.grid(6, 7, offset=(1e6, 2e6)),  # a million positions out
        ar.grid(6, 7, scale=0.7, offset=(-3.0, 5.0)),  # fractional and negative
        torch.arange(42).reshape(21, 2) * 123_457 - 1_000_000,  # int64, past float32's 2**24
        torch.randint(-(2**40), 2**40, (21, 2), generator=torch.Generator().manual_seed(0)),  # int64 far out
    ],
)
def test_turn_angles_equal_float64_angles_to_float32_rounding(pos):
    freqs = ar.AxialRoPE((32, 32), theta=100.0).freqs
    got = turn_angles(pos, freqs.float(), fixed_turns(freqs)).double()
    exact = rope_angles(pos, freqs)
    # int64 positions near 2**40: W's rounding is 2**40 * 2**-49 turns = 1.2e-2 rad at the fastest plane;
    # the float64 product itself is off by |angle| 2**-53 = 1.2e-4 rad there. Below 2**24: ANGLE_TOL.
    far = not pos.is_floating_point() and pos.abs().max() > 2**24
    tol = 2.0**-49 * float(pos.abs().max()) * 2 * math.pi + 2.0**-53 * float(exact.abs().max()) if far else ANGLE_TOL
    assert _wrapped(got - exact).abs().max() <= tol
    assert got.abs().max() <= math.pi + 1e-6  # reduced


def test_per_head_frequencies_by_turns():
    freqs = torch.rand(2, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.randint(-1000, 10**6, (5, 3), generator=torch.Generator().manual_seed(2))
    got = turn_angles(pos, freqs.float(), fixed_turns(freqs)).double()
    assert _wrapped(got - rope_angles(pos, freqs)).abs().max() <= ANGLE_TOL


def _ropes(angles: str):
    yield "plain", ar.AxialRoPE((16, 16), theta=100.0, angles=angles), ar.grid(4, 5, offset=(1e6, 3.0))
    yield "yarn", ar.AxialRoPE((16, 16), scaling=(None, ar.scaling.YaRN(2.0, 4)), angles=angles), ar.grid(4, 5)
    yield "dynamic", ar.AxialRoPE(16, scaling=ar.scaling.DynamicNTK(2.0, 4), angles=angles), torch.arange(20)
    yield "dype", ar.AxialRoPE((16, 16), scaling=(None, DyPE(2.0, 4)), angles=angles).at_time(0.3), ar.grid(4, 5)
    items = [Item(torch.randn(h * w, 4), *(lambda s: (s.pos, (h, w)))(ar.positions_for_size((h, w), 3, "yarn")),
                  scaling=ar.positions_for_size((h, w), 3, "yarn").scaling) for h, w in ((3, 3), (4, 2))]  # fmt: skip
    p = pack(items)
    yield "packed", p.rope(ar.AxialRoPE((16, 16), angles=angles)), p.pos


def _rope(name: str, angles: str):
    return next((rope, pos) for n, rope, pos in _ropes(angles) if n == name)


NAMES = [name for name, _, _ in _ropes("turns")]


@pytest.mark.parametrize("name", NAMES)
def test_rotations_by_turns_equal_the_float64_path(name):
    (rope, pos), (exact, _) = _rope(name, "turns"), _rope(name, "float64")
    x = torch.randn(1, pos.shape[0], 2, 40, generator=torch.Generator().manual_seed(3))
    rotation = rope.rotation(pos)
    assert rotation.turns is not None and rotation.turns.dtype == torch.int64
    # each rotated channel moves by |x| * ANGLE_TOL, plus float32 rounding of both paths (6 u |x|, u = 2**-24);
    # time-dependent F(t) is float32 by turns (2**-24 relative, angles here < 100 rad: 6e-6 rad)
    tol = (6e-6 if name == "dype" else ANGLE_TOL + 6 * 2.0**-24) * float(x.abs().max())
    torch.testing.assert_close(rope.rotate(x, pos), exact.rotate(x, pos), rtol=0, atol=tol)


class _Dtypes(TorchDispatchMode):
    """Records the dtype of every tensor an operation takes or makes."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in (*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))):
            if isinstance(value, torch.Tensor):
                self.seen.add(value.dtype)
        return out


# a length-dependent F is computed per call on the host, in float64, and moved as float32 and turns: float64
# never reaches a device without it, but with the CPU standing in for that device the two cannot be told apart
@pytest.mark.parametrize("name", [n for n in NAMES if n != "dynamic"])
def test_no_float64_tensor_is_made_in_a_forward_by_turns(name):
    rope, pos = _rope(name, "turns")
    q = torch.randn(1, pos.shape[0], 2, 32)
    with _Dtypes() as mode:
        rope(q, q, pos)
    assert torch.float64 not in mode.seen, sorted(map(str, mode.seen))


def test_relative_invariance_a_million_positions_out_as_on_the_float64_path():
    # the score of a query and a key 4 positions apart must not change when both move 1e6 out (scripts/rope_check)
    from scripts.rope_check import PAIRS, invariance_table

    table = invariance_table(seed=0)
    near, far, _ = PAIRS
    for impl in ("axial_rope", "axial_rope (turns)"):
        scores = table[impl]["float32"]
        assert abs(scores[far] - scores[near]) < 1e-4, impl


def test_the_path_is_chosen_automatically_where_float64_is_missing(monkeypatch):
    monkeypatch.setitem(common._FLOAT64, "cpu", False)  # the CPU stands in for a device without float64
    rope = ar.AxialRoPE((16, 16), theta=100.0)  # angles="auto"
    assert not rope.float64_angles() and rope.freqs.dtype == torch.float32 and rope.turns.dtype == torch.int64
    assert all(b.dtype != torch.float64 for b in rope.buffers())
    pos, q = ar.grid(4, 5, offset=(1e6, 0.0)), torch.randn(1, 20, 2, 32)
    with _Dtypes() as mode:
        out = rope(q, q, pos)[0]
    assert torch.float64 not in mode.seen
    monkeypatch.setitem(common._FLOAT64, "cpu", True)
    exact = ar.AxialRoPE((16, 16), theta=100.0)
    assert exact.float64_angles() and exact.freqs.dtype == torch.float64 and exact.turns is None
    torch.testing.assert_close(out, exact(q, q, pos)[0], rtol=0, atol=(ANGLE_TOL + 6 * 2.0**-24) * float(q.abs().max()))


def test_float64_is_refused_as_an_explicit_choice_nowhere_and_the_names_are_checked():
    with pytest.raises(ValueError, match="angles must be one of"):
        ar.AxialRoPE(8, angles="float32")
    rope = ar.AxialRoPE(8, angles="float64")
    assert rope.float64_angles() and rope.turns is None
