"""Tiny random transformers models, one per family that ``apply_axial_rope`` is checked on, with their inputs
(shared by the tests, scripts.bench_transformers and scripts/gpu_transformers.py).

:func:`case` builds the model (seeded, float32, eval mode; norm weights drawn away from their init so that a
misplaced weight or offset shows) and the inputs of one forward: token ids, and for the vision-language
models an image, so that their ``get_rope_index`` gives M-RoPE positions that differ per axis.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch
import transformers

SIZES = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
         "intermediate_size": 32, "num_hidden_layers": 2, "vocab_size": 64, "max_position_embeddings": 64,
         "initializer_range": 0.2, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
S = 12  # prompt tokens
IMAGE, START, END = 60, 61, 62  # token ids of the vision-language models
LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}  # fmt: skip


@dataclass
class Case:
    model: torch.nn.Module
    inputs: dict  # one forward's keyword arguments (input_ids [B, S], ...)
    fused: int = 0  # attention layers whose QK-norm apply_axial_rope fuses


def _text(name: str, model_cls: str, config_cls: str, fused: int = 0, **fields) -> tuple:
    return name, (model_cls, config_cls, SIZES | fields, fused)


def _longrope() -> dict:
    n = 8  # planes of the rotated width: head 32, partial_rotary_factor 0.5
    return {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
            "short_factor": [1.0 + 0.1 * j for j in range(n)], "long_factor": [1.0 + 0.5 * j for j in range(n)]}  # fmt: skip


TEXT = dict([
    _text("llama", "LlamaForCausalLM", "LlamaConfig"),
    _text("llama-linear", "LlamaForCausalLM", "LlamaConfig", rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                              "rope_theta": 1e4}),
    _text("llama-dynamic", "LlamaForCausalLM", "LlamaConfig", max_position_embeddings=8,
          rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
    _text("llama-yarn", "LlamaForCausalLM", "LlamaConfig", rope_parameters={"rope_type": "yarn", "factor": 4.0,
          "rope_theta": 1e4, "original_max_position_embeddings": 16}),
    _text("llama-llama3", "LlamaForCausalLM", "LlamaConfig", rope_parameters=LLAMA3),
    _text("mistral", "MistralForCausalLM", "MistralConfig", sliding_window=5),
    _text("qwen2", "Qwen2ForCausalLM", "Qwen2Config"),
    _text("qwen3", "Qwen3ForCausalLM", "Qwen3Config", fused=2),
    _text("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig", fused=2, sliding_window=5, query_pre_attn_scalar=32,
          layer_types=["sliding_attention", "full_attention"],
          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                           "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
    _text("olmo2", "Olmo2ForCausalLM", "Olmo2Config"),
    _text("phi3", "Phi3ForCausalLM", "Phi3Config", num_key_value_heads=2, max_position_embeddings=64,
          original_max_position_embeddings=8, rope_parameters=_longrope()),
    _text("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig",
          rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}),
    _text("glm", "GlmForCausalLM", "GlmConfig", rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                 "partial_rotary_factor": 0.5}),
    _text("llama4_text", "Llama4ForCausalLM", "Llama4TextConfig", intermediate_size_mlp=32, num_local_experts=2,
          num_experts_per_tok=1, attention_chunk_size=5, no_rope_layers=[1, 0], rope_parameters=LLAMA3),
])  # fmt: skip

_VISION = {"depth": 1, "num_heads": 2, "patch_size": 2, "spatial_merge_size": 2, "temporal_patch_size": 2,
           "in_channels": 3}  # fmt: skip
VISION = {  # name -> (model class, config class, text sections, vision fields, fused)
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLConfig", [4, 6, 6],
                 _VISION | {"embed_dim": 32, "hidden_size": 64}, 0),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", [4, 6, 6],
                   _VISION | {"hidden_size": 32, "intermediate_size": 32, "out_hidden_size": 64, "window_size": 8,
                              "fullatt_block_indexes": [0]}, 0),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", [6, 5, 5],
                 _VISION | {"hidden_size": 32, "intermediate_size": 32, "out_hidden_size": 64,
                            "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}, 2),
}  # fmt: skip
NAMES = tuple(TEXT) + tuple(VISION)


def _draw_norms(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen) if p.abs().sum() else
                        0.3 * torch.randn(p.shape, generator=gen))  # fmt: skip  # Gemma's (1 + w): w from 0


def _ids(batch: int = 2, seq: int = S) -> torch.Tensor:
    return torch.randint(0, IMAGE, (batch, seq), generator=torch.Generator().manual_seed(2))


def _image_inputs() -> dict:
    """Two samples: text, an image of 4 x 4 patches (2 x 2 merged tokens), text."""
    ids = _ids(2, 10)
    row = torch.tensor([START, IMAGE, IMAGE, IMAGE, IMAGE, END])
    ids = torch.cat([ids[:, :3], row.expand(2, -1), ids[:, 3:]], 1)  # [2, 16]
    patch = 3 * 2 * 2 * 2  # channels x temporal x patch x patch
    pixels = torch.randn(2 * 16, patch, generator=torch.Generator().manual_seed(3))
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])
    return {
        "input_ids": ids,
        "mm_token_type_ids": (ids == IMAGE).long(),
        "pixel_values": pixels,
        "image_grid_thw": grid,
    }


@functools.cache
def case(name: str) -> Case:
    """The family's tiny model and inputs (cached: callers must leave the model as they found it)."""
    torch.manual_seed(0)
    if name in TEXT:
        model_cls, config_cls, fields, fused = TEXT[name]
        config = getattr(transformers, config_cls)(**fields)
        inputs = {"input_ids": _ids()}
    else:
        model_cls, config_cls, sections, vision, fused = VISION[name]
        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": sections}
        config = getattr(transformers, config_cls)(
            text_config=SIZES | {"rope_parameters": rope}, vision_config=vision, image_token_id=IMAGE,
            video_token_id=63, vision_start_token_id=START, vision_end_token_id=END,
        )  # fmt: skip
        inputs = _image_inputs()
    config._attn_implementation = "sdpa"
    model = getattr(transformers, model_cls)(config).eval()
    _draw_norms(model)
    return Case(model, inputs, fused)


@functools.cache
def case64(name: str) -> Case:
    """:func:`case` in float64 (a copy): the model's weights and the image's pixels; the tables the model
    computes stay what stock computes (float32 angles, cast), on both sides of a comparison."""
    small = case(name)
    inputs = {k: v.double() if v.is_floating_point() else v for k, v in small.inputs.items()}
    return Case(copy.deepcopy(small.model).double(), inputs, small.fused)
