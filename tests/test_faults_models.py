"""Saved models and configs, and model inputs, under faults: nothing loads or runs silently wrong.

- diffusers wrappers: a config.json whose weight-free fields were edited or removed, or whose
  sizes do not describe the weights, is a clear error; explicit overrides still load;
- reference configs: wrong types and values name the field (before: arithmetic errors deep inside);
- timm models: the positional settings travel with the weights, a scaling method survives
  ``save_for_hf`` and ``create_model("local-dir:...")``, torch.fx traces them, scripting says why not;
- inputs: ``GPT.generate``'s temperature and top_k, DiT timesteps of the wrong shape.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch
from helpers import one_torch_thread, perturb

import axial_rope as ar
from models.dit import PRESETS as DIT_PRESETS
from models.dit import DiT, DiTConfig
from models.gpt import GPT, GPTConfig, sample
from models.video_dit import PRESETS as VIDEO_PRESETS
from models.video_dit import VideoDiT, VideoDiTConfig

_one_thread = one_torch_thread()


# -- inputs ---------------------------------------------------------------------------------


def test_generate_refuses_negative_temperature_and_top_k_zero():
    model = GPT(GPTConfig(depth=1, hidden_size=32, num_heads=2)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    for kwargs, match in (
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),  # before: sampled the least likely
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_k": 0}, "top_k must be None .* or an int >= 1"),  # before: a size-mismatch RuntimeError
        ({"top_k": -3}, "top_k must be"),
    ):
        with pytest.raises(ValueError, match=match):
            model.generate(prompt, 2, **kwargs)
        with pytest.raises(ValueError, match=match):
            sample(torch.zeros(1, 8), **kwargs)
    greedy = model.generate(prompt, 3, temperature=0)  # 0 is greedy, as documented
    assert torch.equal(greedy, model.generate(prompt, 3, temperature=0.0, top_k=1))


@pytest.mark.parametrize("kind", ["image", "video"])
def test_dit_timesteps_of_any_wrong_shape_are_a_clear_error(kind):
    y = torch.tensor([0, 1])
    if kind == "image":
        model, x = perturb(DiT(DIT_PRESETS["tiny"])), torch.randn(2, 3, 8, 8)
    else:
        model, x = perturb(VideoDiT(replace(VIDEO_PRESETS["tiny"], depth=1))), torch.randn(2, 3, 2, 4, 4)
    with torch.no_grad():
        expected = model(x, torch.tensor([300.0, 300.0]), y)
        for one in (torch.tensor(300.0), torch.tensor([300.0]), 300.0, 300):  # before: IndexError for a 0-d tensor
            torch.testing.assert_close(model(x, one, y), expected, rtol=0, atol=0)
        for shape in ((2, 1), (3,), (1, 2)):  # before: broadcasting errors deep in the blocks
            with pytest.raises(ValueError, match=r"timesteps must be one value or \[B\] = \[2\], got shape"):
                model(x, torch.full(shape, 300.0), y)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_dit_timesteps_and_labels_name_the_argument_and_the_range(kind):
    y, t = torch.tensor([0, 1]), torch.tensor([300.0, 300.0])
    if kind == "image":
        model, x = DiT(DIT_PRESETS["tiny"]).eval(), torch.randn(2, 3, 8, 8)
    else:
        model, x = VideoDiT(replace(VIDEO_PRESETS["tiny"], depth=1)).eval(), torch.randn(2, 3, 2, 4, 4)
    with torch.no_grad():
        with pytest.raises(TypeError, match=r"t must be the timesteps.* \[0, 1000\], got None"):  # before: RuntimeError
            model(x, None, y)
        # 4 classes and the null label 4 (label dropout); before: IndexError, "index out of range in self"
        with pytest.raises(
            ValueError, match=r"y must hold class labels in \[0, 4\] \(4 classes; 4: the null label\).*got \[7\]"
        ):
            model(x, t, torch.tensor([0, 7]))
        with pytest.raises(ValueError, match=r"y must hold class labels .*got \[-1\]"):
            model(x, t, torch.tensor([-1, 0]))
        with pytest.raises(TypeError, match="y must hold integer class labels, got torch.float32"):
            model(x, t, torch.tensor([0.0, 1.0]))
        with pytest.raises(ValueError, match=r"y must be one label per sample, \[B\] = \[2\], got shape \(1,\)"):
            model(x, t, torch.tensor([1]))  # before: broadcast over the batch
        model(x, t, torch.tensor([4, 3]))  # the null label is a label


def test_time_dependent_dit_refuses_timesteps_outside_0_1000():
    """The rope's time is ``t / 1000`` in [0, 1]; before, the DiT clamped 1500 to 1000 without a word."""
    model, x, y = DiT(DIT_PRESETS["tiny"]).eval(), torch.randn(1, 3, 64, 64), torch.tensor([0])
    with torch.no_grad():
        for t in (1500.0, -5.0, float("nan")):
            with pytest.raises(ValueError, match=r"t must be model timesteps in \[0, 1000\]"):
                model(x, torch.tensor([t]), y, pos_mode="dype")
        rounded = torch.tensor([1000.0]).nextafter(torch.tensor([2000.0]))  # float rounding of 1000 * 1.0 / 1000 * 1000
        end = model(x, torch.tensor([1000.0]), y, pos_mode="dype")
        torch.testing.assert_close(model(x, rounded, y, pos_mode="dype"), end, rtol=1e-4, atol=1e-4)


