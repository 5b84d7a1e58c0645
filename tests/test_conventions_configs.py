"""``ar.rope_from_config``: a transformers or diffusers config gives the identical rope in one call, and a
field it cannot honour raises ``ValueError`` naming the field."""

from __future__ import annotations

import re

import pytest
import torch
from conventions_support import EPS32, max_diff, upstream_table_bound

import axial_rope as ar
from axial_rope import conventions as conv

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")


def same(a: ar.AxialRoPE, b: ar.AxialRoPE) -> bool:
    return (
        torch.equal(a.freqs, b.freqs) and torch.equal(a.scale, b.scale) and a.pairing == b.pairing
        and a.frequency_model == b.frequency_model
    )  # fmt: skip


def test_transformers_config_json_and_object_agree():
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    raw = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "rope_theta": 5e5,
           "rope_scaling": params, "max_position_embeddings": 1024}  # fmt: skip
    config = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=1024,
                                      rope_parameters={"rope_theta": 5e5, **params})  # fmt: skip
    expected = ar.AxialRoPE(64, 5e5, ar.scaling.YaRN(4.0, 256), pairing="half")
    assert same(ar.rope_from_config(raw), expected) and same(ar.rope_from_config(config), expected)


def test_multimodal_config_reads_its_text_config():
    config = transformers.Qwen2VLConfig(text_config={"hidden_size": 64, "num_attention_heads": 2, "head_dim": 32,
                                                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                                         "mrope_section": [4, 6, 6]}})  # fmt: skip
    assert same(ar.rope_from_config(config), conv.qwen2_vl(32, 1e6, (4, 6, 6)))


def test_interleaved_model_types():
    from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding

    config = transformers.CohereConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, vocab_size=8,
                                       intermediate_size=8, num_hidden_layers=1)  # fmt: skip
    rope = ar.rope_from_config(config)
    assert rope.pairing == "interleaved"
    ids = torch.arange(9)[None]
    cos, sin = CohereRotaryEmbedding(config)(torch.zeros(1), ids)  # repeat_interleave: (2j, 2j+1) share a plane
    ours = rope.cos_sin(ids[..., None].float())
    assert max_diff((ours[0], cos), (ours[1], sin)) <= upstream_table_bound(rope, ids[..., None].float())


DIFFUSERS_CONFIGS = {
    # class: (tiny config, the convention it must give)
    "FluxTransformer2DModel": ({"attention_head_dim": 16, "axes_dims_rope": [4, 6, 6]}, lambda: conv.flux((4, 6, 6))),
    "HunyuanVideoTransformer3DModel": ({"attention_head_dim": 10, "rope_axes_dim": [2, 4, 4], "rope_theta": 256.0},
                                       lambda: conv.hunyuan_video((2, 4, 4), 256.0)),
    "HunyuanImageTransformer2DModel": ({"attention_head_dim": 16, "rope_axes_dim": [8, 8], "rope_theta": 256.0},
                                       lambda: conv.hunyuan_image((8, 8), 256.0)),
    "WanTransformer3DModel": ({"attention_head_dim": 12}, lambda: conv.wan(12)),
    "CogVideoXTransformer3DModel": ({"attention_head_dim": 32, "use_rotary_positional_embeddings": True},
                                    lambda: conv.cogvideox(32)),
    "LTXVideoTransformer3DModel": ({"num_attention_heads": 2, "attention_head_dim": 16}, lambda: conv.ltx_video(2, 16)),
    "LTX2VideoTransformer3DModel": ({"num_attention_heads": 2, "attention_head_dim": 16, "pos_embed_max_pos": 20,
                                     "base_height": 2048, "base_width": 2048, "rope_theta": 10000.0,
                                     "rope_double_precision": True, "rope_type": "split"},
                                    lambda: conv.ltx2(2, 16, rope_type="split")),
    "Lumina2Transformer2DModel": ({"hidden_size": 64, "num_attention_heads": 2, "axes_dim_rope": [8, 12, 12],
                                   "axes_lens": [300, 512, 512]}, lambda: conv.lumina2((8, 12, 12))),
    "MochiTransformer3DModel": ({"num_attention_heads": 2, "attention_head_dim": 16}, lambda: conv.mochi(2, 16)),
    "HunyuanDiT2DModel": ({"attention_head_dim": 88}, lambda: conv.hunyuan_dit(88)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(DIFFUSERS_CONFIGS))
def test_diffusers_configs(name):
    fields, expected = DIFFUSERS_CONFIGS[name]
    assert same(ar.rope_from_config({"_class_name": name, **fields}), expected())


def test_diffusers_model_config_object():
    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))  # fmt: skip
    rope = ar.rope_from_config(model)  # the model, or its config (a FrozenDict without _class_name) and the class
    assert same(rope, ar.rope_from_config(model.config, class_name="FluxTransformer2DModel"))
    ids = conv.flux_positions(3, 2, 3)
    cos, sin = model.pos_embed(ids)
    ours = rope.cos_sin(ids)
    # Flux builds its tables from float64 angles on the CPU: both are float64 values rounded once
    assert max_diff((ours[0], cos), (ours[1], sin)) <= 2 * EPS32


