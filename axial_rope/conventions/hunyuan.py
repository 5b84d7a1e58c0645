"""Tencent Hunyuan: HunyuanVideo, HunyuanImage (2.1) and Hunyuan-DiT, as diffusers implements them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..positions import crop_grid
from ..rope import AxialRoPE
from ._registry import (
    Convention,
    DiffusersFamily,
    PipelineUnits,
    Timing,
    TrainedGrid,
    builds_rope,
    register,
    register_diffusers,
)
from .fields import axes_sum, field, size
from .tables import frames_grid_positions, grid_coordinates, grid_positions, latent_positions

__all__ = ["hunyuan_video", "hunyuan_image", "hunyuan_dit", "hunyuan_dit_positions", "hunyuan_dit_crop"]

VIDEO_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_hunyuan_video.py` `HunyuanVideoRotaryPosEmbed`"
IMAGE_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_hunyuanimage.py` `HunyuanImageRotaryPosEmbed`"
DIT_SOURCE = (
    "diffusers 0.42.1 `models/embeddings.py` `get_2d_rotary_pos_embed` with "
    "`pipelines/hunyuandit/pipeline_hunyuandit.py` `get_resize_crop_region_for_grid`"
)


@builds_rope
def hunyuan_video(rope_axes_dim: Sequence[int] = (16, 56, 56), rope_theta: float = 256.0) -> AxialRoPE:
    """HunyuanVideo from its config: per-axis spectra over ``(t, y, x)``, interleaved, ``bshd``; text unrotated."""
    return AxialRoPE(tuple(rope_axes_dim), theta=rope_theta, pairing="interleaved")


@builds_rope
def hunyuan_image(rope_axes_dim: Sequence[int] = (64, 64), rope_theta: float = 256.0) -> AxialRoPE:
    """HunyuanImage 2.1 from its config: per-axis spectra over ``(y, x)`` (or ``(t, y, x)``), interleaved.

    Positions are the integer token grid (:func:`axial_rope.grid`); the text tokens, appended after
    the image tokens, are not rotated.
    """
    if len(tuple(rope_axes_dim)) not in (2, 3):
        raise ValueError(f"hunyuan_image: rope_axes_dim must have 2 or 3 entries, got {rope_axes_dim!r}")
    return AxialRoPE(tuple(rope_axes_dim), theta=rope_theta, pairing="interleaved")


@builds_rope
def hunyuan_dit(attention_head_dim: int = 88, theta: float = 10000.0) -> AxialRoPE:
    """Hunyuan-DiT: a head of ``D`` channels, the first ``D / 2`` on x and the last ``D / 2`` on y.

    ``get_2d_rotary_pos_embed`` meshes ``(grid_w, grid_h)`` with ``indexing="xy"``, so its first
    half listens to the column coordinate; each half has its own spectrum ``theta ** (-2i / (D/2))``.
    The positions stay ``(y, x)`` (as :func:`hunyuan_dit_positions` and :func:`axial_rope.crop_grid`
    give them); the per-axis spectrum's x planes come first (``plane_order``), so it scales per axis.
    """
    if not isinstance(attention_head_dim, int) or attention_head_dim % 4:
        raise ValueError(f"hunyuan_dit: attention_head_dim must be divisible by 4, got {attention_head_dim!r}")
    n = attention_head_dim // 4  # planes per axis
    order = [*range(n, 2 * n), *range(n)]  # x's planes, then y's
    return AxialRoPE((attention_head_dim // 2,) * 2, theta=theta, pairing="interleaved", plane_order=order)


def hunyuan_dit_crop(height: int, width: int, base_size: int = 32) -> tuple[tuple[int, int], tuple[int, int]]:
    """The pipeline's crop of a ``height x width`` token grid in the ``base_size`` square (aspect kept, centred).

    ``get_resize_crop_region_for_grid`` of the Hunyuan-DiT pipeline: ``((top, left), (bottom, right))``.
    """
    ratio = height / width
    if ratio > 1:
        resize_h, resize_w = base_size, int(round(base_size / height * width))
    else:
        resize_w, resize_h = base_size, int(round(base_size / width * height))
    top, left = int(round((base_size - resize_h) / 2.0)), int(round((base_size - resize_w) / 2.0))
    return (top, left), (top + resize_h, left + resize_w)


def hunyuan_dit_positions(
    height: int, width: int, base_size: int = 32, *, diffusers_compat: bool = True, dtype=torch.float32
) -> torch.Tensor:
    """Hunyuan-DiT's token coordinates ``(y, x)``: the grid spread over the pipeline's crop.

    ``base_size`` is ``512 // 8 // patch_size`` in the pipeline (32 for patch 2).
    ``diffusers_compat=True`` is diffusers' torch linspace (see :func:`axial_rope.crop_grid`), which the
    published checkpoints run with in diffusers.
    """
    start, stop = hunyuan_dit_crop(height, width, base_size)
    return crop_grid(start, stop, (height, width), diffusers_compat=diffusers_compat, dtype=dtype)


register(
    Convention(
        name="hunyuan_video",
        family="hunyuan",
        source=VIDEO_SOURCE,
        axes="(t, y, x): 16, 56, 56",
        pairing="interleaved",
        positions="integer latent grid; text tokens unrotated",
        max_diff=3e-07,
        example=lambda: hunyuan_video((4, 6, 6)),
    )
)
register(
    Convention(
        name="hunyuan_image",
        family="hunyuan",
        source=IMAGE_SOURCE,
        axes="(y, x): 64, 64 (3-D: t, y, x)",
        pairing="interleaved",
        positions="integer latent grid; text tokens unrotated",
        max_diff=6e-08,
        example=lambda: hunyuan_image((8, 8)),
    )
)
register(
    Convention(
        name="hunyuan_dit",
        family="hunyuan",
        source=DIT_SOURCE,
        axes="(y, x) positions, planes x first: D/2 on x, then D/2 on y",
        pairing="interleaved",
        positions="crop grid of the base square (torch linspace), `hunyuan_dit_positions`",
        max_diff=2e-06,
        example=lambda: hunyuan_dit(16),
    )
)

HUNYUAN_VIDEO_TRAINED_SOURCE = (
    "github.com/Tencent/HunyuanVideo README resolution table: 720p (recommended) 720px1280px129f, 1280px720px129f; "
    "arXiv:2412.03603"
)
register_diffusers(
    DiffusersFamily(
        name="hunyuan_video",
        classes=("HunyuanVideoTransformer3DModel",),
        rope=lambda c: hunyuan_video(axes_sum(c, "rope_axes_dim", "attention_head_dim"), field(c, "rope_theta")),
        tables=("module", "rope"),  # HunyuanVideoRotaryPosEmbed(hidden_states): the latent video
        positions=latent_positions(lambda c: (size(c, "patch_size_t"), size(c, "patch_size"), size(c, "patch_size"))),
        stock=("HunyuanVideoAttnProcessor2_0",),
        processor="HunyuanVideoRopeProcessor",
        qk_norm="rms",  # HunyuanVideoAttnProcessor2_0: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb
        max_diff=3e-9,  # float64 models, unscaled; the tables' float32 rounding
        source=VIDEO_SOURCE,
        axes="(t, y, x): `rope_axes_dim`, `rope_theta`",
        trained=(
            TrainedGrid("HunyuanVideo", (129, 720, 1280), HUNYUAN_VIDEO_TRAINED_SOURCE),
            TrainedGrid("HunyuanVideo", (129, 1280, 720), HUNYUAN_VIDEO_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)


def _crop(height, width, base: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`hunyuan_dit_crop` in tensor ops (``(top, left)``, ``(bottom, right)`` float64 ``[2]``), so symbolic
    sizes stay symbolic: the same float64 arithmetic and round-half-even as Python's ``round``."""
    h, w = (torch.tensor(float(n), dtype=torch.float64, device=device) for n in (height, width))
    tall = h > w
    resize_h = torch.where(tall, torch.full_like(h, base), torch.round(base / w * h))
    resize_w = torch.where(tall, torch.round(base / h * w), torch.full_like(w, base))
    start = torch.round((base - torch.stack([resize_h, resize_w])) / 2.0)
    return start, start + torch.stack([resize_h, resize_w])