def test_sampling_refuses_zero_steps_and_a_non_finite_guidance_scale():
    """Before: ``steps=0`` returned the noise, a NaN scale a blank image (``scripts.sample`` exit 0)."""
    from models.flow import classifier_free_guidance, sample_euler

    noise = torch.randn(2, 3, 4, 4)
    for steps in (0, -1, 2.0):
        with pytest.raises(ValueError, match="steps must be an int >= 1"):
            sample_euler(lambda x, t: x, noise, steps)
    for scale in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="guidance scale must be a finite number"):
            classifier_free_guidance(lambda x, t, y: x, noise, torch.zeros(2), torch.tensor([0, 1]), 4, scale)


def test_diffusers_wrappers_check_timestep_shapes():
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT2DModel, AxialDiT3DModel

    image = perturb(AxialDiT2DModel.from_preset("tiny", depth=1))
    video = perturb(AxialDiT3DModel.from_preset("tiny", depth=1))
    for model, x in ((image, torch.randn(2, 3, 8, 8)), (video, torch.randn(2, 3, 2, 4, 4))):
        with torch.no_grad():
            expected = model(x, torch.tensor([300.0, 300.0]), torch.tensor([0, 1])).sample
            torch.testing.assert_close(model(x, torch.tensor(300), torch.tensor([0, 1])).sample, expected)
            with pytest.raises(ValueError, match="timesteps must be one value or"):
                model(x, torch.ones(2, 1), torch.tensor([0, 1]))


