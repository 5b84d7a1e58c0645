"""LTX-Video and LTX-2 (Lightricks), as diffusers implements them: one schedule spread over the hidden size.

Both build one table over the whole hidden size ``dim = heads * head_dim`` (not per head) and
rotate q and k before splitting the heads, so head ``h`` turns with planes
``h * D/2 .. (h + 1) * D/2 - 1`` of that table: per-head frequencies. The table's planes cycle
``t, y, x, t, y, x, ...`` through one schedule of ``dim // 6`` frequencies
``theta ** linspace(0, 1) * pi / 2`` (low to high), after ``dim // 2 - 3 (dim // 6)`` unrotated
padding planes. The positions are fractions ``g`` of a base grid, read as ``2 g - 1``: here the
positions are the coordinates before the division (seconds x frames-per-base, pixels) and the
:class:`~axial_rope.frequencies.PositionTransform` applies ``2 / base`` and ``- 1``.

The schedule is rounded to float32 as upstream computes it (the values the checkpoints were
trained with: at angles up to ``theta * pi / 2`` an exact float64 schedule would differ by 1e-3
rad); the angles are float64 products.
"""

from __future__ import annotations

import math

import torch

from ..frequencies import Frequencies, PositionTransform
from ..rope import AxialRoPE
from ._fields import size
from ._registry import Convention, DiffusersFamily, builds_rope, register, register_diffusers

__all__ = ["ltx_video", "ltx_video_positions", "ltx2", "ltx2_positions", "ltx2_audio_positions"]

LTX_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_ltx.py` `LTXVideoRotaryPosEmbed`"
LTX2_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_ltx2.py` `LTX2AudioVideoRotaryPosEmbed`"