def _crop_axis(coords: torch.Tensor, start: torch.Tensor, stop: torch.Tensor, n) -> torch.Tensor:
    """Token coordinates ``c`` of an axis of ``n`` tokens cropped to ``[start, stop)`` -> positions, as the torch
    port lays them: ``linspace(start, stop (n - 1) / n, n)`` at ``c`` (one token: ``stop - start`` per token)."""
    step = (stop * ((n - 1) / n) - start) / (n - 1) if n > 1 else (stop - start) / n
    return start + coords * step


def _hunyuan_dit_positions(config):
    """``(rope, sizing, latent [B, C, H, W])``: unsized, the pipeline's crop grid of the latent's token grid in the
    ``512 // 8 // patch`` square; sized, the crop grid of the training grid at the sized coordinates (the crop
    already spreads every size over the square, so ``"interpolate"`` stays close to stock)."""
    p = size(config, "patch_size")
    base = 512 // 8 // p  # the pipeline's base_size

    def positions(rope, sizing, latent):
        sizes = (latent.shape[2] // p, latent.shape[3] // p)
        axes, scaling = grid_coordinates(sizes, sizing, dtype=torch.float64, device=latent.device)
        grid = sizes if sizing is None else sizing.train_size
        start, stop = _crop(*grid, base, latent.device)
        ys, xs = (_crop_axis(axes[a], start[a], stop[a], grid[a]) for a in range(2))
        pos = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2).float()
        return pos, rope.scaling if sizing is None else scaling

    return positions


