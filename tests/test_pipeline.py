"""The reference DiTs as diffusers models and pipelines (models/diffusers_models.py, models/pipeline.py),
and trainer runs converted to them (models/training/export.py)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_torch_thread, perturb

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # models/ is not installed: import it from the repository root
    sys.path.insert(0, str(ROOT))

diffusers = pytest.importorskip("diffusers")

import axial_rope as ar  # noqa: E402
from models.diffusers_models import AxialDiT2DModel, AxialDiT3DModel  # noqa: E402
from models.dit import DiT, DiTConfig  # noqa: E402
from models.flow import T_SCALE, sample_euler  # noqa: E402
from models.pipeline import AxialDiTPipeline, AxialVideoDiTPipeline  # noqa: E402
from models.video_dit import VideoDiTConfig  # noqa: E402

_one_thread = one_torch_thread()  # this file: about 15 s with one thread, 50-60 s with two on 2 busy cores


@pytest.fixture(scope="module")
def image_model() -> AxialDiT2DModel:
    torch.manual_seed(0)
    return perturb(AxialDiT2DModel.from_preset("tiny"))


@pytest.fixture(scope="module")
def video_model() -> AxialDiT3DModel:
    torch.manual_seed(0)
    return perturb(AxialDiT3DModel.from_preset("tiny"))


def _pipe(cls, model, scheduler=None):
    pipe = cls(model, scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _seed(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- models ---------------------------------------------------------------------------------


def test_config_fields_are_the_reference_configs():
    # the diffusers signature mirrors the dataclass: a field added there must be added here
    from dataclasses import fields

    assert set(AxialDiT2DModel.from_preset("tiny").config) == {f.name for f in fields(DiTConfig)}
    assert set(AxialDiT3DModel.from_preset("tiny").config) == {f.name for f in fields(VideoDiTConfig)} | {
        "temporal_scaling"
    }


def test_image_model_equals_reference_dit(image_model):
    ref = DiT(image_model.dit.config).eval()  # eval: no random label dropout
    ref.load_state_dict(image_model.dit.state_dict())
    x, t, y = torch.randn(2, 3, 16, 24), torch.tensor([900.0, 50.0]), torch.tensor([1, 3])
    with torch.no_grad():  # bit for bit: the same modules and arithmetic in one process (one thread count)
        torch.testing.assert_close(image_model(x, t, y).sample, ref(x, t, y), rtol=0, atol=0)
        copy = AxialDiT2DModel.from_reference(ref)
        torch.testing.assert_close(copy(x, t, y, return_dict=False)[0], ref(x, t, y), rtol=0, atol=0)


def test_image_model_save_load_round_trip(image_model, tmp_path):
    image_model.save_pretrained(tmp_path)
    assert (tmp_path / "diffusion_pytorch_model.safetensors").is_file()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["_class_name"] == "AxialDiT2DModel" and config["pos_mode"] == "none"
    loaded = AxialDiT2DModel.from_pretrained(tmp_path).eval()
    x, y = torch.randn(2, 3, 24, 40), torch.tensor([0, 2])
    with torch.no_grad():
        for pos_mode in ("none", "ntk"):
            expected = image_model(x, 300.0, y, pos_mode=pos_mode).sample
            torch.testing.assert_close(loaded(x, 300.0, y, pos_mode=pos_mode).sample, expected, rtol=0, atol=0)


def test_video_model_save_load_round_trip_with_temporal_scaling(video_model, tmp_path):
    riflex = ar.scaling.RIFLEx(k=2, test_length=6)
    scaled = AxialDiT3DModel.from_preset("tiny", temporal_scaling=riflex)
    scaled.load_state_dict(video_model.state_dict())
    scaled.eval().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["temporal_scaling"] == {"rope_type": "riflex", "k": 2, "test_length": 6}  # the library's to_dict
    assert config["patch_size"] == [1, 2, 2]
    loaded = AxialDiT3DModel.from_pretrained(tmp_path).eval()
    x, y = torch.randn(2, 3, 6, 8, 8), torch.tensor([0, 3])
    with torch.no_grad():
        expected = video_model(x, 500.0, y, temporal_scaling=riflex).sample
        torch.testing.assert_close(scaled(x, 500.0, y).sample, expected, rtol=0, atol=0)  # the config's default
        torch.testing.assert_close(loaded(x, 500.0, y).sample, expected, rtol=0, atol=0)
        assert not torch.equal(video_model(x, 500.0, y).sample, expected)  # RIFLEx moved a frequency


def test_scaling_config_round_trip():
    # the model's config stores ar.scaling's own dict (Scaling.to_dict / ar.scaling.from_dict)
    for method in (
        ar.scaling.RIFLEx(3, 12),
        ar.scaling.YaRN(2.0, 16),
        ar.scaling.LongRoPE((1.0, 2.0), (2.0, 4.0), 16),
    ):
        config = AxialDiT3DModel.from_preset("tiny", depth=1, temporal_scaling=method).config["temporal_scaling"]
        assert config == method.to_dict() and ar.scaling.from_dict(json.loads(json.dumps(config))) == method
        from_dict = AxialDiT3DModel.from_preset("tiny", depth=1, temporal_scaling=json.loads(json.dumps(config)))
        assert from_dict.config["temporal_scaling"] == config  # a dict is accepted, checked and kept
    assert AxialDiT3DModel.from_preset("tiny", depth=1).config["temporal_scaling"] is None
    with pytest.raises(ValueError, match="rope_type"):
        AxialDiT3DModel.from_preset("tiny", depth=1, temporal_scaling={"rope_type": "rotary", "k": 1})
    with pytest.raises(TypeError, match="temporal_scaling"):
        AxialDiT3DModel.from_preset("tiny", depth=1, temporal_scaling=2.0)


def test_flow_time_scale_is_defined_once():
    import models.pipeline

    assert models.pipeline.T_SCALE is T_SCALE == 1000.0  # imported from models.flow, not redefined


def test_image_run_converts_with_its_ema_weights(tmp_path):
    from models.training.export import dit_from_checkpoint, video_dit_from_checkpoint
    from models.training.trainer import Run, TrainConfig

    run = Run(TrainConfig(resolution=16, out=str(tmp_path), progress=False))
    perturb(run.model)  # stands in for training: raw weights and their EMA now differ, outputs non-zero
    with torch.no_grad():
        for e, p in zip(run.ema, run.model.parameters()):
            e.copy_(p + 0.02 * torch.randn_like(p))
    run.save()  # checkpoint.safetensors as the trainer writes it
    model = dit_from_checkpoint(tmp_path)  # the run folder
    assert model.config.input_size == 16 and model.config.hidden_size == 128
    x, t, y = torch.randn(2, 3, 16, 16), torch.tensor([700.0, 200.0]), torch.tensor([0, 1])
    with torch.no_grad():
        ema = model(x, t, y).sample
        torch.testing.assert_close(ema, run.ema_model()(x, t, y), rtol=0, atol=0)
        raw = dit_from_checkpoint(tmp_path / "checkpoint.safetensors", use_ema=False)
        torch.testing.assert_close(raw(x, t, y).sample, run.model.eval()(x, t, y), rtol=0, atol=0)
        assert (raw(x, t, y).sample - ema).abs().max() > 1e-3
    assert isinstance(model, AxialDiT2DModel)
    with pytest.raises(ValueError, match="'dit' run"):
        video_dit_from_checkpoint(tmp_path)


def test_video_run_converts_with_its_preset_and_ema_weights(tmp_path):
    from models.training.export import dit_from_checkpoint, video_dit_from_checkpoint
    from models.training.trainer import Run, TrainConfig

    run = Run(TrainConfig(model="video_dit", resolution=8, frames=2, out=str(tmp_path), progress=False))
    perturb(run.model)
    with torch.no_grad():
        for e, p in zip(run.ema, run.model.parameters()):
            e.copy_(p + 0.02 * torch.randn_like(p))
    run.save()
    model = video_dit_from_checkpoint(tmp_path)
    assert isinstance(model, AxialDiT3DModel) and model.config.hidden_size == 128
    x, t, y = torch.randn(1, 3, 2, 8, 8), torch.tensor([400.0]), torch.tensor([2])
    with torch.no_grad():
        torch.testing.assert_close(model(x, t, y).sample, run.ema_model()(x, t, y), rtol=0, atol=0)
    with pytest.raises(ValueError, match="'video_dit' run"):
        dit_from_checkpoint(tmp_path)


# -- image pipeline -----------------------------------------------------------------------


def test_euler_pipeline_equals_project_sampler_with_cfg(image_model):
    # the timestep convention: scheduler sigmas 1 .. 1/n -> model t = 1000 sigma, x += (sigma' - sigma) v
    pipe = _pipe(AxialDiTPipeline, image_model)
    labels, steps, scale = torch.tensor([0, 3, 1]), 5, 2.5
    noise = torch.randn(3, 3, 16, 24, generator=_seed(0))
    out = pipe(labels, 16, 24, steps, scale, latents=noise, output_type="pt").images
    with torch.no_grad():
        ref = sample_euler(lambda x, t: image_model.dit.forward_with_cfg(x, t, labels, scale), noise, steps)
    # the same arithmetic on both sides (float32 sigmas k / n rounded once, x + (s' - s) v, one model call per
    # step): equal here; 1e-5 is room for the output map's rounding (u of values <= 1), not a measurement
    torch.testing.assert_close(out, (ref.clamp(-1, 1) + 1) / 2, rtol=0, atol=1e-5)
    assert out.std() > 0.05  # a real image, not a constant


def test_same_seed_same_images_other_seed_other_images(image_model):
    pipe = _pipe(AxialDiTPipeline, image_model)
    a, b, c = (pipe([0, 1], num_inference_steps=3, generator=_seed(s), output_type="np").images for s in (7, 7, 8))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0.1


def test_pipeline_save_load_gives_same_images(image_model, tmp_path):
    pipe = _pipe(AxialDiTPipeline, image_model)
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["transformer"] == ["models.diffusers_models", "AxialDiT2DModel"]
    assert index["scheduler"] == ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    loaded = AxialDiTPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    kwargs = dict(class_labels=[2, 3], height=16, width=16, num_inference_steps=3, output_type="np")
    np.testing.assert_array_equal(
        loaded(generator=_seed(3), **kwargs).images, pipe(generator=_seed(3), **kwargs).images
    )


def test_output_types_and_shapes_non_square(image_model):
    pipe = _pipe(AxialDiTPipeline, image_model)
    kwargs = dict(class_labels=[0, 1], height=16, width=24, num_inference_steps=2, num_images_per_label=2)
    pt = pipe(generator=_seed(0), output_type="pt", **kwargs).images
    assert pt.shape == (4, 3, 16, 24) and pt.min() >= 0 and pt.max() <= 1
    np_images = pipe(generator=_seed(0), output_type="np", **kwargs).images
    assert np_images.shape == (4, 16, 24, 3)
    np.testing.assert_allclose(np_images, pt.permute(0, 2, 3, 1).numpy(), atol=1e-6)  # the same values, reordered
    pil = pipe(generator=_seed(0), **kwargs).images  # "pil" by default
    assert len(pil) == 4 and pil[0].size == (24, 16) and pil[0].mode == "RGB"
    (default,) = pipe(3, num_inference_steps=1, output_type="pt", return_dict=False)
    assert default.shape == (1, 3, 32, 32)  # the training input_size


def test_pos_mode_changes_images_beyond_training_size(image_model):
    pipe = _pipe(AxialDiTPipeline, image_model)
    kwargs = dict(class_labels=[1], height=48, width=64, num_inference_steps=2, output_type="pt")
    none, yarn = (pipe(generator=_seed(0), pos_mode=m, **kwargs).images for m in ("none", "yarn"))
    assert (none - yarn).abs().max() > 1e-3


def test_scheduler_swap(image_model):
    from diffusers import FlowMatchHeunDiscreteScheduler, UniPCMultistepScheduler

    noise = torch.randn(2, 3, 16, 16, generator=_seed(0))
    kwargs = dict(class_labels=[0, 2], height=16, width=16, latents=noise, output_type="pt")
    euler = _pipe(AxialDiTPipeline, image_model)(num_inference_steps=12, **kwargs).images
    scale = ((noise.clamp(-1, 1) + 1) / 2 - euler).abs().mean()  # how far sampling moves the pixels
    for scheduler in (
        FlowMatchHeunDiscreteScheduler(),
        UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction"),
    ):
        out = _pipe(AxialDiTPipeline, image_model, scheduler)(num_inference_steps=4, **kwargs).images
        # another integrator of the same flow: near the Euler solution (a wrong timestep or sign is not)
        assert 0 < (out - euler).abs().mean() < 0.25 * scale, type(scheduler).__name__


def test_errors_name_the_argument(image_model):
    from diffusers import DDIMScheduler

    pipe = _pipe(AxialDiTPipeline, image_model)
    with pytest.raises(ValueError, match="height must be a positive multiple of the image patch 4, got 30"):
        pipe(0, height=30, width=32)
    with pytest.raises(ValueError, match=re.escape("output_type must be one of ('pil', 'np', 'pt'), got 'latent'")):
        pipe(0, output_type="latent")
    with pytest.raises(ValueError, match=r"class_labels must be in \[0, 4\)"):
        pipe([0, 4])
    with pytest.raises(ValueError, match="samples per label must be a positive int, got 0"):
        pipe(0, num_images_per_label=0)
    with pytest.raises(ValueError, match="pos_mode"):
        pipe(0, num_inference_steps=1, pos_mode="stretch")
    with pytest.raises(ValueError, match="DDIMScheduler does not integrate a rectified flow"):
        _pipe(AxialDiTPipeline, image_model, DDIMScheduler())(0, num_inference_steps=1)
    no_null = AxialDiT2DModel.from_preset("tiny", class_dropout_prob=0.0, depth=1)
    with pytest.raises(ValueError, match="null label"):
        _pipe(AxialDiTPipeline, no_null)(0, num_inference_steps=1, guidance_scale=2.0)


# -- video pipeline ------------------------------------------------------------------------


def test_video_pipeline_frames_reproducible_and_scaled(video_model):
    pipe = _pipe(AxialVideoDiTPipeline, video_model)
    kwargs = dict(class_labels=[0, 3], num_frames=4, height=8, width=12, num_inference_steps=2)
    frames = pipe(generator=_seed(0), **kwargs).frames  # "np" by default, as diffusers' video pipelines
    assert frames.shape == (2, 4, 8, 12, 3)
    np.testing.assert_array_equal(pipe(generator=_seed(0), **kwargs).frames, frames)
    assert np.abs(pipe(generator=_seed(1), **kwargs).frames - frames).max() > 0.1
    pt = pipe(generator=_seed(0), output_type="pt", **kwargs).frames
    assert pt.shape == (2, 4, 3, 8, 12)
    np.testing.assert_allclose(pt.permute(0, 1, 3, 4, 2).numpy(), frames, atol=1e-6)  # the same values, reordered
    pil = pipe(generator=_seed(0), output_type="pil", **kwargs).frames
    assert len(pil) == 2 and len(pil[0]) == 4 and pil[0][0].size == (12, 8)
    riflex = pipe(generator=_seed(0), temporal_scaling=ar.scaling.RIFLEx(k=2, test_length=4), **kwargs).frames
    assert np.abs(riflex - frames).max() > 1e-3


def test_video_pipeline_equals_project_sampler(video_model):
    pipe = _pipe(AxialVideoDiTPipeline, video_model)
    labels, noise = torch.tensor([1, 2]), torch.randn(2, 3, 3, 8, 8, generator=_seed(2))
    out = pipe(labels, 3, 8, 8, num_inference_steps=4, guidance_scale=2.0, latents=noise, output_type="pt").frames

    def velocity(x, t):
        null = torch.full_like(labels, video_model.null_label)
        cond, uncond = video_model.dit(torch.cat([x, x]), torch.cat([t, t]), torch.cat([labels, null])).chunk(2)
        return uncond + 2.0 * (cond - uncond)

    ref = sample_euler(velocity, noise, 4)  # [B, C, T, H, W]
    torch.testing.assert_close(out, (ref.clamp(-1, 1) + 1).transpose(1, 2) / 2, rtol=0, atol=1e-5)  # as above


def test_video_pipeline_save_load_and_errors(video_model, tmp_path):
    pipe = _pipe(AxialVideoDiTPipeline, video_model)
    pipe.save_pretrained(tmp_path)
    loaded = AxialVideoDiTPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    kwargs = dict(class_labels=1, num_frames=2, height=8, width=8, num_inference_steps=2)
    np.testing.assert_array_equal(
        loaded(generator=_seed(5), **kwargs).frames, pipe(generator=_seed(5), **kwargs).frames
    )
    with pytest.raises(ValueError, match="width must be a positive multiple of the video patch 2, got 9"):
        pipe(1, width=9)
    with pytest.raises(ValueError, match="class_labels is required"):
        pipe(num_frames=2, height=8, width=8)
    with pytest.raises(ValueError, match="output_type must be one of"):
        pipe(1, output_type="mp4")


# -- docs -----------------------------------------------------------------------------------


def test_docs_reference_dit_examples_run(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "integrations.md").read_text()
    (part,) = [b for b in re.split(r"^## ", text, flags=re.M) if b.startswith("The reference DiTs in diffusers")]
    blocks = re.findall(r"```python\n(.*?)```", part, flags=re.S)  # ``py`` blocks need a trained run
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)  # the examples save to relative folders
    monkeypatch.syspath_prepend(str(ROOT))
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/integrations.md:reference DiTs", "exec"), namespace)


def test_preset_names_checked():
    with pytest.raises(ValueError, match="preset must be one of"):
        AxialDiT2DModel.from_preset("DiT-XXL/2")
    assert asdict(AxialDiT2DModel.from_preset("tiny", depth=1).dit.config)["depth"] == 1


def test_video_pipeline_vector_conditioning():
    model = AxialDiT3DModel.from_preset("tiny", num_classes=0, cond_dim=8, depth=1).eval()
    pipe = _pipe(AxialVideoDiTPipeline, model)
    kwargs = dict(num_frames=2, height=8, width=8, num_inference_steps=1)
    frames = pipe(cond=torch.randn(3, 8), guidance_scale=1.0, num_videos_per_label=2, **kwargs).frames
    assert frames.shape == (6, 2, 8, 8, 3)
    with pytest.raises(ValueError, match="guidance_scale 3.0 needs class labels"):
        pipe(cond=torch.randn(3, 8), **kwargs)
    with pytest.raises(ValueError, match=r"cond must have shape \[3, cond_dim=8\], got \(3, 4\)"):
        pipe(cond=torch.randn(3, 4), **kwargs)
    with pytest.raises(ValueError, match="class_labels is not used"):
        pipe(1, cond=torch.randn(1, 8), **kwargs)
