"""Model configs -> the identical :class:`~axial_rope.AxialRoPE`, in one call.

:func:`rope_from_config` reads a Hugging Face transformers config (a ``PretrainedConfig`` or its
``config.json`` dict: ``head_dim`` or ``hidden_size / num_attention_heads``, ``rope_parameters`` or
``rope_theta`` + ``rope_scaling``, ``partial_rotary_factor``, ``mrope_section``) or a diffusers
transformer config (``model.config`` or its dict, told apart by ``_class_name``) and builds the rope
through the matching :mod:`axial_rope.conventions` constructor. Fields it does not know, and fields
that contradict each other, raise ``ValueError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable

from . import conventions as conv
from .conventions._fields import field, kind, size
from .conventions._registry import DIFFUSERS
from .conventions.model_types import REFUSED, ModelConvention, model_convention
from .conventions.per_layer import LayerRoPE
from .frequencies import Frequencies
from .rope import AxialRoPE

__all__ = ["rope_from_config", "layers_from_config", "DIFFUSERS_CLASSES"]

# config fields with errors that name them (shared with the diffusers family records)
_get, _kind, _size = field, kind, size


# diffusers transformer class -> the rope of its config: every family's record (one place per family)
DIFFUSERS_CLASSES: dict[str, Callable] = {name: family.rope for name, family in DIFFUSERS.items()}


def _text_config(config):
    """The language model's config of a multimodal one (``text_config``), else the config itself."""
    text = _get(config, "text_config", None)
    has_rope = any(_get(config, k, None) is not None for k in ("rope_parameters", "rope_scaling", "rope_theta"))
    return text if text is not None and not has_rope else config


def _head_dim(config, layer_type: str | None) -> int:
    head_dim = _size(config, "head_dim", None)
    if layer_type == "full_attention" and _get(config, "global_head_dim", None) is not None:
        head_dim = _size(config, "global_head_dim")  # Gemma 4's global layers
    if head_dim is None:
        hidden, heads = _size(config, "hidden_size"), _size(config, "num_attention_heads")
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}; give head_dim")
        head_dim = hidden // heads
    return head_dim


def _dict_field(name: str, value) -> dict:
    """A copy of a ``rope_parameters``-like field (``None`` is ``{}``); ``ValueError`` naming it unless a dict."""
    if value is None:
        return {}
    if not isinstance(value, dict):  # a dict subclass too (diffusers' FrozenDict)
        raise ValueError(f"{name} must be a dict of RoPE settings (rope_type, rope_theta, ...), got {value!r}")
    return dict(value)


def _rope_parameters(config, layer_type: str | None) -> dict:
    """``rope_parameters`` (or ``rope_scaling`` + ``rope_theta`` + ``partial_rotary_factor``), for one layer type."""
    name = "rope_parameters" if _get(config, "rope_parameters", None) is not None else "rope_scaling"
    params = _dict_field(name, _get(config, name, None))
    per_type = {k: v for k, v in params.items() if k in conv.per_layer.LAYER_TYPES}
    if per_type:
        if layer_type is None:
            raise ValueError(f"rope_parameters holds one entry per layer type {sorted(per_type)}: pass layer_type")
        if layer_type not in per_type:
            raise ValueError(f"layer_type {layer_type!r} is not in rope_parameters (has {sorted(per_type)})")
        params = _dict_field(f"{name}[{layer_type!r}]", per_type[layer_type])
    elif layer_type is not None and layer_type not in conv.per_layer.LAYER_TYPES:
        raise ValueError(f"layer_type must be one of {conv.per_layer.LAYER_TYPES}, got {layer_type!r}")
    for key, legacy in (("rope_theta", "rope_theta"), ("partial_rotary_factor", "partial_rotary_factor"),
                        ("partial_rotary_factor", "rotary_pct")):  # fmt: skip
        if key not in params and _get(config, legacy, None) is not None:
            params[key] = _get(config, legacy)
    return params


