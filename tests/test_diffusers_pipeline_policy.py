"""``apply_rope_scaling(pipe, policy="auto")`` end to end on tiny Flux, Qwen-Image, Wan and HunyuanVideo 1.5
pipelines (tests/test_diffusers_pipelines.py builds them): each call is planned from its ``height``, ``width`` and
``num_frames``; at 1x the output is the unscaled adapter's (the model's own tables), at 2x and 3x the explicit
install of the plan's per-axis choice. Outputs are the denoised latents of 2 Euler steps, compared bit for bit:
the same operations run either way.
"""

from __future__ import annotations

import pytest
import torch

from axial_rope.conventions._registry import PipelineUnits

diffusers = pytest.importorskip("diffusers")

from test_diffusers_pipelines import (  # noqa: E402
    flux_pipeline,
    hunyuan_video_1_5_pipeline,
    qwen_image_pipeline,
    wan_pipeline,
)

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_pipeline import apply_rope_scaling  # noqa: E402

# (builder, trained pipeline size, the tiny pipeline's units, trained token grid): the tiny VAEs are not the released
# ones, so each test states how its pixels map to tokens (units=)
IMAGES = {
    "flux": (flux_pipeline, (16, 16), PipelineUnits(2), (8, 8)),
    "qwen_image": (qwen_image_pipeline, (32, 32), PipelineUnits(8), (4, 4)),
}
VIDEOS = {
    "wan": (wan_pipeline, (5, 16, 16), PipelineUnits(16, frames=(4, 1)), (2, 1, 1)),
    "hunyuan_video_1_5": (hunyuan_video_1_5_pipeline, (5, 8, 8), PipelineUnits(4, frames=(2, 1)), (3, 2, 2)),
}


def _explicit(pipe, call, target, **install):
    handle = set_rope_processors(pipe.transformer, **install)
    out = call(*target) if len(target) == 2 else call(target[1], target[2], target[0])
    handle.remove()
    return out


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_pipeline_is_planned_per_call(name):
    build, (h, w), units, trained = IMAGES[name]
    pipe, call = build()
    stock, cls = call(h, w), type(pipe)
    want = {
        1: _explicit(pipe, call, (h, w)),  # the unscaled adapter: the model's own tables
        2: _explicit(pipe, call, (2 * h, 2 * w), mode="content", train_size=trained),
        3: _explicit(pipe, call, (3 * h, 3 * w), mode="content", train_size=trained),
    }
    handle = apply_rope_scaling(pipe, train_size=trained, units=units)
    for factor in (2, 1, 3):  # the 1x call between two larger ones: each call planned on its own
        got = call(factor * h, factor * w)
        assert torch.equal(got, want[factor]), factor
        assert [a.target for a in handle.plan.plan.axes] == [factor * t for t in trained]
    assert "interpolated by the shared growth 3.00x" in str(handle.plan)
    handle.remove()
    assert type(pipe) is cls and "_axial_rope_scaling" not in pipe.__dict__
    assert torch.equal(call(h, w), stock)  # the stock pipeline again, its processors included


@pytest.mark.parametrize("name", sorted(VIDEOS))
def test_video_pipeline_plans_riflex_for_more_frames(name):
    build, (frames, h, w), units, trained = VIDEOS[name]
    pipe, call = build()
    c = units.frames[0]  # the causal VAE: latent = (frames - 1) // c + 1, so twice the latent frames is
    longer = ((2 * ((frames - 1) // c + 1) - 1) * c + 1, 2 * h, 2 * w)
    want = _explicit(pipe, call, longer, policy="auto", size=longer, train_size=trained, units=units)
    handle = apply_rope_scaling(pipe, train_size=trained, units=units)
    got = call(longer[1], longer[2], longer[0])
    assert torch.equal(got, want)
    axes = handle.plan.plan.axes
    assert [a.choice for a in axes] == ["riflex", "content", "content"]
    assert [a.target for a in axes] == [2 * t for t in trained]
    assert handle.plan.scaling[0].test_length == 2 * trained[0]
    handle.remove()


def test_a_compiled_transformer_is_not_recompiled_between_image_sizes():
    from torch._dynamo.testing import CompileCounter

    build, (h, w), units, trained = IMAGES["flux"]
    pipe, call = build()
    apply_rope_scaling(pipe, train_size=trained, units=units)
    counter = CompileCounter()
    torch._dynamo.reset()
    pipe.transformer.compile(backend=counter, dynamic=True)
    call(2 * h, 2 * w)
    frames = counter.frame_count
    call(3 * h, 3 * w)
    call(3 * h // 2, 3 * w // 2)
    assert counter.frame_count == frames  # (square sizes: the stock pipeline's own ids recompile per aspect ratio)
    torch._dynamo.reset()


def test_a_pipeline_without_a_height_argument_is_refused_by_name():
    from models import tiny_diffusers as tiny

    class AudioPipeline:  # StableAudioPipeline's call takes a duration, not a height (its scheduler needs torchsde)
        def __init__(self, transformer):
            self.transformer = transformer

        def __call__(self, prompt=None, audio_end_in_s=None):
            raise AssertionError("never called")

    pipe = AudioPipeline(tiny.build("StableAudioDiTModel")[0])
    with pytest.raises(ValueError, match="has no 'height' argument"):
        apply_rope_scaling(pipe)
    with pytest.raises(TypeError, match="adapts a pipeline's `transformer`"):
        apply_rope_scaling(object())


def test_a_call_past_the_policy_limit_fails_before_any_step():
    build, (h, w), units, trained = IMAGES["flux"]
    pipe, call = build()
    apply_rope_scaling(pipe, train_size=trained, units=units)
    steps = []
    pipe.transformer.register_forward_pre_hook(lambda *a: steps.append(1))
    with pytest.raises(ValueError, match="past the 4x"):
        call(5 * h, 5 * w)
    assert not steps
