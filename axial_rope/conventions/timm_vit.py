"""timm's ViT RoPE: ``RotaryEmbeddingCat`` (EVA-02 and friends) and ``RotaryEmbeddingMixed`` (RoPE-Mixed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..frequencies import Frequencies
from ..rope import AxialRoPE
from ..scaling import base_inv_freq
from ._registry import Convention, builds_rope, register

__all__ = ["timm_cat", "timm_positions", "eva02", "timm_mixed"]

CAT_SOURCE = "timm 1.0.31 `layers/pos_embed_sincos.py` `RotaryEmbeddingCat` (`build_rotary_pos_embed`)"
EVA_SOURCE = "timm 1.0.31 `models/eva.py` `Eva` (`rope_type='cat'`, `ref_feat_shape`)"
MIXED_SOURCE = "timm 1.0.31 `layers/pos_embed_sincos.py` `RotaryEmbeddingMixed` (`get_mixed_freqs`)"

GRID_TYPES = ("index", "pixel", "centered")


def _bands(dim: int, temperature: float, in_pixels: bool, max_res: int, linear_bands: bool) -> torch.Tensor:
    """timm's ``dim // 4`` bands per axis: the geometric spectrum (float64), or pixel bands as timm rounds them."""
    n = dim // 4
    if not in_pixels:  # temperature ** (-j / n) = theta ** (-2j / d_axis), d_axis = dim / 2
        return base_inv_freq(dim // 2, temperature)
    if linear_bands:  # float32 as timm computes them: up to max_res / 2 * pi rad per unit, too large to re-round
        bands = torch.linspace(1.0, max_res / 2, n, dtype=torch.float32)
    else:
        bands = 2 ** torch.linspace(0, math.log(max_res, 2) - 1, n, dtype=torch.float32)
    return (bands * torch.pi).double()


@builds_rope
def timm_cat(
    dim: int,
    temperature: float = 10000.0,
    *,
    in_pixels: bool = False,
    max_res: int = 224,
    linear_bands: bool = False,
    rotate_half: bool = False,
) -> AxialRoPE:
    """``RotaryEmbeddingCat(dim, ...)`` (``dim`` = head dim): two axes of ``dim / 2`` channels, one band set each.

    ``in_pixels=False``: bands ``temperature ** (-j / (dim / 4))``; ``in_pixels=True``: timm's pixel
    bands ``linspace(1, max_res / 2) * pi`` (or log-spaced). Planes follow timm's grid channels (axis 0
    first); ``rotate_half=True`` is the half pairing. Positions: :func:`timm_positions`.
    """
    if dim % 4:
        raise ValueError(f"timm_cat: dim must be divisible by 4, got {dim!r}")
    bands = _bands(dim, temperature, in_pixels, max_res, linear_bands)
    n = bands.shape[0]
    model = Frequencies.axial([0] * n + [1] * n, torch.cat([bands, bands]), n_axes=2)
    return AxialRoPE.from_frequencies(model, pairing="half" if rotate_half else "interleaved")


def timm_positions(
    feat_shape: Sequence[int],
    *,
    grid_type: str = "index",
    ref_feat_shape: Sequence[int] | None = None,
    grid_offset: float = 0.0,
    grid_indexing: str = "ij",
    normalize_coords: str = "separate",
    dtype=torch.float32,
) -> torch.Tensor:
    """timm's rotary grid (``_build_grid``) in float64, flattened to ``[H * W, 2]`` in timm's channel order.

    ``index``: ``i + grid_offset``; ``pixel``: ``linspace(-1, 1, n)``; ``centered``: ``(i + 1/2 + offset) / m``
    mapped to ``[-1, 1]`` with ``m`` the axis' (``"separate"``), largest or smallest extent; ``ref_feat_shape``
    rescales by ``ref / n`` (EVA); ``grid_indexing="xy"`` makes the channels ``(x, y)``, tokens stay row-major.
    """
    if grid_type not in GRID_TYPES:
        raise ValueError(f"timm_positions: grid_type must be one of {GRID_TYPES}, got {grid_type!r}")
    shape, ref = list(feat_shape), None if ref_feat_shape is None else list(ref_feat_shape)
    if grid_indexing == "xy":
        shape, ref = shape[::-1], None if ref is None else ref[::-1]
    elif grid_indexing != "ij":
        raise ValueError(f"timm_positions: grid_indexing must be 'ij' or 'xy', got {grid_indexing!r}")
    denom = {"separate": shape, "max": [max(shape)] * 2, "min": [min(shape)] * 2}[normalize_coords]
    axes = []
    for a, n in enumerate(shape):
        if grid_type == "pixel":
            t = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
        elif grid_type == "centered":
            t = (torch.arange(n, dtype=torch.float64) + 0.5 + grid_offset) / denom[a]
        else:
            t = torch.arange(n, dtype=torch.float64) + grid_offset
        axes.append(t if ref is None else t / n * ref[a])
    mesh = torch.stack(torch.meshgrid(*axes, indexing=grid_indexing), dim=-1)
    if grid_type == "centered":
        mesh = 2.0 * mesh - 1.0
    return mesh.reshape(-1, 2).to(dtype)


@builds_rope
def eva02(embed_dim: int = 768, num_heads: int = 12, rope_temperature: float = 10000.0, rope_rotate_half: bool = False):
    """EVA-02 (timm ``Eva`` with ``use_rot_pos_emb``): :func:`timm_cat` on the head dim, language-model bands.

    Positions: ``timm_positions(grid, ref_feat_shape=ref)``: the patch grid rescaled to the pretraining grid
    (``ref_feat_shape``, 16 x 16 for the 224 / 14 models). The class token is not rotated.
    """
    return timm_cat(embed_dim // num_heads, rope_temperature, rotate_half=rope_rotate_half)


@builds_rope
def timm_mixed(freqs: torch.Tensor, *, grid_indexing: str = "xy", learnable: bool = False) -> list[AxialRoPE]:
    """One rope per block from ``RotaryEmbeddingMixed.freqs`` ``[2, depth, H, head_dim / 2]``: dense per-head ``F``.

    timm turns plane ``j`` of head ``h`` in block ``b`` by ``t_x * freqs[0, b, h, j] + t_y * freqs[1, b, h, j]``,
    where ``(t_x, t_y)`` are the two channels of its grid: ``(x, y)`` for ``grid_indexing="xy"`` (its
    default), ``(y, x)`` for ``"ij"``. The ropes take ``(y, x)`` positions (:func:`axial_rope.grid`),
    interleaved planes.
    """
    if freqs.ndim != 4 or freqs.shape[0] != 2:
        raise ValueError(f"timm_mixed: freqs must be [2, depth, H, head_dim / 2], got {tuple(freqs.shape)}")
    if grid_indexing not in ("xy", "ij"):
        raise ValueError(f"timm_mixed: grid_indexing must be 'xy' or 'ij', got {grid_indexing!r}")
    order = [1, 0] if grid_indexing == "xy" else [0, 1]  # rows of F for the axes (y, x)
    blocks = freqs.detach().to(torch.float64)[order].permute(1, 2, 0, 3)  # [depth, H, 2, n]
    return [AxialRoPE.from_frequencies(Frequencies(F), pairing="interleaved", learnable=learnable) for F in blocks]


def _mixed_example() -> AxialRoPE:
    gen = torch.Generator().manual_seed(0)
    return timm_mixed(torch.randn(2, 1, 2, 8, generator=gen))[0]


register(
    Convention(
        name="timm_cat",
        family="timm",
        source=CAT_SOURCE,
        axes="two axes of dim/2 in grid-channel order (`xy`: x first); pixel bands too",
        pairing="interleaved or half (`rotate_half`)",
        positions="`timm_positions`: index (+ offset), pixel [-1, 1], centered; `ref_feat_shape` rescale",
        max_diff=9e-06,
        example=lambda: timm_cat(16, 100.0),
    )
)
register(
    Convention(
        name="eva02",
        family="timm",
        source=EVA_SOURCE,
        axes="(y, x): head_dim/2 each, temperature 10000",
        pairing="interleaved",
        positions="patch grid x `ref_feat_shape / grid`; class token unrotated",
        max_diff=6e-08,
        example=lambda: eva02(48, 3),
    )
)
register(
    Convention(
        name="timm_mixed",
        family="timm",
        source=MIXED_SOURCE,
        axes="(y, x) mixed in every plane: learned [2, depth, H, D/2]; per block and head",
        pairing="interleaved",
        positions="integer grid (x, y channels for `xy`)",
        max_diff=4e-07,
        example=_mixed_example,
    )
)
