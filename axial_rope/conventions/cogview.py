"""CogView4 and GLM-Image (Zhipu AI), as diffusers implements them: half of the head on y, half on x, half pairing.

Both tables modules (``CogView4RotaryPosEmbed``, ``GlmImageRotaryPosEmbed``) read the latent image
``[B, C, H, W]`` and return ``(cos, sin)`` ``[h w, D]`` for the image tokens (the text, first, is not
rotated): planes ``0 .. D/4 - 1`` on y and ``D/4 .. D/2 - 1`` on x, each axis its own spectrum
``theta ** (-2i / (D/2))``, channels ``[planes, planes]`` (``rotate_half``). GLM-Image's positions are the
integer token grid; CogView4's a fixed range: token ``i`` of ``n`` sits at ``floor(i L / n)`` with ``L =
rope_axes_dim`` (256), so every resolution spans ``[0, L)``.
"""

from __future__ import annotations

import torch

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, builds_rope, register_diffusers
from .fields import field, size
from .tables import grid_coordinates, grid_positions

__all__ = ["cogview4", "cogview4_positions"]

COGVIEW4_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_cogview4.py` `CogView4RotaryPosEmbed`"
GLM_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_glm_image.py` `GlmImageRotaryPosEmbed`"


@builds_rope
def cogview4(attention_head_dim: int = 40, theta: float = 10000.0) -> AxialRoPE:
    """CogView4's (and GLM-Image's) RoPE from ``attention_head_dim``: ``(y, x)`` with ``D/2`` channels each, half pairing.

    Attention is ``bhsd`` (CogView4) or ``bshd`` (GLM-Image); the text tokens are not rotated.
    """
    if not isinstance(attention_head_dim, int) or attention_head_dim % 4:
        raise ValueError(f"cogview4: attention_head_dim must be an int divisible by 4, got {attention_head_dim!r}")
    return AxialRoPE((attention_head_dim // 2,) * 2, theta=theta, pairing="half")


def _fixed_range(coords: torch.Tensor, span: int, extent: int) -> torch.Tensor:
    """``floor(c L / n)``: the table row CogView4 reads for token coordinate ``c`` of ``n`` (``L = span``); the
    1e-6 keeps a coordinate sized to an exact row (``i / s``, rounded in float64) on that row."""
    return torch.floor(coords * span / extent + 1e-6)


def cogview4_positions(
    height: int, width: int, rope_axes_dim: tuple[int, int] = (256, 256), *, dtype=torch.float32
) -> torch.Tensor:
    """CogView4's token coordinates ``(y, x)`` for an ``height x width`` token grid: ``(floor(i L_y / h),
    floor(j L_x / w))``. Returns ``[h w, 2]``."""
    (ys, xs), _ = grid_coordinates((height, width), None, dtype=torch.float64)
    ys, xs = _fixed_range(ys, rope_axes_dim[0], height), _fixed_range(xs, rope_axes_dim[1], width)
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2).to(dtype)


def _cogview4_positions(config):
    """``(rope, sizing, latent [B, C, H, W])``: unsized, upstream's rows ``floor(i L / n)``; sized, the rows of the
    training grid ``N`` at the sized coordinates, ``floor(c L / N)`` (``"interpolate"`` then gives upstream's
    rows at every size, ``"none"`` continues the training spacing past ``L``)."""
    p, spans = size(config, "patch_size"), tuple(field(config, "rope_axes_dim", (256, 256)))

    def positions(rope, sizing, latent):
        sizes = (latent.shape[2] // p, latent.shape[3] // p)
        axes, scaling = grid_coordinates(sizes, sizing, dtype=torch.float64, device=latent.device)
        extents = sizes if sizing is None else sizing.train_size
        ys, xs = (_fixed_range(c, span, n) for c, span, n in zip(axes, spans, extents))
        pos = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2).float()
        return pos, rope.scaling if sizing is None else scaling

    return positions


def _glm_positions(config):
    p = size(config, "patch_size")

    def positions(rope, sizing, latent):  # latent [B, C, H, W]: the integer token grid
        return grid_positions((latent.shape[2] // p, latent.shape[3] // p), rope, sizing, latent.device)

    return positions


_COMMON = dict(
    rope=lambda c: cogview4(size(c, "attention_head_dim")),  # theta fixed at 10000 upstream
    tables=("module", "rope"),  # the tables module reads the latent image [B, C, H, W]
    grid_axes=(0, 1),
    time_axis=None,
    blocks=("transformer_blocks.",),
)
COGVIEW4_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/cogview4/pipeline_cogview4.py` default: the "
    "transformer's `sample_size` 128 x `vae_scale_factor` 8 (github.com/THUDM/CogView4 README: any 512 <= H, W <= "
    "2048 with H W <= 2^21)"
)
register_diffusers(
    DiffusersFamily(
        name="cogview4",
        classes=("CogView4Transformer2DModel",),
        positions=_cogview4_positions,
        # CogView4TrainingAttnProcessor (packed variable-length batches) stays stock: CogView4RopeProcessor
        # reproduces CogView4AttnProcessor only
        stock=("CogView4AttnProcessor",),
        processor="CogView4RopeProcessor",
        qk_norm="layer",  # CogView4AttnProcessor: norm_q, norm_k (LayerNorm over D, no affine), then apply_rotary_emb
        timing=Timing(noise=1000.0),  # CogView4Pipeline: flow-match timesteps = 1000 sigma
        refused_modes=(("interpolate", "its own rows interpolate already (every size spans `rope_axes_dim` rows, "
                        "floor(i L / n)), so 'interpolate' would leave a grid larger than train_size at the stock "
                        "positions; use 'yarn' or 'ntk' to change them, or 'none' to continue the training "
                        "spacing"),),  # fmt: skip
        max_diff=5e-9,  # float64 models, at the training size; the tables' float32 rounding
        source=COGVIEW4_SOURCE,
        axes="(y, x): D/2, D/2, theta 10000; rows `floor(i rope_axes_dim / n)`",
        **_COMMON,
        trained=(TrainedGrid("CogView4-6B", (1024, 1024), COGVIEW4_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
GLM_IMAGE_TRAINED_SOURCE = "github.com/zai-org/GLM-Image README: the example request's size 1024x1024"
register_diffusers(
    DiffusersFamily(
        name="glm_image",
        classes=("GlmImageTransformer2DModel",),
        positions=_glm_positions,
        stock=("GlmImageAttnProcessor",),
        processor="GlmImageRopeProcessor",
        qk_norm="layer",  # GlmImageAttnProcessor: norm_q, norm_k (LayerNorm over D, no affine), then apply_rotary_emb
        timing=Timing(noise=1000.0),  # GlmImagePipeline passes 1000 sigma - 1
        max_diff=3e-9,
        source=GLM_SOURCE,
        axes="(y, x): D/2, D/2, theta 10000",
        **_COMMON,
        trained=(TrainedGrid("GLM-Image", (1024, 1024), GLM_IMAGE_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
