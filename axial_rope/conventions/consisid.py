"""ConsisID (diffusers ``ConsisIDTransformer3DModel``): CogVideoX 1.0's tables, which its pipeline computes.

The pipeline spreads the ``h x w`` latent token grid over the crop of the ``sample_height/p x sample_width/p``
base region that keeps the aspect ratio (``get_resize_crop_region_for_grid``, torch linspace), frames at their
index, and passes ``image_rotary_emb = (cos, sin) [F h w, D]`` (interleaved, CogVideoX's head split); the
stock ``CogVideoXAttnProcessor2_0`` rotates the video tokens by them. The adapter replaces the argument from
``hidden_states`` ``[B, F, C, H, W]``: with a fixed ``scaling``, at the same positions; sized with ``mode``,
the integer latent grid is sized against ``train_size`` instead (as for EasyAnimate).
"""

from __future__ import annotations

from ._fields import field, size
from ._registry import DiffusersFamily, register_diffusers
from ._tables import grid_positions
from .cogvideox import cogvideox, cogvideox_positions
from .easyanimate import easyanimate_crop

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `pipelines/consisid/pipeline_consisid.py` `_prepare_rotary_positional_embeddings`"


def _rope(config):
    if not field(config, "use_rotary_positional_embeddings", False):
        raise ValueError("ConsisIDTransformer3DModel config: use_rotary_positional_embeddings is False (no RoPE)")
    return cogvideox(size(config, "attention_head_dim"))


def _positions(config):
    p = size(config, "patch_size")
    base = (size(config, "sample_height") // p, size(config, "sample_width") // p)

    def positions(rope, sizing, latent):  # latent [B, F, C, H, W]
        frames, height, width = latent.shape[1], latent.shape[3] // p, latent.shape[4] // p
        if sizing is not None:
            return grid_positions((frames, height, width), rope, sizing, latent.device)
        crops = easyanimate_crop(height, width, *base)
        return cogvideox_positions(frames, height, width, crops).to(latent.device), rope.scaling

    return positions


register_diffusers(
    DiffusersFamily(
        name="consisid",
        classes=("ConsisIDTransformer3DModel",),
        rope=_rope,
        tables=("argument", "image_rotary_emb"),  # the pipeline's (cos, sin) over the crop grid
        positions=_positions,
        stock=("CogVideoXAttnProcessor2_0",),
        blocks=("transformer_blocks.",),
        max_diff=8e-9,  # float64 models, tables replaced: 7.6e-9 measured (the pipeline's float32 tables)
        source=SOURCE,
        axes="(t, y, x): D/4, 3D/8, 3D/8, theta 10000",
    )
)
