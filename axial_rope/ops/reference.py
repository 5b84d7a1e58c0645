"""The readable specification of RoPE: each plane is a complex number, rotated by multiplication.

Slow and exact (float64 complex arithmetic, cast to the input dtype at the end);
the oracle every other backend is tested against. Never chosen automatically.
"""

from __future__ import annotations

import torch

from .common import rotate_qk_by_tables


def apply_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """Rotate the first ``2n`` channels of ``x`` by the half tables ``cos``/``sin`` ``[..., n]``.

    ``cos``/``sin`` broadcast against ``x[..., :n]``; channels from ``2n`` on pass through.
    """
    n = cos.shape[-1]
    rotated, rest = x[..., : 2 * n], x[..., 2 * n :]
    if pairing == "interleaved":  # plane i = channels (2i, 2i + 1)
        re, im = rotated[..., 0::2], rotated[..., 1::2]
    else:  # "half": plane i = channels (i, i + n)
        re, im = rotated[..., :n], rotated[..., n:]
    z = torch.complex(re.double(), im.double()) * torch.complex(cos.double(), sin.double())
    if pairing == "interleaved":
        out = torch.stack([z.real, z.imag], dim=-1).flatten(-2)
    else:
        out = torch.cat([z.real, z.imag], dim=-1)
    return torch.cat([out.to(x.dtype), rest], dim=-1)


def rotate_qk(q, k, pos, freqs, scale, pairing, layout):
    """Rotate q (and k, if not None) by the angles ``pos @ freqs``; pos ``[B|1, S, n_axes]``."""
    return rotate_qk_by_tables(apply_table, q, k, pos, freqs, scale, pairing, layout, torch.float64)
