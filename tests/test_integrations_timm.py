"""axial_rope.integrations.timm: registered ViTs with 2D axial RoPE, built and run through timm's API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import axial_rope as ar

timm = pytest.importorskip("timm")

from axial_rope.integrations import timm as ar_timm  # noqa: E402  (registers the models)

NAMES = ("vit_small_patch16_axial_rope", "vit_base_patch16_axial_rope", "test_vit_axial_rope")


def _model(**kwargs):
    # the test-sized model at the usual ImageNet size, so 224 is "trained" and 320 is larger
    return timm.create_model("test_vit_axial_rope", pretrained=False, img_size=224, **kwargs).eval()


def _run(model, size: int, batch: int = 2) -> torch.Tensor:
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        return model(torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(size)).to(dtype))


def test_registered_names_are_listed_by_timm():
    listed = timm.list_models("*axial_rope*")
    assert set(NAMES) <= set(listed)
    assert all(timm.is_model(name) for name in NAMES)
    assert not timm.list_models("*axial_rope*", pretrained=True)  # no weights are published


@pytest.mark.parametrize(
    "name, width, heads", [("vit_small_patch16_axial_rope", 384, 6), ("vit_base_patch16_axial_rope", 768, 12)]
)
def test_presets_build_with_their_widths(name, width, heads):
    model = timm.create_model(name, pretrained=False, num_classes=10, depth=1).eval()  # depth=1 keeps it quick
    assert (model.embed_dim, model.blocks[0].attn.num_heads, model.rope.axes_dim) == (width, heads, (32, 32))
    assert _run(model, 224, batch=1).shape == (1, 10)


@pytest.mark.parametrize("rope_positions", ar_timm.ROPE_POSITIONS)
def test_one_model_runs_at_224_and_320(rope_positions):
    model = _model(num_classes=7, rope_positions=rope_positions)
    for size in (224, 320):
        out = _run(model, size)
        assert out.shape == (2, 7) and torch.isfinite(out).all()


def test_position_choices_give_the_documented_coordinates():
    # rope_positions is a mode of ar.positions_for_size with the trained 14 x 14 patch grid: one meaning
    # everywhere. (Before, "interpolate" also stretched smaller grids and "normalize" was DINOv3's
    # [-1, 1] per axis times 2 pi; the assertions below pin the shared meaning instead.)
    none, interp, norm = (_model(rope_positions=p) for p in ("none", "interpolate", "normalize"))
    torch.testing.assert_close(none.positions(20, 20), ar.grid(20, 20))
    # interpolation: a 20 x 20 grid spread over the trained 14 x 14 range
    torch.testing.assert_close(interp.positions(20, 20), ar.grid(20, 20) * 14 / 20)
    assert interp.positions(20, 20).max().item() == pytest.approx(19 * 14 / 20)
    torch.testing.assert_close(interp.positions(14, 14), ar.grid(14, 14))
    torch.testing.assert_close(interp.positions(10, 20), ar.grid(10, 20, scale=(1.0, 14 / 20)))  # no stretching
    # normalize: centred cell centres, the longest axis spanning the trained extent (unit spacing at 14 x 14)
    torch.testing.assert_close(norm.positions(14, 14), ar.grid(14, 14, center=True))
    pos = norm.positions(20, 20)
    torch.testing.assert_close(pos, ar.grid(20, 20, center=True) * 14 / 20)
    assert pos.abs().max().item() < 14 / 2
    for mode in ar_timm.ROPE_POSITIONS:  # every mode is positions_for_size's
        model = _model(rope_positions=mode)
        expected = ar.positions_for_size((12, 20), (14, 14), mode)
        torch.testing.assert_close(model.positions(12, 20), expected.pos)
        scaled = mode in ("ntk", "yarn")
        rope = model.rope.with_scaling(expected.scaling) if scaled else model.rope
        torch.testing.assert_close(model.rotation(12, 20).freqs, rope.freqs, rtol=0, atol=0)
    ntk = _model(rope_positions="ntk")
    assert ntk.rotation(14, 14).freqs is ntk.rope.freqs  # the trained size: the rope's own buffer
    expected = ntk.rope.with_scaling((None, ar.scaling.NTK(20 / 14))).freqs
    torch.testing.assert_close(ntk.rotation(12, 20).freqs, expected, rtol=0, atol=0)


def test_interpolation_equals_plain_indices_at_the_trained_size_only():
    none = _model(rope_positions="none")
    interp = _model(rope_positions="interpolate")
    with pytest.warns(UserWarning, match="rope_positions='none' loaded into a model with 'interpolate'"):
        interp.load_state_dict(none.state_dict())  # another inference choice: allowed, never silent
    torch.testing.assert_close(_run(interp, 224), _run(none, 224))  # the same positions and arithmetic: equal
    assert _run(interp, 320).sub(_run(none, 320)).abs().max() > 1e-5


@pytest.mark.parametrize("mode", ["ntk", "yarn"])
def test_frequency_modes_equal_plain_indices_at_the_trained_size_only(mode):
    none = _model(rope_positions="none")
    scaled = _model(rope_positions=mode)
    with pytest.warns(UserWarning, match="rope_positions"):
        scaled.load_state_dict(none.state_dict())
    torch.testing.assert_close(_run(scaled, 224), _run(none, 224))
    assert _run(scaled, 320).sub(_run(none, 320)).abs().max() > 1e-5
    assert scaled.rope.scaling == (None, None)  # the scaled rope is built per call, never stored


def test_only_relative_positions_matter():
    # RoPE is the only position signal: shifting every patch coordinate leaves the output unchanged
    # (without a class token, whose unrotated q/k would see absolute patch angles)
    model = _model(rope_positions="none", class_token=False, global_pool="avg").double()  # float64: an equality
    with torch.no_grad():  # sharper attention than the 0.02-std init, so positions visibly matter
        for block in model.blocks:
            block.attn.qkv.weight.mul_(20)
    expected = _run(model, 224)
    # the model's positional code is its GridRoPE (one torch.fx leaf): other coordinates go there
    model.rope_grid.positions = lambda h, w, device=None: ar.grid(h, w, offset=(37.0, -5.0), device=device)
    # float64: angles up to 60 rad move by 60 * 2**-53 = 7e-15 rad; through 4 blocks of sharp attention
    # softmax weights move by 2 |s| 7e-15 relative, below 1e-10 for any logit |s| < 1e4: within 1e-9
    torch.testing.assert_close(_run(model, 224), expected, atol=1e-9, rtol=1e-9)
    model.rope_grid.positions = lambda h, w, device=None: ar.grid(h, w, scale=2.0, device=device)  # not a shift
    assert _run(model, 224).sub(expected).abs().max() > 1e-2


def test_rope_scaling_changes_the_frequencies_and_the_output():
    plain = _model()
    scaled = _model(rope_scaling=(None, ar.scaling.NTK(2.0)))
    with pytest.warns(UserWarning, match="rope_scaling"):
        scaled.load_state_dict(plain.state_dict())
    torch.testing.assert_close(scaled.rope.freqs[0], plain.rope.freqs[0])  # y untouched
    assert (scaled.rope.freqs[1] < plain.rope.freqs[1]).sum() == 7  # x: every plane but the first slows down
    assert _run(scaled, 224).sub(_run(plain, 224)).abs().max() > 1e-5


def test_forward_features_and_head_follow_timm_conventions():
    model = _model(num_classes=5)
    images = torch.randn(2, 3, 224, 320)
    with torch.no_grad():
        tokens = model.forward_features(images)
        assert tokens.shape == (2, 1 + 14 * 20, 64)  # class token first
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 0])
        torch.testing.assert_close(model.forward_head(tokens), model(images))
    model.reset_classifier(0, "avg")
    with torch.no_grad():
        torch.testing.assert_close(model(images), tokens[:, 1:].mean(1))


def test_features_only_returns_nchw_maps_at_any_size():
    features = timm.create_model("test_vit_axial_rope", features_only=True, out_indices=(1, 3), img_size=224).eval()
    assert features.feature_info.channels() == [64, 64] and features.feature_info.reduction() == [16, 16]
    assert len(features.model.blocks) == 4
    for h, w in ((224, 224), (224, 320)):
        with torch.no_grad():
            maps = features(torch.randn(1, 3, h, w))
        assert [tuple(m.shape) for m in maps] == [(1, 64, h // 16, w // 16)] * 2


def test_forward_intermediates_matches_forward_features():
    model = _model()
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        final, inter = model.forward_intermediates(images, indices=2, output_fmt="NLC", return_prefix_tokens=True)
        torch.testing.assert_close(final, model.forward_features(images))
    assert len(inter) == 2 and inter[0][0].shape == (1, 196, 64) and inter[0][1].shape == (1, 1, 64)
    model.prune_intermediate_layers(indices=(1,))
    assert len(model.blocks) == 2 and isinstance(model.head, torch.nn.Identity)


def test_gradient_checkpointing_gives_the_same_gradients():
    model = _model(num_classes=3).train().double()  # float64: recomputing may sum in another order
    images = torch.randn(1, 3, 160, 160, dtype=torch.float64)
    model(images).sum().backward()
    expected = model.patch_embed.proj.weight.grad.clone()
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(images).sum().backward()
    # within helpers.chain_bound(U64, 256, 20) = 5e-12 of the gradient's scale
    torch.testing.assert_close(model.patch_embed.proj.weight.grad, expected, atol=1e-10, rtol=1e-10)


def test_fixed_size_model_rejects_other_sizes():
    model = _model(dynamic_img_size=False)
    assert _run(model, 224).shape == (2, 1000)
    with pytest.raises(AssertionError):
        _run(model, 320)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rope_positions"):
        _model(rope_positions="stretch")
    with pytest.raises(ValueError, match="rope_scaling"):
        _model(rope_positions="yarn", rope_scaling=ar.scaling.NTK(2.0))
    with pytest.raises(ValueError, match="head_dim"):
        _model(embed_dim=60, num_heads=2)
    with pytest.raises(RuntimeError, match="No pretrained weights"):
        timm.create_model("test_vit_axial_rope", pretrained=True)


def test_docs_timm_examples_run():
    text = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    (part,) = [b for b in re.split(r"^## ", text, flags=re.M) if b.startswith("timm")]
    blocks = re.findall(r"```python\n(.*?)```", part, flags=re.S)  # ``py`` blocks would download weights
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:  # one reader's session
        exec(compile(block, "docs/integrations.md:timm", "exec"), namespace)


def _fx_model(model):
    """timm's ``_create_fx_model`` (tests/test_models.py): a feature extractor returning the last train/eval node."""
    fx = pytest.importorskip("torchvision.models.feature_extraction")
    from timm.models import get_notrace_functions, get_notrace_modules

    kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    train_nodes, eval_nodes = fx.get_graph_node_names(model, tracer_kwargs=kwargs)
    return fx.create_feature_extractor(model, train_return_nodes=[train_nodes[-1]],
                                       eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=kwargs)  # fmt: skip


