"""ConsisID (diffusers ``ConsisIDTransformer3DModel``): CogVideoX 1.0's tables, which its pipeline computes.

The pipeline spreads the ``h x w`` latent token grid over the crop of the ``sample_height/p x sample_width/p``
base region that keeps the aspect ratio (``get_resize_crop_region_for_grid``, torch linspace), frames at their
index, and passes ``image_rotary_emb = (cos, sin) [F h w, D]`` (interleaved, CogVideoX's head split); the
stock ``CogVideoXAttnProcessor2_0`` rotates the video tokens by them. Scaled or sized, the adapter replaces the
argument from ``hidden_states`` ``[B, F, C, H, W]`` by the tables of the integer latent grid, as for CogVideoX:
at the base size that is the pipeline's crop (the whole base region); at another size it is the grid the scaling
(or ``mode`` against ``train_size``) is stated for, without the crop's host arithmetic, so one graph serves
every size.
"""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, register_diffusers
from .cogvideox import cogvideox
from .fields import field, size
from .tables import latent_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `pipelines/consisid/pipeline_consisid.py` `_prepare_rotary_positional_embeddings`"


def _rope(config):
    if not field(config, "use_rotary_positional_embeddings", False):
        raise ValueError("ConsisIDTransformer3DModel config: use_rotary_positional_embeddings is False (no RoPE)")
    return cogvideox(size(config, "attention_head_dim"))


CONSISID_TRAINED_SOURCE = "github.com/PKU-YuanGroup/ConsisID README: 49 frames, 720x480 (W x H); arXiv:2411.17440"
register_diffusers(
    DiffusersFamily(
        name="consisid",
        classes=("ConsisIDTransformer3DModel",),
        rope=_rope,
        tables=("argument", "image_rotary_emb"),  # the pipeline's (cos, sin) over the crop grid; ours: integer grid
        positions=latent_positions(lambda c: (1, size(c, "patch_size"), size(c, "patch_size")), channels_first=False),
        stock=("CogVideoXAttnProcessor2_0",),
        processor="CogVideoXRopeProcessor",  # CogVideoX's processor class (attention_processor.py), as stock
        blocks=("transformer_blocks.",),
        qk_norm="layer",  # CogVideoXAttnProcessor2_0: norm_q, norm_k (LayerNorm over D), then apply_rotary_emb
        max_diff=8e-9,  # float64 models, tables replaced: 7.6e-9 measured (the pipeline's float32 tables)
        source=SOURCE,
        axes="(t, y, x): D/4, 3D/8, 3D/8, theta 10000",
        trained=(TrainedGrid("ConsisID", (49, 480, 720), CONSISID_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
