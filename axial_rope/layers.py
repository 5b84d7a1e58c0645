"""Transformer blocks on axial RoPE: the adaLN-Zero DiT block, embedders, patches (attention and its attend records,
re-exported).

Everything positional goes through :class:`~axial_rope.AxialRoPE` (and so through
whichever kernel backend is available); nothing here computes an angle. Tokens are
``x [B, S, C]`` and their coordinates ``pos [S, n_axes]`` or ``[B, S, n_axes]``:
image tokens from ``ar.grid(h, w)``, video tokens from ``ar.grid(t, h, w)``, text
or class tokens from ``ar.text_positions`` (or any coordinates the caller chooses).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .attend import Cached, Sdpa, Sharded, Varlen, attend_record
from .attention import FACTOR_PLACEMENTS, QK_NORMS, Attention, xavier_linear
from .init import deferred_init
from .ops.rotation import QKRotation, Rotation
from .rope import AxialRoPE
from .segments import Segments

__all__ = [
    "Attention",
    "Cached",
    "Varlen",
    "Sdpa",
    "Sharded",
    "DiTBlock",
    "FinalLayer",
    "LabelEmbedder",
    "Mlp",
    "PatchEmbed",
    "TimestepEmbedder",
    "modulate",
    "timestep_embedding",
    "unpatchify",
    "QK_NORMS",
    "FACTOR_PLACEMENTS",
]


class Mlp(nn.Module):
    """``Linear -> GELU(tanh) -> Linear``, the DiT feed-forward."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True):
        super().__init__()
        with deferred_init(self):  # built on meta, then reset_parameters (axial_rope.init)
            self.fc1, self.act, self.fc2 = (
                nn.Linear(dim, hidden_dim, bias=bias),
                nn.GELU("tanh"),
                nn.Linear(hidden_dim, dim, bias=bias),
            )

    def reset_parameters(self) -> None:
        """Xavier-uniform weights, zero biases (DiT's init of its MLP)."""
        xavier_linear(self.fc1)
        xavier_linear(self.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: ``x * (1 + scale) + shift``; x ``[B, S, C]``, shift/scale ``[B, 1, C]`` (or ``[B, S, C]``)."""
    return x * (1 + scale) + shift


def _per_token(mod: torch.Tensor, segments: Segments | None = None, frame: int | None = None) -> torch.Tensor:
    """A modulation ``[B, k C]`` per sample (or ``[B, S, k C]`` per token) -> broadcastable over the tokens.

    With ``frame``, ``mod [B, T, k C]`` holds one row per frame of ``frame`` consecutive tokens (a video
    with a noise level per frame): repeated to ``[B, T * frame, k C]``, the projection computed once per frame.

    In a packed sequence (``segments``: ``x [1, T, C]`` holds ``N`` items) it is one row per item
    ``[N, k C]``, gathered per token: the numbers of a per-token conditioning at ``N / T`` of the
    cost (``index_select``, whose backward is a fast ``index_add_``).
    """
    if segments is not None:
        return mod.index_select(0, segments.segment_ids)[None]  # [1, T, k C]
    if frame is not None:
        if mod.ndim != 3:
            raise ValueError(f"a per-frame conditioning (frame={frame}) is [B, T, C], got {tuple(mod.shape)}")
        return mod.repeat_interleave(frame, dim=1)  # [B, T * frame, k C]
    return mod[:, None] if mod.ndim == 2 else mod


class DiTBlock(nn.Module):
    """Transformer block with adaLN-Zero conditioning (Peebles & Xie 2023) and RoPE attention.

    The conditioning ``c`` yields shift, scale and gate for the attention and MLP
    branches; the modulation projection starts at zero, so the block is the identity
    at initialisation.

    Args:
        dim: width ``C``.
        num_heads: attention heads.
        rope: rotary layout of a head (shared by all blocks of a model), or ``None``.
        mlp_ratio: MLP hidden width over ``dim``.
        **attn_kwargs: passed to :class:`Attention` (``qk_norm``, ``num_kv_heads``, ``factor_placement``, ...).
    """

    def __init__(
        self, dim: int, num_heads: int, rope: AxialRoPE | None = None, *, mlp_ratio: float = 4.0, **attn_kwargs
    ):
        super().__init__()
        with deferred_init(self):
            self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
            self.attn = Attention(dim, num_heads, rope, **attn_kwargs)
            self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
            self.mlp = Mlp(dim, int(dim * mlp_ratio))
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def reset_parameters(self) -> None:
        """DiT's init of a block: the attention's and the MLP's own (xavier), then adaLN-Zero: zero modulation,
        so the gates are 0 and the block starts as the identity."""
        self.attn.reset_parameters()
        self.mlp.reset_parameters()
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        pos: torch.Tensor | None = None,
        *,
        rotation: Rotation | QKRotation | None = None,
        attend: Sdpa | Cached | Varlen | Sharded | None = None,
        rope: AxialRoPE | None = None,
        seq_len: int | Sequence[int] | None = None,
        frame: int | None = None,
        **attend_options,
    ) -> torch.Tensor:
        """x ``[B, S, C]``, conditioning c ``[B, C]`` (or per token ``[B, S, C]``, or per frame ``[B, T, C]``
        with ``frame`` tokens per frame, ``S = T * frame``); pos (or rotation), ``rope``, ``seq_len`` and ``attend``
        go to the attention (:meth:`Attention.forward`), ``attend`` as one record or in its keyword form
        (``attend_options``: ``mask``, ``cache``, ``input_pos``, ``cache_write``, ``context_parallel``, ``segments``).

        Sharded (:class:`~axial_rope.attend.Sharded`): ``x`` and ``pos`` are this rank's shard ``[B, L, C]`` and
        ``c`` is the same on every rank of the group; only attention communicates. Packed
        (:class:`~axial_rope.attend.Varlen`): ``x [1, T, C]`` is a packed sequence of ``N`` items, ``c [N, C]`` one
        conditioning per item, and attention stays within each item.
        """
        attend = attend_record(attend, **attend_options)
        segments = attend.segments if isinstance(attend, Varlen) else None  # one conditioning row per item
        mods = _per_token(self.adaLN_modulation(c), segments, frame).chunk(6, dim=-1)  # each [B, 1 | S, C]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
        h = modulate(self.norm1(x), shift_msa, scale_msa)
        x = x + gate_msa * self.attn(h, pos, rotation=rotation, attend=attend, rope=rope, seq_len=seq_len)
        return x + gate_mlp * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm and a linear map from ``C`` to one patch of output ``prod(patch) * out_channels``.

    Starts at zero (DiT's initialisation), so an untrained model predicts zeros.
    """

    def __init__(self, dim: int, patch_size: int | Sequence[int], out_channels: int, *, n_axes: int = 2):
        super().__init__()
        patch = _patch_tuple(patch_size, n_axes)
        with deferred_init(self):
            self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
            self.linear = nn.Linear(dim, math.prod(patch) * out_channels)
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def reset_parameters(self) -> None:
        """Zero modulation and zero projection (DiT's init): an untrained model predicts zeros."""
        for layer in (self.linear, self.adaLN_modulation[-1]):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(
        self, x: torch.Tensor, c: torch.Tensor, *, segments: Segments | None = None, frame: int | None = None
    ) -> torch.Tensor:
        """x ``[B, S, C]``, c ``[B, C]`` -> ``[B, S, prod(patch) * out_channels]`` (packed, per frame: see
        :class:`DiTBlock`)."""
        shift, scale = _per_token(self.adaLN_modulation(c), segments, frame).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of (possibly fractional) timesteps: t ``[B]`` -> float32 ``[B, dim]`` (cos, then sin)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]  # [B, half]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return F.pad(emb, (0, dim % 2))  # odd dim: one zero channel


