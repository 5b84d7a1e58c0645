"""Rotate the q and k of a transformers model through axial_rope: ``apply_axial_rope(model)``; ``handle.remove()``.

What it changes, and where (transformers 5.24):

- **the rotation** (every served model): transformers marks ``apply_rotary_pos_emb`` as a hub-kernel
  function layer (``use_kernel_forward_from_hub("rotary_pos_emb")``), but that layer acts only with a
  ``kernels`` version transformers accepts (``>= 0.18.2``); without it the decorator returns the
  function unchanged, and no other extension point reaches the rotation. So this uses the convention
  of Liger-Kernel and Unsloth: the modeling module's function is rebound
  (``modeling_llama.apply_rotary_pos_emb = ...``) to one that rotates by the same tables through
  :func:`axial_rope.apply_rope` (:func:`~axial_rope.integrations.transformers_rotation.rotation_function`).
  **Scope**: per modeling module and process-wide while installed: every model of that module in the
  process rotates through axial_rope until :meth:`AxialRoPEHandle.remove`. When ``kernels``' hub layer
  does act, the module's function is its wrapper, not transformers' own, and this refuses.
- **fused QK-norm** (``fuse_qk_norm=True``; Qwen3, Qwen3-MoE, Qwen3-VL text, Gemma 3): the attention's
  ``forward`` is bound per instance (an instance attribute, deleted by ``remove``) to one that calls the
  per-head RMSNorm and the rotation at once: ``rope.norm_and_rotate`` (:func:`axial_rope.ops.norm_rotate`,
  one Triton kernel forward and backward) with the rope of :func:`~axial_rope.rope_from_config` at the
  ``position_ids`` the attention receives; where it receives no rotary positions (M-RoPE: Qwen3-VL) or
  the frequencies depend on the length (dynamic, LongRoPE), the norm in float32 then the table rotation,
  rounded once. The attention also carries that rope as a child ``axial_rope`` (non-persistent buffers:
  the state dict is unchanged). The rope rotates by positions only where it turns as the model's own rotary
  does (:func:`~axial_rope.integrations.transformers_rotation.disagreement`, checked when installed); a
  ``rope_parameters`` that ``rope_from_config`` reads otherwise or refuses leaves the fused attention on the
  model's tables (``handle.why_tables`` says why): whatever transformers runs, the adapter runs, with stock's
  result. OLMo 2 normalises over all heads at once, which is no per-head norm: not fused.
- **from_config=True**: the model's rotary module is replaced (``setattr`` on its parent) by a
  :class:`~axial_rope.integrations.transformers_rotation.ConfigRotary` that returns the same tables from
  float64 angles (stock multiplies positions by inverse frequencies in float32: at position 1e5 an angle
  is off by up to 2 u p = 1.2e-2 rad); a rebuilt rope that does not turn as the model's rotary is refused
  (unchecked on the meta device, where the rotary holds no values; the fused attention keeps the tables there).

**Copies**: the handle belongs to the model it was applied to. ``copy.deepcopy(model)`` and ``torch.save``
of the whole module give the stock model (no fused forward, no ``axial_rope`` child, the stock rotary
module), which unpickles without axial_rope; while a handle is installed, the copy, like every model of the
modeling module, still rotates through the rebound function, and after ``remove()`` it is stock throughout.

Served: a model whose text ``model_type`` is in :data:`axial_rope.conventions.MODEL_TYPES` (pairing and
sign checked against the code), whose modeling module's rotation function is one of the forms pinned
in :data:`~axial_rope.integrations.transformers_rotation.BODIES` and whose attention and rotary classes
are transformers' own; :func:`serves` says why a config (or a model) is not, with the checks of
:func:`apply_axial_rope` itself: the two agree.
:data:`FAMILIES` are the ones checked end to end (logits, generation, gradients, compile, removal).
Frequency rules are read from the config by ``rope_from_config``, checked against ``ROPE_INIT_FUNCTIONS``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from types import ModuleType

import torch
from torch import nn

from ..configs import rope_from_config
from ..conventions import model_types as conventions
from ..conventions.fields import text_config
from ..ops import BACKENDS
from . import transformers_rotation as rotary_code  # transformers' rotary code, recognised by digest

__all__ = ["apply_axial_rope", "AxialRoPEHandle", "FAMILIES", "serves"]

# family -> (model types, what is special); each checked end to end by tests/test_integrations_transformers.py
FAMILIES = {
    "Llama": (("llama",), "default, linear, dynamic, yarn and llama3 scaling"),
    "Mistral": (("mistral",), "sliding window"),
    "Qwen2": (("qwen2",), "q, k, v biases"),
    "Qwen3": (("qwen3", "qwen3_moe"), "QK-norm, fused"),
    "Gemma 3": (("gemma3_text", "gemma3"), "QK-norm with (1 + w), fused; sliding and global layers, own theta"),
    "OLMo 2": (("olmo2",), "QK-norm over all heads: not fused"),
    "Phi-3": (("phi3",), "LongRoPE, partial rotary"),
    "GPT-NeoX": (("gpt_neox",), "partial rotary"),
    "GLM": (("glm",), "interleaved pairs, partial rotary"),
    "Qwen2-VL": (("qwen2_vl",), "M-RoPE, split sections"),
    "Qwen2.5-VL": (("qwen2_5_vl",), "M-RoPE, split sections"),
    "Qwen3-VL": (("qwen3_vl",), "M-RoPE, cycled sections; QK-norm, fused by tables"),
    "Llama 4 text": (("llama4_text",), "complex freqs_cis, interleaved; chunked and NoPE layers"),
}


def _modeling_module(config) -> ModuleType:
    return importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))


def _plan_functions(config) -> tuple[str, conventions.ModelConvention, ModuleType, dict]:
    """The text model type, its convention, its modeling module and {function name: (stock function, kind)}.

    Raises ``ValueError`` (the reason) when not served, ``RuntimeError`` when the module was patched.
    """
    text = text_config(config)
    model_type = getattr(text, "model_type", None) or getattr(config, "model_type", None)
    convention = conventions.model_convention(model_type)  # ValueError naming it when not pinned
    try:
        module = _modeling_module(text)
    except ImportError as error:
        raise ValueError(f"its modeling module does not import: {error}") from None
    found, seen = {}, []
    for name in rotary_code.FUNCTION_NAMES:
        fn = vars(module).get(name)
        if fn is None:
            continue
        if hasattr(fn, "axial_rope_kind"):
            raise RuntimeError(
                f"{module.__name__}.{name} is already axial_rope's: another handle is installed on this modeling "
                "module (remove() it first; the rebinding is process-wide)"
            )
        plain = rotary_code.plain_function(fn)
        if plain is None or not str(getattr(plain, "__module__", "")).startswith("transformers."):
            raise RuntimeError(
                f"{module.__name__}.{name} is {fn.__module__}.{getattr(fn, '__qualname__', fn)}, not transformers' "
                "own: the model was patched by another library (Liger-Kernel, Unsloth, kernels' hub layer); "
                "apply_axial_rope does not stack on it: load the model without that patch"
            )
        seen.append(f"{name} (digest {rotary_code.digest(fn)})")
        if rotary_code.digest(fn) in rotary_code.BODIES:
            found[name] = (fn, rotary_code.BODIES[rotary_code.digest(fn)][0])
    if not found:
        what = ", ".join(seen) or f"none of {rotary_code.FUNCTION_NAMES}"
        raise ValueError(f"its rotation function is not one of the pinned forms (found {what})")
    _check_classes(module)
    return model_type, convention, module, found


def _transformers_own(fn) -> bool:
    plain = rotary_code.plain_function(fn)
    return plain is not None and str(getattr(plain, "__module__", "")).startswith(("transformers.", "torch."))


def _check_classes(module: ModuleType) -> None:
    """The module's attention and rotary classes' forwards must be transformers' own (Unsloth rebinds them)."""
    for cls in vars(module).values():
        if isinstance(cls, type) and cls.__module__ == module.__name__ and issubclass(cls, nn.Module) and \
                cls.__name__.endswith(("Attention", "RotaryEmbedding")) and not _transformers_own(cls.forward):
            raise RuntimeError(
                f"{cls.__name__}.forward is {cls.forward.__module__}.{cls.forward.__qualname__}, not transformers' "
                "own: the model was patched by another library; apply_axial_rope does not stack on it"
            )  # fmt: skip


