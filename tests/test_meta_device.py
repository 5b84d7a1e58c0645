"""Every module and model of the library builds under ``torch.device("meta")``; ``to_empty`` followed by
``reset_parameters()`` gives exactly the normal constructor's weights for the same seed, buffers recomputed.

That is how FSDP2 users build large models: nothing allocated, nothing drawn, until each shard is
materialised (``axial_rope.init``).
"""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope.layers import Attention, DiTBlock, FinalLayer, LabelEmbedder, Mlp, PatchEmbed, TimestepEmbedder
from models.dit import PRESETS as DIT_PRESETS
from models.dit import DiT
from models.gpt import GPT
from models.gpt import PRESETS as GPT_PRESETS
from models.studies.length.positions import STUDY_PRESETS
from models.video_dit import PRESETS as VIDEO_PRESETS
from models.video_dit import VideoDiT


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and every buffer (persistent or not), by name."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _builders():
    rope = lambda: ar.AxialRoPE((8, 8), theta=100.0)  # noqa: E731
    yield "AxialRoPE", rope
    yield "AxialRoPE learnable", lambda: ar.AxialRoPE((8, 8), learnable=True, num_heads=2)
    yield "AxialRoPE scaled", lambda: ar.AxialRoPE((8, 8), scaling=(None, ar.scaling.YaRN(2.0, 8)))
    yield "convention", lambda: ar.conventions.ltx_video(2, 16)
    yield "Attention", lambda: Attention(32, 2, rope(), qk_norm="rms", num_kv_heads=1)
    yield "Attention layer norm", lambda: Attention(32, 2, rope(), qk_norm="layer", fused_qkv=False)
    yield "DiTBlock", lambda: DiTBlock(32, 2, rope())
    yield "Mlp", lambda: Mlp(16, 32)
    yield "FinalLayer", lambda: FinalLayer(32, 2, 4)
    yield "TimestepEmbedder", lambda: TimestepEmbedder(32)
    yield "LabelEmbedder", lambda: LabelEmbedder(4, 32)
    yield "PatchEmbed 3D", lambda: PatchEmbed((1, 2, 2), 3, 32)
    yield "KVCache", lambda: ar.KVCache(1, 8, 2, 16)
    yield "DiT tiny", lambda: DiT(DIT_PRESETS["tiny"])
    yield "VideoDiT tiny", lambda: VideoDiT(VIDEO_PRESETS["tiny"])
    yield "GPT tiny", lambda: GPT(GPT_PRESETS["tiny"])
    for name in ("lm-rope", "lm-alibi", "lm-learned", "lm-t5"):  # the length study's schemes
        yield f"GPT {name}", lambda name=name: STUDY_PRESETS[name].build()


BUILDERS = dict(_builders())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_meta_build_then_to_empty_and_reset_equals_the_constructor(name):
    build = BUILDERS[name]
    torch.manual_seed(7)
    expected = _state(build())
    with torch.device("meta"):
        meta = build()
    assert all(t.is_meta for t in _state(meta).values() if t.numel()), "something was allocated"
    meta.to_empty(device="cpu")
    torch.manual_seed(7)
    meta.reset_parameters()
    got = _state(meta)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_meta_build_of_the_largest_presets_allocates_nothing():
    with torch.device("meta"):
        model = DiT(DIT_PRESETS["DiT-XL/2"])
        video = VideoDiT(VIDEO_PRESETS["wan-1.3b-like"])
    n = sum(p.numel() for p in model.parameters())
    assert 6.7e8 < n < 6.8e8 and all(p.is_meta for p in model.parameters())  # DiT-XL/2: 675 M
    assert all(p.is_meta for p in video.parameters())


def test_a_rope_shared_into_a_layer_keeps_its_values():
    # a layer materialises only what it built: the learned F of a rope passed in stays as it was
    rope = ar.AxialRoPE((8, 8), learnable=True)
    with torch.no_grad():
        rope.learned_freqs.mul_(3.0)
    before = rope.learned_freqs.clone()
    Attention(32, 2, rope)
    assert torch.equal(rope.learned_freqs, before)


def test_timm_vit_builds_on_meta():
    timm = pytest.importorskip("timm")
    import axial_rope.integrations.timm  # noqa: F401  (registers the models)

    build = lambda: timm.create_model("test_vit_axial_rope", img_size=64, rope_positions="ntk")  # noqa: E731
    torch.manual_seed(3)
    expected = _state(build())
    with torch.device("meta"):
        meta = build()
    meta.to_empty(device="cpu")
    torch.manual_seed(3)
    meta.reset_parameters()
    for key, value in expected.items():
        assert torch.equal(_state(meta)[key], value), key


def test_diffusers_wrappers_build_on_meta():
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT2DModel

    torch.manual_seed(5)
    expected = _state(AxialDiT2DModel.from_preset("tiny"))
    with torch.device("meta"):
        meta = AxialDiT2DModel.from_preset("tiny")
    meta.to_empty(device="cpu")
    torch.manual_seed(5)
    meta.reset_parameters()
    for key, value in expected.items():
        assert torch.equal(_state(meta)[key], value), key
