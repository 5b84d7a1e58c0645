"""The video families of diffusers that compute their tables from the latent's shape and the pipeline's extra
inputs (Wan's tables in other models, Helios's frame indices, Cosmos's frame rate, JoyImage's
methods): the records' tables equal the stock ones, structure
by structure, at two sizes.

The shared checks of every record (stock equality, scaling, removal, checkpointing, compile) are in
``tests/test_diffusers_families.py`` and ``tests/test_compile_diffusers.py``; here: the tables themselves, the
bad scalings and the cases the tiny inputs do not reach.
"""

from __future__ import annotations

import pytest
import torch

from axial_rope.conventions._registry import DIFFUSERS, DIFFUSERS_UNSUPPORTED

diffusers = pytest.importorskip("diffusers")

from test_diffusers_families import _train_size  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from axial_rope.scaling import RIFLEx  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_video import ENTRIES  # noqa: E402

BATCH = sorted(
    {
        *ENTRIES,
        "JoyImageEditPlusTransformer3DModel",
        "JoyImageEditTransformer3DModel",
        "HeliosTransformer3DModel",
        "ChronoEditTransformer3DModel",
        "WanAnimateTransformer3DModel",
        "SanaVideoTransformer3DModel",
        "WanVACETransformer3DModel",
        "SkyReelsV2Transformer3DModel",
    }
)
U = 2.0**-24  # float32's unit roundoff


def _stock_calls(model, inputs: dict) -> list:
    """Every call of the model's tables module (or method) in one forward: ``(args, kwargs, output)``."""
    where, attr = DIFFUSERS[type(model).__name__].tables
    calls = []
    if where == "module":
        hook = getattr(model, attr).register_forward_hook(
            lambda module, args, kwargs, out: calls.append((args, kwargs, out)), with_kwargs=True
        )
    else:  # a method: recorded through an instance attribute standing in front of it
        stock = getattr(model, attr)

        def recorded(*args, **kwargs):
            out = stock(*args, **kwargs)
            calls.append((args, kwargs, out))
            return out

        object.__setattr__(model, attr, recorded)
    with torch.no_grad():
        model(**inputs)
    if where == "module":
        hook.remove()
    else:
        del model.__dict__[attr]
    assert calls
    return calls


def _ours(model) -> RotaryTables:
    family = DIFFUSERS[type(model).__name__]
    return RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None)


def _bound(ours: RotaryTables, args, kwargs) -> float:
    # upstream rounds its frequencies (u relative), the float32 product (u) and takes cos/sin of a float32 angle
    # (u); ours rounds float64 cos/sin once (u / 2): |difference| <= 4 u |angle| + 2 u
    pos, *_ = ours.positions(ours.rope, None, *args, **kwargs)
    angle = float((pos.reshape(-1, pos.shape[-1]).double().abs() @ ours.rope.freqs.abs()).max())
    return 4 * U * angle + 2 * U