def _layer_ropes(text, layer_types) -> dict:
    """The rope of each layer type with its own ``rope_parameters`` (``{None: rope}`` without)."""
    params = getattr(text, "rope_parameters", None) or {}
    own = [t for t in dict.fromkeys(layer_types) if t is not None and isinstance(params.get(t), dict)]
    return {t: rope_from_config(text, layer_type=t) for t in own} if own else {None: rope_from_config(text)}


def _length_dependent(rope) -> bool:
    return any(m is not None and m.length_dependent for m in rope.scaling)


def _text_rotaries(model: nn.Module, module: ModuleType, text) -> list[tuple[str, nn.Module]]:
    """The model's rotary modules of its text config, by qualified name (not a vision or audio rotary)."""
    return [(name, m) for name, m in model.named_modules()
            if type(m).__module__ == module.__name__ and type(m).__name__.endswith("RotaryEmbedding")
            and type(getattr(m, "config", None)) is type(text)]  # fmt: skip


def _rebuilt(text, convention, kind: str, stock: nn.Module | None = None) -> rotary_code.ConfigRotary:
    """The model's rotary rebuilt from ``text`` (``ValueError`` when ``rope_from_config`` refuses it)."""
    ropes = _layer_ropes(text, getattr(text, "layer_types", None) or ())
    return rotary_code.ConfigRotary(ropes, kind=kind, sign=convention.sign, mrope=convention.mrope is not None,
                                 stock=stock)  # fmt: skip