def rope_from_config(
    config,
    *,
    layer_type: str | None = None,
    modality: str = "video",
    class_name: str | None = None,
    pairing: str | None = None,
) -> AxialRoPE:
    """The :class:`~axial_rope.AxialRoPE` of a transformers or diffusers model config.

    Args:
        config: a transformers ``PretrainedConfig`` (or ``config.json`` dict); a diffusers transformer's
            ``config.json`` dict (its ``_class_name`` one of :data:`DIFFUSERS_CLASSES`), the model itself, or
            its ``model.config`` with ``class_name``.
        class_name: the diffusers class when ``config`` does not say it (``model.config`` has no ``_class_name``).
        layer_type: for configs with per-layer-type RoPE (Gemma 3/4: ``"sliding_attention"``,
            ``"full_attention"``); see :func:`layers_from_config` for every layer at once.
        modality: LTX-2's ``"video"`` or ``"audio"`` rope (audio reads the ``audio_*`` fields).

    transformers: head dim from ``head_dim`` (or ``hidden_size / num_attention_heads``), the spectrum and
    scaling from ``rope_parameters``; the pairing, sign and M-RoPE layout from the ``model_type``'s entry in
    :data:`~axial_rope.conventions.MODEL_TYPES`, which a test checked against the model's own code (a
    ``model_type`` not there raises ``ValueError`` naming it). A multimodal config's ``text_config`` is read.
    ``pairing`` (``"half"`` or ``"interleaved"``): the pairing of a model type that is not pinned, which you
    checked in its ``apply_rotary_pos_emb`` (for a pinned one it must agree). Mochi's frequencies are weights,
    not config: its rope starts from zeros (pass ``pos_frequencies`` to :func:`~axial_rope.conventions.mochi`).
    """
    if isinstance(config, (str, bytes, int, float, list, tuple)) or config is None:
        raise TypeError(f"config must be a transformers or diffusers config (an object or a dict), got {config!r}")
    if type(config).__name__ in DIFFUSERS_CLASSES and hasattr(config, "config"):  # a diffusers model
        class_name, config = type(config).__name__, config.config
    class_name = class_name or _get(config, "_class_name", None)
    if class_name is not None:
        if class_name not in DIFFUSERS_CLASSES:
            raise ValueError(
                f"_class_name {class_name!r} has no RoPE convention here; supported: {sorted(DIFFUSERS_CLASSES)}"
            )
        if class_name == "LTX2VideoTransformer3DModel" and modality == "audio":
            return _ltx2(config, "audio")
        return DIFFUSERS_CLASSES[class_name](config)
    text = _text_config(config)
    model_type = _get(text, "model_type", None) or _get(config, "model_type", None)
    turn = _convention(model_type, pairing)
    params = _rope_parameters(text, layer_type)
    if turn.mrope is not None:  # the code lays the sections out; no modeling file reads `mrope_interleaved`
        params.pop("mrope_interleaved", None)
    elif params.get("mrope_section") is not None and model_type in conv.MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} has no M-RoPE (its rotary, checked, ignores it), but rope_parameters has "
            f"mrope_section {params['mrope_section']!r}"
        )
    rope = conv.rope_for_parameters(
        params,
        _head_dim(text, layer_type),
        max_position_embeddings=_get(text, "max_position_embeddings", None),
        interleaved=turn.pairing == "interleaved",
        mrope_interleaved=turn.mrope == "cycled",
    )
    return _negated(rope, model_type) if turn.sign < 0 else rope


def _convention(model_type: str | None, pairing: str | None) -> ModelConvention:
    """The pinned rotation of ``model_type``, or (not pinned) the ``pairing`` the caller checked."""
    if pairing is not None and pairing not in ("half", "interleaved"):
        raise ValueError(f"pairing must be None, 'half' or 'interleaved', got {pairing!r}")
    if pairing is None or model_type in conv.MODEL_TYPES or model_type in REFUSED:
        pinned = model_convention(model_type)
        if pairing is not None and pairing != pinned.pairing:
            raise ValueError(
                f"pairing={pairing!r} contradicts model_type {model_type!r}, whose code pairs {pinned.pairing!r} (checked)"
            )
        return pinned
    return ModelConvention(pairing)


def _negated(rope: AxialRoPE, model_type: str | None) -> AxialRoPE:
    """``rope`` turning by minus its angles (negated ``F``): NanoChat's ``rotate_half`` is ``cat(x2, -x1)``."""
    if rope.length_dependent:
        raise ValueError(
            f"model_type {model_type!r} rotates by minus the angle: a length-dependent scaling is not built"
        )
    model = rope.frequency_model
    return AxialRoPE.from_frequencies(Frequencies(-model.freqs, model.scale, model.transform), pairing=rope.pairing)


def _ltx2(config, modality: str) -> AxialRoPE:
    """LTX-2's video rope, or its audio rope from the ``audio_*`` fields (audio has no spatial bases)."""
    prefix = "audio_" if modality == "audio" else ""
    bases = {} if prefix else dict(base_height=_get(config, "base_height"), base_width=_get(config, "base_width"))
    return conv.ltx2(
        _size(config, prefix + "num_attention_heads"),
        _size(config, prefix + "attention_head_dim"),
        pos_embed_max_pos=_get(config, prefix + "pos_embed_max_pos"),
        rope_theta=_get(config, "rope_theta"),
        rope_double_precision=_get(config, "rope_double_precision"),
        rope_type=_get(config, "rope_type"),
        modality=modality,
        **bases,
    )


def layers_from_config(config) -> list[LayerRoPE]:
    """Every layer's :class:`~axial_rope.conventions.LayerRoPE` of a per-layer transformers config.

    Llama 4 (``no_rope_layers``, ``attention_chunk_size``, temperature tuning) and configs with
    ``layer_types`` (Gemma 2/3/4: one rope per layer type, sliding windows); other configs give the
    one rope on every layer (``num_hidden_layers``).
    """
    text = _text_config(config)
    model_type = _get(text, "model_type", None) or ""
    if model_type.startswith("llama4"):
        return conv.llama4(
            _get(text, "num_hidden_layers"),
            _head_dim(text, None),
            _rope_parameters(text, None),
            no_rope_layers=_get(text, "no_rope_layers", None),
            no_rope_layer_interval=_get(text, "no_rope_layer_interval", 4),
            attention_chunk_size=_get(text, "attention_chunk_size", None),
            attn_temperature_tuning=_get(text, "attn_temperature_tuning", True),
            floor_scale=_get(text, "floor_scale", 8192),
            attn_scale=_get(text, "attn_scale", 0.1),
            max_position_embeddings=_get(text, "max_position_embeddings", None),
        )
    layer_types = _get(text, "layer_types", None)
    if layer_types is None:
        rope = rope_from_config(config)
        return [LayerRoPE(rope) for _ in range(_get(text, "num_hidden_layers"))]
    window = _get(text, "sliding_window", None)
    ropes = {kind: rope_from_config(config, layer_type=kind) for kind in sorted(set(layer_types))}
    return [LayerRoPE(ropes[k], k, window if k == "sliding_attention" else None) for k in layer_types]