HUNYUAN_DIT_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/hunyuandit/pipeline_hunyuandit.py` "
    "SUPPORTED_SHAPE: the 1024 and 1280 px buckets (1:1, 4:3, 3:4, 16:9 1280 x 768, 9:16 768 x 1280); "
    "arXiv:2405.08748 (multi-resolution training)"
)
register_diffusers(
    DiffusersFamily(
        name="hunyuan_dit",
        classes=("HunyuanDiT2DModel", "HunyuanDiT2DControlNetModel"),
        rope=lambda c: hunyuan_dit(size(c, "attention_head_dim")),  # theta 10000 in get_2d_rotary_pos_embed
        # the pipeline's (cos, sin) [S, D] of the crop grid, passed to the transformer and its ControlNets alike
        tables=("argument", "image_rotary_emb"),
        positions=_hunyuan_dit_positions,
        grid_axes=(0, 1),
        time_axis=None,
        stock=("HunyuanAttnProcessor2_0",),
        processor="HunyuanDiTRopeProcessor",
        blocks=("blocks.",),
        qk_norm="layer",  # HunyuanAttnProcessor2_0: norm_q, norm_k (LayerNorm over D, qk_norm=True), then rotation
        timing=Timing(noise=1000.0),  # DDPM timesteps
        max_diff=5e-7,  # float64 models: the pipeline's positions are float32 linspace values (1 ulp at 32)
        source=DIT_SOURCE,
        axes="(y, x): D/2 each, x's planes first, theta 10000; the pipeline's crop grid",
        trained=(
            TrainedGrid("HunyuanDiT v1.2", (1280, 1280), HUNYUAN_DIT_TRAINED_SOURCE),
            TrainedGrid("HunyuanDiT v1.2", (768, 1280), HUNYUAN_DIT_TRAINED_SOURCE),
            TrainedGrid("HunyuanDiT v1.2", (1280, 768), HUNYUAN_DIT_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16),
    )
)

VIDEO15_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_hunyuan_video15.py` `HunyuanVideo15RotaryPosEmbed`"

