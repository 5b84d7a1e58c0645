"""Positions as data: grid order, offsets, scale, centring, normalisation, crops, text tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import axial_rope as ar


def test_grid_is_ij_order_first_axis_slowest():
    pos = ar.grid(2, 3, 4)
    assert pos.shape == (24, 3) and pos.dtype == torch.float32
    t, y, x = 1, 2, 3
    assert pos[(t * 3 + y) * 4 + x].tolist() == [1.0, 2.0, 3.0]
    assert pos[:4, 2].tolist() == [0, 1, 2, 3]  # last axis fastest


def test_grid_offset_scale_center_compose_in_documented_order():
    pos = ar.grid(3, 4, offset=(10, 0), scale=0.5, center=True)
    ys, xs = pos[:, 0].unique(), pos[:, 1].unique()
    torch.testing.assert_close(ys, torch.tensor([9.5, 10.0, 10.5]))  # (i - 1) * 0.5 + 10
    torch.testing.assert_close(xs, torch.tensor([-0.75, -0.25, 0.25, 0.75]))


def test_grid_normalize_matches_dinov3_cell_centres():
    pos = ar.grid(2, 4, normalize=True)
    torch.testing.assert_close(pos[:, 0].unique(), torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(pos[:, 1].unique(), torch.tensor([-0.75, -0.25, 0.25, 0.75]))
    # "max": both axes divided by the larger extent, so the short axis covers less
    pos = ar.grid(2, 4, normalize="max")
    torch.testing.assert_close(pos[:, 0].unique(), torch.tensor([-0.75, -0.25]))


def test_grid_interpolation_scale_maps_large_grid_into_trained_range():
    big = ar.grid(8, 8, scale=0.5)
    assert float(big.max()) == 3.5 and float(big.min()) == 0.0


def test_crop_grid_default_is_endpoint_free_spacing():
    pos = ar.crop_grid((2.0, 0.0), (6.0, 8.0), (4, 5))
    expect_y = np.linspace(2.0, 6.0, 4, endpoint=False)
    expect_x = np.linspace(0.0, 8.0, 5, endpoint=False)
    torch.testing.assert_close(pos[:, 0].unique().double(), torch.from_numpy(expect_y))
    torch.testing.assert_close(pos[:, 1].unique().double(), torch.from_numpy(expect_x))


def test_crop_grid_diffusers_compat_differs_only_for_crops_not_at_zero():
    start, stop = (2.0, 0.0), (6.0, 8.0)
    right, compat = ar.crop_grid(start, stop, (4, 5)), ar.crop_grid(start, stop, (4, 5), diffusers_compat=True)
    torch.testing.assert_close(compat[:, 1], right[:, 1])  # the x crop starts at 0: same
    # diffusers' torch form: linspace(2, 6 * 3 / 4, 4) = 2, 2.833, 3.667, 4.5 instead of 2, 3, 4, 5
    torch.testing.assert_close(compat[:, 0].unique(), torch.tensor([2.0, 2.8333333, 3.6666667, 4.5]))
    assert not torch.allclose(compat[:, 0], right[:, 0])


def test_text_positions_flux_zeros_and_mrope_diagonal():
    assert torch.equal(ar.text_positions(3, 3, step=0), torch.zeros(3, 3))
    pos = ar.text_positions(4, 3, start=2)
    assert pos[:, 0].tolist() == [2, 3, 4, 5] and torch.equal(pos[:, 0], pos[:, 2])
    # an image after the text continues from start + length on every axis
    image = ar.grid(1, 2, 2, offset=6)
    assert float(image.min()) == 6.0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ar.grid(), "at least one size"),
        (lambda: ar.grid(0, 3), "positive ints"),
        (lambda: ar.grid(2.5, 3), "positive ints"),
        (lambda: ar.grid(2, 3, offset=(1, 2, 3)), "offset"),
        (lambda: ar.grid(2, 3, scale=float("nan")), "scale"),
        (lambda: ar.grid(2, 3, normalize="diag"), "normalize"),
        (lambda: ar.crop_grid((0,), (1, 1), (2, 2)), "start"),
        (lambda: ar.text_positions(-1), "length"),
    ],
)
def test_position_builders_reject_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- positions_for_size: the one rule for a size not seen in training ------------------------------


def test_positions_for_size_formulas_per_mode():
    sizes, train = (4, 6), (4, 3)  # y as trained, x twice as long
    none = ar.positions_for_size(sizes, train, "none")
    assert torch.equal(none.pos, ar.grid(4, 6)) and none.scaling == (None, None) and none.factors == (1.0, 2.0)
    interp = ar.positions_for_size(sizes, train, "interpolate")
    assert torch.equal(interp.pos, ar.grid(4, 6, scale=(1.0, 0.5)))  # only the longer axis: i / s_a
    ntk = ar.positions_for_size(sizes, train, "ntk")
    assert torch.equal(ntk.pos, ar.grid(4, 6)) and ntk.scaling == (None, ar.scaling.NTK(2.0))
    yarn = ar.positions_for_size(sizes, train, "yarn")
    assert yarn.scaling == (None, ar.scaling.YaRN(2.0, 3))  # original length: the axis' training extent
    norm = ar.positions_for_size(sizes, train, "normalize")
    # (i + 1/2 - n_a / 2) * M / m with M = max(train) = 4, m = max(sizes) = 6
    axes = [(torch.arange(n, dtype=torch.float64) + 0.5 - n / 2) * 4 / 6 for n in sizes]
    expected = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)  # float64
    # float32 positions: a float64 value rounded once (within an ulp, 2**-23, of ours); float32 arithmetic (the 1e-7 this
    # used against a float32 expectation) would add a few roundings of values up to 1.7
    torch.testing.assert_close(norm.pos.double(), expected, rtol=2.0**-23, atol=0)


def test_positions_for_size_normalize_is_centred_unit_spacing_at_the_training_size():
    pos = ar.positions_for_size((4, 4), 4, "normalize").pos
    assert torch.equal(pos, ar.grid(4, 4, center=True))


def test_positions_for_size_per_axis_modes_and_smaller_sizes():
    sized = ar.positions_for_size((16, 8, 8), (8, 4, 4), ("none", "yarn", "interpolate"))
    assert sized.scaling[0] is None and sized.scaling[1] == ar.scaling.YaRN(2.0, 4) and sized.scaling[2] is None
    assert torch.equal(sized.pos[:, 0], ar.grid(16, 8, 8)[:, 0])  # time extrapolates
    smaller = ar.positions_for_size((2, 2), (4, 4), "interpolate")  # below the training size: untouched
    assert torch.equal(smaller.pos, ar.grid(2, 2)) and smaller.factors == (1.0, 1.0)


@pytest.mark.parametrize(
    "args,match",
    [
        (((4, 4), (4,), "none"), "one size per axis"),
        (((4, 4), 4, "stretch"), "mode must be one of"),
        (((4, 4), 4, ("none",)), "one per axis"),
        (((4, 0), 4, "none"), "positive ints"),
    ],
)
def test_positions_for_size_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        ar.positions_for_size(*args)
