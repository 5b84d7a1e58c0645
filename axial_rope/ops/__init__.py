"""``apply_rope`` and its backends, all behind one signature.

Backends: ``"reference"`` (complex-number oracle), ``"torch"`` (fast real arithmetic)
and ``"triton"`` (fused GPU kernels, when built and importable). The choice is the
``backend`` argument, else the environment variable ``AXIAL_ROPE_BACKEND`` (read at
every call), else automatic: triton for CUDA tensors when it can run, torch otherwise.
An explicitly requested backend that cannot run raises ``RuntimeError`` with the reason;
the automatic choice falls back quietly.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

from torch import is_grad_enabled
from torch.compiler import is_compiling

from .common import (
    LAYOUTS,
    PAIRINGS,
    check_choice,
    check_table_pair,
    check_tensor,
    half_table,
    rms_norm,
    table_for_layout,
)

if TYPE_CHECKING:  # the submodule ops/torch.py would shadow a runtime `torch` name here
    import torch

__all__ = ["apply_rope", "rotate_qk", "norm_rotate_qk", "select_backend", "preload", "BACKENDS"]

BACKENDS = ("reference", "torch", "triton")
ENV_VAR = "AXIAL_ROPE_BACKEND"


# name -> (module, None) or (None, why it cannot load). Filled outside torch.compile:
# dynamo cannot trace an import, but reads this dict as a constant.
_LOADED: dict[str, tuple[ModuleType | None, str | None]] = {}


def _module(name: str) -> tuple[ModuleType | None, str | None]:
    if name not in _LOADED:
        if is_compiling():
            return None, "it was never loaded outside torch.compile (call axial_rope.ops.preload() first)"
        try:
            _LOADED[name] = importlib.import_module(f"{__name__}.{name}"), None
        except ImportError as err:  # triton not installed, or its backend not built
            _LOADED[name] = None, f"it could not be imported ({err})"
    return _LOADED[name]


def preload(*, triton: bool | None = None) -> None:
    """Import the backends now, so that code compiled later finds them.

    ``triton=None`` loads it when CUDA is available or ``TRITON_INTERPRET=1`` is set.
    :class:`~axial_rope.AxialRoPE` calls this when constructed.
    """
    _module("reference")
    _module("torch")
    if triton is None:
        import torch as _torch  # a local name: the submodule ops/torch.py shadows `torch` here

        triton = _torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    if triton:
        _module("triton")


def select_backend(backend: str | None, x: torch.Tensor, freqs: torch.Tensor | None = None) -> ModuleType:
    """The backend module that will rotate ``x`` (see the module docstring for the rules).

    ``freqs`` is the frequency matrix of a table-free call (``None`` for table calls);
    a backend may decline it, e.g. when it needs a gradient the backend cannot give.
    """
    name = backend if backend is not None else os.environ.get(ENV_VAR) or None
    if name is not None:
        source = "backend" if backend is not None else f"environment variable {ENV_VAR}"
        if name not in BACKENDS:
            raise ValueError(f"{source} must be one of {BACKENDS}, got {name!r}")
        module, reason = _module(name)
        if module is not None:
            reason = getattr(module, "unavailable_reason", lambda x, f: None)(x, freqs)
        if reason is not None:
            raise RuntimeError(f"backend {name!r} (from {source}) cannot run: {reason}")
        return module
    if x.is_cuda:
        module, _ = _module("triton")
        if module is not None and module.unavailable_reason(x, freqs) is None:
            return module
    return _module("torch")[0]


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pairing: str = "interleaved",
    layout: str = "bshd",
    backend: str | None = None,
    *,
    inplace: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` by precomputed cos/sin tables (drop-in for other libraries' tables).

    Args:
        x: ``[B, S, H, D]`` (``layout="bshd"``) or ``[B, H, S, D]`` (``"bhsd"``).
        cos, sin: ``[S, r]`` or ``[B, S, r]``, ``r <= D`` even, in the pairing's channel
            layout (each plane's value in both of its channels, as diffusers, timm and
            transformers build them); only the first ``r`` channels are rotated.
        pairing: ``"interleaved"`` (planes ``(2i, 2i+1)``) or ``"half"`` (``(i, i + r/2)``).
        backend: ``None`` (automatic), ``"reference"``, ``"torch"`` or ``"triton"``.
        inplace: write the result into ``x`` and return ``x`` (see :func:`rotate_qk`).

    Returns:
        The rotated tensor, same shape and dtype as ``x``.
    """
    check_choice("pairing", pairing, PAIRINGS)
    check_choice("layout", layout, LAYOUTS)
    check_tensor("x", x, 4)
    check_table_pair(cos, sin, x, layout)
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    cos = table_for_layout(half_table(cos, pairing), layout)
    sin = table_for_layout(half_table(sin, pairing), layout)
    module = select_backend(backend, x)
    if not inplace:
        return module.apply_table(x, cos, sin, pairing)
    _check_inplace(("x", x))
    if _native_inplace(module, x, cos, sin):
        return module.apply_table(x, cos, sin, pairing, inplace=True)
    return x.copy_(module.apply_table(x, cos, sin, pairing))


