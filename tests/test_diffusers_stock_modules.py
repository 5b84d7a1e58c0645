"""With its tables replaced, a diffusers transformer keeps its stock tables module: same object, same class, same
state dict, answering with the adapter's tables through diffusers' hook registry (``diffusers_sites.ModuleSite``).

Code that inspects that module's class keeps working: diffusers' own ``TestQwenImageTransformer::
test_layered_model_with_mask`` (``tests/models/transformers/test_models_transformer_qwenimage.py``, not installed
with the package) asserts ``isinstance(model.pos_embed, QwenEmbedLayer3DRope)``; it is written again here as our
own case with the adapter installed. Models and inputs are float64; upstream's tables are float32 (complex64 for
Qwen-Image), within ``TOL`` of ours through two blocks (the bound of ``tests/test_integrations_diffusers.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS

diffusers = pytest.importorskip("diffusers")

from diffusers.models.transformers.transformer_qwenimage import QwenEmbedLayer3DRope  # noqa: E402
from helpers import one_torch_thread  # noqa: E402
from test_diffusers_families import _model, _replacing, _run  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_sites import CHILD as HOOK  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

_one_thread = one_torch_thread()
TOL = 1e-5  # float32 tables through two blocks at O(1) logits (tests/test_integrations_diffusers.py)


def _layered_qwen_image():
    """diffusers' layered Qwen-Image test config and inputs: 4 layers and a condition image of 4 x 4 tokens, text of
    8 tokens of which the last 3 are masked; float64."""
    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=16, axes_dims_rope=(8, 4, 4), use_layer3d_rope=True, use_additional_t_cond=True,
    ).double().eval()  # fmt: skip
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(1, 8, dtype=torch.float64)
    mask[0, 5:] = 0
    inputs = dict(
        hidden_states=torch.randn(1, 5 * 16, 16, generator=g, dtype=torch.float64),
        encoder_hidden_states=torch.randn(1, 8, 16, generator=g, dtype=torch.float64), encoder_hidden_states_mask=mask,
        timestep=torch.tensor([1.0], dtype=torch.float64), img_shapes=[[(1, 4, 4)] * 5],
        additional_t_cond=torch.tensor([0]), return_dict=False,
    )  # fmt: skip
    return model, inputs


def test_layered_qwen_image_with_mask_keeps_its_layer3d_rope_and_equals_stock_scaled_by_one():
    model, inputs = _layered_qwen_image()
    stock = _run(model, inputs)
    assert isinstance(model.pos_embed, QwenEmbedLayer3DRope)
    for install in (dict(scaling=ar.scaling.Linear(1.0)), dict(mode="interpolate", train_size=(4, 4))):
        handle = set_rope_processors(model, **install)
        assert isinstance(model.pos_embed, QwenEmbedLayer3DRope)  # upstream's assertion, with the tables replaced
        out = _run(model, inputs)
        assert out.shape == (1, 5 * 16, 16)
        # the layers at frames 0..3, the condition image at frame -1, the text after the layer count: as stock
        torch.testing.assert_close(out, stock, atol=TOL, rtol=TOL)
        handle.remove()
    set_rope_processors(model, mode="interpolate", train_size=(2, 2))  # a 4 x 4 grid is twice that: it acts
    scaled = _run(model, inputs)
    assert isinstance(model.pos_embed, QwenEmbedLayer3DRope)
    assert torch.isfinite(scaled).all() and (scaled - stock).abs().max() > 1e-4


def _module_sites(name: str) -> list[str]:
    family = DIFFUSERS[name]
    if family.tables[0] != "module":
        return []
    return [family.tables[1], *(p.tables[1] for p in family.producers)]


MODULE_SITES = [n for n in sorted(DIFFUSERS) if n in tiny.TINY and _module_sites(n)]


@pytest.mark.parametrize("name", MODULE_SITES)
def test_replaced_tables_leave_the_stock_module_in_place_of_its_class(name):
    model, inputs = _model(name)
    sites = {attr: getattr(model, attr) for attr in _module_sites(name)}
    keys = set(model.state_dict())
    handle = set_rope_processors(model, **_replacing(name))
    for attr, stock in sites.items():
        now = getattr(model, attr)
        if isinstance(stock, torch.nn.Module):  # the object itself: every isinstance / type check upstream holds
            assert now is stock and type(now) is type(stock)
            assert isinstance(getattr(stock, HOOK), RotaryTables)
        else:  # a plain object (Z-Image's RopeEmbedder) has no forward to hook: replaced, its attributes readable
            assert isinstance(now, RotaryTables) and now.stock is stock
    assert set(model.state_dict()) == keys  # our tables hold no persistent state
    _run(model, inputs)
    handle.remove()
    for attr, stock in sites.items():
        assert getattr(model, attr) is stock and not hasattr(stock, HOOK)
    assert set(model.state_dict()) == keys


def test_no_installed_diffusers_code_inspects_the_class_of_a_tables_object_we_replace():
    # the sites we cannot keep (plain objects, no forward to hook) must not be class-inspected upstream
    replaced = {DIFFUSERS[n].tables[1] for n in ("ZImageTransformer2DModel", "BriaFibo2Transformer2DModel")}
    root = Path(diffusers.__file__).parent
    pattern = re.compile(r"isinstance\(\s*[\w.]*\b(" + "|".join(sorted(replaced)) + r")\b\s*,")
    found = [str(p.relative_to(root)) for p in root.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert not found, f"isinstance checks on a replaced tables object in {found}"
