"""An id axis of width 0 is an unrotated axis: Flux-style models with ``axes_dims_rope=(0, 4, 4)`` (diffusers' own
tiny Bria and Bria-Fibo test config, which the stock models run: ``FluxPosEmbed`` gives that column an empty table)
are served, unscaled, sized and scaled on the other axes; a scaling on the empty axis cannot act and is refused.

The reference is the stock model itself: ``Linear(2)`` on y and x (or ``mode="interpolate"`` at twice the training
grid, which gives index ``i`` the coordinate ``i / 2``) turns as the stock model does at image ids halved on y and x.
Models and inputs are float64; upstream's tables are float32, within ``TOL`` of ours through two blocks at O(1)
logits (the bound of ``tests/test_integrations_diffusers.py``).
"""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar

diffusers = pytest.importorskip("diffusers")

from helpers import one_torch_thread  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models.tiny_diffusers_common import flux_inputs  # noqa: E402
from models.tiny_diffusers_flux import _ids_inputs  # noqa: E402

_one_thread = one_torch_thread()
TOL = 1e-5
AXES = (0, 4, 4)  # (index, y, x): the index column has no channels
COMMON = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=sum(AXES),
              num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=AXES)  # fmt: skip


def _text_layers(g):
    return [torch.randn(2, 5, 8, generator=g) for _ in range(2)]  # Bria-Fibo: one text-encoder layer per block


MODELS = {
    "BriaTransformer2DModel": (dict(), lambda h, w, g: _ids_inputs(h, w, g, timestep=torch.rand(2, generator=g))),
    "BriaFiboTransformer2DModel": (
        dict(text_encoder_dim=8),
        lambda h, w, g: _ids_inputs(h, w, g, timestep=torch.rand(2, generator=g), text_encoder_layers=_text_layers(g)),
    ),
    "FluxTransformer2DModel": (dict(pooled_projection_dim=32, guidance_embeds=False), lambda h, w, g: flux_inputs(
        h, w, 1, g)),  # fmt: skip
    "ChromaTransformer2DModel": (
        dict(approximator_num_channels=8, approximator_hidden_dim=16, approximator_layers=1),
        lambda h, w, g: {k: v for k, v in flux_inputs(h, w, 1, g).items() if k != "pooled_projections"},
    ),
}


def _setup(name: str, h: int, w: int):
    extra, make = MODELS[name]
    torch.manual_seed(0)
    model = getattr(diffusers, name)(**COMMON, **extra).double().eval()
    inputs = make(h, w, torch.Generator().manual_seed(0))
    inputs = {k: v.double() if k not in ("img_ids", "txt_ids") and isinstance(v, torch.Tensor)
              and v.is_floating_point() else v for k, v in inputs.items()}  # fmt: skip
    if "text_encoder_layers" in inputs:
        inputs["text_encoder_layers"] = [t.double() for t in inputs["text_encoder_layers"]]
    return model, inputs


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_zero_width_axis_is_served_unscaled_sized_and_scaled_on_the_other_axes(name):
    model, inputs = _setup(name, 4, 6)
    stock = _run(model, inputs)
    halved = dict(inputs, img_ids=inputs["img_ids"] / torch.tensor([1.0, 2.0, 2.0]))
    stock_halved = _run(model, halved)
    linear = ar.scaling.Linear(2.0)
    for install, want in (
        (dict(), stock),
        (dict(mode="interpolate", train_size=(4, 6)), stock),  # tables replaced, positions as they are
        (dict(scaling=(None, ar.scaling.Linear(1.0), ar.scaling.Linear(1.0))), stock),
        (dict(scaling=(None, linear, linear)), stock_halved),
        (dict(scaling=linear), stock_halved),  # one method: every axis that has channels
        (dict(mode="interpolate", train_size=(2, 3)), stock_halved),  # twice the training grid
    ):
        handle = set_rope_processors(model, **install)
        assert handle.rope.axes_dim == (4, 4)
        torch.testing.assert_close(_run(model, inputs), want, atol=TOL, rtol=TOL, msg=lambda m, i=install: f"{i}: {m}")
        handle.remove()
    assert (stock_halved - stock).abs().max() > 1e-3  # the scaled installs were told apart from the unscaled ones
    assert torch.equal(_run(model, inputs), stock)


@pytest.mark.parametrize(
    "scaling, match",
    [
        ((ar.scaling.Linear(2.0), None, None), r"axis 0 \(index\) has no channels.*cannot act there"),
        ((None, ar.scaling.Linear(2.0)), r"one method \(or None\) per axis \(3\), got 2"),
    ],
)
def test_a_scaling_on_the_zero_width_axis_or_of_the_wrong_length_is_refused(scaling, match):
    model, _ = _setup("BriaTransformer2DModel", 4, 6)
    with pytest.raises(ValueError, match=match):
        set_rope_processors(model, scaling=scaling)
