"""The backend contract and registry: what a backend must do, and which backends exist.

A backend is one module defining ``BACKEND``, an object with the operations of
:class:`Backend` (one signature each) and ``supports(call) -> reason | None``. It is
registered by one line in :data:`REGISTRY`. Backends never call each other: the
dispatcher (:mod:`axial_rope.ops`) asks ``supports`` and, for an automatic choice,
moves on to the next capable backend; for an explicit choice it raises with the reason.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.compiler import is_compiling

from .norm import QKNorm

__all__ = ["Backend", "Call", "OPS", "REGISTRY", "load"]

OPS = ("rotate_table", "rotate_qk", "norm_rotate_qk", "norm_rotate_table")

# name -> (module in this package, devices it is chosen for automatically: None = any, () = never).
# The automatic choice takes the first entry, in this order, whose supports() accepts the call.
REGISTRY: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "triton": ("_triton", ("cuda",)),
    "torch": ("_torch", None),
    "reference": ("_reference", ()),
}


@dataclass(frozen=True)
class Call:
    """One request, as a backend's ``supports`` sees it.

    Attributes:
        op: one of :data:`OPS`.
        device: device of the rotated tensors.
        dtype: dtype of the rotated tensors.
        grads: names of the inputs whose gradient autograd must compute (``"x"``, ``"q"``,
            ``"k"``, ``"cos"``, ``"sin"``, ``"pos"``, ``"freqs"``, ``"scale"``, ``"q_weight"``,
            ``"k_weight"``, ``"q_bias"``, ``"k_bias"``).
        inplace: the result is to be written into the inputs (never with ``grads``: the
            dispatcher runs such calls out of place and copies).
        per_head: frequencies (``[H, n_axes, n]``) or tables differ per head.
    """

    op: str
    device: torch.device
    dtype: torch.dtype
    grads: frozenset[str] = frozenset()
    inplace: bool = False
    per_head: bool = False


class Backend(Protocol):
    """What every backend implements. Arguments arrive checked, in the shapes below.

    Shapes: ``x``, ``q``, ``k``: 4-D in ``layout`` (``"bshd"``: ``[B, S, H, D]``;
    ``"bhsd"``: ``[B, H, S, D]``); k may have fewer heads (grouped-query attention) or be
    ``None``. ``cos``/``sin``: *plane tables*, one value per plane ``[..., n]``, laid out as ``x``
    (``[B|1, S, H_t|1, n]`` or ``[B|1, H_t|1, S, n]``). ``pos``: ``[B|1, S, n_axes]``; ``freqs``: ``F``
    ``[n_axes, n]`` or per head ``[H_F, n_axes, n]``; ``scale``: float64 attention factor per plane ``[n]``
    or ``None``. Per-head tables and ``F`` serve *grouped heads*: ``H_t`` (``H_F``) divides the heads of
    each tensor it turns, and head ``h`` of a tensor with ``H`` heads takes entry ``h // (H / H_t)``.
    Channels past ``2n`` pass through. Arithmetic in float32 (float64 for float64
    inputs); outputs in the input dtype, rounded once. With ``inplace=True`` the
    result is written into ``x`` (or ``q`` and ``k``), which is returned.
    """

    name: str

    def supports(self, call: Call) -> str | None:
        """``None`` when the backend can serve ``call``, else the reason it cannot."""
        ...

    def rotate_table(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str, layout: str, *, inplace: bool
    ) -> torch.Tensor: ...

    def rotate_qk(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        pos: torch.Tensor,
        freqs: torch.Tensor,
        scale: torch.Tensor | None,
        pairing: str,
        layout: str,
        *,
        inplace: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def norm_rotate_qk(
        self,
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
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head RMSNorm over the ``D`` channels (float32, weights ``[D]`` or ``None``), then rotation."""
        ...

    def norm_rotate_table(
        self, q: torch.Tensor, k: torch.Tensor, norm: QKNorm, cos: torch.Tensor, sin: torch.Tensor, pairing: str,
        layout: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """q and k normalised as ``norm`` says (float32, :mod:`axial_rope.ops.norm`), then rotated by plane tables
        (``[B|1, S, 1, n]``, or ``[B|1, 1, S, n]`` for ``bhsd``); rounded once."""
        ...


# name -> (backend, None) or (None, why it cannot load). Filled outside torch.compile:
# dynamo cannot trace an import, but reads this dict as a constant.
_LOADED: dict[str, tuple[Backend | None, str | None]] = {}


def load(name: str) -> tuple[Backend | None, str | None]:
    """The registered backend ``name`` and ``None``, or ``None`` and why it cannot be imported."""
    if name not in _LOADED:
        if is_compiling():
            return None, "it was never loaded outside torch.compile (call axial_rope.ops.preload() first)"
        try:
            module = importlib.import_module(f"{__package__}.{REGISTRY[name][0]}")
            _LOADED[name] = module.BACKEND, None
        except ImportError as err:  # triton not installed, or its backend not built
            _LOADED[name] = None, f"it could not be imported ({err})"
    return _LOADED[name]
