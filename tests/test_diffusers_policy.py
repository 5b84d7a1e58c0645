"""``set_rope_processors(..., policy="auto", size=...)``: the plan from the record's training size, installed as
diffusers hooks; equal to the explicit install of what it planned, and to stock inside the trained grid.

Models and inputs are float64 (the tiny fixtures of models/tiny_diffusers.py); "equal" is bit for bit: the planned
install and the explicit one run the same operations.
"""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS, PipelineUnits

diffusers = pytest.importorskip("diffusers")

from diffusers.hooks import HookRegistry  # noqa: E402
from test_diffusers_families import _model, _run  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_policy import plan_family  # noqa: E402
from axial_rope.integrations.diffusers_sites import HOOK  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

FLUX, WAN = "FluxTransformer2DModel", "WanTransformer3DModel"
TOKENS = PipelineUnits(pixels=1)  # sizes in tokens: the tiny models' grids are a few tokens


def _inputs(name: str, h: int, w: int, frames: int | None = None) -> dict:
    from test_diffusers_families import _double

    return _double(tiny.inputs(name, h, w, frames=frames), tiny.TINY[name].dtype)


def test_inside_the_trained_grid_the_plan_is_the_models_own_tables():
    model, inputs = _model(FLUX)
    _, h, w = tiny.TINY[FLUX].grid
    unscaled = set_rope_processors(model)  # our processors on the model's own tables: the unscaled adapter
    want = _run(model, inputs)
    handle = set_rope_processors(model, policy="auto", size=(h, w), train_size=(h, w), units=TOKENS)
    assert [a.choice for a in handle.plan.plan.axes] == ["content", "content"]
    assert "inside the trained extent" in str(handle.plan)
    assert handle.tables is None and unscaled.tables is None  # no tables replaced
    assert torch.equal(_run(model, inputs), want)


@pytest.mark.parametrize("grow", [(2, 2), (3, 3), (1, 2)])
def test_the_plan_equals_the_explicit_install_of_what_it_planned(grow):
    model, _ = _model(FLUX)
    _, h, w = tiny.TINY[FLUX].grid
    size = (grow[0] * h, grow[1] * w)
    inputs = _inputs(FLUX, *size)
    set_rope_processors(model, mode="content", train_size=(h, w))
    want = _run(model, inputs)
    handle = set_rope_processors(model, policy="auto", size=size, train_size=(h, w), units=TOKENS)
    assert handle.plan.modes == ("content", "content") and handle.plan.train_size == (h, w)
    assert torch.equal(_run(model, inputs), want)
    if grow == (1, 2):  # an aspect change: the trained height, the canvas wider at unit spacing
        set_rope_processors(model, mode="none", train_size=(h, w))
        assert torch.equal(_run(model, inputs), want)


def test_a_longer_video_gets_riflex_on_time_and_content_positions_in_space():
    model, _ = _model(WAN)
    frames, h, w = tiny.TINY[WAN].grid
    inputs = _inputs(WAN, 2 * h, 2 * w, frames=2 * frames)
    handle = set_rope_processors(model, policy="auto", size=(2 * frames, 2 * h, 2 * w),
                                 train_size=(frames, h, w), units=PipelineUnits(1, frames=(1, 1)))  # fmt: skip
    riflex = handle.plan.scaling[0]
    assert isinstance(riflex, ar.scaling.RIFLEx) and riflex.test_length == 2 * frames
    assert [a.choice for a in handle.plan.plan.axes] == ["riflex", "content", "content"]
    got = _run(model, inputs)
    # the tables the blocks receive: the record's rope with RIFLEx on time, at the content positions, by hand
    rope = DIFFUSERS[WAN].rope(model.config).with_scaling((riflex, None, None))
    pos = ar.positions_for_size((2 * frames, 2 * h, 2 * w), (frames, h, w), ("none", "content", "content")).pos
    cos, sin = rope.cos_sin(pos)
    ours = handle.tables(inputs["hidden_states"])  # Wan's layout [1, S, 1, D]
    assert torch.equal(ours[0][0, :, 0], cos) and torch.equal(ours[1][0, :, 0], sin)
    for other in (dict(mode=("none", "content", "content"), train_size=(frames, h, w)),
                  dict(scaling=(riflex, None, None))):  # fmt: skip
        set_rope_processors(model, **other)  # each half alone differs from the plan
        assert not torch.equal(_run(model, inputs), got)


