"""The rotation contract written out for tests: complex numbers in float64, from a rotation's fields alone.

Shared by the tests of queries and keys turned differently (``QKRotation``) and of per-head tables and per-head
``F``; it shares no code with the backends, so a bug in their angle, grouping or table code cannot hide in it.
"""

from __future__ import annotations

import torch

from axial_rope.ops import Rotation


def planes(x: torch.Tensor, n: int, pairing: str) -> torch.Tensor:
    """The first ``2n`` channels of x ``[..., D]`` as ``n`` complex128 planes."""
    x = x.double()
    if pairing == "interleaved":
        return torch.complex(x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2])
    return torch.complex(x[..., :n], x[..., n : 2 * n])


def channels(z: torch.Tensor, pairing: str) -> torch.Tensor:
    return torch.view_as_real(z).flatten(-2) if pairing == "interleaved" else torch.cat([z.real, z.imag], -1)


def head_turns(rotation: Rotation, heads: int) -> torch.Tensor:
    """``attention_factor * exp(i pos @ F_h)`` per token, head and plane ``[B|1, S, heads, n]`` (float64).

    Head ``h`` of ``heads`` takes ``F[h // (heads / H_F)]`` (per-head F) or the shared F.
    """
    pos, freqs, factor = rotation.pos.double(), rotation.freqs.double(), rotation.attention_factor
    n = freqs.shape[-1]
    per_head = freqs if freqs.ndim == 3 else freqs[None]
    group = heads // per_head.shape[0]
    f = torch.stack([per_head[h // group] for h in range(heads)])  # [heads, R, n]
    angle = torch.einsum("bsr,hrn->bshn", pos, f)
    amp = torch.ones(n, dtype=torch.float64) if factor is None else factor.double()
    amp = amp.reshape(*amp.shape[:-1], 1, n) if amp.ndim == 3 else amp  # per token [B|1, S, 1, n] or [n]
    return torch.polar(amp.expand_as(angle).contiguous(), angle)


def oracle(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x ``[B, S, H, D]`` turned as the contract says (float64; channels past ``2n`` pass through)."""
    n = rotation.freqs.shape[-1]
    z = planes(x, n, rotation.pairing) * head_turns(rotation, x.shape[2])
    return torch.cat([channels(z, rotation.pairing), x[..., 2 * n :].double()], -1)


def table_oracle(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """x ``[B, S, H, D]`` turned by channel tables ``[B|1, S, H_t, r]`` (head h by table head ``h // (H / H_t)``)."""
    r = cos.shape[-1]
    group = x.shape[2] // cos.shape[2]
    index = torch.arange(x.shape[2]) // group
    c, s = (t.double()[:, :, index] for t in (cos, sin))  # [B|1, S, H, r]
    c = c[..., 0::2] if pairing == "interleaved" else c[..., : r // 2]
    s = s[..., 0::2] if pairing == "interleaved" else s[..., : r // 2]
    z = planes(x, r // 2, pairing) * torch.complex(c, s)
    return torch.cat([channels(z, pairing), x[..., r:].double()], -1)


def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``q . k`` per sample, query head, query token and key token ``[B, H, S_q, S_k]`` (float64; k's heads grouped)."""
    k = k.double().repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    return torch.einsum("bshd,bthd->bhst", q.double(), k)
