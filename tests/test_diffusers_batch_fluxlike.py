"""The records of the Flux-like diffusers families (Flux-style id tables and their relatives) against the tables
their models compute.

For each family, the stock tables module is run inside its tiny model's forward (``models/tiny_diffusers.py``)
at the default token grid and at another one, its inputs are recorded, and ``RotaryTables`` of the record,
unscaled, is called with the same inputs: its output must have the stock structure (tuples, shapes, dtypes,
complex or real) and its values the stock ones within float32's bound. That is what proves a record's rope,
positions and layout. A scaling that does not fit a family's axes is refused naming the family and the axis.
"""

from __future__ import annotations

import pytest
import torch
from conventions_support import upstream_table_bound

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS
from axial_rope.conventions.tables import Sizing
from axial_rope.scaling import RIFLEx, YaRN

diffusers = pytest.importorskip("diffusers")

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models import tiny_diffusers_flux as tiny_flux  # noqa: E402

BATCH = (
    "ChromaTransformer2DModel",
    "BriaTransformer2DModel",
    "BriaFiboTransformer2DModel",
    "Krea2Transformer2DModel",
    "LongCatImageTransformer2DModel",
    "OvisImageTransformer2DModel",
    "Flux2Transformer2DModel",
    "Flux3Transformer2DModel",
    "HiDreamImageTransformer2DModel",
    "PRXTransformer2DModel",
)


class _Recorder(torch.nn.Module):
    """Stands in for a model's tables module (a module or a plain object), calls it, records inputs and outputs."""

    def __init__(self, stock):
        super().__init__()
        self.__dict__["stock"], self.calls = stock, []

    def forward(self, *args, **kwargs):
        out = self.stock(*args, **kwargs)
        self.calls.append((args, kwargs, out))
        return out


def _calls(name: str, h: int, w: int):
    """The stock tables module's ``(args, kwargs, output)`` per call during a forward at an ``h x w`` token grid."""
    model, _ = tiny.build(name)
    attr = DIFFUSERS[name].tables[1]
    stock = getattr(model, attr)
    recorder = _Recorder(stock)
    setattr(model, attr, recorder)
    with torch.no_grad():
        model(**tiny.inputs(name, h, w))
    return model, recorder.calls


def _leaves(out) -> list[torch.Tensor]:
    """The tensors of a tables module's output, in order (complex ones as real pairs)."""
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _leaves(item)]
    return [torch.view_as_real(out) if out.is_complex() else out]


def _structure(out):
    if isinstance(out, (tuple, list)):
        return type(out), tuple(_structure(item) for item in out)
    return tuple(out.shape), out.dtype


@pytest.mark.parametrize("name", BATCH)
@pytest.mark.parametrize("size", ["default", "other"])
def test_rotary_tables_reproduce_the_stock_tables_module(name, size):
    frames, h, w = tiny.TINY[name].grid
    h, w = (h, w) if size == "default" else (h + 2, 2 * w - 1)
    model, calls = _calls(name, h, w)
    family = DIFFUSERS[name]
    ours = RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None)
    assert calls
    for args, kwargs, stock in calls:
        got = ours(*args, **kwargs)
        assert _structure(got) == _structure(stock)
        pos = family.positions(model.config)(ours.rope, None, *args, **kwargs)[0]
        # upstream's float32 angles (frequency and product roundings of |angle|) and cos/sin, ours rounded once
        # from float64: conventions_support.upstream_table_bound, per entry
        bound = upstream_table_bound(ours.rope, pos.reshape(-1, pos.shape[-1]))
        for a, b in zip(_leaves(got), _leaves(stock)):
            torch.testing.assert_close(a, b, atol=bound, rtol=0)


@pytest.mark.parametrize("name", BATCH)
def test_a_temporal_scaling_is_refused_naming_the_family_and_the_axis(name):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    with pytest.raises(ValueError, match=rf"{name} \({family.name}\) has no time axis: RIFLEx .* axis 0"):
        set_rope_processors(model, scaling=RIFLEx(k=2, test_length=8))


@pytest.mark.parametrize("name", BATCH)
def test_a_scaling_per_axis_of_the_wrong_count_is_refused_naming_the_family(name):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    with pytest.raises(ValueError, match=rf"{name} \({family.name}: axes"):
        set_rope_processors(model, scaling=(None,) * (family.rope(model.config).n_axes + 1))