# -- reference configs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: DiTConfig(theta="big"), TypeError, "DiTConfig.theta must be a number"),
        (lambda: DiTConfig(num_heads=2.5), TypeError, "DiTConfig.num_heads must be an int"),
        (lambda: DiTConfig(hidden_size=130, num_heads=4), ValueError, "hidden_size 130 must be divisible by num_heads"),
        (lambda: DiTConfig(hidden_size=12, num_heads=4), ValueError, "head_dim .* must be >= 4"),
        (lambda: DiTConfig(class_dropout_prob=1.5), ValueError, r"class_dropout_prob must be in \[0, 1\)"),
        (lambda: DiTConfig(qk_norm="l2"), ValueError, "qk_norm must be one of"),
        (lambda: DiTConfig(learn_sigma="yes"), TypeError, "learn_sigma must be a bool"),
        (lambda: VideoDiTConfig(patch_size=3, num_classes=4), ValueError, "patch_size must be three positive ints"),
        (lambda: VideoDiTConfig(axes_dim=(21, 22, 21), num_classes=4), ValueError, "axes_dim .* must be even"),
        (lambda: VideoDiTConfig(theta=-1.0, num_classes=4), ValueError, "theta must be a finite number > 0"),
        (lambda: VideoDiTConfig(depth=0, num_classes=4), ValueError, "depth must be >= 1"),
    ],
)
def test_reference_configs_name_the_wrong_field(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_json_lists_are_accepted_as_sizes():
    config = VideoDiTConfig(patch_size=[1, 2, 2], axes_dim=[12, 10, 10], hidden_size=128, num_heads=4, num_classes=4)
    assert config.patch_size == (1, 2, 2) and config.axes_dim == (12, 10, 10)


# -- diffusers wrappers: config.json against the weights ------------------------------------------


@pytest.fixture
def saved_image(tmp_path):
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT2DModel

    model = perturb(AxialDiT2DModel.from_preset("tiny", depth=2, qk_norm="rms"))
    model.save_pretrained(tmp_path)
    return model, tmp_path


def _edit(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"theta": 500.0}, r"theta: 10000.0 saved with the weights, 500.0 in config.json"),
        ({"pos_mode": "ntk"}, r"pos_mode: another value saved with the weights, 'ntk' in config.json"),
        ({"input_size": 16}, r"input_size: 32 saved with the weights, 16 in config.json"),
        ({"theta": ...}, r"lacks \['theta'\]: every field is required"),
        ({"pos_mode": ..., "input_size": ...}, r"lacks \['input_size', 'pos_mode'\]"),
        ({"num_heads": 8}, "does not describe its weights .*num_heads: the weights have 32 channels per head"),
        ({"hidden_size": 64}, "does not describe its weights"),
        ({"num_heads": 2.5}, "DiTConfig.num_heads must be an int"),
        # weights the edited config lacks or has no place for (before: a log line, new random weights)
        (
            {"qk_norm": "layer"},
            r"qk_norm \('layer' in config.json\): the checkpoint lacks dit.blocks.0.attn.k_norm.bias",
        ),
        ({"qk_norm": None}, r"qk_norm \(None in config.json\): the checkpoint has .*q_norm.weight.* no place for"),
        ({"depth": 3}, r"depth: the weights have 2 blocks, config.json 3"),
        ({"depth": 1}, r"depth: the weights have 2 blocks, config.json 1"),
    ],
)
def test_image_config_edits_are_refused_on_load(saved_image, changes, match):
    from models.diffusers_models import AxialDiT2DModel

    _, path = saved_image
    _edit(path, **changes)
    with pytest.raises((ValueError, TypeError), match=match):
        AxialDiT2DModel.from_pretrained(path)
    if "theta" in changes and changes["theta"] is not ...:  # diffusers' other loading path checks too
        with pytest.raises(ValueError, match="saved with the weights"):
            AxialDiT2DModel.from_pretrained(path, low_cpu_mem_usage=False)
    if "qk_norm" in changes:  # every loading path, device_map too (before: a meta-device error)
        for kwargs in ({"low_cpu_mem_usage": False}, {"device_map": "cpu"}, {"qk_norm": changes["qk_norm"]}):
            with pytest.raises(ValueError, match=match):
                AxialDiT2DModel.from_pretrained(path, **kwargs)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_qk_norm_added_in_config_json_is_refused_naming_it(kind, tmp_path):
    """Weights saved without QK-norm, config.json edited to ``"rms"`` or ``"layer"``: the checkpoint has
    no norm weights to load, so the model would run with freshly initialised ones. Refused, naming the field."""
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT2DModel, AxialDiT3DModel

    cls = AxialDiT2DModel if kind == "image" else AxialDiT3DModel
    model = perturb(cls.from_preset("tiny", depth=1, qk_norm=None))
    model.save_pretrained(tmp_path)
    for qk_norm in ("rms", "layer"):
        _edit(tmp_path, qk_norm=qk_norm)
        match = rf"qk_norm \('{qk_norm}' in config.json\): the checkpoint lacks dit.blocks.0.attn.k_norm"
        for kwargs in ({}, {"low_cpu_mem_usage": False}):
            with pytest.raises(ValueError, match=match):
                cls.from_pretrained(tmp_path, **kwargs)
    _edit(tmp_path, qk_norm=None)  # the config the weights were saved with loads them exactly
    loaded = cls.from_pretrained(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_image_config_explicit_overrides_load_and_are_recorded(saved_image, tmp_path):
    from models.diffusers_models import AxialDiT2DModel

    model, path = saved_image
    x, y = torch.randn(1, 3, 24, 24), torch.tensor([1])
    loaded = AxialDiT2DModel.from_pretrained(path, pos_mode="ntk", torch_dtype=torch.float64)
    assert loaded.config.pos_mode == "ntk" and loaded.config_fingerprint.dtype == torch.int64
    with torch.no_grad():
        expected = model.double()(x.double(), 300.0, y, pos_mode="ntk").sample
        torch.testing.assert_close(loaded(x.double(), 300.0, y).sample, expected, rtol=0, atol=0)
    loaded.save_pretrained(tmp_path / "again")  # the override is now what the weights were saved with
    assert AxialDiT2DModel.from_pretrained(tmp_path / "again").config.pos_mode == "ntk"


def test_weights_copied_between_configs_keep_their_own_fingerprint(tmp_path):
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT3DModel

    plain = perturb(AxialDiT3DModel.from_preset("tiny", depth=1))
    riflex = AxialDiT3DModel.from_preset("tiny", depth=1, temporal_scaling=ar.scaling.RIFLEx(2, 6))
    riflex.load_state_dict(plain.state_dict())  # weights only: riflex's config still describes riflex
    riflex.save_pretrained(tmp_path)
    loaded = AxialDiT3DModel.from_pretrained(tmp_path)
    assert loaded.config.temporal_scaling == {"rope_type": "riflex", "k": 2, "test_length": 6}
    _edit(tmp_path, temporal_scaling=None)
    with pytest.raises(ValueError, match="temporal_scaling: another value saved with the weights, None in config"):
        AxialDiT3DModel.from_pretrained(tmp_path)
    _edit(tmp_path, temporal_scaling=riflex.config.temporal_scaling, axes_dim=[8, 12, 12])
    with pytest.raises(ValueError, match="axes_dim: another value saved with the weights"):
        AxialDiT3DModel.from_pretrained(tmp_path)
    _edit(tmp_path, axes_dim=..., temporal_scaling=...)
    with pytest.raises(ValueError, match=r"lacks \['axes_dim', 'temporal_scaling'\]"):
        AxialDiT3DModel.from_pretrained(tmp_path)


# -- timm ------------------------------------------------------------------------------------------


@pytest.fixture
def timm():
    timm = pytest.importorskip("timm")
    import axial_rope.integrations.timm  # noqa: F401  (registers the models)

    return timm


def _vit(timm, **kwargs):
    return timm.create_model("test_vit_axial_rope", **({"num_classes": 5, "img_size": 224} | kwargs)).eval()


def test_timm_model_with_a_scaling_method_saves_and_loads_back(timm, tmp_path):
    pytest.importorskip("huggingface_hub")
    from timm.models import save_for_hf

    model = _vit(timm, rope_theta=50.0, rope_scaling=(None, ar.scaling.NTK(2.0)))
    save_for_hf(model, tmp_path, safe_serialization=True)  # before: "rope_scaling is not serializable"
    args = json.loads((tmp_path / "config.json").read_text())["model_args"]
    assert args["rope_scaling"] == [None, {"rope_type": "ntk", "factor": 2.0, "exponent": True}]
    loaded = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    assert loaded.rope.scaling == model.rope.scaling
    x = torch.randn(1, 3, 224, 288)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, match",
    [({"rope_theta": 10000.0}, "rope_theta=100.0 on a 14 x 14 patch grid"), ({"img_size": 320}, "a 20 x 20 grid")],
)
def test_timm_weights_refuse_another_theta_or_trained_grid(timm, change, match, tmp_path):
    model = _vit(timm)
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    with pytest.raises(RuntimeError, match=match):  # before: loaded, and computed something else
        timm.create_model("test_vit_axial_rope", num_classes=5, checkpoint_path=str(tmp_path / "weights.pth"), **change)
    other = _vit(timm, **change)
    weights = {k: v for k, v in model.state_dict().items() if k != "rope_config"}
    other.load_state_dict(weights)  # on purpose (e.g. fine-tuning at another size): drop rope_config


