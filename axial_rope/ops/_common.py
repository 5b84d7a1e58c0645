"""What the dispatcher, the backends and the floors above share: checks, layouts, tables, angles, norms.

Private to :mod:`axial_rope.ops`, which exports every name here that another module uses (`from axial_rope.ops
import seq_dim`): the boundary the tree shows.

Backends see *plane tables*: ``cos``/``sin`` with one entry per plane, ``[..., n_pairs]``,
already shaped to broadcast against ``x`` with the plane axis last (``[B|1, S, H|1, n]``
for ``bshd``, ``[B|1, H|1, S, n]`` for ``bhsd``). Channel tables (the public form, each
plane's value in both of its channels) are cut to plane tables by :func:`plane_table`,
a view, so no backend re-reads duplicated channels. The reference backend uses the
checks and layouts only: it computes its own angles.
"""

from __future__ import annotations

import torch

from .turns import turn_angles

PAIRINGS = ("interleaved", "half")
LAYOUTS = ("bshd", "bhsd")
FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_tensor(name: str, x: torch.Tensor, ndim: int | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float64/32/16 or bfloat16, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be 4-D [B, S, H, D] or [B, H, S, D], got shape {tuple(x.shape)}")


def seq_dim(layout: str) -> int:
    return 1 if layout == "bshd" else 2


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Rotation arithmetic is float32, float64 inputs stay float64 (gradcheck, oracles)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def plane_table(table: torch.Tensor, pairing: str) -> torch.Tensor:
    """Channel table ``[..., r]`` -> one value per plane ``[..., r / 2]`` (a view)."""
    return table[..., 0::2] if pairing == "interleaved" else table[..., : table.shape[-1] // 2]


def channel_table(planes: torch.Tensor, pairing: str) -> torch.Tensor:
    """One value per plane ``[..., n]`` -> the pairing's channel layout ``[..., 2n]``."""
    return planes.repeat_interleave(2, dim=-1) if pairing == "interleaved" else torch.cat([planes, planes], dim=-1)


def table_for_layout(table: torch.Tensor, layout: str) -> torch.Tensor:
    """``[B|1, S, n]`` or per-head ``[B|1, S, H_t, n]`` -> ``[B|1, S, H_t|1, n]`` (``bshd``) or ``[B|1, H_t|1, S, n]``
    (``bhsd``): broadcastable against x, or, grouped (``H_t`` dividing x's heads), by head ``h // (H / H_t)``."""
    if table.ndim == 3:
        table = table.unsqueeze(2)  # [B|1, S, 1, n]
    return table if layout == "bshd" else table.transpose(1, 2)


def check_table_pair(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, layout: str) -> torch.Tensor:
    """Validate public tables ``[S, r]`` / ``[B, S, r]`` against x; returns them as ``[B|1, S, r]``."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got {getattr(t, 'dtype', type(t))}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.ndim not in (2, 3):
        raise ValueError(f"cos/sin must be [S, r] or [B, S, r], got shape {tuple(cos.shape)}")
    r, head_dim = cos.shape[-1], x.shape[-1]
    if r % 2 or r == 0 or r > head_dim:
        raise ValueError(f"cos/sin width r={r} must be even, > 0 and <= head_dim={head_dim}")
    seq = x.shape[seq_dim(layout)]
    if cos.shape[-2] != seq:
        raise ValueError(f"cos/sin have {cos.shape[-2]} positions, x has S={seq} tokens (layout={layout!r})")
    if cos.ndim == 3 and cos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"cos/sin batch {cos.shape[0]} must be 1 or x's batch {x.shape[0]}")
    return cos


def head_axis(layout: str) -> int:
    return 2 if layout == "bshd" else 1


def check_grouped_heads(what: str, count: int, name: str, heads: int) -> None:
    """Per-head data for ``count`` heads serves a tensor of ``heads`` heads when ``count`` divides ``heads`` (head ``h``
    reads entry ``h // (heads / count)``, as grouped-query attention pairs query heads with key heads)."""
    if count == 0 or heads % count:
        raise ValueError(
            f"{what} are for {count} heads, {name} has {heads} heads: expected {name}'s heads or a divisor of them "
            "(grouped heads: head h uses entry h // (heads / count))"
        )


def check_head_tables(
    cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Public tables, shared or per head, checked against x; returned as ``[B|1, S, H_t, r]`` (``H_t = 1``: shared).

    Accepted: ``[S, r]``, ``[B|1, S, r]`` (shared by the heads), ``[S, H_t, r]``, ``[B|1, S, H_t, r]`` (per head,
    ``H_t`` equal to x's heads or dividing them). A 3-D table is ``[B|1, S, r]`` or ``[S, H_t, r]`` by its shape
    against x; a shape both readings fit, and where they differ (``B = S > 1``, ``S`` dividing the heads), is
    refused with the two 4-D forms that say which is meant.
    """
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got {getattr(t, 'dtype', type(t))}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.ndim not in (2, 3, 4):
        raise ValueError(f"cos/sin must be [S, r], [B, S, r], [S, H, r] or [B, S, H, r], got shape {tuple(cos.shape)}")
    r, head_dim = cos.shape[-1], x.shape[-1]
    if r % 2 or r == 0 or r > head_dim:
        raise ValueError(f"cos/sin width r={r} must be even, > 0 and <= head_dim={head_dim}")
    batch, seq, heads = x.shape[0], x.shape[seq_dim(layout)], x.shape[head_axis(layout)]
    shape = tuple(cos.shape)
    if cos.ndim == 3:
        a, b = shape[:2]
        as_batch = b == seq and a in (1, batch)  # [B|1, S, r]
        as_heads = a == seq and b > 0 and heads % b == 0  # [S, H_t, r]
        if as_batch and as_heads and seq > 1:
            raise ValueError(
                f"cos/sin of shape {shape} read as [B, S, r] and as [S, H, r] both fit x {tuple(x.shape)} "
                f"(layout={layout!r}); pass [B, S, 1, r] (shared by the heads) or [1, S, H, r] (per head)"
            )
        # neither reading fits: read as per-head tables when the first axis is x's tokens, so the error below
        # names the head counts; else as shared ones, and it names the positions or the batch
        per_head = not as_batch and a == seq
        cos, sin = (cos[None], sin[None]) if per_head else (cos[:, :, None], sin[:, :, None])
    elif cos.ndim == 2:
        cos, sin = cos[None, :, None], sin[None, :, None]
    if cos.shape[1] != seq:
        raise ValueError(
            f"cos/sin have {cos.shape[1]} positions (shape {shape}), x has S={seq} tokens (layout={layout!r})"
        )
    if cos.shape[0] not in (1, batch):
        raise ValueError(f"cos/sin batch {cos.shape[0]} (shape {shape}) must be 1 or x's batch {batch}")
    check_grouped_heads(f"cos/sin of shape {shape}", cos.shape[2], "x", heads)
    return cos, sin


def check_qk(q: torch.Tensor, k: torch.Tensor | None, layout: str) -> None:
    check_choice("layout", layout, LAYOUTS)
    check_tensor("q", q, 4)
    if k is None:
        return
    check_tensor("k", k, 4)
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    hq, hk = q.shape[head_axis(layout)], k.shape[head_axis(layout)]
    if hk == 0 and hq > 0:
        raise ValueError(f"k has 0 heads but q has {hq}: k's heads must divide q's (grouped-query attention)")
    if hk and hq % hk:
        raise ValueError(f"k's {hk} heads must divide q's {hq} heads (grouped-query attention)")
    s = seq_dim(layout)
    if (q.shape[0], q.shape[s]) != (k.shape[0], k.shape[s]):
        raise ValueError(
            f"q and k must share batch and sequence length, got q {tuple(q.shape)} and k {tuple(k.shape)} "
            f"(layout={layout!r})"
        )


# device types without float64 (found by trying, once per type, for a device not listed)
_FLOAT64: dict[str, bool] = {"cpu": True, "cuda": True, "meta": True, "mps": False}


def has_float64(device: torch.device) -> bool:
    """Whether tensors on ``device`` can be float64 (Apple's MPS and several NPUs: no)."""
    kind = torch.device(device).type
    if kind not in _FLOAT64:
        try:
            torch.zeros(1, dtype=torch.float64, device=device)
            _FLOAT64[kind] = True
        except (RuntimeError, TypeError):
            _FLOAT64[kind] = False
    return _FLOAT64[kind]


def rope_angles(pos: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotation angle of every plane, computed in float64 (float32 on a device without it).

    Args:
        pos: ``[..., S, n_axes]`` coordinates (any float or int dtype).
        freqs: ``F``, ``[n_axes, n]`` or per head ``[H, n_axes, n]``.

    Returns:
        float64 ``[..., S, n]`` (per head: ``[..., S, H, n]``). For axial F (one
        non-zero per column) each angle is one exactly-rounded float64 product. (Fixed ``F`` on a
        device without float64 goes by :func:`~axial_rope.ops.turns.turn_angles` instead; what reaches
        here there is a learned float32 ``F``, whose angles are float32 products.)
    """
    dtype = torch.float64 if has_float64(pos.device) else torch.float32
    pos = pos.to(dtype)
    freqs = freqs.to(device=pos.device, dtype=dtype)
    if freqs.ndim == 2:
        return pos @ freqs
    return torch.einsum("...sa,han->...shn", pos, freqs)


def plane_cos_sin(
    pos: torch.Tensor,
    freqs: torch.Tensor,
    scale: torch.Tensor | None,
    dtype: torch.dtype,
    turns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plane tables from positions: ``scale * cos(angle)``, ``scale * sin(angle)`` in ``dtype``.

    ``scale`` is the attention factor, float64 ``[n]`` per plane or ``[B|1, S, n]`` per token (or ``None``).
    With ``turns`` (:func:`axial_rope.ops.turns.fixed_turns` of ``F``) the angles are the int64
    fixed-point ones of :func:`~axial_rope.ops.turns.turn_angles` and every step is float32: no
    float64 tensor is made (devices without float64).
    """
    if turns is not None:
        angles = turn_angles(pos, freqs, turns)
    else:
        angles = rope_angles(pos, freqs)
    work = angles.dtype
    cos, sin = angles.cos(), angles.sin()
    if scale is not None:
        scale = scale.to(device=angles.device, dtype=work)
        if scale.ndim == 3 and angles.ndim == 4:  # per token [B|1, S, n] with per-head angles [B|1, S, H, n]
            scale = scale[:, :, None]
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis in float32 (float64 for float64 inputs); returns that dtype."""
    x = x.to(compute_dtype(x))
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(x.dtype)


def qk_norm(x: torch.Tensor, norm, weight: torch.Tensor | None, bias: torch.Tensor | None, layout: str) -> torch.Tensor:
    """One of q, k normalised as the :class:`~axial_rope.ops.norm.QKNorm` ``norm`` says, in float32 (float64 for
    float64 inputs): a fresh tensor of x's shape.

    x ``[B, S, H, D]`` (``bshd``) or ``[B, H, S, D]`` (``bhsd``); ``weight``/``bias`` ``[D]`` (span ``"head"``) or
    ``[H * D]`` (``"heads"``). torch's own fused norms (``F.rms_norm``, ``F.layer_norm``) on the upcast rows, so
    a bfloat16 input is rounded once, after the rotation, by the caller.
    """
    shape = x.shape
    across = norm.span == "heads"
    if across:  # each token's H * D channels as one row [B, S, H * D]
        x = (x if layout == "bshd" else x.transpose(1, 2)).flatten(2)
    dtype = compute_dtype(x)
    x, width = x.to(dtype), (x.shape[-1],)
    weight = None if weight is None else weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    if norm.kind == "layer":
        y = torch.nn.functional.layer_norm(x, width, weight, bias, norm.eps)
    else:
        y = torch.nn.functional.rms_norm(x, width, weight, norm.eps)
        y = y if bias is None else y + bias
    if not across:
        return y
    y = y.unflatten(2, (-1, shape[-1]))  # [B, S, H, D]
    return y if layout == "bshd" else y.transpose(1, 2)


def check_inplace(**targets: torch.Tensor | None) -> None:
    """In-place targets must own their memory: a broadcast (zero-stride) view would be written many times,
    and two targets sharing an element would rotate it twice. (Eager only: compiled code has no addresses.)"""
    present = [(name, x) for name, x in targets.items() if x is not None]
    for name, x in present:
        if any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape)):
            raise ValueError(
                f"inplace=True needs {name} to own every element's memory; got a broadcast view "
                f"(shape {tuple(x.shape)}, strides {tuple(x.stride())})"
            )
    if len(present) == 2 and not torch.compiler.is_compiling():
        (a_name, a), (b_name, b) = present
        shared = overlap(a, b)
        if shared is not False:
            why = "share memory" if shared else "may share memory (their strides differ, so it cannot be ruled out)"
            raise ValueError(
                f"inplace=True with {a_name} and {b_name} that {why} would rotate shared elements twice; "
                "pass disjoint views (e.g. the q and k slices of one qkv buffer) or inplace=False"
            )


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether two strided views share an element: True, False, or None (cannot tell cheaply)."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):  # [first, last] element offsets in the storage
        last = t.storage_offset() + sum(st * (n - 1) for st, n in zip(t.stride(), t.shape))
        return t.storage_offset(), last

    (lo_a, hi_a), (lo_b, hi_b) = span(a), span(b)
    if a.dtype != b.dtype:
        return None if not (hi_a < lo_b or hi_b < lo_a) else False  # offsets in different units: spans only
    if hi_a < lo_b or hi_b < lo_a:
        return False
    if a.shape != b.shape or a.stride() != b.stride():
        return None
    # same geometry, shifted by delta: they share an element iff delta = sum_d i_d stride_d with |i_d| < n_d.
    # With nested strides (each larger than the span of the smaller ones, true of slices of a dense tensor)
    # that representation is unique and the greedy digits find it.
    delta, dims, covered = abs(a.storage_offset() - b.storage_offset()), [], 0
    for st, n in sorted((st, n) for st, n in zip(a.stride(), a.shape) if n > 1):
        if st <= covered:
            return None
        dims.append((st, n))
        covered += st * (n - 1)
    for st, n in reversed(dims):
        delta -= min(delta // st, n - 1) * st
    return delta == 0