def _on_meta(module: nn.Module) -> bool:
    return next(iter(module.buffers()), torch.empty(0)).device.type == "meta"


def _disagreement(stock: nn.Module, rebuilt: rotary_code.ConfigRotary, text) -> str | None:
    """:func:`rotary_code.disagreement` at the layer types the model calls ``stock`` with."""
    if "layer_type" not in inspect.signature(stock.forward).parameters:
        return rotary_code.disagreement(stock, rebuilt, [None])
    own = [key for key in rebuilt.ropes if key != "None"]
    return rotary_code.disagreement(stock, rebuilt, own or sorted(set(getattr(text, "layer_types", None) or ())) or [None])


def _plan_rotaries(model, module, text, convention, kinds) -> list[tuple[str, rotary_code.ConfigRotary]]:
    """from_config=True: each text rotary's replacement (``ValueError`` naming why one cannot be rebuilt)."""
    (kind,) = kinds if len(kinds) == 1 else (None,)
    if kind is None:
        raise ValueError(f"from_config=True needs one rotation kind, the module has {sorted(kinds)}")
    found = _text_rotaries(model, module, text)
    if not found:
        raise ValueError(f"from_config=True: no rotary module of the text config in {type(model).__name__}")
    plan = []
    for name, stock in found:
        rebuilt = _rebuilt(text, convention, kind, stock)
        reason = None if _on_meta(stock) else _disagreement(stock, rebuilt, text)  # meta: no values to compare
        if reason is not None:
            raise ValueError(f"from_config=True: the rope rebuilt from the config does not turn as {name} does: "
                             f"{reason}; leave from_config False (stock's tables)")  # fmt: skip
        plan.append((name, rebuilt))
    return plan


def _fused_ropes(model, module, text, convention) -> tuple[dict, str | None]:
    """The rope of each layer type for a fused attention to rotate by positions, or ``({}, why not)``."""
    if convention.mrope is not None:
        return {}, "M-RoPE: the attention receives no rotary positions"
    try:
        rebuilt = _rebuilt(text, convention, "tables")
    except ValueError as error:  # transformers runs it; the model's own tables serve it as stock does
        return {}, f"rope_from_config refuses the config: {error}"
    stocks = _text_rotaries(model, module, text)
    reasons = [_disagreement(stock, rebuilt, text) for _, stock in stocks] or ["no rotary module to compare with"]
    reasons = [r for r in reasons if r is not None]
    if reasons:
        return {}, f"the rope rebuilt from the config does not turn as the model's rotary: {reasons[0]}"
    ropes = {None if key == "None" else key: rope for key, rope in rebuilt.ropes.items()}
    fixed = {key: rope for key, rope in ropes.items() if not _length_dependent(rope)}
    return fixed, None if fixed else "the frequencies depend on the length (dynamic, LongRoPE): read per forward"


