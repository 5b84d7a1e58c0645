"""The doctor's view of a transformers model: its rotary module's tables and the q, k its rotation function turns.

Two observables per attention call (transformers 5.24):

- the text rotary module (``model.rotary_emb``: a class named ``*RotaryEmbedding`` holding the text config):
  a forward hook reads ``position_ids`` and the ``(cos, sin)`` (Llama 4: complex ``freqs_cis``) it returns;
- the modeling module's rotation function (``apply_rotary_pos_emb``, ``apply_rotary_emb``): transformers has
  no extension point there (see :mod:`axial_rope.integrations.transformers`), so for the doctor's forward
  only the module attribute is rebound to a wrapper that records q and k before and after, and put back
  when the forward ends, also when it fails.

The doctor passes ``position_ids`` with an offset per sample (:data:`OFFSETS`) where the model takes them and
positions are 1-D: the tables must follow them (the Automodel incident), and angles far from 0 show their
precision. The prescription is :func:`axial_rope.rope_from_config` of the config (per layer type where
``rope_parameters`` has one entry per type), the pairing and sign those of the model type's record
(:data:`axial_rope.conventions.MODEL_TYPES`). The rotary modules' buffers and length state (dynamic
scaling keeps the longest length seen) are restored after each forward.
"""

from __future__ import annotations

import importlib
import inspect

import torch
from torch import nn

from ..configs import rope_from_config
from ..conventions.fields import text_config
from ..conventions.model_types import ModelConvention, model_convention
from ..rope import AxialRoPE
from .observe import Observation, plane_render, planes_of_tables, qk_rotation

__all__ = ["OFFSETS", "TransformersSite", "config_axes", "is_transformers_model"]

FUNCTION_NAMES = ("apply_rotary_pos_emb", "apply_rotary_emb")  # what a text attention calls (transformers 5.24)
OFFSETS = (300, 700)  # position offset of sample 0, 1: far enough from 0 to show float32 vs float64 angles, and
# below 1024, where bfloat16's spacing (8) would exceed 2 pi and hide which turn an angle is on
SEQ = 12  # tokens of the inputs the doctor builds


def is_transformers_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") or any(
        c.__module__.startswith("transformers.") for c in type(model).__mro__[1:]
    )


def config_axes(text, mrope: bool):
    """The map's axes of a transformers text config: the sequence (M-RoPE: t, h, w, each as long as the text),
    trained over ``original_max_position_embeddings`` where a scaling names it, else ``max_position_embeddings``;
    no policy kind (:mod:`axial_rope.policy` plans image and video grids)."""
    from .extrapolation import MapAxes

    get = text.get if isinstance(text, dict) else lambda key, default=None: getattr(text, key, default)
    params = get("rope_parameters") or get("rope_scaling") or {}
    if params and all(isinstance(v, dict) for v in params.values()):  # per layer type: the first
        params = next(iter(params.values()))
    trained = params.get("original_max_position_embeddings") or get("original_max_position_embeddings") or get(
        "max_position_embeddings")  # fmt: skip
    n = 3 if mrope else 1
    return MapAxes(("t", "h", "w") if mrope else ("position",), (trained,) * n, (None,) * n)


def _ropes(config, text) -> dict:
    """The prescribed rope of each layer type (``{None: rope}`` where the config has one for all)."""
    params = getattr(text, "rope_parameters", None) or {}
    types = [t for t in dict.fromkeys(getattr(text, "layer_types", None) or ()) if isinstance(params.get(t), dict)]
    if types:
        return {t: rope_from_config(config, layer_type=t) for t in types}
    return {None: rope_from_config(config)}


def _snapshot(module: nn.Module) -> dict:
    """A rotary module's buffers and plain number attributes (dynamic scaling changes both on a long forward)."""
    numbers = {k: v for k, v in vars(module).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"buffers": {k: None if b is None else b.clone() for k, b in module._buffers.items()}, "numbers": numbers}


def _restore(module: nn.Module, saved: dict) -> None:
    for k, b in saved["buffers"].items():
        module._buffers[k] = b
    for k, v in saved["numbers"].items():
        setattr(module, k, v)