def _check_inplace(*named: tuple[str, torch.Tensor | None]) -> None:
    """In-place targets must own their memory: a broadcast (zero-stride) view would be written many times."""
    for name, x in named:
        if x is not None and any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape)):
            raise ValueError(
                f"inplace=True needs {name} to own every element's memory; got a broadcast view "
                f"(shape {tuple(x.shape)}, strides {tuple(x.stride())})"
            )


def _native_inplace(module: ModuleType, *tensors: torch.Tensor | None) -> bool:
    """Whether the backend's own in-place kernel runs: it has one, and no gradient is to be recorded."""
    needs_grad = is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return getattr(module, "INPLACE", False) and not needs_grad


def rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor | None,
    pos: torch.Tensor,
    freqs: torch.Tensor,
    scale: torch.Tensor | None,
    pairing: str,
    layout: str,
    backend: str | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Table-free entry used by :class:`~axial_rope.AxialRoPE`: rotate q and k by ``pos @ freqs``.

    Arguments are already checked: pos ``[B|1, S, n_axes]``, freqs ``[n_axes, n]`` or
    ``[H, n_axes, n]`` (per head), scale ``[n]`` float64 attention factor per plane or ``None``.

    ``inplace=True`` writes the results into q and k and returns them. Without a gradient
    to record (inference, or inputs that do not require one) the torch and triton
    backends rotate in place, with no output allocation (triton: the mutating op
    ``axial_rope::rope_``, which ``torch.compile`` functionalises). Otherwise the
    rotation runs out of place and is copied back with ``copy_``, which autograd records
    (so a leaf that requires grad gets PyTorch's usual in-place error).
    """
    module = select_backend(backend, q, freqs)
    if not inplace:
        return module.rotate_qk(q, k, pos, freqs, scale, pairing, layout)
    _check_inplace(("q", q), ("k", k))
    if k is q:
        raise ValueError("inplace=True with k the same tensor as q would rotate it twice")
    if _native_inplace(module, q, k, pos, freqs, scale):
        module.rotate_qk(q, k, pos, freqs, scale, pairing, layout, inplace=True)
        return q, k
    q_out, k_out = module.rotate_qk(q, k, pos, freqs, scale, pairing, layout)
    return q.copy_(q_out), (None if k is None else k.copy_(k_out))


def norm_rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    pos: torch.Tensor,
    freqs: torch.Tensor,
    scale: torch.Tensor | None,
    pairing: str,
    layout: str,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q and k (weights ``[D]``) followed by rotation, fused where the backend can.

    Backends without a fused kernel normalise in float32 and rotate the float32 result,
    so the output is rounded once, as in the fused kernel.
    """
    module = select_backend(backend, q, freqs)
    fused = getattr(module, "norm_rotate_qk", None)
    if fused is not None:
        return fused(q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout)
    q32, k32 = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    q32, k32 = module.rotate_qk(q32, k32, pos, freqs, scale, pairing, layout)
    return q32.to(q.dtype), k32.to(k.dtype)


preload(triton=False)
