"""Wan's rotary tables in other diffusers models: ``rope(hidden_states)`` returning ``[1, S, 1, D]`` cos and sin
over the latent video's ``(t, y, x)`` grid (copies of ``WanRotaryPosEmbed``), rotated by the models' own
processors (no fused processor: ``processor=None``)."""

from __future__ import annotations

from ..rope import AxialRoPE
from ._fields import field, size
from ._registry import DiffusersFamily, register_diffusers
from ._tables import latent_positions
from .wan import wan

__all__: list[str] = []

_DIFFUSERS = "diffusers 0.42.1 `models/transformers/"
AXES = "(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000"


def _wan_copy(name: str, classes: tuple[str, ...], stock: tuple[str, ...], source: str, max_diff: float,
              blocks: tuple[str, ...] = ("blocks.",)) -> DiffusersFamily:  # fmt: skip
    return register_diffusers(
        DiffusersFamily(
            name=name,
            classes=classes,
            rope=lambda c: wan(size(c, "attention_head_dim")),  # theta fixed at 10000, as WanRotaryPosEmbed's
            tables=("module", "rope"),  # a copy of WanRotaryPosEmbed(hidden_states): the latent video
            positions=latent_positions(lambda c: tuple(field(c, "patch_size"))),
            layout=lambda cos, sin: (cos[None, :, None], sin[None, :, None]),  # [1, S, 1, D]
            stock=stock,
            blocks=blocks,
            max_diff=max_diff,  # float64 models, tables replaced at the training size
            source=source,
            axes=AXES,
        )
    )


_wan_copy("skyreels_v2", ("SkyReelsV2Transformer3DModel",), ("SkyReelsV2AttnProcessor",),
          _DIFFUSERS + "transformer_skyreels_v2.py` `SkyReelsV2RotaryPosEmbed`", 0.0)  # fmt: skip
_wan_copy("wan_vace", ("WanVACETransformer3DModel",), ("WanAttnProcessor",),
          _DIFFUSERS + "transformer_wan_vace.py` (`WanRotaryPosEmbed`)", 0.0, ("blocks.", "vace_blocks."))  # fmt: skip
# Sana-Video: linear attention that rotates the ReLU'd q and k of its numerator by Wan's tables
_wan_copy("sana_video", ("SanaVideoTransformer3DModel",), ("SanaLinearAttnProcessor3_0",),
          _DIFFUSERS + "transformer_sana_video.py` `WanRotaryPosEmbed`", 0.0, ("transformer_blocks.",))  # fmt: skip
_wan_copy("wan_animate", ("WanAnimateTransformer3DModel",), ("WanAttnProcessor",),
          _DIFFUSERS + "transformer_wan_animate.py` `WanRotaryPosEmbed`", 0.0)  # fmt: skip

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


register_diffusers(
    DiffusersFamily(
        name="chronoedit",
        classes=("ChronoEditTransformer3DModel",),
        rope=_chronoedit_rope,
        tables=("module", "rope"),  # ChronoEditRotaryPosEmbed(hidden_states): the latent video
        positions=_chronoedit_positions,
        layout=lambda cos, sin: (cos[None, :, None], sin[None, :, None]),  # [1, S, 1, D]
        stock=("WanAttnProcessor",),
        blocks=("blocks.",),
        max_diff=0.0,
        source=CHRONOEDIT_SOURCE,
        axes=AXES + "; 2 frames at 0 and skip - 1",
    )
)
