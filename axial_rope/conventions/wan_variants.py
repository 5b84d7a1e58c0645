"""Wan's rotary tables in other diffusers models: ``rope(hidden_states)`` returning ``[1, S, 1, D]`` cos and sin
over the latent video's ``(t, y, x)`` grid (copies of ``WanRotaryPosEmbed``). Where a model's attention is Wan's
(``WanAttention`` with ``WanAttnProcessor``, the same code: Wan VACE, Wan Animate, ChronoEdit) our
``WanRopeProcessor`` replaces the stock processor and fuses its RMSNorm across heads with the rotation, as
``SkyReelsV2RopeProcessor`` does for SkyReels-V2 (whose processor, a copy of Wan's, passes its context-parallel config
to cross-attention too); SANA-Video keeps its own (linear attention)."""

from __future__ import annotations

from ..rope import AxialRoPE
from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, register_diffusers
from .fields import field, size
from .tables import latent_positions
from .wan import wan

__all__: list[str] = []

_DIFFUSERS = "diffusers 0.42.1 `models/transformers/"
AXES = "(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000"


def _wan_copy(name: str, classes: tuple[str, ...], stock: tuple[str, ...], source: str, max_diff: float,
              blocks: tuple[str, ...] = ("blocks.",), trained: tuple[TrainedGrid, ...] = (),
              qk_norm: str | None = "rms across heads", processor: str | None = None
              ) -> DiffusersFamily:  # fmt: skip
    return register_diffusers(
        DiffusersFamily(
            name=name,
            classes=classes,
            rope=lambda c: wan(size(c, "attention_head_dim")),  # theta fixed at 10000, as WanRotaryPosEmbed's
            tables=("module", "rope"),  # a copy of WanRotaryPosEmbed(hidden_states): the latent video
            positions=latent_positions(lambda c: tuple(field(c, "patch_size"))),
            layout=lambda cos, sin: (cos[None, :, None], sin[None, :, None]),  # [1, S, 1, D]
            stock=stock,
            processor=processor,
            blocks=blocks,
            qk_norm=qk_norm,  # the stock processors' norm_q, norm_k (RMSNorm over H * D) before the rotation
            max_diff=max_diff,  # float64 models, tables replaced at the training size
            source=source,
            axes=AXES,
            trained=trained,
            units=PipelineUnits(16, frames=(4, 1)),  # Wan's VAE (8 x 8 pixels, 4 frames), (1, 2, 2) patches
        )
    )


SKYREELS_V2_TRAINED_SOURCE = (
    "github.com/SkyworkAI/SkyReels-V2 README model table: 540P 544 * 960 * 97f, 720P 720 * 1280 * 121f"
)
WAN_VACE_TRAINED_SOURCE = (
    "github.com/ali-vilab/VACE README model table: ~ 81 x 480 x 832 (1.3B), ~ 81 x 720 x 1280 (14B)"
)
SANA_VIDEO_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/sana_video/pipeline_sana_video.py` default height "
    "480, width 832, num_frames 81, as the docs' (`sana_video.md`) examples"
)
WAN_ANIMATE_TRAINED_SOURCE = (
    "github.com/Wan-Video/Wan2.2 `wan/configs/wan_animate_14B.py` frame_num 77, `wan/configs/__init__.py` "
    "SUPPORTED_SIZES (animate-14B: 720 x 1280, 1280 x 720)"
)
_wan_copy("skyreels_v2", ("SkyReelsV2Transformer3DModel",), ("SkyReelsV2AttnProcessor",),
          _DIFFUSERS + "transformer_skyreels_v2.py` `SkyReelsV2RotaryPosEmbed`", 0.0,
          processor="SkyReelsV2RopeProcessor",  # SkyReelsV2AttnProcessor: Wan's, the parallel config everywhere
          trained=(TrainedGrid("SkyReels-V2 540P", (97, 544, 960), SKYREELS_V2_TRAINED_SOURCE),
                   TrainedGrid("SkyReels-V2 720P", (121, 720, 1280), SKYREELS_V2_TRAINED_SOURCE)))  # fmt: skip
