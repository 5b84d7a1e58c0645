"""transformers' ``rope_parameters`` rules that need no scaling method: the keys that are not a method's
fields, and the lengths transformers fills from the model config.

:func:`axial_rope.scaling.from_rope_parameters` builds the method with them (the rules follow
``transformers.modeling_rope_utils``, checked in ``tests/test_scaling.py`` and
``tests/test_scaling_faults.py``). This module imports nothing from axial_rope, so ``scaling`` can
import it. A whole model config to its rope is :func:`axial_rope.rope_from_config` (:mod:`axial_rope.configs`).
"""

from __future__ import annotations

__all__ = ["CONFIG_KEYS", "NESTED_LAYER_KEYS", "fill_lengths", "layer_entry"]

# Keys transformers keeps in `rope_parameters` that are not fields of a method: the method's name, the
# base and the rotary fraction (arguments of `inv_freq`), and what its model configs exempt from
# validation (`ignore_keys_at_rope_validation`) without touching the frequencies: M-RoPE's axis split and
# layout (Qwen-VL, GLM-4V), Ministral 3's query temperature and its copy of `max_position_embeddings`.
# `original_max_position_embeddings` is a length of the model, as `max_position_embeddings` is: transformers
# writes it into the dict itself (`standardize_rope_params`) and a rope type that does not read it (default,
# linear, dynamic) ignores it; its own tests put it into a 'default' dict that later becomes 'linear' or
# 'dynamic' (`_set_config_rope_params` updates the dict). A method with the field (YaRN, Llama 3, LongRoPE)
# keeps it. Frequency keys stay refused where their method lacks them: 'factor' in a 'default' dict is a
# misspelt rope_type more often than not.
CONFIG_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "partial_rotary_factor",
    "mrope_section", "mrope_interleaved", "interleaved", "llama_4_scaling_beta", "max_position_embeddings",
    "original_max_position_embeddings",
})  # fmt: skip


# Layer types that key a per-layer-type `rope_parameters` (Gemma 2/3/4, Laguna, Mellum)
NESTED_LAYER_KEYS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})


def layer_entry(params: dict) -> dict:
    """A layer type's own ``rope_parameters`` entry without the per-layer entries nested in it.

    transformers reads an entry's flat keys only (``config.rope_parameters[layer_type]["rope_theta"]``) and its
    Laguna and Mellum configs exempt the nested layer-type keys from validation; its tests build such entries
    (``_set_config_rope_params`` copies a per-layer dict updated with flat keys into each layer type). An entry
    without its own ``rope_type`` is left whole: a per-layer dict read as one entry stays an error.
    """
    if "rope_type" not in params and "type" not in params:
        return params
    return {k: v for k, v in params.items() if not (k in NESTED_LAYER_KEYS and isinstance(v, dict | None))}


def fill_lengths(kind: str, names: set[str], values: dict, max_position_embeddings: int | None) -> None:
    """Lengths transformers reads from (or fills from) the model config's ``max_position_embeddings``."""
    for name in ("max_position_embeddings", "original_max_position_embeddings"):
        if name in names and name not in values:  # dynamic; yarn, longrope, llama3 (standardize_rope_params)
            if max_position_embeddings is None:
                hint = "pass max_position_embeddings=config.max_position_embeddings (transformers fills it from there)"
                raise ValueError(f"rope_type {kind!r} needs {name}: put it in the dict or {hint}")
            values[name] = max_position_embeddings
    if kind in ("yarn", "longrope") and "factor" not in values:
        if max_position_embeddings is not None:  # DeepSeek-V3, Phi-3: factor = the ratio of the two lengths
            values["factor"] = max_position_embeddings / values["original_max_position_embeddings"]
        elif kind == "yarn":
            raise ValueError("rope_type 'yarn' without 'factor' needs max_position_embeddings to derive it: pass it")
