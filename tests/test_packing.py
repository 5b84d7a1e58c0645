"""Packing (axial_rope.packing) and per-item scaling on packed tokens (axial_rope.packed_rope): equal to per item.

Packed against per item is an equality, checked in float64 (``TOL``): both sides form each angle
as one float64 product of a position and a frequency (the packed block positions are zero off the
item's axes), the frequencies agreeing to a few ulps (|angle| < 10: 1e-14 rad), then one rotation
(6 u |z|, helpers.TOL) and RMSNorm ((D / 2 + 8) u), with u = 1.1e-16 and |z| < 8: below 1e-14, and
``TOL = 1e-12``. (The float32 1e-6 once used sat below the float32 bound, 12 u m |z| = 5e-6 for two
float32 rotations.) An item rotated with another item's scaling is off by O(1).

One exception: with per-token attention factors (YaRN items of different sizes) ``PackedRoPE``
rotates by float32 tables (its ``cos_sin``), float64 inputs too, so the packed side is within the
tables' rounding, ``u m (|a| + |b|)`` per plane with u = 2**-24 and the factor m < 1.1
(:func:`_float32_table_bound`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import axial_rope as ar
from axial_rope.packed_rope import PackedRoPE, item_rope
from axial_rope.packing import Item, greedy_pack, pack, unpack

C = 6
TOL = 1e-12  # float64 error bound (module docstring)


def _mixed_items():
    return [
        Item.grid(torch.randn(3, 4, C)),  # image
        Item.grid(torch.randn(2, 2, 3, C)),  # video
        Item.text(torch.randn(5, C)),  # text
        Item.grid(torch.randn(2, 2, C), prefix=torch.randn(3, C)),  # caption, then image
    ]


def test_pack_lays_items_end_to_end_with_their_own_grids():
    items = _mixed_items()
    p = pack(items)
    assert p.tokens.shape == (12 + 12 + 5 + 7, C) and p.pos.shape == (36, 3)
    assert p.segments.bounds == (0, 12, 24, 29, 36) and p.cu_seqlens.tolist() == [0, 12, 24, 29, 36]
    assert p.segment_ids.tolist() == [0] * 12 + [1] * 12 + [2] * 5 + [3] * 7
    # an image is frame 0 of a video; a video keeps its grid; text has its coordinate on every axis
    torch.testing.assert_close(p.pos[:12], torch.cat([torch.zeros(12, 1), ar.grid(3, 4)], 1))
    torch.testing.assert_close(p.pos[12:24], ar.grid(2, 2, 3))
    torch.testing.assert_close(p.pos[24:29], ar.text_positions(5, 3))
    # the caption at 0, 1, 2 on every axis, the image after it (offset 3 on its axes)
    torch.testing.assert_close(p.pos[29:32], ar.text_positions(3, 3))
    torch.testing.assert_close(p.pos[32:], torch.cat([torch.zeros(4, 1), ar.grid(2, 2, offset=3.0)], 1))


def test_unpack_inverts_pack_and_padding_is_its_own_segment():
    items = _mixed_items()
    p = pack(items, pad_to=40)
    assert p.pad == 4 and p.segments.n == 5 and p.lengths == (12, 12, 5, 7)
    assert torch.equal(p.tokens[36:], torch.zeros(4, C))
    grids = unpack(p, p.tokens)
    assert torch.equal(grids[0], items[0].tokens.reshape(3, 4, C))
    assert torch.equal(grids[1], items[1].tokens.reshape(2, 2, 3, C))
    assert torch.equal(grids[2], items[2].tokens)
    text, image = unpack(p, p.tokens[None], prefix=True)[3]
    assert torch.equal(text, items[3].tokens[:3]) and torch.equal(image, items[3].tokens[3:].reshape(2, 2, C))


def test_flux_convention_puts_text_at_zero():
    item = Item.grid(torch.randn(2, 3, C), prefix=torch.randn(4, C), prefix_step=0.0)
    assert torch.equal(item.pos[:4], torch.zeros(4, 2)) and torch.equal(item.pos[4:], ar.grid(2, 3))


BIG = 2**24 + 1  # the first integer float32 cannot hold: it rounds to 2**24


def _far_text(dtype: torch.dtype) -> Item:
    """Three text tokens at 2**24 + 1, + 2, + 3 (float32 would make them 2**24, 2**24 + 2, 2**24 + 4)."""
    return (
        Item.text(torch.randn(3, C))
        if dtype is None
        else Item(torch.randn(3, C), (BIG + torch.arange(3, dtype=dtype))[:, None], (3,), kind="text")
    )


@pytest.mark.parametrize(
    "far, others, expected",
    [
        (torch.int64, [torch.int64], torch.int64),  # integers stay integers (before: float32)
        (torch.int64, [torch.int32, torch.int64], torch.int64),
        (torch.int64, [torch.float32], torch.float64),  # before: float32, 2**24 + 1 -> 2**24
        (torch.float64, [torch.float32, torch.int64], torch.float64),  # before: float32
        (torch.float64, [torch.float64], torch.float64),
    ],
)
def test_packed_positions_are_exact_and_rotate_as_each_item_alone(far, others, expected):
    others = [Item(torch.randn(2, C), torch.arange(2, dtype=d)[:, None] + 7, (2,), kind="text") for d in others]
    items = [others[0], _far_text(far), *others[1:]]
    p = pack(items)
    assert p.pos.dtype == expected
    assert p.pos[2:5, 0].tolist() == [BIG, BIG + 1, BIG + 2]  # every value exact
    rope = ar.AxialRoPE(C, theta=100.0)
    rotated = rope.rotate(p.tokens[None, :, None], p.pos)[0, :, 0]  # [T, C]
    for start, item in zip(p.segments.bounds, items):
        alone = rope.rotate(item.tokens[None, :, None], item.pos)[0, :, 0]
        # float32 rotation arithmetic: equal to rounding (before: 1.1 off at 2**24 + 1)
        torch.testing.assert_close(rotated[start : start + len(item.tokens)], alone, rtol=0, atol=1e-6)


def test_integers_past_float64_mixed_with_floats_are_refused():
    huge = Item(torch.randn(1, C), torch.tensor([[2**53 + 1]]), (1,), kind="text")
    with pytest.raises(ValueError, match=r"item 1 has integer positions up to 9007199254740993, past 2\*\*53"):
        pack([Item.text(torch.randn(2, C)), huge])
    assert pack([huge, huge]).pos[0, 0].item() == 2**53 + 1  # integers alone stay int64


def test_greedy_pack_is_first_fit_decreasing_and_reports_waste():
    plan = greedy_pack([5, 9, 3, 7, 2, 8, 6], 12)
    assert plan.bins == ((1, 2), (5, 4), (3, 0), (6,)) and plan.loads == (12, 10, 12, 6)
    assert plan.waste == pytest.approx(1 - 40 / 48)
    capped = greedy_pack([5, 9, 3, 7, 2, 8, 6], 12, max_bins=2)
    assert capped.bins == ((1, 2), (5, 4)) and capped.dropped == (0, 3, 6)
    with pytest.raises(ValueError, match="item 1 has 13 tokens"):
        greedy_pack([4, 13], 12)


@pytest.mark.parametrize(
    "items, match",
    [
        ([], "at least one item"),
        ([Item.text(torch.randn(2, C)), Item.text(torch.randn(2, C + 1))], "item 1 has token width 7"),
        ([Item.text(torch.randn(2, C)), Item.text(torch.randn(2, C).double())], "item 1 has token dtype"),
    ],
)
def test_bad_items_name_the_item(items, match):
    with pytest.raises(ValueError, match=match):
        pack(items)


def test_bad_item_contents_are_refused():
    with pytest.raises(ValueError, match="has 6 tokens"):
        Item(torch.randn(5, C), torch.zeros(5, 2), (2, 3))
    with pytest.raises(ValueError, match="empty"):
        Item(torch.randn(0, C), torch.zeros(0, 1), (0,))
    with pytest.raises(TypeError, match="bfloat16"):
        Item(torch.randn(2, C), torch.zeros(2, 1, dtype=torch.bfloat16), (2,))
    with pytest.raises(ValueError, match="item 0 has 3 position axes, the pack has 2"):
        pack([Item.grid(torch.randn(1, 2, 2, C))], n_axes=2)
    with pytest.raises(ValueError, match=r"item 3 \(tokens 29..35\) lies past its end"):
        unpack(pack(_mixed_items()), torch.randn(30, 2))


# -- per-item scaling --------------------------------------------------------------------------------

SIZES = [(4, 4), (6, 3), (5, 8), (8, 8), (3, 7), (8, 5)]  # trained at 4 x 4: factors 1 .. 2 per axis


def _packed_case(mode, heads=2, dim=16):
    """Per-item positions and scalings under ``mode``, their q and k, and the packed sequence."""
    items, qs = [], []
    for h, w in SIZES:
        sized = ar.positions_for_size((h, w), 4, mode)
        q = torch.randn(1, h * w, heads, dim, dtype=torch.float64)
        items.append(Item(q[0].reshape(h * w, -1), sized.pos, (h, w), scaling=sized.scaling))
        qs.append(q)
    return items, qs, pack(items)


def _float32_table_bound(x: torch.Tensor, gain: float = 1.0) -> float:
    """Rotating x by float32 tables (factor m < 1.1) instead of float64 ones: within u m (|a| + |b|) <= 2.2 u max |x|.

    ``gain`` bounds what comes after the rotation (RMSNorm's backward: max |w| / min rms).
    """
    return 2.2 * 2.0**-24 * float(x.abs().max()) * gain


def _rotate_both(rope, q, k, pos, backend, norm):
    if norm:
        w = torch.linspace(0.5, 1.5, q.shape[-1], dtype=q.dtype)
        return rope.norm_and_rotate(q, k, pos, w, w, backend=backend)
    return rope(q, k, pos, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("mode, norm", [("ntk", False), ("yarn", False), ("yarn", True), ("ntk", True)])
def test_per_item_scaling_equals_each_item_rotated_by_its_own_rope(backend, mode, norm):
    rope = ar.AxialRoPE((8, 8), theta=100.0)
    items, qs, p = _packed_case(mode)
    packed = p.rope(rope)
    assert isinstance(packed, PackedRoPE) and (packed.scale is not None and packed.scale.ndim == 2) == (mode == "yarn")
    q = p.tokens.reshape(1, -1, 2, 16).clone().requires_grad_()
    k = (2 * q.detach()).requires_grad_()
    qo, ko = _rotate_both(packed, q, k, p.pos, backend, norm)
    ref = [_rotate_both(rope.with_scaling(it.scaling), x, 2 * x, it.pos, backend, norm) for it, x in zip(items, qs)]
    g = torch.randn(qo.shape, dtype=qo.dtype)
    tol = grad_tol = TOL
    if mode == "yarn":  # float32 tables (module docstring), of k = 2 q (normalised: what the rotation sees)
        w = torch.linspace(0.5, 1.5, 16, dtype=q.dtype)
        rms = (k.detach().square().mean(-1) + 1e-6).sqrt()
        rotated = k.detach() / rms[..., None] * w if norm else k.detach()
        tol = _float32_table_bound(rotated)
        grad_tol = _float32_table_bound(g, 1.5 / float(rms.min()) if norm else 1.0)
    torch.testing.assert_close(qo[0], torch.cat([r[0][0] for r in ref]), atol=tol, rtol=TOL)
    torch.testing.assert_close(ko[0], torch.cat([r[1][0] for r in ref]), atol=tol, rtol=TOL)
    # backward: the adjoint of each item's rotation
    grad_q, grad_k = torch.autograd.grad((qo * g).sum() + (ko * g).sum(), (q, k))
    parts = torch.split(g[0], p.lengths)
    ref_grads = []
    for it, x, gi in zip(items, qs, parts):
        xq, xk = x.clone().requires_grad_(), (2 * x).requires_grad_()
        a, b = _rotate_both(rope.with_scaling(it.scaling), xq, xk, it.pos, backend, norm)
        ref_grads.append(torch.autograd.grad((a[0] * gi).sum() + (b[0] * gi).sum(), (xq, xk)))
    torch.testing.assert_close(grad_q[0], torch.cat([r[0][0] for r in ref_grads]), atol=grad_tol, rtol=TOL)
    torch.testing.assert_close(grad_k[0], torch.cat([r[1][0] for r in ref_grads]), atol=grad_tol, rtol=TOL)


def test_block_rows_are_shared_per_axis():
    rope = ar.AxialRoPE((8, 8), theta=100.0)
    _, _, p = _packed_case("ntk")
    packed = p.rope(rope)
    # heights 4, 6, 5, 8, 3, 8 -> y factors {1, 1.5, 1.25, 2}; widths 4, 3, 8, 8, 7, 5 -> x {1, 2, 1.75, 1.25}
    assert packed.freqs.shape[0] == 8
    block = packed.block_positions(p.pos)[0]
    assert block.shape == (p.pos.shape[0], 8) and torch.equal(
        (block != 0).sum(1) <= 2, torch.ones(len(block), dtype=torch.bool)
    )


def test_one_scaling_for_every_item_is_the_plain_rope():
    rope = ar.AxialRoPE((8, 8))
    _, _, p = _packed_case("interpolate")  # positions squeezed, frequencies untouched
    assert p.rope(rope) is rope


def test_length_dependent_scaling_sees_each_items_own_length():
    rope = ar.AxialRoPE(16, scaling=ar.scaling.DynamicNTK(2.0, max_position_embeddings=6))
    lengths = [4, 9, 13]
    xs = [torch.randn(1, n, 1, 16, dtype=torch.float64) for n in lengths]
    p = pack([Item.text(x[0, :, 0]) for x in xs])
    packed = p.rope(rope)
    out = packed.rotate(p.tokens[None, :, None], p.pos)
    ref = torch.cat([rope.rotate(x, torch.arange(n)) for x, n in zip(xs, lengths)], 1)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)
    with pytest.raises(ValueError, match="length-dependent"):
        ar.Attention(16, 1, rope).double()(torch.randn(1, 26, 16, dtype=torch.float64), p.pos, segments=p.segments)


def test_an_items_own_length_dependent_scaling_sees_its_length_on_an_unscaled_rope():
    rope, method = ar.AxialRoPE(16), ar.scaling.DynamicNTK(2.0, max_position_embeddings=6)
    lengths = [4, 9, 13]
    xs = [torch.randn(1, n, 1, 16, dtype=torch.float64) for n in lengths]
    p = pack([Item(x[0, :, 0], torch.arange(n)[:, None], (n,), scaling=method) for x, n in zip(xs, lengths)])
    out = p.rope(rope).rotate(p.tokens[None, :, None], p.pos)
    ref = torch.cat([rope.with_scaling(method).rotate(x, torch.arange(n)) for x, n in zip(xs, lengths)], 1)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)


def test_item_rope_refuses_what_it_cannot_pack():
    _, _, p = _packed_case("ntk")
    with pytest.raises(ValueError, match="learns its own"):
        p.rope(ar.AxialRoPE((8, 8), learnable=True))
    normalized = ar.Frequencies(ar.AxialRoPE((8, 8)).freqs, transform=ar.PositionTransform(normalize="max"))
    with pytest.raises(ValueError, match="normalise each item"):
        item_rope(ar.AxialRoPE.from_frequencies(normalized), [None] * 6, p.segments)
    with pytest.raises(ValueError, match="4 item scalings for 6 segments"):
        item_rope(ar.AxialRoPE((8, 8)), [None] * 4, p.segments)
    packed = p.rope(ar.AxialRoPE((8, 8)))
    with pytest.raises(ValueError, match="does not fit this packed rope"):
        packed.rotate(torch.randn(1, 10, 1, 16), p.pos[:10])


TRITON_SCRIPT = textwrap.dedent(
    """
    import torch, axial_rope as ar
    from axial_rope.packing import Item, pack
    torch.manual_seed(0)
    rope = ar.AxialRoPE((4, 6, 6), theta=100.0)
    sizes = [(t, h, w) for t, h, w in zip(range(1, 9), range(8, 0, -1), (2, 3, 5, 7, 4, 6, 8, 1))]
    for mode in ("ntk", "yarn"):
        items, xs = [], []
        for s in sizes:  # 8 items, every axis with its own factor per item: up to 24 block rows
            sized = ar.positions_for_size(s, 1, mode)
            x = torch.randn(1, sized.pos.shape[0], 2, 16, dtype=torch.float64)  # float64: equality (module docstring)
            items.append(Item(x[0].flatten(1), sized.pos, s, scaling=sized.scaling)); xs.append(x)
        p = pack(items)
        packed = p.rope(rope)
        rows = packed.freqs.shape[0]
        q = p.tokens.reshape(1, -1, 2, 16).clone().requires_grad_()
        qo, _ = packed(q, None, p.pos, backend="triton")
        ref = torch.cat([rope.with_scaling(it.scaling).rotate(x, it.pos, backend="torch") for it, x in zip(items, xs)], 1)
        # float64 (the module docstring's bound: 1e-12), but YaRN's per-token factors: float32 tables
        tol = 1e-12 if mode == "ntk" else 2.2 * 2.0**-24 * float(q.abs().max())
        torch.testing.assert_close(qo, ref, atol=tol, rtol=1e-12)
        g = torch.randn(qo.shape, dtype=qo.dtype)
        (gq,) = torch.autograd.grad((qo * g).sum(), q)
        xr = torch.cat(xs, 1).requires_grad_()
        parts = torch.split(xr, p.lengths, 1)
        out = torch.cat([rope.with_scaling(it.scaling).rotate(x, it.pos, backend="torch") for it, x in zip(items, parts)], 1)
        (gr,) = torch.autograd.grad((out * g).sum(), xr)
        tol = 1e-12 if mode == "ntk" else 2.2 * 2.0**-24 * float(g.abs().max())
        torch.testing.assert_close(gq, gr, atol=tol, rtol=1e-12)
        print(mode, rows, "ok")
    """
)


def test_per_item_scaling_on_the_triton_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).parents[1]
    out = subprocess.run(
        [sys.executable, "-c", TRITON_SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.split()
    assert "ntk" in lines and "yarn" in lines and lines.count("ok") == 2
    assert int(lines[1]) == 24  # 24 rows compiled and ran


def test_the_packing_page_examples_run():
    pytest.importorskip("timm")
    page = (Path(__file__).parents[1] / "docs" / "packing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 6
    namespace: dict = {}
    for block in blocks:  # one namespace, as a reader's session
        exec(compile(block, "docs/packing.md:example", "exec"), namespace)
