"""The records of Bria-Fibo 2, Ideogram 4, ACE-Step 1.5 and Mochi reproduce their model's tables: :class:`RotaryTables` built
from the record, unscaled, returns what the stock model computes on every call of a stock forward, at the tiny
model's grid and at another one; the record's ``max_diff`` bounds the whole model with its tables replaced at the
training size; a scaling that does not fit the axes is refused with the family and the axis named.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from test_diffusers_families import _double, _run, _train_size  # noqa: E402

from axial_rope import scaling  # noqa: E402
from axial_rope.conventions import mochi_positions  # noqa: E402
from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations.diffusers import _rotary_blocks, set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_last import ENTRIES  # noqa: E402

NAMES = sorted(ENTRIES)
U = 2.0**-24  # float32 unit roundoff
# upstream computes its angles in float32 (inverse frequency and product rounded: |angle| 2 u) and rounds cos/sin
# once more; ours are float64 angles rounded once: the tables differ by at most 2 u max|angle| + 3 u, which at the
# tiny grids' angles (< 100 rad) 3e-5 bounds with room; Ideogram 4's image ids start at 65536, so there the bound
# is 2 u max|angle| (8e-3 rad at its largest position, 65536 + 16) + the same 3e-5
TABLES_TOL = 3e-5


def _close(got, want, atol: float, path: str = "tables"):
    """Structure by structure (tuples item by item, complex tensors as their real pairs), within ``atol``."""
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, atol, f"{path}[{i}]")
        return
    assert got.shape == want.shape and got.dtype == want.dtype, f"{path}: {got.shape} {got.dtype} {want.dtype}"
    g, w = (torch.view_as_real(t) if t.is_complex() else t for t in (got, want))
    torch.testing.assert_close(g.double(), w.double(), atol=atol, rtol=0, msg=path)


def _stock_calls(name: str, model, inputs: dict) -> list:
    """Every table the stock forward computes: ``(args, kwargs of the record's positions, stock tables)``."""
    where, attr = DIFFUSERS[name].tables
    calls = []
    if where == "block argument":  # what each block is handed, and the block's hidden_states ours reads

        def record(block, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            calls.append(((hidden,), {}, kwargs.get(attr, args[1] if len(args) > 1 else None)))

        hooks = [
            b.register_forward_pre_hook(record, with_kwargs=True) for b in _rotary_blocks(model, DIFFUSERS[name].blocks)
        ]
        try:
            _run(model, inputs)
        finally:
            for hook in hooks:
                hook.remove()
        return calls
    stock = getattr(model, attr)

    def recorder(*args, **kwargs):
        out = stock(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    object.__setattr__(model, attr, recorder)  # an instance attribute: found before a submodule of that name
    try:
        _run(model, inputs)
    finally:
        if isinstance(stock, torch.nn.Module):
            del model.__dict__[attr]
        else:
            object.__setattr__(model, attr, stock)
    return calls


def _tolerance(name: str, model, inputs: dict) -> float:
    if "position_ids" in inputs:  # Ideogram 4: float32 angles at its largest position id (its first plane turns by 1)
        return 2 * U * inputs["position_ids"].max().item() + TABLES_TOL
    if name == "MochiTransformer3DModel":  # learned F at the base area's coordinates: angles up to A = 180 rad; stock
        # rounds positions (u) and sums three float32 products (3 u), ours rounds the positions too: 5 u A
        frames, height, width = inputs["hidden_states"].shape[2], *(n // 2 for n in inputs["hidden_states"].shape[3:])
        pos = mochi_positions(frames, height, width, dtype=torch.float64).abs()
        largest = torch.einsum("nd,dhf->nhf", pos, model.pos_frequencies.detach().abs().double()).max().item()
        return 5 * U * largest + TABLES_TOL
    return TABLES_TOL


def _ours(name: str, model) -> RotaryTables:
    family = DIFFUSERS[name]
    frequencies = None if family.frequencies is None else family.frequencies(model.config)
    return RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None,
                        frequencies=frequencies)  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_unscaled_tables_equal_the_stock_tables(name):
    model, _ = tiny.build(name)
    ours = _ours(name, model)
    frames, h, w = tiny.TINY[name].grid
    for size in ((h, w), (5, 3)):
        inputs = tiny.inputs(name, *size)
        calls = _stock_calls(name, model, inputs)
        assert calls
        for args, kwargs, want in calls:
            _close(ours(*args, **kwargs), want, _tolerance(name, model, inputs))


@pytest.mark.parametrize("name", NAMES)
def test_tables_replaced_at_the_training_size_stay_within_max_diff(name):
    model, inputs = tiny.build(name)
    model, inputs = model.double(), _double(inputs)
    stock = _run(model, inputs)
    handle = set_rope_processors(model, mode="interpolate", train_size=_train_size(name))  # unscaled positions
    assert handle.tables is not None
    diff = (_run(model, inputs) - stock).abs().max().item()
    print(f"{name}: {diff:.2e}")
    assert diff <= DIFFUSERS[name].max_diff, diff


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
    blocks = _rotary_blocks(model, DIFFUSERS[name].blocks)
    assert len(blocks) == 2  # a sliding-window block and a full one
    handle = set_rope_processors(model, scaling=scaling.Linear(2.0))
    got = [want for _, _, want in _stock_calls(name, model, inputs)]  # what each block is handed, now ours
    rope = DIFFUSERS[name].rope(model.config).with_scaling(scaling.Linear(2.0))
    cos, sin = rope.cos_sin(torch.arange(12.0)[:, None])  # 12 tokens: positions / 2
    for tables in got:
        _close(tables, (cos, sin), 1e-6)
    handle.remove()
    assert all(not b._forward_pre_hooks for b in blocks) and not hasattr(model, "_axial_rope_tables")


def test_consisid_tables_are_the_pipelines_at_the_base_size_and_the_integer_grids_elsewhere():
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    name = "ConsisIDTransformer3DModel"
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    ours = RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None)
    frames = tiny.TINY[name].grid[0]
    base = tiny.inputs(name, 4, 4)  # the 4 x 4 base region: the pipeline's crop is the whole of it
    _close(ours(base["hidden_states"]), base["image_rotary_emb"], TABLES_TOL)
    other = tiny.inputs(name, 5, 3)  # the pipeline crops the base region; scaled, ours count the latent grid
    integer = get_3d_rotary_pos_embed(16, ((0, 0), (5, 3)), (5, 3), frames)
    _close(ours(other["hidden_states"]), integer, TABLES_TOL)


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
    # angles twice those the record's max_diff was measured at: twice their float32 rounding
    diff = (_run(model, inputs) - _run(stock, inputs)).abs().max().item()
    assert diff <= 2 * DIFFUSERS[name].max_diff, diff
    model(**inputs)[0].square().sum().backward()
    assert model.pos_frequencies.grad is not None and model.pos_frequencies.grad.abs().sum() > 0
