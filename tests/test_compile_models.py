"""The library's own models under ``torch.compile`` and ``torch.export``: no graph break, no recompilation per
size beyond the one dynamic graph, positions built from (symbolic) shapes inside the graph.

Dynamo-level checks run with a counting backend (``CompileCounter``: graphs compiled, no code generated);
export and AOTInductor run for the tiny DiT. Outputs are compared with eager within the bound of the
torch backend's two paths (``_close``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.export import Dim

import axial_rope as ar
from axial_rope.time_scaling import DyPE
from models.dit import PRESETS as DIT_PRESETS
from models.dit import DiT
from models.studies.length.positions import STUDY_PRESETS
from models.video_dit import PRESETS as VIDEO_PRESETS
from models.video_dit import VideoDiT

# a sampler's sequence of sizes: the training size, then larger and other aspect ratios
IMAGE_SIZES = ((32, 32), (48, 64), (64, 48), (64, 64), (16, 64), (40, 24))
VIDEO_SIZES = ((8, 16, 16), (4, 24, 8), (12, 8, 8), (8, 24, 16), (2, 16, 16), (6, 8, 24))


def _close(got, want):
    """Compiled against eager: the torch backend's eager rotation (one complex multiply) and its traced
    expression round differently, by up to 2 float32 ulps of a rotated channel (4 u |x|, u = 2**-24), carried
    through a few blocks of O(1) activations: 1e-5 bounds it with room."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _randomized(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights drawn at random, so that the zero-initialised adaLN and final layers do not hide the blocks."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def _count(model, inputs, **compile_kwargs) -> CompileCounter:
    """Run ``model`` compiled (fullgraph: a graph break raises) on each of ``inputs``, checking each against eager."""
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, **compile_kwargs)
    with torch.no_grad():
        for args, kwargs in inputs:
            _close(compiled(*args, **kwargs), model(*args, **kwargs))
    return counter


def _images(sizes, batch=2, **kwargs):
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(batch) % 4
    return [((torch.randn(batch, 3, *hw, generator=g), torch.full((batch,), 500.0), labels), kwargs) for hw in sizes]


@pytest.mark.parametrize("pos_mode", ["none", "interpolate", "normalize"])
def test_dit_compiles_two_graphs_over_six_sizes(pos_mode):
    # the first call's graph, then one with symbolic height and width that every later size reuses
    model = _randomized(DiT(DIT_PRESETS["tiny"]))
    assert _count(model, _images(IMAGE_SIZES, pos_mode=pos_mode)).frame_count == 2


def test_dit_compiled_dynamic_is_one_graph():
    model = _randomized(DiT(DIT_PRESETS["tiny"]))
    with torch.fx.experimental._config.patch(use_duck_shape=False):  # a square first size: h and w apart
        assert _count(model, _images(IMAGE_SIZES), dynamic=True).frame_count == 1


@pytest.mark.parametrize("pos_mode", ["ntk", "yarn", "dype"])
def test_dit_frequency_modes_recompile_per_size_without_breaking(pos_mode):
    # their frequencies are Python math on the size's factor: one whole graph per size (fullgraph holds)
    model = _randomized(DiT(DIT_PRESETS["tiny"]))
    counter = _count(model, _images(IMAGE_SIZES[:3], pos_mode=pos_mode))
    assert counter.frame_count <= 3