@pytest.mark.parametrize("route", ["script", "fx_then_script"])
@pytest.mark.parametrize("name", NAMES)
def test_torchscript_of_every_registered_model_raises_the_documented_error(name, route):
    """timm's test_model_forward_torchscript and test_model_forward_fx_torchscript, for each registered name: the
    traced one used to reach the rotation's Python and fail with a raw NotSupportedError from axial_rope/rotary.py."""
    with timm.layers.set_layer_config(scriptable=True):
        model = timm.create_model(name, pretrained=False, depth=1).eval()  # depth=1: the error is per module
    target = model if route == "script" else _fx_model(model)
    with pytest.raises(RuntimeError, match=r"cannot be scripted with TorchScript .*use torch.compile, torch.export or "
                                           r"torch.fx .*EXCLUDE_JIT_FILTERS"):  # fmt: skip
        torch.jit.script(target)
    if route == "fx_then_script":  # the trace itself is supported and runs
        with torch.no_grad():
            assert next(iter(target(torch.randn(1, 3, 64, 64)).values())).shape[0] == 1


def test_torchscript_of_any_module_holding_a_rope_raises_the_library_error():
    """Outside timm too: a module that holds an AxialRoPE is refused by name, not by TorchScript's frontend."""

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = ar.AxialRoPE((8, 8))

        def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
            return self.rope(q, k, pos)

    with pytest.raises(RuntimeError, match=r"AxialRoPE cannot be scripted with TorchScript .*torch.fx \(supported\)"):
        torch.jit.script(Holder())