_wan_copy("wan_vace", ("WanVACETransformer3DModel",), ("WanAttnProcessor",),
          _DIFFUSERS + "transformer_wan_vace.py` (`WanRotaryPosEmbed`)", 0.0, ("blocks.", "vace_blocks."),
          processor="WanRopeProcessor",  # transformer_wan.py's WanAttention and WanAttnProcessor
          trained=(TrainedGrid("Wan2.1-VACE-1.3B", (81, 480, 832), WAN_VACE_TRAINED_SOURCE),
                   TrainedGrid("Wan2.1-VACE-14B", (81, 720, 1280), WAN_VACE_TRAINED_SOURCE)))  # fmt: skip
# Sana-Video: linear attention that rotates the ReLU'd q and k of its numerator by Wan's tables
# (SanaLinearAttnProcessor3_0: norm_q, norm_k over H * D, then F.relu, then the rotation: no norm right before it)
_wan_copy("sana_video", ("SanaVideoTransformer3DModel",), ("SanaLinearAttnProcessor3_0",),
          _DIFFUSERS + "transformer_sana_video.py` `WanRotaryPosEmbed`", 0.0, ("transformer_blocks.",), qk_norm=None,
          trained=(TrainedGrid("SANA-Video 2B 480p", (81, 480, 832), SANA_VIDEO_TRAINED_SOURCE),))  # fmt: skip
_wan_copy("wan_animate", ("WanAnimateTransformer3DModel",), ("WanAttnProcessor",),
          _DIFFUSERS + "transformer_wan_animate.py` `WanRotaryPosEmbed`", 0.0,
          processor="WanRopeProcessor",  # its WanAttnProcessor and WanAttention: copies of transformer_wan.py's
          trained=(TrainedGrid("Wan2.2-Animate-14B", (77, 720, 1280), WAN_ANIMATE_TRAINED_SOURCE),
                   TrainedGrid("Wan2.2-Animate-14B", (77, 1280, 720), WAN_ANIMATE_TRAINED_SOURCE)))  # fmt: skip

CHRONOEDIT_SOURCE = _DIFFUSERS + "transformer_chronoedit.py` `ChronoEditRotaryPosEmbed`"


def _chronoedit_rope(config) -> AxialRoPE:
    d = size(config, "attention_head_dim")
    if d // 3 != 2 * (d // 6):  # its forward splits the tables D - 2 (D//3), D//3, D//3: planes cut apart
        raise ValueError(
            f"ChronoEditTransformer3DModel: attention_head_dim {d} splits its tables into odd sections "
            f"({d - 2 * (d // 3)}, {d // 3}, {d // 3}) that are no rotation; attention_head_dim % 6 must not be 4"
        )
    return wan(d)


def _chronoedit_positions(config):
    """Wan's latent grid, except that a two-frame latent (the input image and the edited one) puts its frames at
    0 and ``rope_temporal_skip_len - 1`` (``[:skip][[0, -1]]`` of the frame table)."""
    patch = tuple(field(config, "patch_size"))
    skip = min(size(config, "rope_temporal_skip_len", 8), size(config, "rope_max_seq_len", 1024))
    grid_of = latent_positions(lambda c: patch)(config)

    def positions(rope, sizing, latent):
        pos, scaling = grid_of(rope, sizing, latent)  # [S, 3]
        if latent.shape[2] == 2:
            pos = pos * pos.new_tensor([skip - 1, 1.0, 1.0])
        return pos, scaling

    return positions


CHRONOEDIT_TRAINED_SOURCE = (
    "diffusers docs `chronoedit.md`: max_area 720 x 1280, num_frames 5 (29 with temporal reasoning); arXiv:2510.04290"
)
register_diffusers(
    DiffusersFamily(
        name="chronoedit",
        classes=("ChronoEditTransformer3DModel",),
        rope=_chronoedit_rope,
        tables=("module", "rope"),  # ChronoEditRotaryPosEmbed(hidden_states): the latent video
        positions=_chronoedit_positions,
        layout=lambda cos, sin: (cos[None, :, None], sin[None, :, None]),  # [1, S, 1, D]
        stock=("WanAttnProcessor",),
        processor="WanRopeProcessor",  # its WanAttnProcessor and WanAttention: copies of transformer_wan.py's
        blocks=("blocks.",),
        qk_norm="rms across heads",  # WanAttnProcessor (transformer_chronoedit.py): RMSNorm over H * D, then rotation
        max_diff=0.0,
        source=CHRONOEDIT_SOURCE,
        axes=AXES + "; 2 frames at 0 and skip - 1",
        trained=(TrainedGrid("ChronoEdit-14B", (29, 720, 1280), CHRONOEDIT_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
