"""Absolute positions added to the token embeddings: fixed sinusoids (Vaswani et al. 2017) or a learned table (GPT-2).

Both add a vector per position to the embedding of the token there, once, before the
first block; attention itself is position-free. A query-key score then depends on both
absolute positions, not only on their difference (the survey table's "relative-distance
invariance": no).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LearnedPositions", "PositionTableError", "SinusoidalPositions", "sinusoids"]


class PositionTableError(ValueError):
    """A position past the end of a learned table: such a model has no vector for it."""


def sinusoids(pos: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(...)``: ``pos [S]`` -> ``[S, dim]`` float32.

    Vaswani et al. 2017, section 3.5. Computed in float64 and rounded once, so a position of
    a million is as exact as float32 allows (the invariance measurement moves positions by 1e6).
    """
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even width, got {dim}")
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)  # [dim/2]
    angle = pos.to(torch.float64)[:, None] * inv[None, :]  # [S, dim/2]
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2).float()  # interleaved sin, cos


class SinusoidalPositions(nn.Module):
    """``x * sqrt(C) + PE(pos)``: the paper scales the embeddings by ``sqrt(d_model)`` before adding PE."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``x [B, S, C]``, ``pos [S]`` (int) -> ``[B, S, C]``."""
        return x * math.sqrt(self.dim) + sinusoids(pos, self.dim).to(x.dtype)


class LearnedPositions(nn.Module):
    """``x + W[pos]`` with ``W [max_seq_len, C]`` learned (GPT-2); a position past the table raises."""

    def __init__(self, max_seq_len: int, dim: int):
        super().__init__()
        self.table = nn.Embedding(max_seq_len, dim)

    def check(self, last: int) -> None:
        """Raise :class:`PositionTableError` unless position ``last`` has a row in the table."""
        size = self.table.num_embeddings
        if last >= size:
            raise PositionTableError(
                f"learned absolute positions hold rows 0..{size - 1} (max_seq_len={size}), asked for position "
                f"{last}: a learned table has no vector past its training length (use a relative scheme, or "
                "train with a longer max_seq_len)"
            )

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``x [B, S, C]``, ``pos [S]`` (int) -> ``[B, S, C]``."""
        if pos.numel() and not torch.compiler.is_compiling():  # a host sync: skipped when compiled
            self.check(int(pos.max()))
        return x + self.table(pos)
