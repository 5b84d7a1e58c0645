"""The sweep over transformers' model types: each one's own rotary module and ``apply_rotary_pos_emb`` on a tiny
config, against ``ar.rope_from_config`` of the same config.

For a model type, :func:`sweep` builds a tiny config (2 heads of 32 channels, one layer; a composite config
gets it as its ``text_config``; an ``mrope_section`` is scaled to the small head), finds the rotary class the
text model builds (``self.rotary_emb = XRotaryEmbedding(...)`` in its ``__init__``) and the rotation its
attention calls (``apply_rotary_pos_emb``, or the ``rope_interleave`` branch), and rotates random q and k at
per-sample positions (three distinct coordinates for M-RoPE). A rotary module that needs more than the
config and ``(x, position_ids[, layer_type])`` is not swept: :class:`NotSwept` says why.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import re
import warnings
from dataclasses import dataclass

import torch

import axial_rope as ar

TINY = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 16, "num_hidden_layers": 1, "vocab_size": 64, "max_position_embeddings": 256}  # fmt: skip
VARIANTS = ({}, {"head_dim": None}, {"num_key_value_heads": None})  # some configs derive or forbid these
S = 7  # tokens per sample
SAMPLES = torch.stack([torch.arange(S), torch.arange(11, 11 + S)])  # position_ids [B=2, S]: two offsets


class NotSwept(Exception):
    """The model type's rotary cannot be run from its config alone (the message says what it needs)."""


@dataclass
class Outcome:
    """What the sweep found for one model type (``diff``: the worst |q, k| difference per convention tried)."""

    model_type: str
    diff: dict[str, float]  # "from_config" (rope_from_config) and, when asked, each pairing x sign
    error: str | None = None  # rope_from_config's ValueError, when it refused


@functools.cache
def _transformers():
    import transformers
    from transformers.models.auto import configuration_auto

    transformers.logging.set_verbosity(transformers.logging.CRITICAL)  # e.g. Falcon's head_dim has no setter
    return configuration_auto


def rotary_model_types() -> dict[str, str]:
    """Every model type of the installed transformers whose modeling module defines a rotary -> its module name."""
    auto = _transformers()
    found = {}
    for model_type in auto.CONFIG_MAPPING_NAMES:
        module = auto.model_type_to_module_name(model_type)
        spec = importlib.util.find_spec(f"transformers.models.{module}.modeling_{module}")
        if spec is None or spec.origin is None:
            continue
        with open(spec.origin) as f:
            source = f.read()
        if re.search(r"class \w*Rotary\w*\(|def apply_\w*rotary\w*\(|def rotate_half\(", source):
            found[model_type] = module
    return found


def _scaled_mrope(config_cls) -> dict:
    """``rope_parameters`` with the text config's ``mrope_section`` (or, absent, the default its rotary code
    falls back to: ``rope_parameters.get("mrope_section", [16, 24, 24])``) scaled to a 32-channel head."""
    try:
        default = config_cls()
    except Exception:  # noqa: BLE001 - a config without defaults: nothing to scale
        return {}
    text = default.get_text_config() if hasattr(default, "get_text_config") else default
    params = getattr(text, "rope_parameters", None)
    if not isinstance(params, dict) or any(k in params for k in ("full_attention", "sliding_attention")):
        return {}
    section = params.get("mrope_section")
    if section is None:
        spec = importlib.util.find_spec(type(text).__module__.replace(".configuration_", ".modeling_"))
        with open(spec.origin) as f:
            fallback = re.findall(r'get\("mrope_section", \[([\d, ]+)\]\)', f.read())
        if not fallback:
            return {}
        section = [int(n) for n in fallback[0].split(",")]
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    total = round(sum(section) * TINY["head_dim"] / head)
    scaled = [max(1, round(n * TINY["head_dim"] / head)) for n in section]
    scaled[0] += total - sum(scaled)
    return {"rope_parameters": dict(params, mrope_section=scaled)}


def tiny_config(model_type: str):
    """The model type's config class with :data:`TINY` sizes (as its ``text_config`` when it has one)."""
    cls = _transformers().CONFIG_MAPPING[model_type]
    composite = "text_config" in (getattr(cls, "sub_configs", None) or {})
    text_cls = cls.sub_configs["text_config"] if composite else cls
    mrope = _scaled_mrope(text_cls)
    errors = []
    for variant in VARIANTS:
        fields = {k: v for k, v in (TINY | variant).items() if v is not None} | mrope
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cls(text_config=fields) if composite else cls(**fields)
        except Exception as error:  # noqa: BLE001 - the next variant, or NotSwept with every reason
            errors.append(f"{type(error).__name__}: {str(error)[:120]}")
    raise NotSwept(f"no tiny config: {errors[0]}")


