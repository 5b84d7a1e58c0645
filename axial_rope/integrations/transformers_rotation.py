"""What :func:`~axial_rope.integrations.transformers.apply_axial_rope` puts into a transformers model.

Three pieces, each reproducing a piece of stock code whose source it recognises by digest (the
function's syntax tree without decorators, docstring and comments, :func:`digest`), pinned for
transformers 5.24.0 and 5.25.0; code with another digest is not served:

- :func:`rotation_function`: the module-level rotation (``apply_rotary_pos_emb(q, k, cos, sin,
  unsqueeze_dim=1)``, Llama 4's ``apply_rotary_emb(xq, xk, freqs_cis)``) rotating by the tables the
  model computed, through :func:`axial_rope.apply_rope`. The tables' read is one of :data:`KINDS`;
  the pairing and sign come from :data:`axial_rope.conventions.MODEL_TYPES`.
- :func:`fused_forward`: the attention forward of the QK-norm families (Qwen3, Qwen3-MoE, Qwen3-VL
  text, Gemma 3), with the per-head RMSNorm and the rotation in one call.
- :class:`ConfigRotary`: the model's rotary module rebuilt by :func:`axial_rope.rope_from_config`,
  the same tables from float64 angles; :func:`disagreement` checks it against the model's own rotary.

Every piece is a function of its tensors (no state between calls), so ``torch.compile`` traces it. A copy
of a model carrying them (``copy.deepcopy``, ``torch.save`` of the whole module) comes out stock: a fused
attention and a :class:`ConfigRotary` reduce to the stock modules (:func:`reduce_as_stock`).
"""

from __future__ import annotations

import ast
import copy
import copyreg
import hashlib
import inspect
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..ops import apply_rope, rms_norm, rotation_tables
from ..rope import AxialRoPE

__all__ = ["AGREEMENT", "BODIES", "FORMS", "NORMS", "KINDS", "ROPE_CHILD", "ConfigRotary", "FusedForm", "digest",
           "disagreement", "fused_forward", "in_place_of", "norm_digest", "plain_function", "reduce_as_stock", "rotation_function"]  # fmt: skip

ROPE_CHILD = "axial_rope"  # the child module holding the rope of a fused attention that rotates by positions

# How a rotation function reads its tables:
#   "tables": channel tables [B, S, r] in the pairing's layout, the first r channels rotated (rotate_half)
#   "first_half": the first half of a rotate_half table [B, S, r], each plane repeated (GLM: interleaved)
#   "complex_bshd" / "complex_bhsd": complex freqs_cis [B, S, D/2] (Llama 4: q, k bshd; DeepSeek-V2: bhsd)
KINDS = ("tables", "first_half", "complex_bshd", "complex_bhsd")

# digest -> (kind, the function it was taken from); the float-casting variants compute in float32 and
# round to q's dtype, as apply_rope does
BODIES = {
    "4a8f8b85ee37bd3f": ("tables", "modeling_llama.apply_rotary_pos_emb"),  # q cos + rotate_half(q) sin
    "d979b6dc501d84b5": ("tables", "modeling_gpt_neox.apply_rotary_pos_emb"),  # first cos.shape[-1] channels
    "9af4c6b9d14681cf": ("tables", "modeling_phi3.apply_rotary_pos_emb"),  # the same, written in one cat
    "2ec47c993e6c0e18": ("tables", "modeling_nemotron.apply_rotary_pos_emb"),  # partial, other names
    "92ec8cff28b47c78": ("tables", "modeling_olmo.apply_rotary_pos_emb"),  # rounded to q's dtype
    "d95cfe37161b6bbb": ("tables", "modeling_esm.apply_rotary_pos_emb"),  # in float32
    "e8f88cb26b9ab6f8": ("tables", "modeling_cohere.apply_rotary_pos_emb"),  # in float32 (interleaved tables)
    "2cba81d929fd6c88": ("first_half", "modeling_glm.apply_rotary_pos_emb"),  # partial
    "783b0459b7cd1162": ("first_half", "modeling_helium.apply_rotary_pos_emb"),
    "b327730a08233f32": ("first_half", "modeling_ernie4_5.apply_rotary_pos_emb"),  # in float32
    "5e085a0003f086f3": ("complex_bshd", "modeling_llama4.apply_rotary_emb"),
    "6945152031279346": ("complex_bhsd", "modeling_deepseek_v2.apply_rotary_emb"),
}
FUNCTION_NAMES = ("apply_rotary_pos_emb", "apply_rotary_emb")  # the names a text attention calls


@dataclass(frozen=True)
class FusedForm:
    """An attention forward that :func:`fused_forward` reproduces: ``q_norm``/``k_norm`` over the head of
    ``q_proj``/``k_proj``, then the rotation, the cache, the attention interface and ``o_proj``."""

    source: str  # the forward it was taken from
    sliding_window: bool  # passes sliding_window=self.sliding_window to the attention interface


