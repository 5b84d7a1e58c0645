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
from ._registry import (
    Convention,
    DiffusersFamily,
    PipelineUnits,
    TablesProducer,
    TrainedGrid,
    builds_rope,
    register,
    register_diffusers,
)
from .fields import field, size

__all__ = ["ltx_video", "ltx_video_positions", "ltx2", "ltx2_positions", "ltx2_audio_positions", "ltx2_from_config"]

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

LTX_VIDEO_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/ltx/pipeline_ltx.py` default height 512, width "
    "704, num_frames 161 (github.com/Lightricks/LTX-Video README: best under 720 x 1280 and 257 frames); "
    "arXiv:2501.00103"
)
# LTX's coordinates are seconds and pixels, scaled about 0 when sized (interpolation): no grid cells to centre
_NO_NORMALIZE = (("normalize", "its coordinates are seconds and pixels, not a grid of cells to centre; use "
                  "'interpolate' or 'none'"),)  # fmt: skip


def _ltx_video_positions(config):
    """``rope(hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords)`` -> positions ``[B, N,
    3]`` float64 in :func:`ltx_video`'s units (the coordinates before the division by the base grid): the pipeline's
    ``video_coords``, or the token grid times ``rope_interpolation_scale`` and the patch (without it, upstream reads
    the index itself as the fraction of the base). Sized, each axis scaled as LTX-2's, by the forward's token grid
    ``(num_frames, height, width)``."""
    patches, bases = (size(config, "patch_size_t"), size(config, "patch_size"), size(config, "patch_size")), (
        20.0, 2048.0, 2048.0)  # LTXVideoRotaryPosEmbed's base grid, fixed by the transformer  # fmt: skip

    def positions(rope, sizing, hidden_states, num_frames=None, height=None, width=None,
                  rope_interpolation_scale=None, video_coords=None):  # fmt: skip
        device, batch = hidden_states.device, hidden_states.shape[0]
        if video_coords is not None:
            pos = video_coords.transpose(1, 2).to(torch.float64)  # [B, N, 3]
        else:
            steps = [torch.as_tensor(rope_interpolation_scale[a], dtype=torch.float64, device=device) * patches[a]
                     if rope_interpolation_scale is not None else torch.tensor(bases[a], dtype=torch.float64,
                     device=device) for a in range(3)]  # fmt: skip
            axes = [torch.arange(n, dtype=torch.float64, device=device) * s for n, s in zip((num_frames, height,
                    width), steps)]  # fmt: skip
            pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(1, -1, 3).expand(batch, -1, 3)
        if sizing is not None:
            if num_frames is None or height is None or width is None:
                raise ValueError("a sized LTXVideoTransformer3DModel reads its token grid from the forward's "
                                 "num_frames, height and width: pass them (not only video_coords)")  # fmt: skip
            grid = torch.tensor([num_frames, height, width], device=device)
            pos = pos * _interpolation_steps(sizing, device, grid).to(torch.float64)
        return pos, None, rope.pairing

    return positions


register_diffusers(
    DiffusersFamily(
        name="ltx_video",
        classes=("LTXVideoTransformer3DModel",),
        rope=lambda c: ltx_video(size(c, "num_attention_heads"), size(c, "attention_head_dim")),
        # rope(hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords); unscaled, the
        # processors rotate by the model's own tables (its float32 angles, 1e-3 rad at theta pi / 2)
        tables=("module", "rope"),
        positions=_ltx_video_positions,
        layout=lambda cos, sin, pairing: _ltx2_layout(cos, sin, pairing),  # [B, N, H D] over the hidden size
        spectrum=False,  # per-head frequencies: position modes
        refused_modes=_NO_NORMALIZE,
        stock=("LTXVideoAttnProcessor",),
        processor="LTXVideoRopeProcessor",
        qk_norm="rms across heads",  # LTXVideoAttnProcessor: norm_q, norm_k (RMSNorm over H * D), then apply_rotary_emb
        max_diff=3e-8,  # float64 models: upstream's float32 tables, rotated as given
        source=LTX_SOURCE,
        axes="(t, y, x) over the hidden size, per head; the pipeline's frame-rate and VAE scale",
        trained=(TrainedGrid("LTX-Video 0.9", (161, 512, 704), LTX_VIDEO_TRAINED_SOURCE),),
        units=PipelineUnits(32, frames=(8, 1)),
    )
)


def ltx2_from_config(config, modality: str = "video", *, heads: str | None = None, head_dim: int | None = None,
                     max_pos: int | None = None) -> AxialRoPE:
    """One of LTX-2's four ropes from its config, the one reader of its fields (:func:`axial_rope.rope_from_config`
    and the family record): ``modality`` ``"video"`` (``num_attention_heads``, ``attention_head_dim``,
    ``pos_embed_max_pos``, ``base_height``, ``base_width``) or ``"audio"`` (their ``audio_*`` fields; no spatial
    bases); ``heads``, ``head_dim``, ``max_pos`` replace the head-count field, the width and the time base (the
    cross-attention ropes)."""
    audio = modality == "audio"
    prefix = "audio_" if audio else ""
    bases = {} if audio else dict(base_height=size(config, "base_height"), base_width=size(config, "base_width"))
    return ltx2(
        size(config, heads or prefix + "num_attention_heads"), head_dim or size(config, prefix + "attention_head_dim"),
        pos_embed_max_pos=max_pos or size(config, prefix + "pos_embed_max_pos"),
        rope_theta=float(field(config, "rope_theta")), rope_double_precision=bool(field(config, "rope_double_precision")),
        rope_type=field(config, "rope_type"), modality=modality, **bases,
    )  # fmt: skip


def _cross_rope(heads: str):
    def rope(config):  # the cross-attention ropes: time only, `audio_cross_attention_dim` wide, the longer base
        cross = size(config, "audio_cross_attention_dim")
        base = max(size(config, "pos_embed_max_pos"), size(config, "audio_pos_embed_max_pos"))
        return ltx2_from_config(config, "audio", heads=heads, head_dim=cross // size(config, heads), max_pos=base)

    return rope




def _interpolation_steps(sizing, device, grid: torch.Tensor | None = None) -> torch.Tensor:
    """float32 ``[A]``: the spacing :func:`~axial_rope.positions_for_size` gives each axis of a token grid (``grid``,
    default ``sizing.grid``: int ``[A]``): ``1 / max(n / N, 1)`` under ``"interpolate"``, 1 under ``"none"``. Tensor
    ops on the grid, never a host read of it, so one compiled graph serves every size."""
    grid = sizing.grid if grid is None else grid
    train = torch.tensor(sizing.train_size, dtype=torch.float64, device=device)
    factor = (grid.to(device, torch.float64) / train).clamp(min=1.0)  # s_a, as positions_for_size
    interpolated = torch.tensor([m == "interpolate" for m in sizing.mode], device=device)
    return torch.where(interpolated, 1.0 / factor, torch.ones_like(factor)).to(torch.float32)


def _ltx2_positions(n_axes: int):
    """``config -> (rope, sizing, coords [B, A', N, 2], device=None) -> (pos [B, N, n_axes], None)``: the midpoints
    of the patch bounds (seconds, pixels) on the first ``n_axes`` axes; sized, each axis' coordinates scaled as
    :func:`~axial_rope.positions_for_size` scales the token grid's (interpolation: ``n / train``)."""

    def of_config(config):
        def positions(rope, sizing, coords, device=None):
            mid = coords[:, :n_axes].mean(-1) if coords.ndim == 4 else coords[:, :n_axes]  # [B, n_axes, N]
            pos = mid.transpose(1, 2).to(torch.float32)  # [B, N, n_axes]
            if sizing is not None:
                pos = pos * _interpolation_steps(sizing, pos.device)[:n_axes]  # time first: audio and cross-attention
                # ropes follow the video's time
            return pos, None, rope.pairing

        return positions

    return of_config


def _ltx2_layout(cos: torch.Tensor, sin: torch.Tensor, pairing: str):
    """Per-head tables ``[B, N, H, D]`` in the rope's pairing -> upstream's: interleaved ``[B, N, H D]`` over the
    hidden size; ``rope_type="split"`` (half pairing) ``[B, H, N, D/2]``, each half's table once."""
    if pairing == "half":
        return tuple(t[..., : t.shape[-1] // 2].transpose(1, 2) for t in (cos, sin))
    return cos.flatten(-2), sin.flatten(-2)


def _ltx2_grid(config):
    def grid(num_frames, height, width):  # the latent token grid (t, y, x), from the forward's arguments
        if num_frames is None or height is None or width is None:
            raise ValueError("a sized LTX2VideoTransformer3DModel reads its token grid from the forward's "
                             "num_frames, height and width: pass them (not only video_coords)")  # fmt: skip
        p_t, p = size(config, "patch_size_t"), size(config, "patch_size")
        return torch.tensor([-(-num_frames // p_t), -(-height // p), -(-width // p)])

    return grid


LTX2_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/ltx2/pipeline_ltx2.py` default height 512, width "
    "768, num_frames 121 (github.com/Lightricks/LTX-2 README: --num-frames 121); arXiv:2601.03233"
)
register_diffusers(
    DiffusersFamily(
        name="ltx2",
        classes=("LTX2VideoTransformer3DModel",),
        rope=ltx2_from_config,
        tables=("module", "rope"),  # rope(video_coords [B, 3, N, 2]) -> (cos, sin) over the hidden size
        positions=_ltx2_positions(3),
        layout=_ltx2_layout,
        producers=(
            TablesProducer(
                ("module", "audio_rope"),
                lambda c: ltx2_from_config(c, "audio"),
                _ltx2_positions(1),
                _ltx2_layout,
            ),  # audio_coords [B, 1, N, 2]
            TablesProducer(
                ("module", "cross_attn_rope"), _cross_rope("num_attention_heads"), _ltx2_positions(1), _ltx2_layout
            ),  # video_coords[:, :1]: the video's time, for audio-video attention
            TablesProducer(
                ("module", "cross_attn_audio_rope"),
                _cross_rope("audio_num_attention_heads"),
                _ltx2_positions(1),
                _ltx2_layout,
            ),  # audio_coords[:, :1]
        ),  # fmt: skip
        spectrum=False,  # per-head bands of one schedule over the hidden size: position modes
        refused_modes=_NO_NORMALIZE,
        grid=(("num_frames", "height", "width"), _ltx2_grid),
        blocks=("transformer_blocks.",),
        qk_norm="rms across heads",  # LTX2AudioVideoAttnProcessor: norm_q, norm_k (RMSNorm over H * D), then rotation
        # float64 models, tables replaced: 4.8e-5 measured; upstream's angles are float32 products up to theta pi / 2
        max_diff=6e-5,
        source=LTX2_SOURCE,
        axes="(t, y, x) cycled over the hidden size, per head; audio and cross-attention: t; `rope_theta`; "
        "seconds and pixels: no normalize",
        trained=(TrainedGrid("LTX-2", (121, 512, 768), LTX2_TRAINED_SOURCE),),
        units=PipelineUnits(32, frames=(8, 1)),
    )
)


