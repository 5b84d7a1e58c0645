"""HiDream-I1 (diffusers ``HiDreamImageEmbedND``): Flux's per-axis spectra over ids per item, as 2x2 matrices.

The ids are ``[B, S, 3]``: the image's ``(0, y, x)`` first (a non-square image padded to ``max_seq`` with zero
rows), then zero text rows. The tables are rotation matrices ``[B, S, 1, D/2, 2, 2]`` (``[[cos, -sin], [sin,
cos]]`` per interleaved plane); a head wider than the axes (``sum(axes_dims_rope) = D / 2``) rotates its
first half.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import field, kind, size
from .flux import flux
from .tables import ids_positions

__all__ = ["rotation_matrices"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_hidream_image.py` `HiDreamImageEmbedND`"


def rotation_matrices(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved channel tables ``[..., S, D]`` -> one rotation matrix per plane ``[..., S, D/2, 2, 2]``."""
    c, s = cos[..., ::2], sin[..., ::2]
    return torch.stack([c, -s, s, c], dim=-1).unflatten(-1, (2, 2))


def _rope(config):
    axes, head = tuple(field(config, "axes_dims_rope")), size(config, "attention_head_dim")
    if len(axes) != 3 or sum(axes) not in (head, head // 2):
        raise ValueError(
            f"{kind(config)} config: axes_dims_rope {list(axes)} must have 3 entries summing to attention_head_dim "
            f"{head} (or half of it: the first half of the head rotated), as the model's ids have 3 columns"
        )
    return flux(axes)  # HiDreamImageEmbedND(theta=10000)


HIDREAM_IMAGE_TRAINED_SOURCE = (
    "github.com/HiDream-ai/HiDream-I1 `inference.py` RESOLUTION_OPTIONS: 1024 x 1024, 768 x 1360, 1360 x 768, 880 x "
    "1168, 1168 x 880, 1248 x 832, 832 x 1248"
)
register_diffusers(
    DiffusersFamily(
        name="hidream_image",
        classes=("HiDreamImageTransformer2DModel",),
        rope=_rope,
        tables=("module", "pe_embedder"),  # pe_embedder(cat([img_ids, txt_ids], dim=1)): ids [B, S, 3]
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing),
        layout=lambda cos, sin: rotation_matrices(cos, sin).unsqueeze(-4),  # [B, S, 1, D/2, 2, 2]
        grid_axes=(1, 2),
        time_axis=None,
        stock=("HiDreamAttnProcessor",),
        processor="HiDreamRopeProcessor",
        blocks=("double_stream_blocks.", "single_stream_blocks."),
        qk_norm="rms across heads",  # HiDreamAttnProcessor: q_rms_norm, k_rms_norm(_t) (over H * D), then apply_rope
        timing=Timing(argument="timesteps", noise=1000.0),  # the pipeline passes the scheduler's timestep
        max_diff=0.0,
        source=SOURCE,
        axes="(index, y, x): `axes_dims_rope` (the head or its first half), theta 10000",
        trained=(
            TrainedGrid("HiDream-I1", (1024, 1024), HIDREAM_IMAGE_TRAINED_SOURCE),
            TrainedGrid("HiDream-I1", (768, 1360), HIDREAM_IMAGE_TRAINED_SOURCE),
            TrainedGrid("HiDream-I1", (1360, 768), HIDREAM_IMAGE_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16),
    )
)