def _fusable(attn: nn.Module, module: ModuleType, digests: dict) -> tuple | None:
    """(form, weight offset, eps) when ``attn`` runs a recognised QK-norm forward with recognised norms."""
    cls = type(attn)
    if cls.__module__ != module.__name__ or "forward" in vars(attn):  # e.g. accelerate's hooks: left alone
        return None
    if cls not in digests:
        digests[cls] = rotary_code.digest(cls.forward)
    form = rotary_code.FORMS.get(digests[cls])
    norms = [getattr(attn, name, None) for name in ("q_norm", "k_norm")]
    if form is None or not all(isinstance(n, nn.Module) and _transformers_own(type(n).forward) for n in norms):
        return None
    offsets = {rotary_code.NORMS.get(rotary_code.norm_digest(type(n))) for n in norms}
    eps = {getattr(n, "variance_epsilon", getattr(n, "eps", None)) for n in norms}
    if len(offsets) != 1 or None in offsets or len(eps) != 1 or None in eps:
        return None
    if any(tuple(n.weight.shape) != (attn.head_dim,) for n in norms):
        return None
    return form, offsets.pop(), float(eps.pop())


class AxialRoPEHandle:
    """What :func:`apply_axial_rope` installed; :meth:`remove` restores the stock model bit for bit.

    Attributes:
        model_type: the text model type served; module: its modeling module's name.
        functions: the rebound rotation functions, by name, with their kind.
        fused: the attention modules whose QK-norm and rotation are fused (``by_positions`` of them through
            ``ops.norm_rotate`` at the positions, the others by the model's tables; ``why_tables`` says why
            none rotates by positions, or ``None``).
        rotaries: the rotary modules replaced by ``ConfigRotary`` (``from_config=True``), by qualified name.
    """

    def __init__(self, model, model_type: str, module: ModuleType):
        self.model, self.model_type, self.module = model, model_type, module.__name__
        self._module, self._functions, self._fused, self._rotaries = module, {}, [], []
        self.functions: dict[str, str] = {}
        self.fused: list[str] = []
        self.by_positions = 0
        self.why_tables: str | None = None
        self.rotaries: list[str] = []

    def remove(self) -> None:
        """Rebind the stock functions, drop the fused forwards and their ropes, put the rotary modules back."""
        for name, original in self._functions.items():
            setattr(self._module, name, original)
        for attn in self._fused:
            vars(attn).pop("forward", None)
            vars(attn).pop("__reduce_ex__", None)
            if rotary_code.ROPE_CHILD in attn._modules:
                delattr(attn, rotary_code.ROPE_CHILD)
        for parent, attr, rebuilt in self._rotaries:
            buffer = next(iter(rebuilt.buffers()), None)
            stock = rebuilt.stock if buffer is None else rebuilt.stock.to(buffer.device)  # where the model went
            setattr(parent, attr, stock)
        self._functions, self._fused, self._rotaries = {}, [], []

    def __enter__(self) -> AxialRoPEHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return (f"AxialRoPEHandle({self.model_type!r}, functions={self.functions}, fused={len(self.fused)} "
                f"({self.by_positions} by positions), rotaries={self.rotaries})")  # fmt: skip


def _refused(config, model_name: str, error: ValueError) -> TypeError:
    families = ", ".join(f"{name} ({'/'.join(types)})" for name, (types, _) in FAMILIES.items())
    return TypeError(
        f"apply_axial_rope does not serve model_type {getattr(text_config(config), 'model_type', None)!r} "
        f"({model_name}): {error}. Served: {families}, and every model type of "
        "axial_rope.conventions.MODEL_TYPES whose rotation function is a pinned form (serves(config) says why not)"
    )


def _plan(model: nn.Module, from_config: bool) -> tuple:
    """Every check of :func:`apply_axial_rope` (and of :func:`serves` given a model), before anything changes."""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None:
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    try:
        model_type, convention, module, functions = _plan_functions(config)
    except ValueError as error:
        raise _refused(config, type(model).__name__, error) from None
    text = text_config(config)
    kinds = {kind for _, kind in functions.values()}
    rotaries = _plan_rotaries(model, module, text, convention, kinds) if from_config else []
    return model_type, convention, module, functions, text, kinds, rotaries