def _spread(values: torch.Tensor, n_axes: int, num_heads: int, head_dim: int) -> torch.Tensor:
    """The schedule ``[n]`` laid over the hidden size, cycled through the axes -> per-head ``F`` ``[H, A, D/2]``.

    Global plane ``pad + k * n_axes + a`` (``pad`` leading unrotated planes) gets ``values[k]`` on axis ``a``;
    head ``h`` owns global planes ``h * D/2 .. (h + 1) * D/2 - 1``.
    """
    planes = num_heads * head_dim // 2
    n = values.shape[0]
    pad = planes - n * n_axes
    F = torch.zeros(n_axes, planes, dtype=torch.float64)
    for a in range(n_axes):
        F[a, pad + a :: n_axes] = values
    return F.view(n_axes, num_heads, head_dim // 2).permute(1, 0, 2).contiguous()


def _check_heads(name: str, num_heads: int, head_dim: int, n_axes: int) -> None:
    if not isinstance(num_heads, int) or num_heads <= 0 or not isinstance(head_dim, int) or head_dim % 2:
        raise ValueError(f"{name}: num_attention_heads must be an int > 0 and attention_head_dim even, got "
                         f"{num_heads!r}, {head_dim!r}")  # fmt: skip
    if num_heads * head_dim < 2 * n_axes:
        raise ValueError(f"{name}: the hidden size {num_heads * head_dim} has no plane per axis")


@builds_rope
def ltx_video(
    num_attention_heads: int = 32,
    attention_head_dim: int = 64,
    *,
    base_num_frames: int = 20,
    base_height: int = 2048,
    base_width: int = 2048,
    theta: float = 10000.0,
) -> AxialRoPE:
    """LTX-Video (``LTXVideoTransformer3DModel``) from its config: per-head ``F`` over ``(t, y, x)``, interleaved.

    Schedule (upstream, float32): ``theta ** linspace(0, 1, dim // 6) * pi / 2``, ``dim = heads * head_dim``.
    Positions: :func:`ltx_video_positions` (the ``video_coords`` the model divides by the base sizes).
    """
    _check_heads("ltx_video", num_attention_heads, attention_head_dim, 3)
    n = num_attention_heads * attention_head_dim // 6
    schedule = theta ** torch.linspace(0.0, 1.0, n, dtype=torch.float32)  # log_theta(1) .. log_theta(theta)
    schedule = (schedule * math.pi / 2.0).double()  # rounded as upstream: (f * pi) in float32, / 2 exact
    F = _spread(schedule, 3, num_attention_heads, attention_head_dim)
    bases = (base_num_frames, base_height, base_width)
    transform = PositionTransform(scale=tuple(2.0 / b for b in bases), offset=-1.0)
    return AxialRoPE.from_frequencies(Frequencies(F, transform=transform), pairing="interleaved")


def ltx_video_positions(
    frames: int,
    height: int,
    width: int,
    *,
    frame_rate: float = 25.0,
    vae_temporal_compression: int = 8,
    vae_spatial_compression: int = 32,
    patch_size: int = 1,
    patch_size_t: int = 1,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """LTX-Video's token coordinates for a ``frames x height x width`` token grid (t slowest).

    The pipeline's ``rope_interpolation_scale = (vae_t / frame_rate, vae_s, vae_s)`` times the patch
    sizes: ``t = i * vae_t / frame_rate * p_t``, ``y = i * vae_s * p``, ``x = j * vae_s * p`` (the
    ``video_coords`` of ``LTXVideoRotaryPosEmbed``). float64 by default: they are fractions.

    Returns:
        ``[frames * height * width, 3]``.
    """
    steps = (vae_temporal_compression / frame_rate * patch_size_t, vae_spatial_compression * patch_size,
             vae_spatial_compression * patch_size)  # fmt: skip
    axes = [torch.arange(n, dtype=torch.float64) * s for n, s in zip((frames, height, width), steps)]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3).to(dtype)


@builds_rope
def ltx2(
    num_attention_heads: int = 32,
    attention_head_dim: int = 128,
    *,
    pos_embed_max_pos: int = 20,
    base_height: int = 2048,
    base_width: int = 2048,
    rope_theta: float = 10000.0,
    rope_double_precision: bool = True,
    rope_type: str = "interleaved",
    modality: str = "video",
) -> AxialRoPE:
    """LTX-2 (``LTX2VideoTransformer3DModel``) from its config: per-head bands over the hidden size.

    ``modality="video"``: axes ``(t, y, x)``, positions :func:`ltx2_positions` (patch midpoints in
    seconds and pixels) normalised by ``(pos_embed_max_pos, base_height, base_width)``;
    ``"audio"``: one time axis (use the ``audio_*`` config fields), positions
    :func:`ltx2_audio_positions`. ``rope_type="interleaved"`` pairs channels ``(2j, 2j+1)``;
    ``"split"`` pairs the two halves of each head (half pairing). Schedule:
    ``theta ** linspace(0, 1, dim // (2 n_axes)) * pi / 2``, computed in float64
    (``rope_double_precision``) or float32 and stored in float32, as upstream.
    """
    if modality not in ("video", "audio"):
        raise ValueError(f"ltx2: modality must be 'video' or 'audio', got {modality!r}")
    if rope_type not in ("interleaved", "split"):
        raise ValueError(f"ltx2: rope_type must be 'interleaved' or 'split', got {rope_type!r}")
    n_axes = 3 if modality == "video" else 1
    _check_heads("ltx2", num_attention_heads, attention_head_dim, n_axes)
    n = num_attention_heads * attention_head_dim // (2 * n_axes)
    dtype = torch.float64 if rope_double_precision else torch.float32
    schedule = torch.pow(rope_theta, torch.linspace(0.0, 1.0, n, dtype=dtype))
    schedule = (schedule * math.pi / 2.0).to(torch.float32).double()  # stored in float32 upstream
    F = _spread(schedule, n_axes, num_attention_heads, attention_head_dim)
    bases = (pos_embed_max_pos, base_height, base_width)[:n_axes]
    transform = PositionTransform(scale=tuple(2.0 / b for b in bases), offset=-1.0)
    pairing = "interleaved" if rope_type == "interleaved" else "half"
    return AxialRoPE.from_frequencies(Frequencies(F, transform=transform), pairing=pairing)


def ltx2_positions(
    frames: int,
    height: int,
    width: int,
    *,
    fps: float = 24.0,
    scale_factors: tuple[int, int, int] = (8, 32, 32),
    causal_offset: int = 1,
    patch_size: int = 1,
    patch_size_t: int = 1,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """LTX-2's video token coordinates: the midpoint of each patch's ``[start, end)`` in seconds and pixels.

    For latent sizes ``frames x height x width`` (patches of ``(p_t, p, p)``), latent bounds are scaled
    by the VAE factors; time is shifted by ``causal_offset - scale_factors[0]`` and clamped at 0 (the
    causal first frame), then divided by ``fps``.

    Returns:
        ``[T * H * W, 3]`` with ``T = ceil(frames / p_t)``, ``H = ceil(height / p)``, ``W = ceil(width / p)``.
    """
    patches = (patch_size_t, patch_size, patch_size)
    mids = []
    for a, (n, p, f) in enumerate(zip((frames, height, width), patches, scale_factors)):
        start = torch.arange(0, n, p, dtype=torch.float64)
        bounds = torch.stack([start, start + p]) * f  # [2, n_a] in pixels (frames for time)
        if a == 0:
            bounds = (bounds + causal_offset - f).clamp(min=0) / fps
        mids.append(bounds.mean(0))
    return torch.stack(torch.meshgrid(*mids, indexing="ij"), dim=-1).reshape(-1, 3).to(dtype)


def ltx2_audio_positions(
    frames: int,
    *,
    sampling_rate: int = 16000,
    hop_length: int = 160,
    scale_factor: int = 4,
    causal_offset: int = 1,
    patch_size_t: int = 1,
    shift: int = 0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """LTX-2's audio token times: the midpoint (seconds) of each latent frame's ``[start, end)``.

    Returns:
        ``[ceil(frames / p_t), 1]``.
    """
    latent = torch.arange(shift, frames + shift, patch_size_t, dtype=torch.float64)
    bounds = torch.stack([latent, latent + patch_size_t]) * scale_factor  # mel frames
    seconds = (bounds + causal_offset - scale_factor).clamp(min=0) * hop_length / sampling_rate
    return seconds.mean(0)[:, None].to(dtype)


register(
    Convention(
        name="ltx_video",
        family="ltx",
        source=LTX_SOURCE,
        axes="(t, y, x) cycled over heads x head_dim / 2 planes, `dim % 6 / 2` leading planes unrotated; per head",
        pairing="interleaved",
        positions="frame-rate / patch fractions, `2 / base` then `- 1` (t: 20 frames, y, x: 2048 px)",
        max_diff=0.0005,
        example=lambda: ltx_video(2, 16),
    )
)
register(
    Convention(
        name="ltx2",
        family="ltx",
        source=LTX2_SOURCE,
        axes="(t, y, x) cycled over the hidden size, leading planes unrotated; per-head bands (audio: t)",
        pairing="interleaved or half (`rope_type='split'`)",
        positions="patch midpoints (s, px), `2 / max_pos` then `- 1`",
        max_diff=0.0007,
        example=lambda: ltx2(2, 16, rope_type="split"),
    )
)

register_diffusers(
    DiffusersFamily(
        name="ltx_video",
        classes=("LTXVideoTransformer3DModel",),
        rope=lambda c: ltx_video(size(c, "num_attention_heads"), size(c, "attention_head_dim")),
        # a per-head frequency model with no spectrum to scale; upstream's float32 angles (1e-3 rad at
        # theta * pi / 2): the processors rotate by the model's own tables
        tables=("fixed", "rope"),
        positions=None,
        stock=("LTXVideoAttnProcessor",),
        processor="LTXVideoRopeProcessor",
        max_diff=3e-8,  # float64 models: upstream's float32 tables, rotated as given
        source=LTX_SOURCE,
        axes="(t, y, x) over the hidden size, per head",
    )
)
