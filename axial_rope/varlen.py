"""Attention over a packed sequence that never crosses item boundaries (variable-length attention).

A packed sequence holds the tokens of several items (images, videos, texts) one after the
other, ``[T, H, D]`` (flash-attn's varlen layout); :class:`Segments` says where each item
starts and ends (``cu_seqlens``, one segment id per token). :func:`varlen_attention` lets
every token attend to the tokens of its own item only: the block-diagonal mask, without
building it, on the fastest path the device has. The library chooses (and logs why):

- ``"varlen"``: ``torch.nn.attention.varlen.varlen_attn`` (PyTorch's flash / cuDNN varlen
  kernels): CUDA, float16 / bfloat16;
- ``"flash_attn"``: flash-attn's ``flash_attn_varlen_func`` when importable: CUDA, float16 / bfloat16;
- ``"flex"``: FlexAttention (``torch.nn.attention.flex_attention``, compiled) with a document
  mask: CUDA in any float dtype; CPU forward only (FlexAttention has no CPU backward);
- ``"loop"``: PyTorch's SDPA on each item in turn: any device, dtype and gradient. The CPU choice
  (measured in ``docs/packing.md``: as fast as compiled FlexAttention's forward there, with a backward);
- ``"dense"``: SDPA with the ``[T, T]`` block-diagonal mask materialised: quadratic memory; never
  chosen automatically, a second oracle for tests.

Every path computes the same function: each item's softmax attention, as SDPA on that item alone.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .segments import Segments

__all__ = [
    "Segments",
    "VarlenChoice",
    "VARLEN_BACKENDS",
    "check_packed_attention",
    "choose_backend",
    "last_choice",
    "varlen_attention",
]

log = logging.getLogger(__name__)

VARLEN_BACKENDS = ("varlen", "flash_attn", "flex", "loop", "dense")
_HALF = (torch.float16, torch.bfloat16)


# -- the choice -----------------------------------------------------------------------------------


class VarlenChoice(NamedTuple):
    """The path :func:`varlen_attention` takes and why (``choose_backend``'s answer, also logged)."""

    name: str
    reason: str


_LAST: list[VarlenChoice] = []  # the latest choice, for last_choice()
_LOGGED: set = set()  # (device type, dtype, grad, name) already logged at INFO


def _torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _flash_attn():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:  # not installed, or built for another torch / CUDA
        return None
    return flash_attn_varlen_func


def _has_flex() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _why_not(name: str, device: torch.device, dtype: torch.dtype, grad: bool) -> str | None:
    """``None`` when path ``name`` can run this call, else the reason it cannot."""
    if name in ("varlen", "flash_attn"):
        if device.type != "cuda":
            return f"a CUDA kernel, the tensors are on {device.type}"
        if dtype not in _HALF:
            return f"its kernels take float16/bfloat16, got {dtype}"
        if name == "varlen" and _torch_varlen() is None:
            return f"torch {torch.__version__} has no torch.nn.attention.varlen"
        if name == "flash_attn" and _flash_attn() is None:
            return "flash_attn is not importable"
    elif name == "flex":
        if not _has_flex():
            return f"torch {torch.__version__} has no FlexAttention"
        if device.type not in ("cuda", "cpu"):
            return f"FlexAttention runs on CUDA and CPU, not {device.type}"
        if device.type == "cpu" and grad:
            return "FlexAttention has no CPU backward"
    elif name not in ("loop", "dense"):
        raise ValueError(f"varlen backend must be one of {VARLEN_BACKENDS}, got {name!r}")
    return None


def choose_backend(q: torch.Tensor, *, requires_grad: bool | None = None, backend: str | None = None) -> VarlenChoice:
    """The path for attention over packed ``q`` (its device and dtype) and why; logged, see :func:`last_choice`.

    Automatic on CUDA: ``varlen``, then ``flash_attn``, then ``flex`` (the first that runs); on CPU
    and other devices: ``loop``. ``backend`` forces a path (``RuntimeError`` with the reason if it
    cannot run). ``requires_grad``: whether a backward will follow (default: autograd's view of ``q``).
    """
    grad = (torch.is_grad_enabled() and q.requires_grad) if requires_grad is None else requires_grad
    if backend is not None:
        why = _why_not(backend, q.device, q.dtype, grad)
        if why is not None:
            raise RuntimeError(f"varlen backend {backend!r} cannot run on {q.device} {q.dtype}: {why}")
        choice = VarlenChoice(backend, "requested")
    elif q.device.type == "cuda":
        skipped = []
        for name in ("varlen", "flash_attn", "flex"):
            why = _why_not(name, q.device, q.dtype, grad)
            if why is None:
                break
            skipped.append(f"{name}: {why}")
        else:
            name = "loop"
        reason = f"fastest path that runs on CUDA {q.dtype}" + (f" (skipped {'; '.join(skipped)})" if skipped else "")
        choice = VarlenChoice(name, reason)
    elif q.device.type == "cpu":
        choice = VarlenChoice(
            "loop",
            "CPU: SDPA per item (FlexAttention has no CPU backward; its forward measured slower, docs/packing.md)",
        )
    else:
        choice = VarlenChoice("loop", f"no varlen kernel for {q.device.type}: SDPA per item")
    key = (q.device.type, q.dtype, grad, choice.name)
    level = logging.DEBUG if key in _LOGGED else logging.INFO
    _LOGGED.add(key)
    log.log(level, "varlen attention on %s %s (grad=%s): %s: %s", q.device, q.dtype, grad, *choice)
    _LAST[:] = [choice]
    return choice


def last_choice() -> VarlenChoice | None:
    """The latest choice of :func:`choose_backend` (every :func:`varlen_attention` call makes one), or ``None``."""
    return _LAST[0] if _LAST else None


# -- the paths ------------------------------------------------------------------------------------


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1)[None]  # [T, H, D] -> [1, H, T, D] (a view)