def rope_source(config):
    """The config whose rope ``rope_from_config`` reads (``text_config`` unless the config has its own rope)."""
    own = any(getattr(config, k, None) is not None for k in ("rope_parameters", "rope_scaling", "rope_theta"))
    text = getattr(config, "text_config", None)
    return text if text is not None and not own else config


def _modeling(config):
    """The modeling module of ``config``'s own model type (a composite's text config may be another model's)."""
    module = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise NotSwept(f"modeling module: {error}") from None


def rotary_class(module, config):
    """The rotary class that the model of ``config`` builds in its ``__init__`` (``self.rotary_emb = X(...)``)."""
    built = []
    for obj in vars(module).values():
        if isinstance(obj, type) and getattr(obj, "config_class", None) is type(config):
            source = inspect.getsource(obj.__init__) if "__init__" in vars(obj) else ""
            built += re.findall(r"self\.\w*rotary\w*\s*=\s*(\w+RotaryEmbedding)\(", source)
    if not built:  # the model that builds it has another config class: the module's one text rotary
        built = [n for n, obj in vars(module).items() if isinstance(obj, type) and n.endswith("RotaryEmbedding")
                 and not any(w in n for w in ("Vision", "Audio", "DiT", "Talker"))]  # fmt: skip
        if len(built) != 1:
            raise NotSwept(f"no {type(config).__name__} model builds a *RotaryEmbedding, and the module has {built}")
    return getattr(module, built[0])


def rotation_function(module, config):
    """The function the attention rotates q and k with; ``rope_interleave`` picks DeepSeek's branch."""
    calls = set()
    for obj in vars(module).values():
        if isinstance(obj, type) and obj.__name__.endswith("Attention") and "forward" in vars(obj):
            if "Vision" not in obj.__name__ and "Audio" not in obj.__name__:
                calls |= set(re.findall(r"\b(apply_\w*rot\w*)\(", inspect.getsource(obj.forward)))
    calls = {c for c in calls if "vision" not in c and "2d" not in c}
    if "apply_rotary_pos_emb_interleave" in calls and getattr(config, "rope_interleave", None) is not None:
        calls = {"apply_rotary_pos_emb_interleave" if config.rope_interleave else "apply_rotary_pos_emb"}
    if len(calls) != 1:
        raise NotSwept(f"the attention calls {sorted(calls) or 'no apply_*rotary* function'}")
    return getattr(module, calls.pop())


def _positions(mrope: bool) -> torch.Tensor:
    """position_ids ``[B, S]``, or ``[3, B, S]`` with distinct t, h, w for M-RoPE."""
    if not mrope:
        return SAMPLES
    return torch.stack([SAMPLES, SAMPLES * 3 % 13 + 2, 40 - SAMPLES])


def _rotate(apply, q, k, tables, kwargs):
    """``apply`` on q, k ``[B, H, S, D]``: with ``(cos, sin)`` tables, or a complex ``freqs_cis`` in bhsd or bshd."""
    if isinstance(tables, torch.Tensor):  # complex [B, S, D / 2] (Llama 4, DeepSeek-V2)
        try:
            return apply(q, k, tables)
        except RuntimeError:
            out_q, out_k = apply(q.transpose(1, 2), k.transpose(1, 2), tables)
            return out_q.transpose(1, 2), out_k.transpose(1, 2)
    cos, sin = tables
    try:
        return apply(q, k, cos, sin, **kwargs)
    except TypeError as error:  # another signature: (tensor, sin, cos) per tensor, ...
        raise NotSwept(f"{apply.__name__}{inspect.signature(apply)} is not (q, k, cos, sin): {error}") from None
    except RuntimeError:  # partial rotary rotated by the attention: the first cos.shape[-1] channels
        r = cos.shape[-1]
        out_q, out_k = apply(q[..., :r], k[..., :r], cos, sin, **kwargs)
        return torch.cat([out_q, q[..., r:]], -1), torch.cat([out_k, k[..., r:]], -1)


