"""CRPA (arXiv 2511.19778) against its index map, transcribed here in float64: every query and key of one
attention call on the query's stride, ``pos = x / s_q`` (``x`` the physical coordinates), so equal physical
distances turn every plane by equal angles whichever grid the key comes from; and the linear interpolation it
replaces (``pos = x / s_token``) does not."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from rotation_oracle import planes

import axial_rope as ar
from axial_rope import ops
from axial_rope.methods import crpa_positions, crpa_rotation, grid_coordinates


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _canvas():
    """A 6x6 canvas of cells: high-resolution tokens (stride 1) on the left 3 columns, a stride-3 token on the
    right (covering 3x3 cells twice)."""
    fine = grid_coordinates(6, 3, stride=1)  # centres (i + 0.5, j + 0.5)
    coarse = grid_coordinates(2, 1, stride=3, origin=(0.0, 3.0))  # centres (3 i + 1.5, 4.5)
    return fine, coarse


def test_grid_coordinates_are_cell_centres():
    got = grid_coordinates(2, 3, stride=(2, 1), origin=(0.0, 4.0))
    want = torch.tensor([[2 * i + 1.0, 4 + j + 0.5] for i in range(2) for j in range(3)], dtype=torch.float64)
    assert torch.equal(got, want)


def test_queries_and_keys_are_expressed_on_the_query_stride():
    rope = ar.AxialRoPE((4, 6), theta=50.0)
    fine, coarse = _canvas()
    keys = torch.cat([fine, coarse])
    pair = crpa_rotation(rope, fine, keys, query_stride=1)
    q, k = _seeded(1, 18, 2, 10, seed=1), _seeded(1, 20, 2, 10, seed=2)
    got_q, got_k = ops.rotate(q, k, pair, "bshd", "torch")
    for x, got, coords in ((q, got_q, fine), (k, got_k, keys)):  # z exp(i (x / s_q) @ F)
        angle = (coords / 1.0) @ rope.freqs
        want = planes(x, 5, "interleaved") * torch.polar(torch.ones_like(angle), angle)[None, :, None]
        assert_close(torch.view_as_real(planes(got, 5, "interleaved")), torch.view_as_real(want))
    # a coarse query: the keys on its stride 3
    assert_close(crpa_positions(keys, 3.0), keys / 3.0)
    assert_close(crpa_rotation(rope, coarse, keys, query_stride=3.0).key.pos[0], keys / 3.0)


def _logit(rope, q_pos, k_pos, q, k):
    """Logit of one query and one key (the same content for every key) at the given RoPE positions."""
    qr = ops.rotate(q, None, rope.rotation(q_pos), "bshd", "torch")[0]
    kr = ops.rotate(k, None, rope.rotation(k_pos), "bshd", "torch")[0]
    return (qr * kr).sum(-1)


def test_equal_physical_distances_give_equal_logits_whichever_grid_the_key_is_on():
    rope = ar.AxialRoPE((4, 6), theta=50.0)
    _, coarse = _canvas()
    q, k = _seeded(1, 1, 1, 10, seed=3), _seeded(1, 1, 1, 10, seed=4)  # one content for both keys
    # a fine query and the coarse key 4 cells to its right; another fine query and a fine key 4 cells to its right
    q_a, coarse_key = torch.tensor([[1.5, 0.5]], dtype=torch.float64), coarse[0:1]  # key at (1.5, 4.5)
    q_b, fine_key = torch.tensor([[2.5, 1.5]], dtype=torch.float64), torch.tensor([[2.5, 5.5]], dtype=torch.float64)
    crpa = [
        _logit(rope, crpa_positions(qq, 1), crpa_positions(kk, 1), q, k)
        for qq, kk in ((q_a, coarse_key), (q_b, fine_key))
    ]
    assert_close(crpa[0], crpa[1])
    # linear interpolation (each token by its own stride: the coarse key at x / 3) turns the planes by other angles
    own = _logit(rope, q_a, coarse_key / 3.0, q, k)
    assert (own - crpa[1]).abs().max() > 1e-2


def test_crpa_rotation_compiles_fullgraph():
    rope = ar.AxialRoPE((4, 6), theta=50.0)
    fine, coarse = _canvas()
    keys = torch.cat([fine, coarse]).float()

    def step(q, k, coords_q, coords_k):
        return ops.rotate(q, k, crpa_rotation(rope, coords_q, coords_k, query_stride=1.0), "bshd")

    q, k = _seeded(1, 18, 2, 10, seed=5).float(), _seeded(1, 20, 2, 10, seed=6).float()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(q, k, fine.float(), keys), step(q, k, fine.float(), keys)):
        assert_close(got, want)


def test_bad_strides_and_coordinates_are_refused_by_name():
    fine, _ = _canvas()
    with pytest.raises(ValueError, match="query_stride"):
        crpa_positions(fine, 0.0)
    with pytest.raises(ValueError, match="query_stride"):
        crpa_positions(fine, (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="coords"):
        crpa_positions(fine.long(), 1.0)
    with pytest.raises(ValueError, match="origin"):
        grid_coordinates(2, 2, stride=1, origin=(0.0, 0.0, 0.0))
