"""transformers' own RoPE-scaling cases with ``apply_axial_rope`` installed, and the ``rope_parameters`` keys
transformers accepts.

``test_model_rope_scaling_from_config`` (transformers ``tests/test_modeling_common.py``, run by
``Qwen3ModelTest``, ``Gemma3TextModelTest`` and ``Gemma3Vision2TextModelTest``) builds a model from a
'default' ``rope_parameters`` holding ``original_max_position_embeddings``, then updates the same dict to
'linear', 'dynamic' or 'yarn' (Gemma 3: copied into each layer type, so each entry also holds the earlier
per-layer entries). Written again here on tiny configs: stock's own assertions hold, and the installed
adapter gives stock's outputs. Then, for every ``rope_type`` transformers validates, a dict with every key
its validation accepts builds our rope with transformers' inverse frequencies and attention factor.
"""

from __future__ import annotations

import copy
import inspect
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")
from helpers import U32, U64, chain_bound  # noqa: E402

import axial_rope as ar  # noqa: E402
from axial_rope.conventions import MODEL_TYPES  # noqa: E402
from axial_rope.integrations.transformers import apply_axial_rope, serves  # noqa: E402
from axial_rope.scaling import from_rope_parameters  # noqa: E402

# logits of one forward: the bounds of tests/test_integrations_transformers.py (chain_bound over the 16 stages of
# a 2-layer forward, 64 terms per sum). float64 with the norm left alone: the equality claim; fused: stock's
# QK-norm computes in float32 whatever the model's dtype (Qwen3's and Gemma 3's `.to(torch.float32)`)
FORWARD, FORWARD32 = chain_bound(U64, 64, 16), chain_bound(U32, 64, 16)
MAX_POSITIONS = 32  # upstream: 512 (the long input is 1.5 x this); smaller keeps the forwards quick


def set_rope_params(config, params: dict) -> None:
    """transformers' ``_set_config_rope_params`` (tests/test_modeling_common.py): update the dict in place, copy
    it into each layer type for Gemma 3, recurse into sub-configs."""
    config.rope_parameters = getattr(config, "rope_parameters", {}) or {}
    config.rope_parameters.update(params)
    if "gemma3" in type(config).__name__.lower():
        config.rope_parameters = {layer_type: config.rope_parameters.copy() for layer_type in config.layer_types}
    for sub in config.sub_configs:
        set_rope_params(getattr(config, sub), params)


TEXT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16, intermediate_size=37, max_position_embeddings=MAX_POSITIONS, pad_token_id=0)  # fmt: skip


def tiny(family: str):
    """The config and base model class of a CausalLMModelTester-sized model (Gemma 3 vision2text: a SigLIP tower)."""
    if family == "qwen3":
        return transformers.Qwen3Config(**TEXT), transformers.Qwen3Model
    text = transformers.Gemma3TextConfig(**TEXT, layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    if family == "gemma3_text":
        return text, transformers.Gemma3TextModel
    vision = dict(image_size=20, patch_size=5, num_channels=3, hidden_size=32, num_hidden_layers=1,
                  num_attention_heads=4, intermediate_size=37)  # fmt: skip
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision, image_token_index=4,
                                       boi_token_index=5, eoi_token_index=6, mm_tokens_per_image=2)  # fmt: skip
    return config, transformers.Gemma3Model


def hidden(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).last_hidden_state


def installed(model, ids: torch.Tensor, fuse_qk_norm: bool) -> tuple[torch.Tensor, object]:
    with apply_axial_rope(model, fuse_qk_norm=fuse_qk_norm) as handle:
        return hidden(model, ids), handle


@pytest.mark.parametrize("scaling", ["linear", "dynamic", "yarn"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "gemma3_vision2text"])
def test_model_rope_scaling_from_config_with_the_adapter_installed(family, scaling):
    """Upstream's assertions on stock, then each model patched: float64 without the fused norm equals stock to
    rounding; fused (the path that refused ``original_max_position_embeddings`` in a 'default' dict) within the
    float32 bound, rotating by positions wherever the frequencies do not depend on the length."""
    config, model_cls = tiny(family)
    text = config.get_text_config()
    gen = torch.Generator().manual_seed(0)
    short = torch.randint(7, text.vocab_size, (1, 10), generator=gen)  # ids >= 7: no image or special token
    long = torch.randint(7, text.vocab_size, (1, int(text.max_position_embeddings * 1.5)), generator=gen)
    outputs = {}
    for stage, params in (("original", {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 1.0,
                                         "original_max_position_embeddings": 16384}),
                          ("scaled", {"rope_type": scaling, "factor": 10.0, "rope_theta": 10_000.0,
                                      "partial_rotary_factor": 1.0})):  # fmt: skip
        set_rope_params(text, params)  # upstream: on config.get_text_config() (a composite's text config)
        transformers.set_seed(42)
        model = model_cls(copy.deepcopy(config)).eval().double()
        stock = [hidden(model, ids) for ids in (short, long)]
        outputs[stage] = stock
        assert serves(model) is None and serves(config) is None  # and apply_axial_rope agrees, below
        for ids, want in zip((short, long), stock):
            got, _ = installed(model, ids, fuse_qk_norm=False)
            assert (got - want).abs().max() <= FORWARD * want.abs().max()
            got, handle = installed(model, ids, fuse_qk_norm=True)
            assert (got - want).abs().max() <= FORWARD32 * want.abs().max()
            assert len(handle.fused) == 2
            length_dependent = stage == "scaled" and scaling == "dynamic"
            assert handle.by_positions == (0 if length_dependent else 2), handle.why_tables
            assert torch.equal(hidden(model, ids), want)  # removed: stock again
    (short0, long0), (short1, long1) = outputs["original"], outputs["scaled"]
    if scaling == "dynamic":  # upstream's own assertions: dynamic changes nothing below the original length
        torch.testing.assert_close(short0, short1, rtol=1e-5, atol=1e-5)
    else:
        assert not torch.allclose(short0, short1, atol=1e-5)
    assert not torch.allclose(long0, long1, atol=1e-5)