class TimestepEmbedder(nn.Module):
    """Diffusion timestep ``t [B]`` -> vector ``[B, C]``: sinusoidal features through a two-layer MLP."""

    def __init__(self, dim: int, frequency_embedding_size: int = 256, *, init_std: float = 0.02):
        super().__init__()
        self.frequency_embedding_size, self.init_std = frequency_embedding_size, init_std
        with deferred_init(self):
            self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, dim), nn.SiLU(), nn.Linear(dim, dim))

    def reset_parameters(self) -> None:
        """MLP weights from ``N(0, init_std)`` (DiT: 0.02), zero biases."""
        for layer in (self.mlp[0], self.mlp[2]):
            nn.init.normal_(layer.weight, std=self.init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freq = timestep_embedding(t, self.frequency_embedding_size)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels ``[B]`` -> vectors ``[B, C]``, with label dropout for classifier-free guidance.

    With ``dropout_prob > 0`` the table has one extra row, the null label ``num_classes``:
    in training each label is replaced by it with probability ``dropout_prob``; at sampling
    the unconditional branch passes ``null_label`` (or ``force_drop_ids``).

    Args:
        init_std: std of the table's normal initialisation (DiT: 0.02; tiny models trained
            for a few hundred steps learn the classes faster from 1.0).
    """

    def __init__(self, num_classes: int, dim: int, dropout_prob: float = 0.1, *, init_std: float = 0.02):
        super().__init__()
        if not 0 <= dropout_prob < 1:
            raise ValueError(f"dropout_prob must be in [0, 1), got {dropout_prob!r}")
        self.num_classes, self.dropout_prob, self.init_std = num_classes, dropout_prob, init_std
        with deferred_init(self):
            self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)

    def reset_parameters(self) -> None:
        """The table from ``N(0, init_std)``, the null label's row included."""
        nn.init.normal_(self.embedding_table.weight, std=self.init_std)

    @property
    def null_label(self) -> int:
        return self.num_classes

    def token_drop(self, labels: torch.Tensor, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Replace dropped labels by the null label; ``force_drop_ids [B]`` (1 = drop) replaces chance."""
        if self.dropout_prob == 0:
            raise ValueError("label dropout needs dropout_prob > 0 (the table has no null label)")
        if force_drop_ids is None:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop = force_drop_ids == 1
        return torch.where(drop, self.null_label, labels)

    def forward(self, labels: torch.Tensor, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if (self.training and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


def _patch_tuple(patch_size: int | Sequence[int], n_axes: int) -> tuple[int, ...]:
    patch = (patch_size,) * n_axes if isinstance(patch_size, int) else tuple(patch_size)
    if len(patch) not in (2, 3) or any(not isinstance(p, int) or p <= 0 for p in patch):
        raise ValueError(
            f"patch_size must be a positive int or 2 or 3 positive ints (y, x) / (t, y, x), got {patch_size!r}"
        )
    return patch


class PatchEmbed(nn.Module):
    """Cut a latent into non-overlapping patches and project each to ``dim``: images or video.

    Args:
        patch_size: ``p`` or ``(p_y, p_x)`` for images ``[B, C, H, W]``; ``(p_t, p_y, p_x)``
            for video ``[B, C, T, H, W]``.
        in_channels: latent channels ``C``.
        dim: token width.
    """

    def __init__(self, patch_size: int | Sequence[int], in_channels: int, dim: int, *, bias: bool = True):
        super().__init__()
        self.patch_size = _patch_tuple(patch_size, 2)
        conv = nn.Conv2d if len(self.patch_size) == 2 else nn.Conv3d
        with deferred_init(self):
            self.proj = conv(in_channels, dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def reset_parameters(self) -> None:
        """Xavier-uniform of the kernel seen as a linear map ``[dim, C * prod(patch)]`` (as DiT), zero bias."""
        dim = self.proj.out_channels
        nn.init.xavier_uniform_(self.proj.weight.view(dim, -1))
        if self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """x ``[B, C, *sizes]`` -> tokens ``[B, S, dim]`` (first axis slowest, as ``ar.grid``) and the token grid."""
        n = len(self.patch_size)
        if x.ndim != n + 2:
            raise ValueError(f"x must be {n + 2}-D [B, C, {'T, ' if n == 3 else ''}H, W], got shape {tuple(x.shape)}")
        sizes = tuple(x.shape[2:])
        if any(s % p for s, p in zip(sizes, self.patch_size)):
            raise ValueError(f"input sizes {sizes} must be divisible by the patch size {self.patch_size}")
        y = self.proj(x)  # [B, dim, *grid]
        return y.flatten(2).transpose(1, 2), tuple(y.shape[2:])


def unpatchify(
    x: torch.Tensor, grid: Sequence[int], patch_size: int | Sequence[int], out_channels: int
) -> torch.Tensor:
    """Inverse of :class:`PatchEmbed`'s layout: ``[B, S, prod(patch) * C]`` -> ``[B, C, *(grid * patch)]``.

    Each token's channels are ordered ``(*patch, C)``, as :class:`FinalLayer` produces them.
    """
    grid = tuple(grid)
    patch = _patch_tuple(patch_size, len(grid))
    n = len(grid)
    if len(patch) != n or x.shape[1] != math.prod(grid) or x.shape[2] != math.prod(patch) * out_channels:
        raise ValueError(
            f"x {tuple(x.shape)} does not match grid {grid}, patch {patch} and out_channels {out_channels}"
        )
    x = x.reshape(x.shape[0], *grid, *patch, out_channels)  # [B, *grid, *patch, C]
    # interleave each grid axis with its patch axis: [B, C, g0, p0, g1, p1, ...]
    order = [0, 2 * n + 1] + [i for a in range(n) for i in (1 + a, 1 + n + a)]
    return x.permute(order).reshape(x.shape[0], out_channels, *(g * p for g, p in zip(grid, patch)))