def test_timm_inference_choices_warn_when_they_differ(timm):
    model = _vit(timm)
    with pytest.warns(UserWarning, match="rope_positions='interpolate' loaded into a model with 'ntk'"):
        _vit(timm, rope_positions="ntk").load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _vit(timm).load_state_dict(model.state_dict())  # the same settings: silent


def test_timm_argument_types_are_checked(timm):
    with pytest.raises(TypeError, match="img_size must be a positive int"):
        _vit(timm, img_size="224")
    with pytest.raises(TypeError, match="rope_theta must be a number"):
        timm.create_model("test_vit_axial_rope", rope_theta="100")
    with pytest.raises(ValueError, match="rope_positions"):
        _vit(timm).rope_positions = "stretch"


def test_timm_models_trace_with_torch_fx(timm):
    fx = pytest.importorskip("torchvision.models.feature_extraction")
    from timm.models import get_notrace_functions, get_notrace_modules

    kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    for mode in ("interpolate", "ntk"):  # as timm's test_model_forward_fx and test_model_backward_fx
        model = _vit(timm, rope_positions=mode)
        train_nodes, eval_nodes = fx.get_graph_node_names(model, tracer_kwargs=kwargs)
        traced = fx.create_feature_extractor(model, train_return_nodes=[train_nodes[-1]],
                                             eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=kwargs)  # fmt: skip
        for size in (160, 224, 288):  # one trace runs at every size, as the model does
            x = torch.randn(1, 3, size, size)
            with torch.no_grad():
                assert torch.equal(next(iter(traced(x).values())), model(x))
        traced.train()
        next(iter(traced(torch.randn(2, 3, 160, 160)).values())).mean().backward()
        assert all(p.grad is not None for p in traced.parameters())


def test_timm_models_refuse_torchscript_clearly(timm):
    from axial_rope.integrations.timm import EXCLUDE_JIT_FILTERS

    with timm.layers.set_layer_config(scriptable=True):
        model = _vit(timm)
    with pytest.raises(RuntimeError, match="cannot be scripted with TorchScript.*torch.fx"):
        torch.jit.script(model)
    assert timm.list_models(filter=EXCLUDE_JIT_FILTERS) == timm.list_models("*axial_rope*")