def _refiner_positions(config):
    """SANA-WM's LTX-2 refiner: ``rope(pixel_coords)`` from ``build_rotary_emb_for_absolute_positions`` (a window's
    absolute frames); sized, the window's (y, x) grid comes from the coordinates (tensor ops: no host read) and time
    keeps the absolute frame positions."""
    p = size(config, "patch_size")
    _, f_y, f_x = field(config, "vae_scale_factors")

    def positions(rope, sizing, coords, device=None):
        pos = coords[:, :3].mean(-1).transpose(1, 2).to(torch.float32)  # [B, N, 3] patch midpoints
        if sizing is not None:
            starts = coords[0, 1:, :, 0].amax(-1)  # [2] the last patch's start, in pixels
            cell = torch.tensor([p * f_y, p * f_x], device=starts.device)
            grid = torch.div(starts, cell, rounding_mode="floor") + 1  # [2] the window's (y, x) token grid
            step = _interpolation_steps(sizing, pos.device, grid)
            pos = pos * torch.cat([step.new_ones(1), step])
        return pos, None, rope.pairing

    return positions


SANA_WM_LTX2_REFINER_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/sana_wm/pipeline_sana_wm.py` default 704 x 1280 x "
    "161: the canvas its refiner (`refiner.py`) refines"
)
register_diffusers(
    DiffusersFamily(
        name="sana_wm_ltx2_refiner",
        classes=("SanaWMLTX2RefinerTransformer3DModel",),
        rope=ltx2_from_config,
        # rope(pixel_coords), called by build_rotary_emb_for_absolute_positions for each AR window (and the sink)
        tables=("module", "rope"),
        positions=_refiner_positions,
        layout=_ltx2_layout,
        grid_axes=(1, 2),  # mode sizes (y, x); time is the frames' absolute index in the source video
        spectrum=False,
        refused_modes=_NO_NORMALIZE,
        blocks=("transformer_blocks.",),
        qk_norm="rms across heads",  # SanaWMLTX2*AttnProcessor: norm_q, norm_k (RMSNorm over H * D), then rotation
        max_diff=6e-5,  # float64 models, tables replaced: 3.7e-5 measured (upstream's float32 angles, as LTX-2's)
        source="diffusers 0.42.1 `models/transformers/transformer_sana_wm_refiner.py` "
        "`build_rotary_emb_for_absolute_positions`",
        axes="(t, y, x) cycled over the hidden size, per head (LTX-2's video rope); absolute frame positions; no "
        "normalize",
        trained=(TrainedGrid("SANA-WM LTX-2 refiner", (161, 704, 1280), SANA_WM_LTX2_REFINER_TRAINED_SOURCE),),
        units=PipelineUnits(32),  # time runs in the refiner's chunks, not sized
    )
)