def _loop(q, k, v, seg: Segments, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    """SDPA on each item: ``[1, H, L, D]`` slices of the heads-first copies, outputs concatenated.

    One heads-first copy of q, k, v (then each item's rows are contiguous per head: measured 20%
    faster than strided views on CPU), and ``split``, not slicing: the backward of N slices adds each
    slice's gradient into its own zero tensor of the whole sequence (N x T work), that of a split is one cat.
    """
    q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))  # [H, T, D]
    parts = zip(*(t.split(seg.lengths, dim=1) for t in (q, k, v)))
    outs = [
        F.scaled_dot_product_attention(qi[None], ki[None], vi[None], is_causal=causal, scale=scale, enable_gqa=gqa)
        for qi, ki, vi in parts
    ]
    return torch.cat(outs, dim=2)[0].transpose(0, 1)  # [T, H, D]


def _dense(q, k, v, seg: Segments, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    mask = seg.dense_mask(causal)  # [T, T]: quadratic memory, the oracle
    out = F.scaled_dot_product_attention(_bhsd(q), _bhsd(k), _bhsd(v), attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


_COMPILED: dict = {}


def _flex_fn():
    """FlexAttention compiled once per process (eager FlexAttention materialises the scores: slow).

    Automatic dynamic shapes: a second packed length recompiles once for any length (or pad packed
    batches to one length, ``pack(..., pad_to=L)``, and it compiles once).
    """
    if "flex" not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED["flex"] = torch.compile(flex_attention)
    return _COMPILED["flex"]


def _flex(q, k, v, seg: Segments, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    if q.device.type == "cpu":  # no gradient is recorded (checked): CPU FlexAttention refuses inputs that want one
        q, k, v = q.detach(), k.detach(), v.detach()
    out = _flex_fn()(_bhsd(q), _bhsd(k), _bhsd(v), block_mask=seg.block_mask(causal), scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


def _varlen(q, k, v, seg: Segments, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    attn, cu, n = _torch_varlen(), seg.cu_seqlens, seg.max_seqlen
    params = inspect.signature(attn).parameters
    kwargs = {"scale": scale}
    if "window_size" in params:  # torch >= 2.10: causal is the window (-1, 0)
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    elif causal:
        kwargs["is_causal"] = True
    if gqa:
        if "enable_gqa" not in params:
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        else:
            kwargs["enable_gqa"] = True
    return attn(q, k, v, cu, cu, n, n, **kwargs)


def _flash(q, k, v, seg: Segments, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    cu, n = seg.cu_seqlens, seg.max_seqlen  # flash-attn takes fewer k/v heads as they are (GQA)
    return _flash_attn()(q, k, v, cu, cu, n, n, dropout_p=0.0, softmax_scale=scale, causal=causal)


_PATHS = {"varlen": _varlen, "flash_attn": _flash, "flex": _flex, "loop": _loop, "dense": _dense}


def _check(q, k, v, segments: Segments) -> None:
    if not isinstance(segments, Segments):
        raise TypeError(f"segments must be an axial_rope.varlen.Segments, got {type(segments).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 3:
            raise ValueError(f"{name} must be packed [T, heads, head_dim], got {getattr(t, 'shape', type(t))}")
        segments.check(name, t)
    if k.shape != v.shape or k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must match, "
                         "share q's head_dim and have a number of heads dividing q's")  # fmt: skip
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: Segments,
    *,
    causal: bool = False,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Softmax attention within each item of a packed sequence.

    Args:
        q: ``[T, H, D]``; k, v: ``[T, H_kv, D]`` (``H_kv`` dividing ``H``: grouped-query attention).
        segments: the items' boundaries (:class:`Segments`, on the tensors' device).
        causal: each token attends to the earlier tokens of its item only.
        scale: softmax scale (default ``1 / sqrt(D)``).
        backend: one of :data:`VARLEN_BACKENDS`, or ``None`` for the automatic choice (:func:`choose_backend`).

    Returns:
        ``[T, H, D]``: row ``t`` equals SDPA over the item of token ``t`` alone.
    """
    _check(q, k, v, segments)
    if scale is not None:  # a Python number: SDPA's kernels take a host float
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a number (the softmax scale) or None, got {scale!r}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be a finite number (the softmax scale), got {scale!r}")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    choice = choose_backend(q, requires_grad=grad, backend=backend)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _PATHS[choice.name](q, k, v, segments, causal, scale, k.shape[1] != q.shape[1])


def check_packed_attention(x: torch.Tensor, pos, segments: Segments, *, rope=None, seq_len=None) -> None:
    """What :class:`~axial_rope.attend.Varlen` refuses, before any work: x ``[B, S, C]`` with ``B * S`` the packed
    tokens, pos ``[B * S | S, n_axes]`` or ``[B, S, n_axes]`` on the same device; a length-dependent rope without
    ``seq_len`` (it would read the whole pack's length, not each item's). (A mask, a cache or context parallelism
    beside segments: :func:`~axial_rope.attend.attend_record`.)"""
    if rope is not None and rope.length_dependent and seq_len is None:
        raise ValueError(
            "a length-dependent scaling on a packed sequence would see the whole pack's length: pass "
            "rope=packed.rope(model_rope) (each item its own lengths, axial_rope.packed_rope.item_rope)"
        )
    if not isinstance(segments, Segments):
        raise TypeError(f"segments must be an axial_rope.varlen.Segments, got {type(segments).__name__}")
    segments.check("x (its B * S tokens)", x.flatten(0, 1))
    if pos is not None:
        segments.check("pos (its rows)", pos.reshape(-1, pos.shape[-1]) if pos.ndim > 1 else pos)
