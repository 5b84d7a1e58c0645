"""The video and audio family records (Mochi, LTX-2, Kandinsky, MiniMax, SANA-WM, AnyFlow, ACE-Step, Stable Audio)
against their stock tables: :class:`RotaryTables` of a record, unscaled, gives what the stock tables module (or the
pipeline's tables argument) gives, at the tiny model's default size and at another one; an install that replaces the
tables at the training size is checked in ``tests/test_diffusers_families.py``; a scaling that does not fit the
family's axes is refused with the family and the axis named.
"""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS

diffusers = pytest.importorskip("diffusers")


from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_videoaudio import ENTRIES  # noqa: E402

SERVED = sorted(name for name in ENTRIES if DIFFUSERS[name].scalable)
# upstream computes its angles as float32 products pos * inv_freq (each rounded, relative 2**-24, on a float32
# inv_freq rounded the same), ours are float64 products rounded once to float32 cos/sin: at the |angle| <= 100 rad
# of these tiny grids the tables differ by at most 100 * 3 * 2**-24 + 2**-24 < 2e-5
TABLES_TOL = 2e-5


def _stock_call(model, name: str, inputs: dict):
    """The stock tables of one forward and what produced them: ``(args, kwargs, output)`` of the tables module, or
    for a tables argument ``((hidden_states,), {}, argument)``."""
    where, attr = DIFFUSERS[name].tables
    if where == "argument":
        return (inputs["hidden_states"],), {}, inputs[attr]
    seen = []
    hook = getattr(model, attr).register_forward_hook(
        lambda module, args, kwargs, output: seen.append((args, kwargs, output)), with_kwargs=True
    )
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    return seen[0]


def _flat(value) -> list[torch.Tensor]:
    """The tensors of a table structure in order (tuples, lists, dicts by key); complex as real pairs."""
    if isinstance(value, dict):
        return [t for key in sorted(value) for t in _flat(value[key])]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _flat(item)]
    return [torch.view_as_real(value) if value.is_complex() else value]


def _same_structure(ours, stock) -> None:
    assert type(ours) is type(stock) and not isinstance(ours, dict) or sorted(ours) == sorted(stock)
    for a, b in zip(_flat(ours), _flat(stock), strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a.to(b.dtype), b, atol=TABLES_TOL, rtol=0)


@pytest.mark.parametrize("name", SERVED)
@pytest.mark.parametrize("size", ["default", "other"])
def test_unscaled_rotary_tables_equal_the_stock_tables(name, size):
    record = DIFFUSERS[name]
    model, inputs = tiny.build(name)
    if size == "other":
        frames, h, w = tiny.TINY[name].grid
        inputs = tiny.inputs(name, h + 1, 2 * w, frames=frames + 1)
    args, kwargs, stock = _stock_call(model, name, inputs)
    ours = RotaryTables(record.rope(model.config), record.positions(model.config), record.layout, None)
    with torch.no_grad():
        got = ours(*args, **kwargs)
    if not record.amplitude:  # angles: equal as rotations (ours are reduced to (-pi, pi])
        got, stock = (got.cos(), got.sin()), (stock.cos(), stock.sin())
    _same_structure(got, stock)


# per family: a scaling that does not fit its axes, and the axis the error names
BAD = {
    "StableAudioDiTModel": ((ar.scaling.Linear(2.0), None), "axes ('t',)"),
    "StableAudio3DiTModel": (ar.scaling.YaRN(2.0, 8), "attention factor"),
    "MiniMaxMusic3Transformer1DModel": ((None, ar.scaling.Linear(2.0)), "axes ('t',)"),
    "MiniMaxH3Transformer3DModel": ((None, ar.scaling.RIFLEx(1, 8), None), "axis 1 (y)"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_scaling_that_does_not_fit_names_the_family_and_the_axis(name):
    model, _ = tiny.build(name)
    scaling, words = BAD[name]
    with pytest.raises(ValueError, match=DIFFUSERS[name].name) as err:
        set_rope_processors(model, scaling=scaling)
    assert words in str(err.value)