def _double(inputs: dict) -> dict:  # positions and ids keep their dtype, as in tests/test_diffusers_families.py
    return {k: v if k.endswith("ids") else _as_double(v) for k, v in inputs.items()}


def _as_double(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_as_double(v) for v in value)
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def test_chroma_with_the_pipelines_attention_mask_equals_stock_and_scales():
    model, _ = tiny.build("ChromaTransformer2DModel")
    model = model.double()
    inputs = _double(tiny.inputs("ChromaTransformer2DModel", 4, 6))
    mask = torch.ones(2, 5 + 24, dtype=torch.float64)  # the pipeline's float mask over text and image tokens
    mask[1, 4] = 0.0
    inputs["attention_mask"] = mask
    with torch.no_grad():
        stock = model(**inputs)[0]
        handle = set_rope_processors(model, mode="interpolate", train_size=(4, 6))
        same = model(**inputs)[0]  # the training grid: interpolation leaves the positions
        handle.remove()
    torch.testing.assert_close(same, stock, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "name, text, image",
    [  # LongCat: text (0, i, i), image (1, 5 + y, 5 + x); Ovis: text (0, i, i), image (0, y, x)
        (
            "LongCatImageTransformer2DModel",
            tiny_flux._diagonal_text(5),
            ar.grid(1, 8, 12) + torch.tensor([1.0, 5.0, 5.0]),
        ),
        ("OvisImageTransformer2DModel", tiny_flux._diagonal_text(5), ar.grid(1, 8, 12)),
    ],
)
def test_sizing_moves_the_image_rows_about_their_origin_and_keeps_the_text_diagonal(name, text, image):
    model, _ = tiny.build(name)
    family = DIFFUSERS[name]
    rope = family.rope(model.config)
    positions = family.positions(model.config)
    ids = torch.cat([text, image])
    pos, scaling = positions(rope, Sizing((4, 6), ("interpolate", "interpolate")), ids)
    origin = image[0]
    assert torch.equal(pos[:5], text)
    assert torch.equal(pos[5:], origin + (image - origin) / torch.tensor([1.0, 2.0, 2.0]))
    assert scaling == (None, None, None)
    pos, scaling = positions(rope, Sizing((4, 6), ("yarn", "yarn")), ids)
    assert torch.equal(pos, ids) and scaling == (None, YaRN(2.0, 4), YaRN(2.0, 6))


@pytest.mark.parametrize("mode", ["interpolate", "yarn"])
def test_flux3_sizes_its_text_image_and_reference_calls_by_the_forwards_one_grid(mode):
    # FLUX.3 computes text, image and reference tables in three calls: each is sized by the forward's grid (8 x 12,
    # from img_ids and image_cond_ids), so the text (no image in its call) and the smaller reference (4 x 6) get the
    # image's factors: positions halved, or the same YaRN spectra and attention factor on y and x
    name = "Flux3Transformer2DModel"
    model, _ = tiny.build(name)
    g = torch.Generator().manual_seed(0)
    inputs = dict(tiny_flux._flux2_inputs(8, 12, 1, g), image_cond_hidden_states=torch.randn(2, 24, 4, generator=g),
                  image_cond_ids=tiny_flux._ids4(10, 4, 6))  # fmt: skip
    handle = set_rope_processors(model, mode=mode, train_size=(4, 6))
    calls = []
    handle.tables.register_forward_hook(lambda module, args, out: calls.append((args[0], out)))
    with torch.no_grad():
        model(**inputs)
    assert len(calls) == 3
    rope = DIFFUSERS[name].rope(model.config)
    for ids, (cos, sin) in calls:
        if mode == "interpolate":
            want = rope.cos_sin(ids / torch.tensor([1.0, 2.0, 2.0, 1.0]))
        else:
            want = rope.with_scaling((None, YaRN(2.0, 4), YaRN(2.0, 6), None)).cos_sin(ids)
        # float32 cos/sin of float64 angles, each rounded once: within u = 6e-8 of the attention factor (< 1.1)
        torch.testing.assert_close((cos, sin), want, atol=1e-6, rtol=0)