def test_an_explicit_mode_overrides_the_plan_and_says_so():
    model, _ = _model(FLUX)
    _, h, w = tiny.TINY[FLUX].grid
    inputs = _inputs(FLUX, 2 * h, 2 * w)
    handle = set_rope_processors(model, policy="auto", size=(2 * h, 2 * w), train_size=(h, w), units=TOKENS,
                                 mode="none")  # fmt: skip
    assert not handle.plan.applied and "not applied" in str(handle.plan)
    handle.remove()
    assert torch.equal(_run(model, inputs), _run(*_model(FLUX)[:1], inputs))


def test_the_plan_reads_the_records_training_size():
    family = DIFFUSERS[FLUX]
    rope = family.rope({"axes_dims_rope": [16, 56, 56], "attention_head_dim": 128, "_class_name": FLUX})
    planned = plan_family(family, rope, policy="auto", size=(2048, 2048))
    assert planned.train_size == (64, 85)  # FLUX.1: 1024 x 1024 and 768 x 1360 px, 16 px per token
    y, x = planned.plan.axes
    assert (y.target, x.target) == (128, 128) and y.choice == x.choice == "content"
    assert "FLUX.1" in planned.source


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(policy="best"), "policy must be None or one of"),
        (dict(size=(64, 64)), "size goes with policy"),
        (dict(policy="auto", size=(64, 0)), "size must be (height, width)"),
        (dict(policy="auto", size=(64, 64), train_size=(4, 4), units=PipelineUnits(1)), None),
        (dict(policy="auto", size=(5 * 4, 5 * 4), train_size=(4, 4), units=PipelineUnits(1)), "past the 4x"),
        (dict(policy="auto", train_size=(4,)), "train_size must be the trained token grid"),
    ],
)
def test_bad_policy_arguments_name_themselves(kwargs, words):
    model, _ = _model(FLUX)
    if words is None:  # 16x: refused, naming the factor and how to override
        with pytest.raises(ValueError, match="pass scaling= or mode="):
            set_rope_processors(model, **kwargs)
        return
    with pytest.raises(ValueError) as info:
        set_rope_processors(model, **kwargs)
    assert words in str(info.value)


def test_a_family_without_a_recorded_training_size_asks_for_train_size():
    name = next(n for n, f in DIFFUSERS.items() if not f.trained and f.grid_axes and n in tiny.TINY)
    model, _ = _model(name)
    with pytest.raises(ValueError, match="pass train_size="):
        set_rope_processors(model, policy="auto")


def test_removing_the_hook_with_diffusers_api_restores_stock():
    model, _ = _model(FLUX)
    _, h, w = tiny.TINY[FLUX].grid
    inputs = _inputs(FLUX, 2 * h, 2 * w)
    stock = _run(model, inputs)
    handle = set_rope_processors(model, policy="auto", train_size=(h, w))
    registry = HookRegistry.check_if_exists_or_initialize(model)
    assert registry.get_hook(HOOK) is not None
    assert not torch.equal(_run(model, inputs), stock)
    registry.remove_hook(HOOK, recurse=True)  # diffusers' own API
    assert torch.equal(_run(model, inputs), stock)
    assert not hasattr(model, "_axial_rope_processors") and not hasattr(model.pos_embed, "_axial_rope_tables")
    handle.remove()  # idempotent after diffusers removed it
    set_rope_processors(model, policy="auto", train_size=(h, w)).remove()
    assert torch.equal(_run(model, inputs), stock)


def test_the_docs_hold_the_policy_and_training_size_tables():
    from pathlib import Path

    from axial_rope.conventions._registry import trained_table
    from axial_rope.integrations.diffusers_policy import policy_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    assert policy_table() in page and trained_table() in page, "regenerate the tables in docs/integrations.md"
