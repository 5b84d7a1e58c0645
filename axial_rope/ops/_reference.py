"""The readable specification of RoPE: each plane is a complex number, turned by multiplication.

Slow and exact, and independent of the fast paths on purpose: it computes its own
angles (float64 sums of ``pos[a] * F[a, j]``), its own RMSNorm, and rotates with
complex128 arithmetic, casting to the input dtype once at the end. It shares only
argument checks with the other backends, so a bug in their table or angle code
cannot hide in the oracle every test compares them with. Never chosen automatically.
"""

from __future__ import annotations

import torch

from .backend import Call


def _planes(x: torch.Tensor, n: int, pairing: str) -> torch.Tensor:
    """The first ``2n`` channels of x as ``n`` complex128 planes ``[..., n]``."""
    if pairing == "interleaved":  # plane j = channels (2j, 2j + 1)
        re, im = x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2]
    else:  # "half": plane j = channels (j, j + n)
        re, im = x[..., :n], x[..., n : 2 * n]
    # copies, also from float64: torch.complex saves its inputs, which must not be views of an
    # x that an in-place caller overwrites afterwards
    return torch.complex(re.to(torch.float64, copy=True), im.to(torch.float64, copy=True))


def _channels(z: torch.Tensor, pairing: str) -> torch.Tensor:
    """Planes ``[..., n]`` back to the pairing's ``2n`` real channels (float64)."""
    if pairing == "interleaved":
        return torch.view_as_real(z).flatten(-2)
    return torch.cat([z.real, z.imag], dim=-1)


def _turn(x: torch.Tensor, turn: torch.Tensor, pairing: str) -> torch.Tensor:
    """x with its planes multiplied by ``turn`` (complex, broadcastable to ``[..., n]``); the rest passes."""
    n = turn.shape[-1]
    rotated = _channels(_planes(x, n, pairing) * turn, pairing)
    return torch.cat([rotated.to(x.dtype), x[..., 2 * n :]], dim=-1)


def _turn_heads(x: torch.Tensor, turn: torch.Tensor, pairing: str, layout: str) -> torch.Tensor:
    """:func:`_turn` with turns for ``H_t`` heads (``1``, x's ``H``, or grouped: a divisor, head ``h`` by turn
    ``h // (H / H_t)``): grouped, x is seen as ``H_t`` groups of ``H / H_t`` heads that share their group's turn."""
    axis = 2 if layout == "bshd" else 1
    groups, heads = turn.shape[axis], x.shape[axis]
    if groups in (1, heads):
        return _turn(x, turn, pairing)
    out = _turn(x.unflatten(axis, (groups, heads // groups)), turn.unsqueeze(axis + 1), pairing)
    return out.flatten(axis, axis + 1)


def _turns(pos, freqs, scale, layout: str) -> torch.Tensor:
    """``scale * exp(i angle)`` per token and plane, shaped to broadcast against q in ``layout``.

    pos ``[B|1, S, A]``, freqs ``[A, n]`` or ``[H_F, A, n]`` -> ``[B|1, S, 1|H_F, n]`` (``bshd``)
    or ``[B|1, 1|H_F, S, n]`` (``bhsd``).
    """
    pos = pos.double()[:, :, None, :, None]  # [B|1, S, 1, A, 1]
    freqs = freqs.double()
    freqs = freqs[None] if freqs.ndim == 2 else freqs  # [1|H, A, n]
    angle = (pos * freqs).sum(-2)  # [B|1, S, 1|H, n]: for axial F, one exact product per plane
    magnitude = torch.ones_like(angle) if scale is None else scale.double().expand_as(angle)
    turn = torch.polar(magnitude, angle)
    return turn if layout == "bshd" else turn.transpose(1, 2)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.double()
    y = x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def _qk_norm(x: torch.Tensor, norm, weight, bias, layout: str) -> torch.Tensor:
    """x normalised in float64 as ``norm`` (a QKNorm) says: over each head's D channels, or a token's H * D."""
    rows = x.double()
    if norm.span == "heads":  # the token's heads side by side: [B, S, H * D]
        rows = (rows if layout == "bshd" else rows.transpose(1, 2)).flatten(2)
    if norm.kind == "layer":  # biased variance, as torch.nn.LayerNorm
        centred = rows - rows.mean(-1, keepdim=True)
        y = centred / torch.sqrt(centred.square().mean(-1, keepdim=True) + norm.eps)
        y = y if weight is None else y * weight.double()
    else:
        y = _rms_norm(rows, weight, norm.eps)
    y = y if bias is None else y + bias.double()
    if norm.span == "heads":
        y = y.unflatten(2, (-1, x.shape[-1]))
        y = y if layout == "bshd" else y.transpose(1, 2)
    return y


class ReferenceBackend:
    name = "reference"

    def supports(self, call: Call) -> str | None:
        if call.device.type == "mps":
            return "MPS has no float64, which the reference computes in"
        return None

    def rotate_table(self, x, cos, sin, pairing, layout, *, inplace):
        out = _turn_heads(x, torch.complex(cos.double(), sin.double()), pairing, layout)
        return x.copy_(out) if inplace else out

    def rotate_qk(self, q, k, pos, freqs, scale, pairing, layout, *, inplace):
        turn = _turns(pos, freqs, scale, layout)
        q_out = _turn_heads(q, turn, pairing, layout)
        k_out = None if k is None else _turn_heads(k, turn, pairing, layout)
        if inplace:
            return q.copy_(q_out), (None if k is None else k.copy_(k_out))
        return q_out, k_out

    def norm_rotate_qk(self, q, k, q_weight, k_weight, eps, pos, freqs, scale, pairing, layout):
        turn = _turns(pos, freqs, scale, layout)
        q_out = _turn_heads(_rms_norm(q, q_weight, eps), turn, pairing, layout)
        k_out = _turn_heads(_rms_norm(k, k_weight, eps), turn, pairing, layout)
        return q_out.to(q.dtype), k_out.to(k.dtype)

    def norm_rotate_table(self, q, k, norm, cos, sin, pairing, layout):
        turn = torch.complex(cos.double(), sin.double())
        q_out = _turn(_qk_norm(q, norm, norm.q_weight, norm.q_bias, layout), turn, pairing)
        k_out = _turn(_qk_norm(k, norm, norm.k_weight, norm.k_bias, layout), turn, pairing)
        return q_out.to(q.dtype), k_out.to(k.dtype)


BACKEND = ReferenceBackend()