def upstream(config, layer_type: str | None, q: torch.Tensor, k: torch.Tensor):
    """q and k ``[B, H, S, D]`` rotated by the model's own code, and the positions ``[B, S, n_axes]`` it used."""
    source = rope_source(config)
    module = _modeling(source)
    rotary = rotary_class(module, source)
    apply = rotation_function(module, source)
    params = getattr(source, "rope_parameters", None) or {}
    params = (params.get(layer_type) or {}) if layer_type else params
    mrope = "mrope_section" in params
    ids = _positions(mrope)
    try:
        embed = rotary(source)
        extra = [layer_type] if "layer_type" in inspect.signature(embed.forward).parameters else []
        tables = embed(torch.zeros(1), ids, *extra)
    except Exception as error:  # noqa: BLE001
        raise NotSwept(f"{rotary.__name__}(config)(x, position_ids): {type(error).__name__}: {error}") from None
    complex_table = isinstance(tables, torch.Tensor) and tables.is_complex()
    if not (complex_table or (isinstance(tables, tuple) and len(tables) == 2 and tables[0].shape[-2] == S)):
        raise NotSwept(f"{rotary.__name__} returns neither (cos, sin) tables [B, S, D] nor complex freqs_cis")
    kwargs = (
        {"mrope_section": params["mrope_section"]} if "mrope_section" in inspect.signature(apply).parameters else {}
    )
    out_q, out_k = _rotate(apply, q, k, tables, kwargs)
    pos = ids.permute(1, 2, 0) if mrope else ids[..., None]
    return out_q, out_k, pos.double()


def layer_types(config) -> list[str | None]:
    """The layer types with their own rope (``rope_parameters`` per type), else ``[None]``."""
    source = rope_source(config)
    params = getattr(source, "rope_parameters", None) or {}
    used = getattr(source, "layer_types", None) or ()
    kinds = [k for k in ("full_attention", "sliding_attention", "chunked_attention") if k in params and k in used]
    return kinds or [None]


def candidates(rope: ar.AxialRoPE) -> dict[str, ar.AxialRoPE]:
    """``rope``'s spectrum with each pairing, sign and (M-RoPE) layout: the conventions a sweep tries.

    Names: ``half+``, ``interleaved-`` (rotation by minus the angle), ``half+cycled`` (M-RoPE layouts).
    """
    spectra = ("split", "cycled") if rope.spectrum in ("split", "cycled") else (rope.spectrum,)
    found = {}
    for spectrum in spectra:
        if spectrum == rope.spectrum:
            model = rope.frequency_model  # its own sign: the candidates are relative to |F|
        else:
            model = ar.Frequencies.from_spectrum(rope.axes_dim, rope.theta[0], rope.scaling[0], spectrum)
        suffix = spectrum if len(spectra) > 1 else ""
        for pairing in ("half", "interleaved"):
            for sign in (1.0, -1.0):
                freqs = ar.Frequencies(model.freqs.abs() * sign, model.scale, model.transform)
                name = f"{pairing}{'-' if sign < 0 else '+'}{suffix}"
                found[name] = ar.AxialRoPE.from_frequencies(freqs, pairing=pairing)
    return found


def sweep(model_type: str, *, pairing: str | None = None, try_all: bool = False) -> Outcome:
    """Run one model type (``NotSwept`` when its rotary cannot be run from the config alone)."""
    config = tiny_config(model_type)
    worst: dict[str, float] = {}
    for layer_type in layer_types(config):
        try:
            rope = ar.rope_from_config(config, layer_type=layer_type, pairing=pairing)
        except ValueError as error:
            if not try_all or pairing is not None:
                return Outcome(model_type, worst, str(error))
            return sweep(model_type, pairing="half", try_all=True)  # not pinned: try the conventions anyway
        head = ar.configs._head_dim(rope_source(config), layer_type)
        gen = torch.Generator().manual_seed(0)
        q, k = torch.randn(2, 2, S, head, generator=gen), torch.randn(2, 2, S, head, generator=gen)
        want_q, want_k, pos = upstream(config, layer_type, q, k)
        tried = {"from_config": rope}
        if try_all:  # every pairing, sign and layout of the spectrum
            tried |= candidates(rope)
        for name, candidate in tried.items():
            got_q, got_k = candidate(q, k, pos.to(torch.float32), layout="bhsd")
            diff = max(float((got_q - want_q).abs().max()), float((got_k - want_k).abs().max()))
            worst[name] = max(worst.get(name, 0.0), diff)
    return Outcome(model_type, worst)