FORMS = {
    "9408ab7bbaf6f145": FusedForm("modeling_qwen3.Qwen3Attention.forward", sliding_window=True),  # and Qwen3-MoE
    "890e4d48c9340e96": FusedForm("modeling_gemma3.Gemma3Attention.forward", sliding_window=True),
    "7a26e6361c8c7e1f": FusedForm("modeling_qwen3_vl.Qwen3VLTextAttention.forward", sliding_window=False),
}
# norm digest -> weight offset: Qwen3's norm multiplies by w, Gemma 3's by (1 + w)
NORMS = {"7f6be55b177fa1d7": 0.0, "2dad5f5760750e09/6dc7d2ba16b4048a": 1.0}


def plain_function(fn: Callable) -> Callable | None:
    """The Python function behind ``fn``: ``fn`` itself, or the one a ``kernels`` function module wraps.

    From transformers 5.25 with the ``kernels`` package installed (a dependency since then), a function decorated
    ``@use_kernel_forward_from_hub`` (``apply_rotary_pos_emb``) is an ``nn.Module`` instance whose class ``forward``
    calls the function it closes over (``kernels/_internals/layer/layer.py``, ``_create_func_module``). None when
    ``kernelize`` has given the instance a forward of its own: it then runs a hub kernel, not the stock source.
    """
    if not isinstance(fn, nn.Module):
        return inspect.unwrap(fn)
    forward = type(fn).forward
    wrapped = inspect.getclosurevars(forward).nonlocals.get("func") if forward.__closure__ else None
    if "forward" in vars(fn) or not callable(wrapped):
        return None
    return inspect.unwrap(wrapped)


def digest(fn: Callable) -> str:
    """16 hex digits of ``fn``'s syntax tree without decorators, docstring and comments."""
    node = ast.parse(textwrap.dedent(inspect.getsource(plain_function(fn) or fn))).body[0]
    node.decorator_list = []
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()[:16]


def norm_digest(cls: type) -> str:
    """The digest of an RMSNorm class: its ``forward`` (and ``_norm``, which Gemma's forward calls)."""
    parts = [digest(cls.forward)] + ([digest(cls._norm)] if "_norm" in vars(cls) else [])
    return "/".join(parts)


_LAYOUTS = {1: "bhsd", 2: "bshd"}  # unsqueeze_dim of the tables -> the layout of q and k


def _layout(unsqueeze_dim: int) -> str:
    if unsqueeze_dim not in _LAYOUTS:
        raise ValueError(f"unsqueeze_dim must be 1 (q, k [B, H, S, D]) or 2 ([B, S, H, D]), got {unsqueeze_dim!r}")
    return _LAYOUTS[unsqueeze_dim]


def _interleaved(planes: torch.Tensor) -> torch.Tensor:
    """Plane values ``[..., n]`` as an interleaved channel table ``[..., 2n]``."""
    return planes.repeat_interleave(2, dim=-1)


def rotation_function(kind: str, pairing: str, sign: int, backend: str | None) -> Callable:
    """The replacement of a rotation function of ``kind``: rotates q and k by the model's tables.

    ``sign=-1`` (NanoChat's ``rotate_half = cat(x2, -x1)``) turns by minus the tables' angle.
    """
    if kind == "tables":

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            layout, sin = _layout(unsqueeze_dim), sin if sign > 0 else -sin
            return apply_rope(q, cos, sin, pairing, layout, backend), apply_rope(k, cos, sin, pairing, layout, backend)

    elif kind == "first_half":

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            layout, n = _layout(unsqueeze_dim), cos.shape[-1] // 2
            cos, sin = _interleaved(cos[..., :n]), _interleaved(sin[..., :n] * sign)
            return (apply_rope(q, cos, sin, "interleaved", layout, backend),
                    apply_rope(k, cos, sin, "interleaved", layout, backend))  # fmt: skip

    elif kind in ("complex_bshd", "complex_bhsd"):
        layout = kind[-4:]

        def apply_rotary_pos_emb(xq, xk, freqs_cis):  # freqs_cis complex [B, S, D / 2]
            cos, sin = _interleaved(freqs_cis.real), _interleaved(freqs_cis.imag * sign)
            return (apply_rope(xq, cos, sin, "interleaved", layout, backend),
                    apply_rope(xk, cos, sin, "interleaved", layout, backend))  # fmt: skip

    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    apply_rotary_pos_emb.__qualname__ = f"rotation_function.<{kind}>"
    apply_rotary_pos_emb.axial_rope_kind = kind  # marks it as axial_rope's (apply_axial_rope refuses to stack)
    return apply_rotary_pos_emb


