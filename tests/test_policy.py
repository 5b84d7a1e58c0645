"""The automatic policy (axial_rope.policy) and the "content" position mode it plans for image axes."""

import warnings

import pytest
import torch

import axial_rope as ar
from axial_rope.policy import DECISIONS, PolicyWarning, plan
from axial_rope.scaling import RIFLEx


def test_content_mode_is_interpolation_on_a_square_upscale():
    content = ar.positions_for_size((16, 16), (8, 8), "content").pos
    interpolated = ar.positions_for_size((16, 16), (8, 8), "interpolate").pos
    assert torch.equal(content, interpolated)


def test_content_mode_keeps_unit_spacing_for_extent_one_side_gains():
    # 1:2 canvas of the trained height: the shared growth is 1, so plain positions on both axes
    assert torch.equal(ar.positions_for_size((8, 16), (8, 8), "content").pos, ar.grid(8, 16))
    # 2x by 3x: both axes interpolated by the shared 2x, so x spans 1.5x the trained extent at spacing 1/2
    pos = ar.positions_for_size((16, 24), (8, 8), "content").pos.view(16, 24, 2)
    assert torch.equal(pos[:, 0, 0], torch.arange(16) / 2.0)
    assert torch.equal(pos[0, :, 1], torch.arange(24) / 2.0)


def test_content_mode_inside_the_trained_grid_is_the_grid():
    assert torch.equal(ar.positions_for_size((5, 8), (8, 8), "content").pos, ar.grid(5, 8))


def test_content_mode_leaves_other_axes_alone():
    pos = ar.positions_for_size((12, 16, 16), (4, 8, 8), ("none", "content", "content")).pos.view(12, 16, 16, 3)
    assert torch.equal(pos[:, 0, 0, 0], torch.arange(12.0))  # time: plain
    assert torch.equal(pos[0, :, 0, 1], torch.arange(16) / 2.0)


def test_content_mode_compiles_with_symbolic_sizes_without_recompiling():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    torch._dynamo.reset()
    f = torch.compile(lambda x: ar.positions_for_size(x.shape, (8, 8), "content").pos, backend=counter, dynamic=True)
    for h, w in ((16, 24), (24, 24), (8, 16), (4, 6)):  # the first distinct: equal sizes would share a symbol
        assert torch.equal(f(torch.zeros(h, w)), ar.positions_for_size((h, w), (8, 8), "content").pos)
    assert counter.frame_count == 1


def test_plan_square_upscale_interpolates_both_axes():
    p = plan(("space", "space"), (64, 64), (128, 128), names=("y", "x"))
    assert p.modes == ("content", "content")
    assert [a.factor for a in p.axes] == [2.0, 2.0]
    assert "interpolated by the shared growth 2.00x" in str(p)
    assert p.scaling() == (ar.scaling.Linear(2.0), ar.scaling.Linear(2.0))


def test_plan_aspect_change_keeps_plain_positions():
    p = plan(("space", "space"), (64, 64), (64, 128), names=("y", "x"))
    assert p.scaling() == (None, None)
    assert "inside the trained extent" in p.axes[0].reason
    assert "extra 2.00x" in p.axes[1].reason


def test_plan_inside_trained_range_does_nothing():
    p = plan(("time", "space", "space"), (21, 30, 52), (13, 30, 52), names=("t", "y", "x"))
    assert p.modes == ("none", "content", "content")
    assert p.scaling() == (None, None, None)
    assert p.riflex(16, 10000.0) is None


def test_plan_video_longer_than_trained_uses_riflex_with_the_intrinsic_pair():
    p = plan(("time", "space", "space"), (13, 30, 45), (26, 30, 45), names=("t", "y", "x"))
    assert p.axes[0].choice == "riflex" and p.modes[0] == "none"
    # CogVideoX's time axis (16 channels, theta 10000, 13 latent frames): the paper's k = 2
    assert p.riflex(16, 10000.0) == RIFLEx(2, 26)


def test_plan_time_without_spectrum_interpolates():
    p = plan(("time",), (10,), (20,), spectrum=False)
    assert p.modes == ("interpolate",)
    assert p.scaling() == (ar.scaling.Linear(2.0),)


@pytest.mark.parametrize(
    "kinds, trained, target, words",
    [
        (("space", "space"), (64, 64), (320, 320), "past the 4x"),
        (("space", "space"), (64, 64), (64, 256), "extra extent of this side 4.00x"),
        (("time", "space", "space"), (13, 8, 8), (53, 8, 8), "at most 3x"),
        (("sequence",), (100,), (150,), "serves nothing"),
    ],
)
def test_plan_refuses_a_factor_past_its_evidence_limit(kinds, trained, target, words):
    with pytest.raises(ValueError, match="pass scaling= or mode="):
        plan(kinds, trained, target)
    with pytest.raises(ValueError) as info:
        plan(kinds, trained, target)
    assert words in str(info.value)


def test_plan_warns_between_measured_and_limit():
    with pytest.warns(PolicyWarning, match="past the 3x measured"):
        p = plan(("space", "space"), (64, 64), (224, 224))
    assert p.axes[0].warning is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan(("space", "space"), (64, 64), (192, 192))  # 3x: measured, no warning


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kinds=("space",), trained=(0,)), "trained"),
        (dict(kinds=("space",), trained=(8,), target=(8, 8)), "target"),
        (dict(kinds=("depth",), trained=(8,)), "kinds"),
        (dict(kinds=("space",), trained=(8,), policy="best"), "policy"),
    ],
)
def test_plan_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        plan(**kwargs)


def test_every_decision_cites_evidence_or_refuses():
    for key, row in DECISIONS.items():
        assert row.choice is None or row.evidence, key
        assert row.measured <= row.limit