def test_ltx2_audio_config():
    fields = {"audio_num_attention_heads": 2, "audio_attention_head_dim": 12, "audio_pos_embed_max_pos": 20,
              "rope_theta": 10000.0, "rope_double_precision": True, "rope_type": "interleaved"}  # fmt: skip
    rope = ar.rope_from_config({"_class_name": "LTX2VideoTransformer3DModel", **fields}, modality="audio")
    assert same(rope, conv.ltx2(2, 12, modality="audio"))


ERRORS = [
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "rope_scaling": {"rope_type": "magic"}},
     "rope_type 'magic'"),
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
      "rope_scaling": {"rope_type": "linear", "factor": 2.0, "fator": 3}}, "fator"),
    ({"model_type": "qwen2_vl", "head_dim": 32, "rope_parameters": {"rope_theta": 1e6, "mrope_section": [4, 6, 4]}},
     "mrope_section"),
    ({"model_type": "gpt_neox", "head_dim": 20, "rope_theta": 1e4, "partial_rotary_factor": 0.25},
     "partial_rotary_factor"),
    ({"model_type": "llama", "num_attention_heads": 2}, "'hidden_size'"),
    ({"model_type": "llama", "hidden_size": 65, "num_attention_heads": 2}, "num_attention_heads"),
    ({"model_type": "gemma3_text", "head_dim": 16, "rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                                                       "sliding_attention": {"rope_theta": 1e4}}},
     "layer_type"),
    ({"model_type": "llama", "head_dim": 16, "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6,
                                                                  "partial_rotary_factor": 0.5, "beta": 1}}, "beta"),
    ({"_class_name": "SD3Transformer2DModel"}, "_class_name 'SD3Transformer2DModel'"),
    ({"_class_name": "FluxTransformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [16, 56, 48]},
     "axes_dims_rope"),
    ({"_class_name": "CogVideoXTransformer3DModel", "attention_head_dim": 64, "use_rotary_positional_embeddings": False},
     "use_rotary_positional_embeddings"),
    ({"_class_name": "WanTransformer3DModel"}, "'attention_head_dim'"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "field"), ERRORS, ids=lambda v: v if isinstance(v, str) else "")
def test_unknown_or_inconsistent_fields_name_the_field(config, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        ar.rope_from_config(config)


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2}
# each was a TypeError or ZeroDivisionError from deep inside ("not all arguments converted during string
# formatting", "integer modulo by zero", "'int' object is not iterable"); now: the field, its value, the expectation
MISTYPED = [
    (LLAMA | {"hidden_size": "64"}, "hidden_size must be an int >= 1, got '64'"),
    (LLAMA | {"num_attention_heads": "2"}, "num_attention_heads must be an int >= 1, got '2'"),
    (LLAMA | {"num_attention_heads": 0}, "num_attention_heads must be an int >= 1, got 0"),
    (LLAMA | {"head_dim": "32"}, "head_dim must be an int >= 1, got '32'"),
    (LLAMA | {"head_dim": True}, "head_dim must be an int >= 1, got True"),
    (LLAMA | {"rope_parameters": [["rope_type", "linear"]]}, "rope_parameters must be a dict"),
    (LLAMA | {"rope_scaling": ["linear", 2.0]}, "rope_scaling must be a dict"),
    ({"model_type": "gemma3_text", "head_dim": 16, "rope_parameters": {"full_attention": [1e6],
      "sliding_attention": {"rope_theta": 1e4}}}, "rope_parameters['full_attention'] must be a dict"),
    ({"model_type": "qwen2_vl", "head_dim": 128, "rope_parameters": {"rope_theta": 1e6, "mrope_section": 64}},
     "mrope_section must be a list of 3 ints (planes for t, h, w), got 64"),
    ({"_class_name": "FluxTransformer2DModel", "attention_head_dim": "16", "axes_dims_rope": [4, 6, 6]},
     "attention_head_dim must be an int >= 1, got '16'"),
    ({"_class_name": "FluxTransformer2DModel", "attention_head_dim": 16, "axes_dims_rope": 16},
     "axes_dims_rope must be a list of ints"),
    ({"_class_name": "Lumina2Transformer2DModel", "hidden_size": 64, "num_attention_heads": 0,
      "axes_dim_rope": [8, 12, 12], "axes_lens": [300, 512, 512]}, "num_attention_heads must be an int >= 1, got 0"),
    ({"_class_name": "WanTransformer3DModel", "attention_head_dim": "128"}, "attention_head_dim must be an int >= 1"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "message"), MISTYPED, ids=[m.split(" ")[0] for _, m in MISTYPED])
def test_mistyped_fields_name_the_field_value_and_expectation(config, message):
    layer_type = "full_attention" if config.get("model_type") == "gemma3_text" else None
    with pytest.raises(ValueError, match=re.escape(message)):
        ar.rope_from_config(config, layer_type=layer_type)


def test_a_config_that_is_not_a_config_is_a_type_error():
    with pytest.raises(TypeError, match="config must be a transformers or diffusers config.*got 'llama'"):
        ar.rope_from_config("llama")
