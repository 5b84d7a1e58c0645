"""Hugging Face configs -> axial_rope: a transformers ``rope_parameters`` dict to a scaling method.

The rules follow ``transformers.modeling_rope_utils`` (checked in ``tests/test_scaling.py`` and
``tests/test_scaling_faults.py``); the methods themselves live in :mod:`axial_rope.scaling`. A whole
model config (head dim, M-RoPE sections, partial rotary, per-layer types, diffusers transformers) to
its rope is :func:`rope_from_config` (:mod:`axial_rope.configs`).
"""

from __future__ import annotations

from dataclasses import fields

from . import scaling

__all__ = ["CONFIG_KEYS", "from_rope_parameters", "rope_from_config"]

# Keys transformers keeps in `rope_parameters` that are not fields of a method: the method's name, the
# base and the rotary fraction (arguments of `inv_freq`), and what its model configs exempt from
# validation (`ignore_keys_at_rope_validation`) without touching the frequencies: M-RoPE's axis split and
# layout (Qwen-VL, GLM-4V), Ministral 3's query temperature and its copy of `max_position_embeddings`.
CONFIG_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "partial_rotary_factor",
    "mrope_section", "mrope_interleaved", "interleaved", "llama_4_scaling_beta", "max_position_embeddings",
})  # fmt: skip


def _fill_lengths(kind: str, names: set[str], values: dict, max_position_embeddings: int | None) -> None:
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


def from_rope_parameters(params: dict | None, *, max_position_embeddings: int | None = None) -> scaling.Scaling | None:
    """Build a scaling method from a transformers ``rope_parameters`` (or ``rope_scaling``) dict.

    ``None``, ``{}`` and ``rope_type="default"`` give ``None`` (plain RoPE). ``rope_type`` (or ``type``)
    picks the method from :data:`axial_rope.scaling.REGISTRY`; other keys must be its fields or :data:`CONFIG_KEYS`
    (ignored). ``null`` means the field's default, except ``truncate: null``: no truncation, as in
    transformers. ``max_position_embeddings`` (the config attribute) fills ``dynamic``'s length and a
    missing ``original_max_position_embeddings``, and gives ``yarn`` / ``longrope`` without ``factor``
    ``max_position_embeddings / original_max_position_embeddings``, as transformers does (Phi-3 keeps
    ``original_max_position_embeddings`` on the config: pass ``config.rope_parameters``, which has it).
    """
    if params is None:
        return None  # a config without rope_scaling: default RoPE
    if not isinstance(params, dict):
        raise TypeError(f"rope_parameters must be a dict or None, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        unknown = sorted(set(params) - CONFIG_KEYS)
        if unknown:  # a misspelt 'rope_type' lands here too; a per-layer-type dict needs one entry at a time
            raise ValueError(f"rope_type 'default': unknown key(s) {unknown}; valid keys are {sorted(CONFIG_KEYS)}")
        return None
    if kind not in scaling.REGISTRY:
        raise ValueError(f"rope_type {kind!r} is not supported; expected one of {['default', *scaling.REGISTRY]}")
    cls = scaling.REGISTRY[kind]
    names = {f.name for f in fields(cls)}
    if max_position_embeddings is None:
        max_position_embeddings = params.get("max_position_embeddings")  # Ministral 3 keeps a copy here
    values = {k: v for k, v in params.items() if k in names or k not in CONFIG_KEYS}
    if "truncate" in values and values["truncate"] is None:
        values["truncate"] = False  # transformers tests `if truncate:`, so null does not truncate
    values = {k: v for k, v in values.items() if v is not None}
    _fill_lengths(kind, names, values, max_position_embeddings)
    return scaling._build(cls, values, also_valid=CONFIG_KEYS)


def rope_from_config(config, **kwargs):
    """The :class:`~axial_rope.AxialRoPE` of a transformers or diffusers config: :func:`axial_rope.configs.rope_from_config`.

    (Imported when called: this module loads with :mod:`axial_rope.scaling`, before the rope exists.)
    """
    from .configs import rope_from_config as load  # noqa: PLC0415

    return load(config, **kwargs)
