"""Motif-Video (diffusers ``MotifVideoRotaryPosEmbed``): HunyuanVideo's tables, rotated by Motif's processors."""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, register_diffusers
from .fields import axes_sum, field, size
from .hunyuan import hunyuan_video
from .tables import latent_positions

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_motif_video.py` `MotifVideoRotaryPosEmbed`"

MOTIF_VIDEO_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/motif_video/pipeline_motif_video.py` default "
    "height 736, width 1280, num_frames 121, as the docs' (`motif_video.md`) examples"
)
register_diffusers(
    DiffusersFamily(
        name="motif_video",
        classes=("MotifVideoTransformer3DModel",),
        rope=lambda c: hunyuan_video(axes_sum(c, "rope_axes_dim", "attention_head_dim"), field(c, "rope_theta")),
        tables=("module", "rope"),  # MotifVideoRotaryPosEmbed(hidden_states): the latent video, float64 angles
        positions=latent_positions(lambda c: (size(c, "patch_size_t"), size(c, "patch_size"), size(c, "patch_size"))),
        # self-attention rotates the video tokens' q and k; the text cross-attention rotates the video queries
        stock=("MotifVideoAttnProcessor2_0", "MotifVideoCrossAttnProcessor2_0"),
        processor="MotifVideoRopeProcessor",
        qk_norm="rms",  # MotifVideoAttnProcessor2_0: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb
        max_diff=0.0,  # tables replaced at the training size, measured in float32 (the model cannot run in float64)
        source=SOURCE,
        axes="(t, y, x): `rope_axes_dim`, `rope_theta`",
        trained=(TrainedGrid("Motif-Video-2B", (121, 736, 1280), MOTIF_VIDEO_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
