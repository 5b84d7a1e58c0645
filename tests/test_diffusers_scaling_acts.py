"""A scaling that cannot act is refused, naming why; one that is accepted acts.

Over every served family with a tiny model and a token grid: installed with ``mode`` against the default grid, a
forward larger on any one grid axis (the others at their training extent) differs from stock, or the install
refused ``mode`` with its reason (CogView4's own rows interpolate already). Before, JoyImage Edit Plus accepted a
``train_size`` on its frame index, which each call sees as one image (sizing it never acted). A family served
unscaled only (tables ``"fixed"``: the model's own) refuses every scaled form with one message.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS

diffusers = pytest.importorskip("diffusers")

from helpers import one_torch_thread  # noqa: E402
from test_conventions_integration import _ltx  # noqa: E402
from test_diffusers_families import _double, _model, _run  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

_one_thread = one_torch_thread()
SIZED = sorted(n for n, f in DIFFUSERS.items() if n in tiny.TINY and f.scalable and f.grid_axes)


def _grown(name: str, axis: int) -> dict:
    """The tiny inputs with grid axis ``axis`` (of the record's grid axes) doubled, the others as trained."""
    frames, h, w = tiny.TINY[name].grid
    n = len(DIFFUSERS[name].grid_axes)
    extents = {"frames": frames, "h": h, "w": w}
    key = {3: ("frames", "h", "w"), 2: ("h", "w"), 1: ("frames",) if tiny.TINY[name].video else ("h",)}[n][axis]
    extents[key] *= 2
    return _double(tiny.inputs(name, extents["h"], extents["w"], frames=extents["frames"]), tiny.TINY[name].dtype)


CASES = [(name, axis) for name in SIZED for axis in range(len(DIFFUSERS[name].grid_axes))]


@pytest.mark.parametrize("name, axis", CASES)
def test_mode_acts_on_every_grid_axis_or_is_refused(name, axis):
    model, _ = _model(name)
    inputs = _grown(name, axis)
    stock = _run(model, inputs)
    for mode in dict.fromkeys(("interpolate", tiny.TINY[name].mode)):
        why = dict(DIFFUSERS[name].refused_modes).get(mode)
        if why is not None:
            with pytest.raises(ValueError, match=f"refuses mode '{mode}': "):
                set_rope_processors(model, mode=mode, train_size=tiny.train_size(name))
            continue
        handle = set_rope_processors(model, mode=mode, train_size=tiny.train_size(name))
        assert (_run(model, inputs) - stock).abs().max() > 1e-4, f"mode {mode!r} did not act on grid axis {axis}"
        handle.remove()


def test_cogview4_refuses_interpolate_which_leaves_larger_grids_at_stock():
    # what the refusal prevents: CogView4's rows floor(i L / n) span L at every size, so "interpolate" is stock there
    name = "CogView4Transformer2DModel"
    model, _ = _model(name)
    inputs = _grown(name, 0)
    stock = _run(model, inputs)
    with pytest.raises(ValueError, match="its own rows interpolate already"):
        set_rope_processors(model, mode="interpolate", train_size=tiny.train_size(name))
    with pytest.raises(ValueError, match="refuses mode 'interpolate'"):
        set_rope_processors(model, mode=("none", "interpolate"), train_size=tiny.train_size(name))
    handle = set_rope_processors(model, mode="none", train_size=tiny.train_size(name))  # the training spacing
    assert (_run(model, inputs) - stock).abs().max() > 1e-4
    handle.remove()


@pytest.mark.parametrize("name", ["LTX2VideoTransformer3DModel", "SanaWMLTX2RefinerTransformer3DModel"])
def test_ltx2_refuses_normalize_at_install(name):
    model, _ = tiny.build(name)
    with pytest.raises(ValueError, match="refuses mode 'normalize': its coordinates are seconds and pixels"):
        set_rope_processors(model, mode="normalize", train_size=tiny.train_size(name))
    with pytest.raises(ValueError, match=r"mode='interpolate' \(or 'none'\) instead"):
        set_rope_processors(model, scaling=ar.scaling.Linear(2.0))


@pytest.mark.parametrize(
    "install",
    [
        dict(scaling=ar.scaling.Linear(2.0)),
        dict(scaling=(None, ar.scaling.NTK(2.0), ar.scaling.NTK(2.0))),
        dict(mode="interpolate", train_size=(3, 4, 5)),
        dict(mode="interpolate", train_size=(3, 4)),
        dict(mode="yarn"),
        dict(train_size=(3, 4, 5)),
    ],
    ids=["one method", "per axis", "mode, 3 ints", "mode, 2 ints", "mode alone", "train_size alone"],
)
def test_a_family_served_unscaled_only_refuses_every_scaled_form_with_one_message(install, monkeypatch):
    # a record whose tables are the model's own ("fixed"): LTX-Video's before it was sized by position modes
    name = "LTXVideoTransformer3DModel"
    fixed = dataclasses.replace(DIFFUSERS[name], tables=("fixed", "rope"), positions=None)
    monkeypatch.setitem(DIFFUSERS, name, fixed)
    model, _ = _ltx()
    with pytest.raises(ValueError, match=rf"{name} \(ltx_video\) is served unscaled only: its processors rotate by "
                                         r"the model's own tables"):  # fmt: skip
        set_rope_processors(model, **install)
    assert set_rope_processors(model).tables is None  # unscaled: served


def test_joyimage_edit_plus_sizes_y_and_x_its_frame_index_stays():
    # each call of its tables method holds one image: its frame index is its place in the item, not a grid to size
    name = "JoyImageEditPlusTransformer3DModel"
    model, _ = tiny.build(name)
    with pytest.raises(ValueError, match=r"training token grid \(y, x\): 2 positive ints"):
        set_rope_processors(model, mode="interpolate", train_size=(2, 2, 3))
    handle = set_rope_processors(model, mode="interpolate", train_size=(1, 3))
    pos, _ = handle.tables.positions(handle.rope, handle.tables.sizing, (1, 0, 0), (2, 2, 6))
    want = torch.stack(torch.meshgrid(torch.tensor([1.0]), torch.arange(2.0) / 2, torch.arange(6.0) / 2,
                                      indexing="ij"), dim=-1).reshape(-1, 3)  # fmt: skip
    torch.testing.assert_close(pos, want, atol=0, rtol=0)  # index 1 kept; (y, x) at twice (1, 3): halved