# -- every key transformers' validation accepts, per rope_type ---------------------------------------------------

HEAD_DIM = 32
# a value for every key transformers' validations name (partial_rotary_factor 0.5: 8 rotated planes of 32 channels)
VALUES = {
    "rope_theta": 10_000.0, "factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.25,
    "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "partial_rotary_factor": 0.5,
    "short_factor": [1.0 + 0.1 * j for j in range(8)], "long_factor": [1.0 + 0.5 * j for j in range(8)],
}  # fmt: skip


def validated_keys() -> dict[str, set[str]]:
    """rope_type -> the keys its ``_validate_<type>_rope_parameters`` accepts without a warning, read by calling it
    with a recorder in place of ``_check_received_keys`` (required, optional, ``partial_rotary_factor``, ``type``)."""
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin as Mixin

    found = {}

    def record(rope_type, received_keys, required_keys, optional_keys=None, ignore_keys=None):  # its signature
        found[rope_type] = set(required_keys) | set(optional_keys or ()) | {"partial_rotary_factor", "type"}

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=HEAD_DIM, max_position_embeddings=64)
    original = vars(Mixin)["_check_received_keys"]  # the staticmethod itself, put back as it was
    try:
        Mixin._check_received_keys = staticmethod(record)
        for name in dir(Mixin):
            match = re.fullmatch(r"_validate_(\w+)_rope_parameters", name)
            if match:
                params = dict(VALUES, rope_type=match[1])
                try:
                    getattr(Mixin, name)(config, params)
                except (KeyError, TypeError):
                    pass  # a check after the keys' (it needs a value we did not give): the keys are recorded
    finally:
        Mixin._check_received_keys = original
    return found


KEYS = validated_keys()


def test_the_validations_are_read():
    assert {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"} <= set(KEYS)
    assert {"beta_fast", "truncate", "original_max_position_embeddings"} <= KEYS["yarn"]
    assert not set().union(*KEYS.values()) - set(VALUES) - {"rope_type", "type"}  # a value for every key


def stock_inv_freq(config, rope_type: str) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type == "default":  # the models' own default: theta ** (-2j / rotated width)
        dim = int(HEAD_DIM * config.rope_parameters.get("partial_rotary_factor", 1.0))
        return 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2).double() / dim), 1.0
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")


@pytest.mark.parametrize("rope_type", sorted(KEYS))
def test_every_key_transformers_validation_accepts_is_accepted_with_its_result(rope_type):
    """A dict with each key the validation accepts for the type: rope_from_config builds the rope of stock's
    inverse frequencies (float32, within 64 u: transformers_rotation.AGREEMENT's reasoning) and attention factor.
    'axial' is the vision towers' 2-D rope type (no text config has it): refused by name."""
    params = {key: VALUES[key] for key in KEYS[rope_type] if key in VALUES} | {"rope_type": rope_type, "type": rope_type}
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=HEAD_DIM,
                                      max_position_embeddings=64, rope_parameters=dict(params))  # fmt: skip
    if rope_type == "axial":
        with pytest.raises(ValueError, match="rope_type 'axial' is not supported"):
            ar.rope_from_config(config)
        return
    rope = ar.rope_from_config(config)
    want, factor = stock_inv_freq(config, rope_type)
    rotation = rope.rotation(torch.zeros(1, 1))  # seq_len 1: dynamic and longrope at their short regime
    got = rotation.freqs[0][: len(want)]
    assert got.shape == want.shape and (got - want.double()).abs().max() <= 64 * U32 * want.abs().max()
    assert rotation.attention_factor == pytest.approx(factor, rel=U32) or (rotation.attention_factor is None
                                                                             and factor == 1.0)  # fmt: skip


