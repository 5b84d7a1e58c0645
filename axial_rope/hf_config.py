"""transformers' ``rope_parameters`` rules that need no scaling method: the keys that are not a method's
fields, and the lengths transformers fills from the model config.

:func:`axial_rope.scaling.from_rope_parameters` builds the method with them (the rules follow
``transformers.modeling_rope_utils``, checked in ``tests/test_scaling.py`` and
``tests/test_scaling_faults.py``). This module imports nothing from axial_rope, so ``scaling`` can
import it. A whole model config to its rope is :func:`axial_rope.rope_from_config` (:mod:`axial_rope.configs`).
"""

from __future__ import annotations

__all__ = ["CONFIG_KEYS", "fill_lengths"]

# Keys transformers keeps in `rope_parameters` that are not fields of a method: the method's name, the
# base and the rotary fraction (arguments of `inv_freq`), and what its model configs exempt from
# validation (`ignore_keys_at_rope_validation`) without touching the frequencies: M-RoPE's axis split and
# layout (Qwen-VL, GLM-4V), Ministral 3's query temperature and its copy of `max_position_embeddings`.
CONFIG_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "partial_rotary_factor",
    "mrope_section", "mrope_interleaved", "interleaved", "llama_4_scaling_beta", "max_position_embeddings",
})  # fmt: skip


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
