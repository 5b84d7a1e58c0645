"""The records of Bria-Fibo 2, Ideogram 4, ACE-Step 1.5 and Mochi reproduce their model's tables: :class:`RotaryTables` built
from the record, unscaled, returns what the stock model computes on every call of a stock forward, at the tiny
model's grid and at another one; the whole model with its tables replaced at the training size is checked in ``tests/test_diffusers_families.py``; a scaling that does not fit the axes is refused with the family and the axis named.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from test_diffusers_families import _double, _run, answered_by_the_records_tables, records_tables  # noqa: E402

from axial_rope import scaling  # noqa: E402
from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_sites import rotary_blocks  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_last import ENTRIES  # noqa: E402

NAMES = sorted(ENTRIES)
U = 2.0**-24  # float32 unit roundoff
# upstream computes its angles in float32: positions, frequencies and their products (summed over up to 3 axes)
# rounded, at most 5 u |angle|; cos/sin rounded once more, and ours (float64 angles) once: 3e-5 bounds those at the
# tiny models' O(1) tables. The angles reach 180 rad (Mochi's learned F at the base area's coordinates), 65552 rad
# (Ideogram 4's image ids from 65536) and 15708 rad (LTX-2's theta pi / 2 at the edge of its range)
TABLES_TOL = 3e-5


def _close(got, want, atol: float, path: str = "tables"):
    """Structure by structure (tuples item by item, dicts key by key, complex tensors as their real pairs), within
    ``atol``."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for key in want:
            _close(got[key], want[key], atol, f"{path}[{key!r}]")
        return
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, atol, f"{path}[{i}]")
        return
    assert got.shape == want.shape and got.dtype == want.dtype, f"{path}: {got.shape} {got.dtype} {want.dtype}"
    g, w = (torch.view_as_real(t) if t.is_complex() else t for t in (got, want))
    torch.testing.assert_close(g.double(), w.double(), atol=atol, rtol=0, msg=path)


class _Recorder:
    """Stands in for a tables module during one stock forward: records each call's inputs and stock output; other
    attributes are the stock module's (LTX-2's forward calls ``rope.prepare_video_coords``)."""

    def __init__(self, stock):
        self.stock, self.calls = stock, []

    def __call__(self, *args, **kwargs):
        out = self.stock(*args, **kwargs)
        self.calls.append((args, kwargs, out))
        return out

    def __getattr__(self, name):
        return getattr(self.__dict__["stock"], name)


def _stock_calls(name: str, model, inputs: dict, attr: str | None = None) -> list:
    """Every table the stock forward computes in the tables module ``attr`` (default the record's):
    ``(args, kwargs of the record's positions, stock tables)``."""
    where, own = DIFFUSERS[name].tables
    attr = attr or own
    calls = []
    if where == "block argument":  # the block's hidden_states ours reads, and the tables its attention is handed
        # (read at the attention: an installed adapter replaces the block's argument in the block's forward, after
        # torch's pre-hooks have run)

        def record(block, args, kwargs):
            calls.append([(kwargs.get("hidden_states", args[0] if args else None),), {}, None])

        def handed(attention, args, kwargs):
            calls[-1][2] = kwargs["image_rotary_emb"]

        blocks = rotary_blocks(model, DIFFUSERS[name].blocks)
        hooks = [b.register_forward_pre_hook(record, with_kwargs=True) for b in blocks]
        hooks += [b.self_attn.register_forward_pre_hook(handed, with_kwargs=True) for b in blocks]
        try:
            _run(model, inputs)
        finally:
            for hook in hooks:
                hook.remove()
        return calls
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


def _tolerance(ours: RotaryTables, args, kwargs) -> float:
    """5 u of the largest angle of the call (see TABLES_TOL) + 3e-5."""
    pos, *_ = ours.positions(ours.rope, None, *args, **kwargs)
    rotation = ours.rope.rotation(pos)
    freqs = rotation.freqs if ours.frequencies is None else ours.frequencies(*args, **kwargs)
    largest = (rotation.pos.abs().amax() * freqs.abs().sum(-2).amax()).item()  # |pos|_max * max_plane sum_a |F_a|
    return 5 * U * largest + TABLES_TOL