def serves(config, *, from_config: bool = False) -> str | None:
    """Why :func:`apply_axial_rope` would not serve a model of this config (``None``: it is served).

    ``config`` may be the model itself: then every check of :func:`apply_axial_rope` runs on it (for
    ``from_config=True``, whether it has a rotary module of its text config and the rebuilt rope turns as it
    does). From a config alone: the model type, the modeling module's rotation function and classes, and for
    ``from_config=True`` whether ``rope_from_config`` builds the rope of each layer type.
    """
    try:
        if isinstance(config, nn.Module):
            _plan(config, from_config)
            return None
        _plan_functions(config)
        if from_config:
            text = text_config(config)
            _layer_ropes(text, getattr(text, "layer_types", None) or ())
    except (ValueError, RuntimeError, TypeError) as error:
        return str(error)
    return None


def apply_axial_rope(
    model: nn.Module, backend: str | None = None, fuse_qk_norm: bool = True, *, from_config: bool = False
) -> AxialRoPEHandle:
    """Rotate q and k of a transformers model through axial_rope (see the module docstring for where).

    Args:
        model: a transformers ``PreTrainedModel`` (a causal LM, a base model or a vision-language model).
        backend: ``None`` (automatic), ``"reference"``, ``"torch"`` or ``"triton"``, for every rotation.
        fuse_qk_norm: fuse the per-head QK-RMSNorm with the rotation where the attention is a recognised form.
        from_config: replace the model's rotary module by its rope rebuilt from ``model.config``: the same
            tables from float64 angles (accurate at long context; a dynamic or LongRoPE scaling then reads
            the length on the host, as stock does, so a compiled forward breaks its graph there).

    Returns:
        The :class:`AxialRoPEHandle`; ``handle.remove()`` (or leaving ``with handle:``) restores stock.

    Raises:
        TypeError: the model is not served (its ``model_type`` and the reason, with the served families).
        RuntimeError: the model or its modeling module was patched by another library, or by another handle.
        ValueError: ``from_config=True`` and the model's rotary cannot be rebuilt from its config.

    :func:`serves` (given the model) returns the reason of each of these without changing anything.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    model_type, convention, module, functions, text, kinds, rotaries = _plan(model, from_config)
    handle = AxialRoPEHandle(model, model_type, module)
    try:
        for name, rebuilt in rotaries:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            handle._rotaries.append((parent, attr, rebuilt))
            setattr(parent, attr, rebuilt.to(next(iter(rebuilt.stock.buffers()), torch.empty(0)).device))
            handle.rotaries.append(name)
        if fuse_qk_norm and kinds == {"tables"} and convention.sign > 0:
            _install_fused(handle, model, module, text, convention, backend)
        for name, (fn, kind) in functions.items():  # last: a failure above leaves the module untouched
            handle._functions[name] = fn
            ours = rotary_code.rotation_function(kind, convention.pairing, convention.sign, backend)
            setattr(module, name, rotary_code.in_place_of(fn, ours))
            handle.functions[name] = kind
    except BaseException:
        handle.remove()
        raise
    return handle


def _install_fused(handle, model, module, text, convention, backend) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    digests, ropes = {}, None
    for name, attn in model.named_modules():
        found = _fusable(attn, module, digests)
        if found is None:
            continue
        form, offset, eps = found
        settings = rotary_code.FusedSettings(form, offset, eps, convention.pairing, backend,
                                          module.eager_attention_forward, ALL_ATTENTION_FUNCTIONS)  # fmt: skip
        if ropes is None:
            ropes, handle.why_tables = _fused_ropes(model, module, text, convention)
        rope = ropes.get(getattr(attn, "layer_type", None), ropes.get(None))
        if rope is not None:
            setattr(attn, rotary_code.ROPE_CHILD, rope.to(attn.q_proj.weight.device))
            handle.by_positions += 1
        attn.forward = functools.partial(rotary_code.fused_forward, attn, settings)
        attn.__reduce_ex__ = functools.partial(rotary_code.reduce_as_stock, attn)  # a copy of the model is stock
        handle._fused.append(attn)
        handle.fused.append(name)