def in_place_of(stock: Callable, ours: Callable) -> Callable:
    """``ours`` as the modeling module's attribute in place of ``stock``: itself, or, where ``stock`` is a ``kernels``
    function module (see :func:`plain_function`), a copy of that module running ``ours``. The attribute keeps its
    class, which ``kernels`` reads when it unpickles a saved model (``_rebuild_kernel_func`` instantiates the class
    of the module's attribute): a model saved while installed loads stock, as one saved without axial_rope does."""
    if not isinstance(stock, nn.Module):
        return ours
    module = copy.copy(stock)
    module.forward = ours  # an instance attribute: the class's forward, which calls the stock function, stays
    module.axial_rope_kind = ours.axial_rope_kind
    return module


@dataclass(frozen=True)
class FusedSettings:
    """What :func:`fused_forward` needs beyond the attention module (fixed when installed)."""

    form: FusedForm
    weight_offset: float  # Gemma 3's norm multiplies by (1 + w)
    eps: float
    pairing: str
    backend: str | None
    eager: Callable  # the modeling module's eager_attention_forward
    interfaces: object  # transformers' ALL_ATTENTION_FUNCTIONS


def _norm_rotate(attn: nn.Module, s: FusedSettings, q, k, position_embeddings, position_ids):
    """q, k ``[B, S, H, D]``: RMSNorm over D with the attention's weights, then the rotation, rounded once."""
    q_weight, k_weight = attn.q_norm.weight, attn.k_norm.weight
    if s.weight_offset:
        q_weight, k_weight = q_weight + s.weight_offset, k_weight + s.weight_offset  # stock: float32 (1 + w)
    rope = getattr(attn, ROPE_CHILD, None)  # present when the positions reach the attention (no M-RoPE)
    if rope is not None and position_ids is not None:  # one ops.norm_rotate call: one kernel on Triton
        return rope.norm_and_rotate(q, k, position_ids[..., None], q_weight, k_weight, "bshd", eps=s.eps,
                                    backend=s.backend)  # fmt: skip
    cos, sin = position_embeddings  # normalised in float32, rotated by the model's tables, rounded once
    q32 = apply_rope(rms_norm(q, q_weight, s.eps), cos, sin, s.pairing, "bshd", s.backend)
    k32 = apply_rope(rms_norm(k, k_weight, s.eps), cos, sin, s.pairing, "bshd", s.backend)
    return q32.to(q.dtype), k32.to(k.dtype)


def fused_forward(attn: nn.Module, s: FusedSettings, hidden_states, position_embeddings=None, attention_mask=None,
                  cache=None, **kwargs):  # fmt: skip
    """The recognised QK-norm attention forward (:data:`FORMS`) with norm and rotation fused; bound per instance."""
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    q = attn.q_proj(hidden_states).view(hidden_shape)  # [B, S, H, D]
    k = attn.k_proj(hidden_states).view(hidden_shape)  # [B, S, H_k, D]
    v = attn.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [B, H_k, S, D]
    q, k = _norm_rotate(attn, s, q, k, position_embeddings, kwargs.get("position_ids"))
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
    interface = s.interfaces.get_interface(attn.config._attn_implementation, s.eager)
    window = {"sliding_window": attn.sliding_window} if s.form.sliding_window else {}
    dropout = 0.0 if not attn.training else attn.attention_dropout
    out, weights = interface(attn, q, k, v, attention_mask, dropout=dropout, scaling=attn.scaling, **window, **kwargs)
    return attn.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def reduce_as_stock(attn: nn.Module, protocol: int) -> tuple:
    """``__reduce_ex__`` of a fused attention (bound per instance): ``copy.deepcopy`` and ``pickle`` (``torch.save``
    of the whole module) take its state without the fused forward and its rope, so the copy is the stock module."""
    state = type(attn).__getstate__(attn)  # nn.Module's: a copy of __dict__
    state.pop("forward", None)
    state.pop("__reduce_ex__", None)
    state["_modules"] = type(attn._modules)((k, v) for k, v in attn._modules.items() if k != ROPE_CHILD)
    return copyreg.__newobj__, (type(attn),), state