@pytest.mark.parametrize("name", NAMES)
def test_unscaled_tables_equal_the_stock_tables(name):
    model, _ = tiny.build(name)
    frames, h, w = tiny.TINY[name].grid
    for size in ((h, w), (5, 3)):
        inputs = tiny.inputs(name, *size)
        for attr, ours in records_tables(model).items():
            calls = _stock_calls(name, model, inputs, attr)
            assert calls, attr
            for args, kwargs, want in calls:
                _close(ours(*args, **kwargs), want, _tolerance(ours, args, kwargs), attr)


@pytest.mark.parametrize("name", NAMES)
def test_a_scaling_that_does_not_fit_the_axes_names_the_family_and_the_axis(name):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    n_axes = family.rope(model.config).n_axes
    with pytest.raises(ValueError, match=rf"{name} \({family.name}"):
        set_rope_processors(model, scaling=(None,) * (n_axes + 1))
    if family.time_axis is None:  # RIFLEx is temporal: refused on every axis of an image model
        with pytest.raises(ValueError, match=rf"{name} \({family.name}\) has no time axis: .* axis 0"):
            shared = family.rope(model.config).spectrum in ("split", "cycled")  # one method for all axes (M-RoPE)
            riflex = scaling.RIFLEx(2, 8)
            set_rope_processors(model, scaling=riflex if shared else (riflex,) + (None,) * (n_axes - 1))


def test_ideogram4_per_axis_modes_are_refused_for_its_shared_spectrum():
    name = "Ideogram4Transformer2DModel"
    model, inputs = tiny.build(name)
    set_rope_processors(model, mode="yarn", train_size=(3, 4))
    with pytest.raises(ValueError, match=r"Ideogram4Transformer2DModel \(ideogram4\) shares one spectrum"):
        _run(model, tiny.inputs(name, 6, 8))


def test_ace_step_every_block_gets_the_scaled_tables_and_remove_drops_the_hooks():
    name = "AceStepTransformer1DModel"
    model, inputs = tiny.build(name)
    blocks = rotary_blocks(model, DIFFUSERS[name].blocks)
    assert len(blocks) == 2  # a sliding-window block and a full one
    handle = set_rope_processors(model, scaling=scaling.Linear(2.0))
    got = [want for _, _, want in _stock_calls(name, model, inputs)]  # what each block is handed, now ours
    rope = DIFFUSERS[name].rope(model.config).with_scaling(scaling.Linear(2.0))
    cos, sin = rope.cos_sin(torch.arange(12.0)[:, None])  # 12 tokens: positions / 2
    for tables in got:  # both float32 cos/sin of float64 angles, each rounded once: within 2 u = 1.2e-7 of each other
        _close(tables, (cos, sin), 1e-6)
    handle.remove()
    assert all(not b._forward_pre_hooks for b in blocks) and not hasattr(model, "_axial_rope_tables")


def test_mochi_sized_tables_turn_by_the_learned_frequencies_and_pass_their_gradient():
    name = "MochiTransformer3DModel"
    model, inputs = tiny.build(name)
    model, inputs = model.double(), _double(inputs)
    set_rope_processors(model, mode="interpolate", train_size=(3,))
    with torch.no_grad():
        model.pos_frequencies.mul_(2.0)  # a training step's update: the tables follow the weight, no reinstall
    stock, _ = tiny.build(name)
    stock = stock.double()
    with torch.no_grad():
        stock.pos_frequencies.mul_(2.0)
    with answered_by_the_records_tables(stock):  # the stock model on the record's tables of the doubled weight
        want = _run(stock, inputs)
    assert torch.equal(_run(model, inputs), want)
    model(**inputs)[0].square().sum().backward()
    assert model.pos_frequencies.grad is not None and model.pos_frequencies.grad.abs().sum() > 0
