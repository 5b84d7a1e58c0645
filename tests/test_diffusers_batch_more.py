"""The records of the later families (Z-Image) reproduce their model's tables: :class:`RotaryTables` built from
the record, unscaled, returns what the stock tables module returns on every call of a stock forward, at the tiny
model's grid and at another one; the whole model with its tables replaced at the training size is checked in ``tests/test_diffusers_families.py``; a scaling that does not fit the axes is refused with the family and the axis named.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from diffusers.models.embeddings import get_3d_rotary_pos_embed  # noqa: E402
from test_diffusers_batch_imageother import _same  # noqa: E402
from test_diffusers_families import _run  # noqa: E402

from axial_rope import scaling  # noqa: E402
from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_more import ENTRIES  # noqa: E402

NAMES = sorted(ENTRIES)
# another token grid (default (5, 3)): NABLA's multiples of 8; OmniGen's 70 tokens, past its original 64 (long factors)
OTHER = {"Kandinsky6SRTransformer3DModel": (16, 8), "OmniGenTransformer2DModel": (8, 8)}


class _Recorder:
    """Stands in for a tables module during one stock forward: records each call's inputs and stock output."""

    def __init__(self, stock):
        self.stock, self.calls = stock, []

    def __call__(self, *args, **kwargs):
        out = self.stock(*args, **kwargs)
        self.calls.append((args, kwargs, out))
        return out


def _stock_calls(name: str, model, inputs: dict) -> list:
    """Every call the stock forward makes to its tables module: ``(args, kwargs, stock output)``."""
    attr = DIFFUSERS[name].tables[1]
    recorder = _Recorder(getattr(model, attr))
    object.__setattr__(model, attr, recorder)  # an instance attribute: found before a submodule of that name
    try:
        _run(model, inputs)
    finally:
        if isinstance(recorder.stock, torch.nn.Module):
            del model.__dict__[attr]
        else:
            object.__setattr__(model, attr, recorder.stock)
    return recorder.calls


def _allegro_per_token(tables):
    """Allegro's ``((cos, sin) per axis, index per axis)`` -> the ``(cos, sin)`` each token reads, per axis: what
    ``apply_rotary_emb_allegro`` rotates by (``F.embedding(index, table)``)."""
    per_axis, index = tables
    return tuple(tuple(torch.nn.functional.embedding(index[a], t) for t in per_axis[a]) for a in range(3))


# of a table structure, what the processors rotate by (stock and ours lay the same rotation out differently)
USED = {
    "AllegroTransformer3DModel": _allegro_per_token,
    "ErnieImageTransformer2DModel": lambda angles: (angles.cos(), angles.sin()),  # ours wrapped to (-pi, pi]
}


def _given(inputs, size, frames):
    return inputs["image_rotary_emb"]


def _integer_grid(inputs, size, frames):
    return get_3d_rotary_pos_embed(16, ((0, 0), size), size, frames)


# ConsisID's pipeline crops its 4 x 4 base region; ours count the integer latent grid (as CogVideoX's), which is that
# crop at the base size and, at another size, the grid the scaling is stated for
PIPELINE = {"ConsisIDTransformer3DModel": _integer_grid}


@pytest.mark.parametrize("name", NAMES)
def test_unscaled_tables_equal_the_stock_tables(name):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    ours = RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None)
    used = USED.get(name, lambda tables: tables)
    frames, h, w = tiny.TINY[name].grid
    for size in ((h, w), OTHER.get(name, (5, 3))):
        inputs = tiny.inputs(name, *size)
        if family.tables[0] == "argument":  # the pipeline's tables, from the latent
            calls = [((inputs["hidden_states"],), {}, PIPELINE.get(name, _given)(inputs, size, frames))]
        else:
            calls = _stock_calls(name, model, inputs)
        assert calls
        for args, kwargs, want in calls:
            # upstream computes its tables in float32 (angles rounded once, then cos/sin): within 3e-5 at the
            # tiny grids' angles (< 100 rad), as ours (float64 angles rounded once)
            _same(used(ours(*args, **kwargs)), used(want))


@pytest.mark.parametrize("name", NAMES)
def test_a_scaling_that_does_not_fit_the_axes_names_the_family_and_the_axis(name):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    n_axes = family.rope(model.config).n_axes
    with pytest.raises(ValueError, match=rf"{name} \({family.name}"):
        set_rope_processors(model, scaling=(None,) * (n_axes + 1))
    if family.time_axis is None:  # RIFLEx is temporal: refused on every axis of an image model
        with pytest.raises(ValueError, match=rf"{name} \({family.name}\) has no time axis: .* axis 0"):
            set_rope_processors(model, scaling=(scaling.RIFLEx(2, 8),) + (None,) * (n_axes - 1))


def test_z_image_sized_forward_sizes_the_caption_call_by_the_image_grid():
    model, _ = tiny.build("ZImageTransformer2DModel")
    inputs = tiny.inputs("ZImageTransformer2DModel", 6, 8)  # twice the default (3, 4) grid
    handle = set_rope_processors(model, mode="interpolate", train_size=(3, 4))
    _run(model, inputs)
    assert handle.tables.grid.tolist() == [6, 8]  # read from the latents x, for the image and the caption calls


def test_kandinsky5_tables_divide_the_positions_by_the_pipelines_scale_factor():
    name = "Kandinsky5Transformer3DModel"
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    ours = RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None)
    args = ((2, 3, 5, 4), [torch.arange(3), torch.arange(5), torch.arange(4)], (1.0, 2.0, 2.5))
    _same(ours(*args), model.visual_rope_embeddings(*args))
