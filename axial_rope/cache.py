"""A static key/value cache for one attention layer of a one-axis (language model) transformer.

The cache is preallocated at its full length, so a decoding step has the same shapes
every time and compiles once (gpt-fast's design). Keys are stored *already rotated*:
each key is rotated once, at the position it is written to, and never again. The
cache is passed to :class:`~axial_rope.layers.Attention` explicitly, one per layer.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["KVCache"]


class KVCache(nn.Module):
    """Preallocated keys and values ``[B_max, H_kv, S_max, D]``, written at ``input_pos``.

    Args:
        max_batch_size: the largest batch the cache serves; a smaller batch uses the first rows.
        max_seq_len: number of positions (slots); writing past it raises ``ValueError``.
        num_kv_heads: key/value heads (fewer than query heads for grouped-query attention).
        head_dim: channels per head.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        for name, value in (
            ("max_batch_size", max_batch_size),
            ("max_seq_len", max_seq_len),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        shape = (max_batch_size, num_kv_heads, max_seq_len, head_dim)
        # not persistent: a cache is runtime state, never part of a checkpoint
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        # which slots hold a key and value: attention never sees the others (decoding may skip positions)
        self.register_buffer("filled", torch.zeros(max_seq_len, dtype=torch.bool, device=device), persistent=False)

    def _check(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if input_pos.ndim != 1 or input_pos.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"input_pos must be a 1-D int tensor [S], got {input_pos.dtype} {tuple(input_pos.shape)}")
        expected = (k.shape[0], *self.k.shape[1:2], input_pos.shape[0], self.k.shape[3])
        if tuple(k.shape) != expected or k.shape != v.shape:
            raise ValueError(
                f"k and v must be [B, H_kv, S, D] = {expected} (S = len(input_pos)), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if k.shape[0] > self.max_batch_size:
            raise ValueError(f"batch {k.shape[0]} exceeds the cache's max_batch_size {self.max_batch_size}")
        # a host sync, so only outside torch.compile; generate() checks its lengths up front
        if input_pos.numel() and not torch.compiler.is_compiling():
            lo, hi = int(input_pos.min()), int(input_pos.max())
            if lo < 0 or hi >= self.max_seq_len:
                raise ValueError(
                    f"KVCache overflow: input_pos spans [{lo}, {hi}], the cache holds positions "
                    f"0..{self.max_seq_len - 1} (max_seq_len={self.max_seq_len}); allocate a longer cache"
                )
            if input_pos.unique().numel() != input_pos.numel():
                raise ValueError(f"input_pos writes one slot twice in one update: {input_pos.tolist()}")

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys (rotated) and values at ``input_pos``; return the whole cache for the batch.

        Args:
            input_pos: int ``[S]``, the slots (= positions) of the new tokens.
            k, v: ``[B, H_kv, S, D]``.

        Returns:
            ``k``, ``v`` ``[B, H_kv, S_max, D]`` (views of the cache; unwritten slots hold zeros and
            are marked in :attr:`filled`, which attention uses as its mask).
        """
        self._check(input_pos, k, v)
        b = k.shape[0]
        self.k[:b].index_copy_(2, input_pos, k.to(self.k.dtype))
        self.v[:b].index_copy_(2, input_pos, v.to(self.v.dtype))
        self.filled.index_fill_(0, input_pos, True)
        return self.k[:b], self.v[:b]

    def reset(self) -> None:
        """Empty the cache: zero keys and values, no slot written."""
        self.k.zero_()
        self.v.zero_()
        self.filled.zero_()

    def reset_parameters(self) -> None:
        """The re-initialisation after ``to_empty`` (a cache built on the meta device): an empty cache."""
        self.reset()

    def extra_repr(self) -> str:
        return f"shape={tuple(self.k.shape)}, dtype={self.k.dtype}"