def _assert_same_structure(got, want, atol: float, where: str = "tables") -> None:
    if want is None:
        assert got is None, f"{where}: {type(got)} vs None"
        return
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {type(got)} vs {type(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same_structure(g, w, atol, f"{where}[{i}]")
        return
    assert got.shape == want.shape and got.dtype == want.dtype, f"{where}: {got.shape, got.dtype} vs {want.shape}"
    torch.testing.assert_close(got.to(want.device), want, atol=atol, rtol=0, msg=where)


@pytest.mark.parametrize("name", BATCH)
@pytest.mark.parametrize("scale", (1, 2), ids=("default", "twice"))
def test_tables_without_scaling_equal_the_stock_module(name, scale):
    model, inputs = tiny.build(name)
    if scale == 2:
        frames, h, w = tiny.TINY[name].grid
        inputs = tiny.inputs(name, 2 * h, 2 * w, frames=2 * frames)
    ours = _ours(model)
    for args, kwargs, stock in _stock_calls(model, inputs):
        _assert_same_structure(ours(*args, **kwargs), stock, _bound(ours, args, kwargs))


@pytest.mark.parametrize("name", BATCH)
def test_a_scaling_that_does_not_fit_names_the_family_and_the_axis(name):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    riflex = RIFLEx(k=2, test_length=20)  # a temporal method on the y axis, the last but one: (y, x) or (t, y, x)
    n_axes = family.rope(model.config).n_axes
    scaling = tuple(riflex if a == n_axes - 2 else None for a in range(n_axes))
    axis = f"axis {n_axes - 2} .y."
    with pytest.raises(ValueError, match=rf"{family.name}.*{axis}"):
        set_rope_processors(model, scaling=scaling)
    with pytest.raises(ValueError, match=family.name):
        set_rope_processors(model, scaling=(None,) * 5)  # one method per axis, and there are not 5


def test_cosmos_image_without_fps_keeps_integer_frames():
    model, inputs = tiny.build("CosmosTransformer3DModel")
    ours = _ours(model)
    for args, kwargs, stock in _stock_calls(model, dict(inputs, fps=None)):
        _assert_same_structure(ours(*args, **kwargs), stock, _bound(ours, args, kwargs))
        pos, *_ = ours.positions(ours.rope, None, *args, **kwargs)
        assert torch.equal(pos[:, 0], pos[:, 0].round())  # frames at their index


def test_cosmos_places_frames_on_the_base_frame_rate():
    model, inputs = tiny.build("CosmosTransformer3DModel")
    ours = _ours(model)
    (args, kwargs, _), *_ = _stock_calls(model, inputs)  # fps 30: 24 / 30 of a base frame apart
    pos, *_ = ours.positions(ours.rope, None, *args, **kwargs)
    assert pos[:, 0].unique().tolist() == pytest.approx([0.0, 0.8, 1.6])


def test_chronoedit_refuses_a_head_its_forward_splits_into_no_rotation():
    config = dict(tiny.WAN, attention_head_dim=16, _class_name="ChronoEditTransformer3DModel")
    with pytest.raises(ValueError, match="attention_head_dim 16.*6, 5, 5"):
        DIFFUSERS["ChronoEditTransformer3DModel"].rope(config)


def test_chronoedit_puts_two_frames_skip_apart_and_more_frames_at_their_index():
    model, _ = tiny.build("ChronoEditTransformer3DModel")
    positions = DIFFUSERS["ChronoEditTransformer3DModel"].positions(model.config)
    rope = _ours(model).rope
    two, _ = positions(rope, None, torch.zeros(1, 4, 2, 4, 6))
    three, _ = positions(rope, None, torch.zeros(1, 4, 3, 4, 6))
    assert two[:, 0].unique().tolist() == [0.0, 7.0]  # rope_temporal_skip_len 8
    assert three[:, 0].unique().tolist() == [0.0, 1.0, 2.0]


def test_helios_tables_follow_each_items_frame_indices():
    model, inputs = tiny.build("HeliosTransformer3DModel")
    rows = {k: v.expand(2, -1).clone() for k, v in inputs.items() if k.startswith("indices")}  # one row per item
    rows["indices_hidden_states"] = torch.tensor([[7, 8, 9], [2, 5, 11]])
    rows["indices_latents_history_mid"] = torch.tensor([[4, 5], [0, 1]])
    ours = _ours(model)
    for args, kwargs, stock in _stock_calls(model, dict(inputs, **rows)):
        _assert_same_structure(ours(*args, **kwargs), stock, _bound(ours, args, kwargs))


def test_hunyuan_image_refuses_its_three_axis_configuration():
    with pytest.raises(ValueError, match=r"\(y, x\) configuration"):
        DIFFUSERS["HunyuanImageTransformer2DModel"].rope(
            dict(rope_axes_dim=(2, 2, 4), attention_head_dim=8, rope_theta=256.0)
        )


def test_wan_animate_2_is_unsupported_with_its_reason():
    assert "WanAnimate2Transformer3DModel" not in DIFFUSERS
    assert "rope_apply" in DIFFUSERS_UNSUPPORTED["WanAnimate2Transformer3DModel"]


def test_joyimage_mrope_text_rows_follow_the_grid():
    model = tiny.TINY["JoyImageEditTransformer3DModel"].model(1)
    model.register_to_config(rope_type="mrope")
    model.rope_type = "mrope"
    _, inputs = tiny.build("JoyImageEditTransformer3DModel")
    ours = _ours(model)
    calls = _stock_calls(model, inputs)
    assert calls[0][2][1] is not None  # text tables
    for args, kwargs, stock in calls:
        _assert_same_structure(ours(*args, **kwargs), stock, _bound(ours, args, kwargs))


@pytest.mark.parametrize("name", ["JoyImageEditTransformer3DModel", "JoyImageEditPlusTransformer3DModel"])
def test_a_shadowed_method_is_the_classs_own_again_after_remove(name):
    model, _ = tiny.build(name)
    attr = DIFFUSERS[name].tables[1]
    handle = set_rope_processors(model, mode="interpolate", train_size=_train_size(name))
    assert getattr(model, attr) is handle.tables and model._axial_rope_tables is handle.tables
    handle.remove()
    assert attr not in model.__dict__ and "_axial_rope_tables" not in dict(model.named_children())
    assert getattr(model, attr).__func__ is getattr(type(model), attr)
