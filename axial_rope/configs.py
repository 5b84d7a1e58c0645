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
from .conventions import DIFFUSERS
from .conventions.fields import field, rope_config, size
from .conventions.model_types import REFUSED, ModelConvention, model_convention
from .conventions.per_layer import LayerRoPE
from .frequencies import Frequencies
from .rope import AxialRoPE

__all__ = ["rope_from_config", "layers_from_config", "DIFFUSERS_CLASSES"]

# diffusers transformer class -> the rope of its config: every family's record (one place per family)
DIFFUSERS_CLASSES: dict[str, Callable] = {name: family.rope for name, family in DIFFUSERS.items()}


def _head_dim(config, layer_type: str | None) -> int:
    head_dim = size(config, "head_dim", None)
    if layer_type == "full_attention" and field(config, "global_head_dim", None) is not None:
        head_dim = size(config, "global_head_dim")  # Gemma 4's global layers
    if head_dim is None:
        hidden, heads = size(config, "hidden_size"), size(config, "num_attention_heads")
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
    name = "rope_parameters" if field(config, "rope_parameters", None) is not None else "rope_scaling"
    params = _dict_field(name, field(config, name, None))
    per_type = {k: v for k, v in params.items() if k in conv.per_layer.LAYER_TYPES}
    if per_type:
        if layer_type is None:
            raise ValueError(f"rope_parameters holds one entry per layer type {sorted(per_type)}: pass layer_type")
        if layer_type not in per_type:
            raise ValueError(f"layer_type {layer_type!r} is not in rope_parameters (has {sorted(per_type)})")
        top, params = params, _dict_field(f"{name}[{layer_type!r}]", per_type[layer_type])
        if params.get("rope_type", params.get("type")) == "yarn":  # transformers' YaRN reads the top level's
            params["truncate"] = top.get("truncate", True)  # `truncate`, not the entry's (_compute_yarn_parameters)
    elif layer_type is not None and layer_type not in conv.per_layer.LAYER_TYPES:
        raise ValueError(f"layer_type must be one of {conv.per_layer.LAYER_TYPES}, got {layer_type!r}")
    for key, legacy in (("rope_theta", "rope_theta"), ("partial_rotary_factor", "partial_rotary_factor"),
                        ("partial_rotary_factor", "rotary_pct")):  # fmt: skip
        if key not in params and field(config, legacy, None) is not None:
            params[key] = field(config, legacy)
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
    class_name = class_name or field(config, "_class_name", None)
    if class_name is not None:
        if class_name not in DIFFUSERS_CLASSES:
            raise ValueError(
                f"_class_name {class_name!r} has no RoPE convention here; supported: {sorted(DIFFUSERS_CLASSES)}"
            )
        if class_name == "LTX2VideoTransformer3DModel" and modality == "audio":
            return conv.ltx2_from_config(config, "audio")
        return DIFFUSERS_CLASSES[class_name](config)
    text = rope_config(config)
    model_type = field(text, "model_type", None) or field(config, "model_type", None)
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
        max_position_embeddings=field(text, "max_position_embeddings", None),
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


def layers_from_config(config) -> list[LayerRoPE]:
    """Every layer's :class:`~axial_rope.conventions.LayerRoPE` of a per-layer transformers config.

    Llama 4 (``no_rope_layers``, ``attention_chunk_size``, temperature tuning) and configs with
    ``layer_types`` (Gemma 2/3/4: one rope per layer type, sliding windows); other configs give the
    one rope on every layer (``num_hidden_layers``).
    """
    text = rope_config(config)
    model_type = field(text, "model_type", None) or ""
    if model_type.startswith("llama4"):
        return conv.llama4(
            field(text, "num_hidden_layers"),
            _head_dim(text, None),
            _rope_parameters(text, None),
            no_rope_layers=field(text, "no_rope_layers", None),
            no_rope_layer_interval=field(text, "no_rope_layer_interval", 4),
            attention_chunk_size=field(text, "attention_chunk_size", None),
            attn_temperature_tuning=field(text, "attn_temperature_tuning", True),
            floor_scale=field(text, "floor_scale", 8192),
            attn_scale=field(text, "attn_scale", 0.1),
            max_position_embeddings=field(text, "max_position_embeddings", None),
        )
    layer_types = field(text, "layer_types", None)
    if layer_types is None:
        rope = rope_from_config(config)
        return [LayerRoPE(rope) for _ in range(field(text, "num_hidden_layers"))]
    window = field(text, "sliding_window", None)
    ropes = {kind: rope_from_config(config, layer_type=kind) for kind in sorted(set(layer_types))}
    return [LayerRoPE(ropes[k], k, window if k == "sliding_attention" else None) for k in layer_types]
