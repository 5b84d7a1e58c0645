"""Cosmos (diffusers ``CosmosRotaryPosEmbed``): half-paired per-axis spectra, NTK-grown bases, time in base frames.

The head splits as ``h = w = 2 floor(D / 6)``, ``t = D - h - w``; axis ``a``'s base is
``10000 * rope_scale[a] ** (d_a / (d_a - 2))`` (NTK's rule, time grown 2x by default) and the planes pair
channel ``i`` with ``i + D/2`` (``apply_rotary_emb(use_real_unbind_dim=-2)``). A video's frame ``i`` sits at
``i * base_fps / fps`` (``base_fps`` 24): a clip at another frame rate is placed on the time scale the model
was trained at. The extra learned absolute embedding (``extra_pos_embed_type="learnable"``) is not RoPE and
stays as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, builds_rope, register_diffusers
from .fields import field, size
from .tables import grid_positions, latent_grid

__all__ = ["cosmos"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_cosmos.py` `CosmosRotaryPosEmbed`"
BASE_FPS = 24  # CosmosRotaryPosEmbed's default; the transformer does not set it


@builds_rope
def cosmos(attention_head_dim: int = 128, rope_scale: Sequence[float] = (2.0, 1.0, 1.0)) -> AxialRoPE:
    """Cosmos from its config: ``(t, y, x)`` with ``D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6)`` channels, half
    pairing, axis bases ``10000 * rope_scale[a] ** (d_a / (d_a - 2))``."""
    d = attention_head_dim
    hw = d // 6 * 2
    dims = (d - 2 * hw, hw, hw)
    if len(tuple(rope_scale)) != 3 or min(dims) <= 2 or any(n % 2 for n in dims):
        raise ValueError(f"cosmos: needs an even head split above 2 per axis and 3 rope_scale values, got "
                         f"attention_head_dim {d!r}, rope_scale {rope_scale!r}")  # fmt: skip
    theta = tuple(10000.0 * s ** (n / (n - 2)) for s, n in zip(rope_scale, dims))
    return AxialRoPE(dims, theta=theta, pairing="half")


def _positions(config):
    patch = tuple(field(config, "patch_size"))

    def positions(rope, sizing, latent, fps=None):
        pos, scaling = grid_positions(latent_grid(latent.shape, patch), rope, sizing, latent.device)
        if fps is not None:  # a video: frames on the base frame rate's time scale
            pos = torch.cat([pos[:, :1] * (BASE_FPS / fps), pos[:, 1:]], dim=1)  # fps: a number or a tensor
        return pos, scaling

    return positions


COSMOS_TRAINED_SOURCE = (
    "github.com/nvidia-cosmos/cosmos-predict2 `cosmos_predict2/datasets/utils.py` VIDEO_RES_SIZE_INFO['720'] (16:9 "
    "1280 x 704), IMAGE_RES_SIZE_INFO['1024'] (16:9 1360 x 768); `configs/base/config_video2world.py` state_t 24 (93 "
    "frames)"
)
register_diffusers(
    DiffusersFamily(
        name="cosmos",
        classes=("CosmosTransformer3DModel",),
        rope=lambda c: cosmos(size(c, "attention_head_dim"), tuple(field(c, "rope_scale"))),
        tables=("module", "rope"),  # CosmosRotaryPosEmbed(hidden_states, fps=fps)
        positions=_positions,
        stock=("CosmosAttnProcessor2_0", "CosmosAttnProcessor2_5"),
        processor="CosmosRopeProcessor",
        qk_norm="rms",  # CosmosAttnProcessor2_0/2_5: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb
        # Cosmos Predict 2 / 2.5 pass timestep = sigma / (sigma + 1) or sigma: 1 at pure noise (Cosmos 1.0's
        # EDM c_noise is no fraction of time: pass set_rope_processors' noise_timestep for a time-dependent scaling there)
        timing=Timing(noise=1.0),
        max_diff=7e-9,  # float64 models, tables replaced: 6.5e-9 measured (upstream float32 tables at 30 fps)
        source=SOURCE,
        axes="(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), bases 10000 `rope_scale` ** (d/(d-2)), half",
        trained=(
            TrainedGrid("Cosmos-Predict2 Video2World 720p", (93, 704, 1280), COSMOS_TRAINED_SOURCE),
            TrainedGrid("Cosmos-Predict2 Text2Image", (1, 768, 1360), COSMOS_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16, frames=(4, 1)),  # Cosmos-Predict2 (Wan's VAE)
    )
)