def ignored_keys() -> set[str]:
    """The keys the configs of the pinned model types exempt from validation (``ignore_keys_at_rope_validation``,
    a class attribute or passed in ``__post_init__``), layer types aside (per-layer dicts: rope_from_config)."""
    from transformers.models.auto import configuration_auto as auto

    keys = set()
    for model_type in set(MODEL_TYPES) & set(auto.CONFIG_MAPPING_NAMES):
        cls = auto.CONFIG_MAPPING[model_type]
        keys |= set(getattr(cls, "ignore_keys_at_rope_validation", None) or ())
        for found in re.findall(r"ignore_keys_at_rope_validation=\{([^}]*)\}", inspect.getsource(cls)):
            keys |= set(re.findall(r'"(\w+)"', found))
    return keys - {"full_attention", "sliding_attention", "chunked_attention"}


IGNORED_VALUES = {"mrope_section": [2, 3, 3], "mrope_interleaved": True, "interleaved": True,
                  "llama_4_scaling_beta": 0.1, "max_position_embeddings": 64}  # fmt: skip


def test_keys_the_served_configs_exempt_from_validation_are_accepted_and_change_nothing():
    keys = ignored_keys()
    assert keys and keys <= set(IGNORED_VALUES), sorted(keys - set(IGNORED_VALUES))
    for rope_type in ("default", "linear", "yarn"):
        base = {"rope_type": rope_type, "rope_theta": 1e4} | ({} if rope_type == "default" else {"factor": 2.0})
        base |= {"original_max_position_embeddings": 16} if rope_type == "yarn" else {}
        want = from_rope_parameters(base, max_position_embeddings=64)
        for key in keys:
            assert from_rope_parameters(base | {key: IGNORED_VALUES[key]}, max_position_embeddings=64) == want, key


def test_misspelt_keys_transformers_only_warns_about_stay_refused_by_rope_from_config_but_not_by_the_adapter():
    """transformers warns ("Unrecognized keys") and runs; rope_from_config names the key (a misspelt rope_type);
    the adapter, which only needs a rope to fuse by positions, rotates by the model's tables: stock's result."""
    config, model_cls = tiny("qwen3")
    config.rope_parameters = {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}  # 'linear' meant
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['factor'\]"):
        ar.rope_from_config(config)
    transformers.set_seed(0)
    model = model_cls(config).eval()
    ids = torch.randint(7, 99, (1, 12), generator=torch.Generator().manual_seed(1))
    want = hidden(model, ids)
    assert serves(model) is None
    got, handle = installed(model, ids, fuse_qk_norm=True)
    assert handle.by_positions == 0 and "unknown key(s) ['factor']" in handle.why_tables
    assert (got - want).abs().max() <= FORWARD32 * want.abs().max()


def _gemma3_yarn_entry():
    """A Gemma 3 text model whose full-attention layer type is YaRN with ``truncate: False`` in its entry, which
    transformers ignores: it reads ``truncate`` from the top-level rope_parameters (``_compute_yarn_parameters``)."""
    yarn = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 64,
            "truncate": False}  # fmt: skip
    config = transformers.Gemma3TextConfig(**(TEXT | {"hidden_size": 64, "head_dim": 32, "max_position_embeddings": 128}),
                                           layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                                           rope_parameters={"sliding_attention": {"rope_type": "default",
                                                                                  "rope_theta": 1e4},
                                                            "full_attention": yarn})  # fmt: skip
    transformers.set_seed(0)
    return transformers.Gemma3TextModel(config).eval()


def test_a_layer_entrys_yarn_truncate_is_read_as_transformers_reads_it():
    """rope_from_config reads ``truncate`` where transformers does (the top level), so the rebuilt rope turns as the
    model's rotary: both layers fused by positions, from_config served."""
    model = _gemma3_yarn_entry()
    ids = torch.randint(7, 99, (1, 12), generator=torch.Generator().manual_seed(1))
    want = hidden(model, ids)
    got, handle = installed(model, ids, fuse_qk_norm=True)
    assert handle.by_positions == 2, handle.why_tables
    assert (got - want).abs().max() <= FORWARD32 * want.abs().max()
    assert serves(model, from_config=True) is None


def test_rotary_buffers_that_differ_from_the_config_keep_the_models_tables():
    """A model whose rotary turns otherwise than its config says (here its full-attention frequencies changed by 1%
    after loading): the fused attention keeps the model's tables, from_config refuses."""
    model = _gemma3_yarn_entry()
    with torch.no_grad():
        model.rotary_emb.full_attention_inv_freq.mul_(1.01)
    ids = torch.randint(7, 99, (1, 12), generator=torch.Generator().manual_seed(1))
    want = hidden(model, ids)
    got, handle = installed(model, ids, fuse_qk_norm=True)
    assert handle.by_positions == 0 and "does not turn as the model's rotary" in handle.why_tables
    assert (got - want).abs().max() <= FORWARD32 * want.abs().max()
    reason = serves(model, from_config=True)
    assert "layer type 'full_attention': tables differ" in reason
    with pytest.raises(ValueError, match="from_config=True: the rope rebuilt from the config does not turn as"):
        apply_axial_rope(model, from_config=True)
    assert torch.equal(hidden(model, ids), want)  # the refusal left nothing behind