HUNYUAN_VIDEO15_TRAINED_SOURCE = (
    "github.com/Tencent-Hunyuan/HunyuanVideo-1.5 README: 480p and 720p models, --video_length 121; their 16:9 buckets "
    "(bases 640 and 960, diffusers' `calculate_default_height_width`); arXiv:2511.18870"
)
register_diffusers(
    DiffusersFamily(
        name="hunyuan_video15",
        classes=("HunyuanVideo15Transformer3DModel",),
        rope=lambda c: hunyuan_video(axes_sum(c, "rope_axes_dim", "attention_head_dim"), field(c, "rope_theta")),
        tables=("module", "rope"),  # HunyuanVideo15RotaryPosEmbed(hidden_states): the latent video
        positions=latent_positions(lambda c: (size(c, "patch_size_t"), size(c, "patch_size"), size(c, "patch_size"))),
        stock=("HunyuanVideo15AttnProcessor2_0",),
        processor="HunyuanVideo15RopeProcessor",
        blocks=("transformer_blocks.",),
        qk_norm="rms",  # HunyuanVideo15AttnProcessor2_0: norm_q, norm_k (RMSNorm over D), then rotation
        max_diff=2e-9,  # float64 models, tables replaced: 1.4e-9 measured (the float32 tables)
        source=VIDEO15_SOURCE,
        axes="(t, y, x): `rope_axes_dim`, `rope_theta`",
        trained=(
            TrainedGrid("HunyuanVideo-1.5 480p", (121, 480, 848), HUNYUAN_VIDEO15_TRAINED_SOURCE),
            TrainedGrid("HunyuanVideo-1.5 720p", (121, 720, 1280), HUNYUAN_VIDEO15_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)


def _image_rope(config) -> AxialRoPE:
    axes = axes_sum(config, "rope_axes_dim", "attention_head_dim")
    if len(axes) != 2:
        raise ValueError(
            f"HunyuanImageTransformer2DModel: axial_rope serves the (y, x) configuration (rope_axes_dim of 2), "
            f"got rope_axes_dim {list(axes)}"
        )
    return hunyuan_image(axes, field(config, "rope_theta"))


def _image_positions(config):
    """``rope(hidden_states)``: a latent image ``[B, C, H, W]`` cut by ``patch_size`` ``(p_y, p_x)``."""
    p_y, p_x = field(config, "patch_size")

    def positions(rope, sizing, latent):
        return grid_positions((latent.shape[-2] // p_y, latent.shape[-1] // p_x), rope, sizing, latent.device)

    return positions


HUNYUAN_IMAGE_TRAINED_SOURCE = (
    "github.com/Tencent-Hunyuan/HunyuanImage-2.1 README: 'only supports 2K' (2048 x 2048 for 1:1, 2560 x 1536 for 16:9)"
)
register_diffusers(
    DiffusersFamily(
        name="hunyuan_image",
        classes=("HunyuanImageTransformer2DModel",),
        rope=_image_rope,
        tables=("module", "rope"),  # HunyuanImageRotaryPosEmbed(hidden_states): the latent image
        positions=_image_positions,
        grid_axes=(0, 1),
        time_axis=None,
        stock=("HunyuanImageAttnProcessor",),
        processor="HunyuanVideoRopeProcessor",  # HunyuanImageAttnProcessor: HunyuanVideoAttnProcessor2_0's steps, copied
        qk_norm="rms",  # HunyuanImageAttnProcessor: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb
        max_diff=2e-9,  # float64 models, tables replaced: 1.4e-9 measured (the float32 tables)
        source=IMAGE_SOURCE,
        axes="(y, x): `rope_axes_dim`, `rope_theta`",
        trained=(
            TrainedGrid("HunyuanImage-2.1", (2048, 2048), HUNYUAN_IMAGE_TRAINED_SOURCE),
            TrainedGrid("HunyuanImage-2.1", (1536, 2560), HUNYUAN_IMAGE_TRAINED_SOURCE),
        ),
        units=PipelineUnits(32),
    )
)

FRAMEPACK_SOURCE = (
    "diffusers 0.42.1 `models/transformers/transformer_hunyuan_video_framepack.py` "
    "`HunyuanVideoFramepackRotaryPosEmbed`"
)


def _framepack_positions(config):
    """``rope(frame_indices, height, width, device)``, called for the new frames and each history (the 2x and 4x
    histories' tables are then pooled by the model, as stock): the frames at their indices, ``height x width``
    (latent pixels) cut by the patch."""
    patch = size(config, "patch_size")

    def positions(rope, sizing, frame_indices, height, width, device):
        return frames_grid_positions(frame_indices, height // patch, width // patch, rope, sizing, device)

    return positions


HUNYUAN_VIDEO_FRAMEPACK_TRAINED_SOURCE = (
    "github.com/lllyasviel/FramePack `diffusers_helper/bucket_tools.py` bucket_options[640] (416 x 960 to 960 x 416), "
    "`demo_gradio.py` sections of latent_window_size 9 (33 frames); arXiv:2504.12626"
)
register_diffusers(
    DiffusersFamily(
        name="hunyuan_video_framepack",
        classes=("HunyuanVideoFramepackTransformer3DModel",),
        rope=lambda c: hunyuan_video(axes_sum(c, "rope_axes_dim", "attention_head_dim"), field(c, "rope_theta")),
        tables=("module", "rope"),
        positions=_framepack_positions,
        grid_axes=(1, 2),  # the frame indices are the pipeline's window of history and new frames: (y, x) sized
        stock=("HunyuanVideoAttnProcessor2_0",),
        processor="HunyuanVideoRopeProcessor",  # its processors are HunyuanVideo's (no attn_processors)
        qk_norm="rms",  # HunyuanVideoAttnProcessor2_0: norm_q, norm_k (RMSNorm over D), then rotation
        max_diff=2e-9,  # float64 models, tables replaced: 1.5e-9 measured (the float32 tables)
        source=FRAMEPACK_SOURCE,
        axes="(t, y, x): `rope_axes_dim`, `rope_theta`; t = the pipeline's frame indices",
        trained=(
            TrainedGrid("FramePack (HunyuanVideo)", (33, 416, 960), HUNYUAN_VIDEO_FRAMEPACK_TRAINED_SOURCE),
            TrainedGrid("FramePack (HunyuanVideo)", (33, 960, 416), HUNYUAN_VIDEO_FRAMEPACK_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16),  # time is the sections' frame indices, not sized
    )
)