class TransformersSite:
    """A transformers model's rotary sites, with the inputs of the doctor's forward.

    Raises ``ValueError`` for a config whose model type has no record (what to pass instead), ``TypeError`` for
    a model without a text rotary module.
    """

    source = "transformers"

    def __init__(self, model: nn.Module, config=None, example_inputs: dict | None = None):
        self.model = model
        rope = config if isinstance(config, AxialRoPE) else None  # the rope it should rotate by, given
        self.config = config if config is not None and rope is None else getattr(model, "config", None)
        if self.config is None:
            raise TypeError(f"{type(model).__name__} has no .config: pass config= (its transformers config)")
        self.text = text_config(self.config)
        self.model_type = getattr(self.text, "model_type", None) or getattr(self.config, "model_type", None)
        if rope is not None:
            mrope = rope.n_axes == 3 and rope.spectrum in ("split", "cycled")
            self.convention = ModelConvention(rope.pairing, 1, rope.spectrum if mrope else None)
            self.ropes = {None: rope}
        else:
            try:
                self.convention = model_convention(self.model_type)
            except ValueError as error:
                raise ValueError(f"{error}; or pass config= an axial_rope.AxialRoPE, the rotation the model should "
                                 "apply (axes, theta, scaling, pairing)") from None  # fmt: skip
            self.ropes = _ropes(self.config, self.text)
        self.rotaries = [(n, m) for n, m in model.named_modules() if self._is_text_rotary(n, m)]
        if not self.rotaries:
            raise TypeError(
                f"{type(model).__name__} has no text rotary module (a *RotaryEmbedding holding its text config, or a "
                "rotary_emb attribute) for the doctor to hook"
            )
        self.mrope = self.convention.mrope is not None
        self.device = next(iter(model.parameters()), torch.empty(0)).device
        self.modeling = importlib.import_module(type(self.text).__module__.replace(".configuration_", ".modeling_"))
        self.inputs, self.passed = self._inputs(example_inputs)

    def prescribed(self) -> dict[str, str]:
        """The prescribed rope per layer type, in words."""
        pairing = self.convention.pairing + (", turning by minus the angle" if self.convention.sign < 0 else "")
        return {f"{self.model_type}" + ("" if t is None else f" [{t}]"): f"AxialRoPE({rope.extra_repr()}) ({pairing})"
                for t, rope in self.ropes.items()}  # fmt: skip

    def describe_sites(self) -> list[str]:
        return [name for name, _ in self.rotaries]

    def axes(self):
        return config_axes(self.text, self.mrope)

    def _is_text_rotary(self, name: str, module: nn.Module) -> bool:
        if not (type(module).__name__.endswith("RotaryEmbedding") or name.rsplit(".", 1)[-1] == "rotary_emb"):
            return False
        config = getattr(module, "config", None)
        return config is None or type(config) is type(self.text)

    def _inputs(self, given: dict | None) -> tuple[dict, torch.Tensor | None]:
        """The forward's inputs, with offset ``position_ids`` added where the model takes them (1-D positions)."""
        if given is None:
            vocab = getattr(self.text, "vocab_size", None)
            if not isinstance(vocab, int) or vocab < 2:
                raise ValueError(f"cannot build input_ids: the config has no vocab_size; pass example_inputs= "
                                 f"(the keyword arguments of one forward of {type(self.model).__name__})")  # fmt: skip
            gen = torch.Generator().manual_seed(0)
            given = {"input_ids": torch.randint(1, vocab, (len(OFFSETS), SEQ), generator=gen).to(self.device)}
        inputs = dict(given)
        if "position_ids" in inputs:
            passed = inputs["position_ids"]
            return inputs, None if passed is None or self.mrope else passed.cpu()
        takes = "position_ids" in inspect.signature(self.model.forward).parameters
        ids = inputs.get("input_ids")
        if not takes or self.mrope or not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            return inputs, None
        batch, seq = ids.shape
        offsets = torch.tensor([OFFSETS[b % len(OFFSETS)] + 400 * (b // len(OFFSETS)) for b in range(batch)])
        inputs["position_ids"] = (offsets[:, None] + torch.arange(seq)[None]).to(ids.device)
        return inputs, inputs["position_ids"].cpu()

    def run(self, forward) -> list[Observation]:
        """One forward (``forward(model, inputs)``, which the caller runs in its pass) with the hooks; the
        observations of each rotary call, with the q, k of the rotation calls that used its tables."""
        calls, rotations, hooks, saved = [], [], [], []
        for name, module in self.rotaries:
            saved.append((module, _snapshot(module)))

            def hook(module, args, kwargs, output, name=name):
                position_ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
                layer_type = args[2] if len(args) > 2 else kwargs.get("layer_type")
                calls.append((name, position_ids, layer_type, output))

            hooks.append(module.register_forward_hook(hook, with_kwargs=True))
        originals = {n: vars(self.modeling)[n] for n in FUNCTION_NAMES if callable(vars(self.modeling).get(n))}
        for fname, fn in originals.items():
            setattr(self.modeling, fname, _recording(fn, rotations))
        try:
            forward(self.model, self.inputs)
        finally:
            for fname, fn in originals.items():
                setattr(self.modeling, fname, fn)
            for h in hooks:
                h.remove()
            for module, state in saved:
                _restore(module, state)
        return [obs for call in calls if (obs := self._observation(call, rotations)) is not None]

    def _positions(self, position_ids: torch.Tensor, batch: int, seq: int) -> tuple[torch.Tensor, bool]:
        """float64 ``[B, S, A]``: the positions passed where the doctor passed them, else the rotary's own input."""
        if self.passed is not None and self.passed.shape[-1] == seq and batch in (1, self.passed.shape[0]):
            return self.passed.double()[..., None], True
        pos = position_ids.double()
        if self.mrope:
            pos = pos.expand(3, -1, -1) if pos.ndim == 2 else pos[-3:]  # a leading text row (Qwen3-VL): (t, h, w)
            return pos.permute(1, 2, 0), False
        return pos[..., None], False

    def _observation(self, call, rotations) -> Observation | None:
        name, position_ids, layer_type, output = call
        tables = output if isinstance(output, tuple) else (output, None)
        if not isinstance(tables[0], torch.Tensor) or position_ids is None:
            return None
        cos, sin, layout = planes_of_tables(*(None if t is None else t.detach().cpu() for t in tables[:2]))
        batch, seq = cos.shape[0], cos.shape[-2]
        pos, passed = self._positions(position_ids.cpu(), batch, seq)
        rope = self.ropes.get(layer_type, self.ropes.get(None, next(iter(self.ropes.values()))))
        dtype = tables[0].real.dtype if tables[0].is_complex() else tables[0].dtype
        site = name if layer_type is None else f"{name}[{layer_type}]"
        qk, sample = None, None
        used = [r for r in rotations if any(t is tables[0] for t in r["tables"])]
        if used:
            qk = qk_rotation(used[0]["before"], used[0]["after"], 2 * cos.shape[-1])
            sample = (used[0]["q"], used[0]["k"])
        return Observation(site, rope, pos, rope.rotation(pos), [cos, sin], dtype,
                           plane_render(self.convention.sign), planes=(cos, sin), width=2 * cos.shape[-1], qk=qk,
                           layout=layout, positions_passed=passed, sign=self.convention.sign, sample=sample)  # fmt: skip


def _recording(fn, rotations: list):
    """``fn`` (a rotation function) that also records q and k ``[B, S, H, D]`` before and after, and its tables."""

    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        q, k = args[0], args[1]
        tables = [a for a in (*args[2:], *kwargs.values()) if isinstance(a, torch.Tensor)]
        if isinstance(out, tuple) and len(out) == 2 and isinstance(q, torch.Tensor) and tables:
            seq = tables[0].shape[-2] if tables and not tables[0].is_complex() else (
                tables[0].shape[-2] if tables else q.shape[-2])  # fmt: skip
            bhsd = q.ndim == 4 and q.shape[2] == seq and not (tables and tables[0].is_complex() and q.shape[1] == seq)
            if not any(t is tables[0] for r in rotations for t in r["tables"]):  # one record per table (layer type)
                views = [(t.transpose(1, 2) if bhsd else t).detach().cpu() for t in (q, k, *out)]
                before, after = torch.cat(views[:2], dim=2), torch.cat(views[2:], dim=2)
                rotations.append({"tables": tables, "before": before, "after": after, "q": views[0], "k": views[1]})
        return out

    wrapper.__wrapped__ = fn
    return wrapper