def test_time_dependent_dit_compiles_once_for_every_sampling_step():
    model = _randomized(DiT(DIT_PRESETS["tiny"]))
    x, labels = torch.randn(2, 3, 64, 64), torch.tensor([0, 1])
    scaling = (DyPE(2.0, 8), DyPE(2.0, 8))
    steps = [((x, torch.full((2,), t), labels), {"scaling": scaling}) for t in (1000.0, 750.0, 500.0, 250.0, 0.0)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert _count(model, steps).frame_count == 1


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_float_time_under_compile_is_refused_with_the_reason(fullgraph):
    # a TypeError with or without fullgraph: not dynamo's "Observed exception", nor accepted by an eager rerun
    rope = ar.AxialRoPE((8, 8), scaling=(None, DyPE(2.0, 4)))
    q, pos = torch.randn(1, 6, 1, 16), ar.grid(2, 3)
    for call in (lambda q: rope(q, q, pos, t=0.5), lambda q: rope.at_time(0.5)(q, q, pos)):
        torch._dynamo.reset()
        compiled = torch.compile(call, backend="eager", fullgraph=fullgraph)
        with pytest.raises(TypeError, match="t must be a tensor under torch.compile, got the number 0.5"):
            compiled(q)
    assert rope.at_time(0.5).t.item() == 0.5  # eagerly a number is fine
    tensor_t = torch.compile(lambda q, t: rope(q, q, pos, t=t), backend="eager", fullgraph=True)
    _close(tensor_t(q, torch.tensor(0.5))[0], rope(q, q, pos, t=0.5)[0])


def test_video_dit_compiles_two_graphs_over_six_sizes_and_frame_counts():
    model = _randomized(VideoDiT(VIDEO_PRESETS["tiny"]))
    g = torch.Generator().manual_seed(2)
    inputs = [((torch.randn(1, 3, *s, generator=g), torch.tensor([500.0]), torch.tensor([1])), {}) for s in VIDEO_SIZES]
    assert _count(model, inputs).frame_count == 2


def test_gpt_decoding_step_compiles_once():
    model = STUDY_PRESETS["lm-rope"].build().eval()  # the length study's RoPE model (its scheme object compiles too)
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(3))
    caches = model.new_caches(1, 12)
    with torch.no_grad():
        model(prompt, torch.arange(5), caches, seq_len=12)  # prefill, eager
        eager_caches = copy.deepcopy(caches)  # the same filled caches, for the eager steps
        torch._dynamo.reset()
        counter = CompileCounter()
        step = torch.compile(lambda tok, pos: model(tok, pos, caches, seq_len=12), backend=counter, fullgraph=True)
        token = prompt[:, -1:].clone(memory_format=torch.contiguous_format)  # strides (1, 1), as the steps' tokens
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i in range(5):
                pos = torch.tensor([5 + i])
                got = step(token, pos)
                want = model(token, pos, eager_caches, seq_len=12)
                _close(got, want)
                token = got[:, -1].argmax(-1, keepdim=True)
    assert counter.frame_count == 1


def test_timm_vit_compiles_two_graphs_over_sizes():
    timm = pytest.importorskip("timm")
    import axial_rope.integrations.timm  # noqa: F401  (registers the models)

    model = _randomized(timm.create_model("test_vit_axial_rope", img_size=64, rope_positions="interpolate"))
    g = torch.Generator().manual_seed(4)
    inputs = [((torch.randn(1, 3, h, w, generator=g),), {}) for h, w in ((64, 64), (96, 128), (128, 96), (80, 80))]
    assert _count(model, inputs).frame_count == 2


def test_diffusers_wrapper_of_the_dit_compiles_fullgraph():
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT2DModel

    model = _randomized(AxialDiT2DModel.from_preset("tiny"))
    g = torch.Generator().manual_seed(5)
    inputs = [
        ((torch.randn(2, 3, *hw, generator=g), torch.full((2,), 500.0), torch.tensor([0, 1])), {"return_dict": False})
        for hw in IMAGE_SIZES[:3]
    ]
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        for args, kwargs in inputs:
            _close(compiled(*args, **kwargs)[0], model(*args, **kwargs)[0])
    assert counter.frame_count == 2


def test_export_with_dynamic_height_and_width_runs_at_an_unseen_size(tmp_path):
    from torch._inductor.package import load_package

    model = _randomized(DiT(DIT_PRESETS["tiny"]))
    x, t, y = torch.randn(2, 3, 32, 48), torch.full((2,), 500.0), torch.tensor([0, 1])
    h, w = Dim("h", min=1, max=64), Dim("w", min=1, max=64)  # in patches of 4 pixels
    exported = torch.export.export(model, (x, t, y), dynamic_shapes={"x": {2: 4 * h, 3: 4 * w}, "t": None, "y": None})
    unseen = torch.randn(2, 3, 64, 24)
    with torch.no_grad():
        _close(exported.module()(unseen, t, y), model(unseen, t, y))
    path = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "dit.pt2"))
    with torch.no_grad():
        _close(load_package(path)(unseen, t, y), model(unseen, t, y))


def test_video_dit_exports_with_dynamic_frames_height_and_width():
    model = _randomized(VideoDiT(VIDEO_PRESETS["tiny"]))
    x, t, y = torch.randn(1, 3, 4, 8, 8), torch.tensor([500.0]), torch.tensor([1])
    frames, h, w = Dim("frames", min=1, max=32), Dim("h", min=1, max=32), Dim("w", min=1, max=32)
    patch = VIDEO_PRESETS["tiny"].patch_size
    shapes = {"x": {2: patch[0] * frames, 3: patch[1] * h, 4: patch[2] * w}, "t": None, "y": None}
    exported = torch.export.export(model, (x, t, y), dynamic_shapes=shapes)
    unseen = torch.randn(1, 3, 6, 12, 4)
    with torch.no_grad():
        _close(exported.module()(unseen, t, y), model(unseen, t, y))