class ConfigRotary(nn.Module):
    """A model's rotary module rebuilt from its config: the tables it returns, from float64 angles.

    Args:
        ropes: the rope of each layer type (``None``: one rope for all), from :func:`~axial_rope.rope_from_config`.
        kind: the read of the model's rotation function (:data:`KINDS`): the tables come in the layout it reads.
        sign: the convention's sign (the rotation function applies it; the tables are stock's, angle +).
        mrope: ``position_ids`` are ``[3, B, S]`` (t, h, w) coordinates (``[B, S]`` is expanded, as stock does).
    """

    def __init__(self, ropes: dict[str | None, AxialRoPE], *, kind: str, sign: int, mrope: bool,
                 stock: nn.Module | None = None):  # fmt: skip
        super().__init__()
        self.ropes = nn.ModuleDict({str(key): rope for key, rope in ropes.items()})
        self.kind, self.sign, self.mrope = kind, sign, mrope
        self.__dict__["stock"] = stock  # the rotary it replaces: outside the module tree (no state, no .to())

    def __reduce_ex__(self, protocol: int):
        # a copy of the model (deepcopy, torch.save) gets the stock rotary back, on this one's device; built by
        # object.__new__, since pickle's __newobj__ insists on the class of the object it reduces
        stock = self.__dict__["stock"]
        if stock is None:
            return super().__reduce_ex__(protocol)
        buffer = next(iter(self.buffers()), None)
        if buffer is not None:
            stock.to(buffer.device)
        return object.__new__, (type(stock),), type(stock).__getstate__(stock)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
        """``(cos, sin)`` ``[B, S, r]`` in ``x``'s dtype (complex ``freqs_cis`` ``[B, S, r / 2]`` for Llama 4), from
        ``position_ids`` ``[B, S]`` (M-RoPE: ``[3, B, S]``)."""
        rope = self.ropes[str(layer_type)]
        pos = position_ids.expand(3, -1, -1).permute(1, 2, 0) if self.mrope else position_ids[..., None]
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # float64 tables for a float64 model
        cos, sin = rotation_tables(rope.rotation(pos), dtype)  # planes [B|1, S, n], factor multiplied in
        sin = sin * self.sign  # stock tables turn by +angle; the rotation function applies the sign
        if self.kind.startswith("complex"):
            return torch.complex(cos, sin)
        if self.kind == "tables" and rope.pairing == "interleaved":
            cos, sin = _interleaved(cos), _interleaved(sin)
        else:  # rotate_half tables: both halves hold the planes
            cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        return cos.to(x.dtype), sin.to(x.dtype)


# A rebuilt rope agrees with the model's rotary when their tables at positions 0 (the attention factor) and 1
# (each plane's sine is that of its inverse frequency, at most 1 rad: sin keeps its relative precision) are
# within AGREEMENT of each other, entry by entry, relative. Stock's float32 inverse frequencies are off by up
# to (ln theta + 1) u from pow's rounded exponent (< 20 u for theta <= 1e8) and a few roundings more from a
# scaling's blend and reciprocal; cos, sin and the attention factor add 2 u on each side: under 32 u. A rope
# read otherwise (another factor, base or ramp boundary) moves some plane by orders of magnitude more.
AGREEMENT = 64 * 2.0**-24


def _real(tables) -> list[torch.Tensor]:
    parts = tables if isinstance(tables, tuple | list) else (tables,)
    return [torch.view_as_real(t) if t.is_complex() else t for t in parts]


def disagreement(stock: nn.Module, rebuilt: ConfigRotary, layer_types: Sequence[str | None]) -> str | None:
    """Where ``rebuilt`` does not return the tables of the model's own rotary ``stock`` (``None``: it does).

    Both are called as the model calls them, ``(x, position_ids[, layer_type])``, at positions 0 and 1 of each
    of ``layer_types`` (``[None]`` for a rotary without layer types); host reads, outside any forward.
    """
    device = next(iter(stock.buffers()), torch.empty(0)).device
    if device.type == "meta":
        return "the model is on the meta device: its rotary has no values to compare with"
    takes_type = "layer_type" in inspect.signature(stock.forward).parameters
    ids = torch.arange(2, device=device)[None]  # position_ids [1, 2]
    ids = ids.expand(3, 1, 2) if rebuilt.mrope else ids  # M-RoPE: [3, 1, 2]
    x = torch.zeros(1, device=device)
    for layer_type in layer_types:
        name = f"layer type {layer_type!r}" if layer_type is not None else "the rotary"
        try:
            with torch.no_grad():
                want = _real(stock(x, ids, *([layer_type] if takes_type else [])))
                got = _real(rebuilt.to(device)(x, ids, layer_type))
        except (KeyError, RuntimeError, TypeError, ValueError) as error:
            return f"{name}: the rebuilt rotary cannot stand in for the model's ({type(error).__name__}: {error})"
        if [tuple(t.shape) for t in got] != [tuple(t.shape) for t in want]:
            return f"{name}: tables {[tuple(t.shape) for t in got]}, the model's {[tuple(t.shape) for t in want]}"
        for g, w in zip(got, want):
            excess = (g.double() - w.double()).abs() - AGREEMENT * w.double().abs()
            if bool((excess > 0).any()):
                worst = float(((g.double() - w.double()).abs() / w.double().abs().clamp_min(1e-30)).max())
                return f"{name}: tables differ from the model's by up to {worst:.2g} relative (above {AGREEMENT:.1g})"
    return None
