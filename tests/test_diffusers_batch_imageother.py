"""The records of CogView4, GLM-Image, Qwen-Image, Lumina, OmniGen, Hunyuan-DiT, Ideogram 4, Allegro and ConsisID
(and ``AxialRoPE(plane_order=...)``, which Hunyuan-DiT and Lumina-Next need to scale) reproduce their model's tables: :class:`RotaryTables` built from the record, unscaled, returns what the stock
tables module returns (or the pipeline passes) at the tiny model's grid and at another one, structure by structure;
the whole model with its tables replaced at the training size is checked in ``tests/test_diffusers_families.py``; a scaling that does
not fit the axes is refused with the family and the axis named.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from test_diffusers_families import TOL, _double  # noqa: E402

from axial_rope import scaling  # noqa: E402
from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_image import HUNYUAN_DIT, hunyuan_dit_inputs  # noqa: E402

# upstream computes its tables in float32 (positions, inverse frequencies and their products rounded: |angle|
# (2 u + u) with u = 2**-24, cos/sin rounded once more): at the tiny grids' angles (< 100 rad) 3e-5 bounds cos and
# sin with room; the same bound holds our float64 angles rounded once
TABLES_TOL = 3e-5


def _stock_tables(name: str, model, inputs: dict):
    """What the stock tables module returns (or the pipeline passed), and the inputs ours reads, for ``inputs``."""
    family = DIFFUSERS[name]
    where, attr = family.tables
    if where == "argument":
        used = USED.get(name, lambda model, table, inputs: table)
        return used(model, inputs[attr], inputs), (inputs["hidden_states"],), {}
    args, kwargs = TABLE_INPUTS[name](model, inputs)
    return getattr(model, attr)(*args, **kwargs), args, kwargs


def _same(got, want, path="tables"):
    """Structure by structure: tuples and lists item by item, complex tensors as their real pairs, python values equal."""
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), f"{path}: {type(got)} vs {type(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{path}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, f"{path}: {getattr(got, 'shape', got)}"
        assert got.dtype == want.dtype or (got.is_complex() == want.is_complex()), f"{path}: {got.dtype} {want.dtype}"
        if want.is_floating_point() or want.is_complex():
            g, w = (torch.view_as_real(t) if t.is_complex() else t for t in (got, want))
            torch.testing.assert_close(g.double(), w.double(), atol=TABLES_TOL, rtol=0, msg=path)
        else:
            assert torch.equal(got, want), path
    else:
        assert got == want, f"{path}: {got!r} vs {want!r}"


def _ours(name: str, model) -> RotaryTables:
    family = DIFFUSERS[name]
    return RotaryTables(family.rope(model.config), family.positions(model.config), family.layout, None)


def _latent(model, inputs):
    return (inputs["hidden_states"],), {}


def _qwen(model, inputs):
    text = inputs["encoder_hidden_states"].shape[1]
    return (inputs["img_shapes"],), {"max_txt_seq_len": text, "device": torch.device("cpu")}


def _qwen21(model, inputs):
    img_mask = inputs["img_mask"]  # the forward expands each vision-language image slot to 2 x 2 latent tokens
    image_pad_mask = torch.repeat_interleave(img_mask[0], torch.where(img_mask, 4, 1)[0])
    return (inputs["img_shapes"][0], image_pad_mask), {"device": torch.device("cpu")}


# the inputs the forward hands its tables module, from the tiny model's forward inputs
TABLE_INPUTS = {
    "CogView4Transformer2DModel": _latent,
    "GlmImageTransformer2DModel": _latent,
    "QwenImageTransformer2DModel": _qwen,
    "QwenImage21Transformer2DModel": _qwen21,
    "Lumina2Transformer2DModel": lambda model, inputs: (
        (inputs["hidden_states"], inputs["encoder_attention_mask"]),
        {},
    ),
    "LuminaNextDiT2DModel": None,  # the pipeline's argument
    "HunyuanDiT2DModel": None,
}


def _lumina_next_used(model, table, inputs):  # the model slices the pipeline's grid to the latent's
    h, w = (n // model.config.patch_size for n in inputs["hidden_states"].shape[2:])
    return table[:h, :w]


# of a pipeline's table argument, the part the model uses
USED = {"LuminaNextDiT2DModel": _lumina_next_used}
OTHER = {"QwenImage21Transformer2DModel": (2, 6)}  # another token grid (default (5, 3): odd extents on purpose)
NAMES = sorted(TABLE_INPUTS)


@pytest.mark.parametrize("name", NAMES)
def test_unscaled_tables_equal_the_stock_tables(name):
    model, _ = tiny.build(name)
    frames, h, w = tiny.TINY[name].grid
    for size in ((h, w), OTHER.get(name, (5, 3))):
        inputs = tiny.inputs(name, *size)
        want, args, kwargs = _stock_tables(name, model, inputs)
        _same(_ours(name, model)(*args, **kwargs), want)


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


@pytest.mark.parametrize("layered", [False, True])
def test_qwen_image_with_references_and_layers_gives_the_stock_tables(layered):
    # Qwen-Image-Edit's target and reference images of other sizes; the layered variant's layers and condition
    model = diffusers.QwenImageTransformer2DModel(**dict(tiny.build("QwenImageTransformer2DModel")[0].config,
                                                         use_layer3d_rope=layered))  # fmt: skip
    shapes = [[(1, 4, 6), (1, 5, 3), (1, 2, 7)]] * 2
    kwargs = {"max_txt_seq_len": 7, "device": torch.device("cpu")}
    _same(_ours("QwenImageTransformer2DModel", model)(shapes, **kwargs), model.pos_embed(shapes, **kwargs))


def test_plane_order_permutes_the_planes_and_scales_each_axis_in_spectrum_order():
    import axial_rope as ar

    plain = ar.AxialRoPE((4, 8), theta=100.0, scaling=(None, scaling.NTK(4.0)))
    order = [2, 0, 3, 1, 4, 5]
    ordered = ar.AxialRoPE((4, 8), theta=100.0, scaling=(None, scaling.NTK(4.0)), plane_order=order)
    assert torch.equal(ordered.freqs, plain.freqs[:, order])
    assert [plain.plane_axis[j] for j in order] == ordered.plane_axis
    again = ordered.with_scaling((None, scaling.YaRN(2.0, 8)))  # a new scaling keeps the order
    assert torch.equal(again.freqs, ar.AxialRoPE((4, 8), 100.0, (None, scaling.YaRN(2.0, 8))).freqs[:, order])
    with pytest.raises(ValueError, match="plane_order must be a permutation of range\\(6\\)"):
        ar.AxialRoPE((4, 8), plane_order=[0, 1, 2, 3, 4, 4])


def test_hunyuan_dit_controlnet_takes_the_transformers_record():
    # the ControlNet reads the same pipeline tables: unscaled it is stock but for the rotation's rounding, sized it
    # changes, removal restores it
    torch.manual_seed(0)
    model = diffusers.HunyuanDiT2DControlNetModel(**HUNYUAN_DIT, transformer_num_layers=4).double().eval()
    for zeroed in (*model.controlnet_blocks, model.input_block):  # zero-initialised: give them weights
        torch.nn.init.normal_(zeroed.weight, std=0.5)
    inputs = _double(hunyuan_dit_inputs(8, 12, 1, torch.Generator().manual_seed(0)))
    inputs.update(controlnet_cond=torch.randn(2, 4, 16, 24, dtype=torch.float64), conditioning_scale=1.0)

    def run():
        with torch.no_grad():
            return torch.stack(model(**inputs)[0])

    stock = run()
    handle = set_rope_processors(model)
    # our processors (the record names HunyuanDiTRopeProcessor) rotate the float64 q and k in float64, stock's
    # apply_rotary_emb rounds them to float32 first: within 4 x swapped layers x 2 (D/2 + 14) u32 of the outputs' scale
    delta = 2 * (HUNYUAN_DIT["attention_head_dim"] / 2 + 14) * 2.0**-24
    assert (run() - stock).abs().max() <= 4 * len(handle.names) * delta * stock.abs().max()
    handle = set_rope_processors(model, mode="interpolate", train_size=(8, 12))  # the training size: tables ours
    bound = TOL * stock.abs().max()  # the tables a pipeline passes: test_diffusers_families' TOL, of O(4) samples
    assert (run() - stock).abs().max() <= bound
    handle = set_rope_processors(model, mode="yarn", train_size=(4, 6))
    assert (run() - stock).abs().max() > 1e-4
    handle.remove()
    assert torch.equal(run(), stock)
