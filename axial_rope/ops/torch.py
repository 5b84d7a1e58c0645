"""The fast pure-PyTorch backend: real arithmetic in float32, any device, compile-friendly.

No complex dtypes, no host synchronisation (``.item()``, ``.tolist()``), no
data-dependent control flow, so ``torch.compile(fullgraph=True)`` traces it.
Autograd comes from the elementwise ops themselves, including gradients for
learnable frequencies through the tables.
"""

from __future__ import annotations

import torch

from .common import compute_dtype, rotate_qk_by_tables


def apply_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """Rotate the first ``2n`` channels of ``x`` by half tables ``cos``/``sin`` ``[..., n]``.

    The tables broadcast against ``x[..., :n]``; the arithmetic runs in float32
    (float64 for float64 inputs) and the result is cast back to ``x.dtype``.
    """
    n = cos.shape[-1]
    rotated = x[..., : 2 * n].to(compute_dtype(x))
    if pairing == "interleaved":  # plane i = channels (2i, 2i + 1)
        pairs = rotated.unflatten(-1, (n, 2))
        re, im = pairs[..., 0], pairs[..., 1]
        out = torch.stack((re * cos - im * sin, im * cos + re * sin), dim=-1).flatten(-2)
    else:  # "half": plane i = channels (i, i + n)
        re, im = rotated[..., :n], rotated[..., n:]
        out = torch.cat((re * cos - im * sin, im * cos + re * sin), dim=-1)
    out = out.to(x.dtype)
    if 2 * n == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 2 * n :]), dim=-1)


def rotate_qk(q, k, pos, freqs, scale, pairing, layout):
    """Rotate q (and k, if not None) by the angles ``pos @ freqs``; pos ``[B|1, S, n_axes]``."""
    return rotate_qk_by_tables(apply_table, q, k, pos, freqs, scale, pairing, layout, compute_dtype(q))
