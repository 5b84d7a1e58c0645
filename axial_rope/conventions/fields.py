"""Reading fields of a model config (an object with attributes, or its ``config.json`` dict) with errors that
name the field, its value and what was expected: the readers :func:`axial_rope.rope_from_config`, the diffusers
family records, the transformers adapter and the doctor share."""

from __future__ import annotations

__all__ = ["MISSING", "ROPE_FIELDS", "axes_sum", "field", "kind", "rope_config", "size", "text_config"]

MISSING = object()
ROPE_FIELDS = ("rope_parameters", "rope_scaling", "rope_theta")  # where a config keeps its rope


def field(config, name: str, default=MISSING):
    """A field of a config object or dict (``default`` when absent, else ``ValueError`` naming it)."""
    value = config.get(name, MISSING) if isinstance(config, dict) else getattr(config, name, MISSING)
    if value is MISSING or (value is None and default is not MISSING):
        if default is MISSING:
            raise ValueError(f"{kind(config)} config has no field {name!r}, which its RoPE needs")
        return default
    return value


def text_config(config):
    """The language model's config of a multimodal one (transformers' ``get_text_config()``; a ``config.json`` dict:
    its ``text_config``), else the config itself: the config whose model type and modeling module serve the text."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        return get()
    text = field(config, "text_config", None)
    return config if text is None else text


def rope_config(config):
    """The config whose rope fields (:data:`ROPE_FIELDS`) :func:`axial_rope.rope_from_config` reads: the config itself
    when it holds them (a composite whose top level keeps M-RoPE's parameters), else its ``text_config``, else itself."""
    text = field(config, "text_config", None)
    has_rope = any(field(config, name, None) is not None for name in ROPE_FIELDS)
    return text if text is not None and not has_rope else config


def kind(config) -> str:
    return field(config, "_class_name", None) or field(config, "model_type", None) or type(config).__name__


def size(config, name: str, default=MISSING) -> int:
    """An int field >= 1 (a head dim, a head count): ``ValueError`` naming the field, its value and the expectation."""
    value = field(config, name, default)
    if value is None and default is None:
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{kind(config)} config: {name} must be an int >= 1, got {value!r}")
    return value


def axes_sum(config, name: str, head_field: str, heads_field: str | None = None) -> tuple[int, ...]:
    """``config[name]`` as a tuple whose sum must be the head dim (``ValueError`` naming both fields otherwise)."""
    axes = field(config, name)
    if not isinstance(axes, (list, tuple)) or any(not isinstance(d, int) or isinstance(d, bool) for d in axes):
        raise ValueError(f"{kind(config)} config: {name} must be a list of ints (channels per axis), got {axes!r}")
    axes = tuple(axes)
    head = size(config, head_field)
    if heads_field is not None:
        heads = size(config, heads_field)
        if head % heads:
            raise ValueError(f"{head_field} {head} is not divisible by {heads_field} {heads}")
        head = head // heads
    if sum(axes) != head:
        raise ValueError(f"{name} {list(axes)} sums to {sum(axes)} channels, but the head has {head} ({head_field})")
    return axes
