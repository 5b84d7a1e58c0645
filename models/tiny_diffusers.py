"""Tiny random diffusers transformers and their inputs at any latent size: the one place the tests, the
benchmarks and the compile report build them (configs after diffusers' own model tests; nothing downloaded).

``build(family)`` gives ``(model, inputs)`` at the family's default token grid; ``inputs(family, h, w,
frames=...)`` gives the same model's inputs at another one (an ``h x w`` token grid, ``frames`` latent frames
for video), seeded by the size so that repeated calls agree. A family is one :class:`Tiny` in :data:`TINY`,
keyed by the name of its diffusers class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import diffusers
import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed

import axial_rope as ar
from models.tiny_diffusers_image import ENTRIES as IMAGE
from models.tiny_diffusers_video import ENTRIES as VIDEO
from models.tiny_diffusers_videoaudio import ENTRIES as VIDEOAUDIO

__all__ = ["COGVIDEOX", "FAMILIES", "TINY", "Tiny", "WAN", "build", "flux", "inputs"]

B = 2  # batch


@dataclass(frozen=True)
class Tiny:
    """A tiny model of one diffusers class and its inputs.

    Attributes:
        model: ``depth -> model``: ``depth`` blocks of each kind (depth 1 in the tests).
        inputs: ``(h, w, frames, generator) -> forward kwargs`` at an ``h x w`` token grid (``frames``
            latent frames; ignored by image models).
        grid: the default ``(frames, h, w)`` in tokens (images: ``frames`` 1).
        video: whether the model has a time axis (the tests then also double the frames).
        train_size: the default grid in the record's grid axes where it is not ``(frames, h, w)`` (video) or
            ``(h, w)``: OmniGen's one axis, its sequence of text, time and image tokens.
        mode: the sizing mode the generic checks install at twice the grid: ``"yarn"`` for models whose own
            positions already interpolate (CogView4's fixed range, crop grids), where ``"interpolate"`` is stock.
        no_fullgraph: why the stock forward cannot be compiled whole (a host read of its inputs deciding the
            shapes): the compile checks of whole forwards skip the model; its repeated blocks still compile.
        no_dynamic: why the stock model recompiles per size itself (nothing the adapter adds): the dynamic-size
            compile check skips it.
    """

    model: Callable[[int], torch.nn.Module]
    inputs: Callable[..., dict]
    grid: tuple[int, int, int]
    video: bool = True
    train_size: tuple[int, ...] | None = None
    mode: str = "interpolate"
    no_fullgraph: str = ""
    no_dynamic: str = ""


def flux(depth: int = 1, heads: int = 2, axes_dims_rope: tuple[int, int, int] = (4, 6, 6)):
    """A Flux with ``depth`` double- and single-stream blocks of ``heads`` heads (head dim ``sum(axes_dims_rope)``);
    ``flux(1, 24, (16, 56, 56))`` has FLUX.1's block sizes."""
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=sum(axes_dims_rope),
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
        axes_dims_rope=axes_dims_rope,
    )  # fmt: skip


def _flux_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, 5, 32, generator=g),
        pooled_projections=torch.randn(B, 32, generator=g), timestep=torch.rand(B, generator=g),
        img_ids=ar.grid(1, h, w), txt_ids=torch.zeros(5, 3), return_dict=False,
    )  # fmt: skip


def _video_inputs(patch: int, text: int = 5, **extra):
    """Inputs of a video model reading a latent ``[B, 4, F, H, W]`` cut by ``(1, patch, patch)``."""

    def make(h, w, frames, g):
        more = {k: v(g) if callable(v) else v for k, v in extra.items()}
        return dict(
            hidden_states=torch.randn(B, 4, frames, patch * h, patch * w, generator=g),
            timestep=torch.rand(B, generator=g) * 1000, encoder_hidden_states=torch.randn(B, text, 16, generator=g),
            return_dict=False, **more,
        )  # fmt: skip

    return make


WAN = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
    freq_dim=32, ffn_dim=32, num_layers=1, qk_norm="rms_norm_across_heads",
)  # fmt: skip
COGVIDEOX = dict(
    num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=2, text_embed_dim=16,
    num_layers=1, sample_width=8, sample_height=8, sample_frames=9, patch_size=2, temporal_compression_ratio=4,
    max_text_seq_length=5, use_rotary_positional_embeddings=True,
)  # fmt: skip


def _cogvideox_inputs(h, w, frames, g):  # patch 2; the pipeline's tables (crop (0, 0)-(h, w): integer positions)
    return dict(
        hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        image_rotary_emb=get_3d_rotary_pos_embed(16, ((0, 0), (h, w)), (h, w), frames), return_dict=False,
    )  # fmt: skip


TINY: dict[str, Tiny] = {
    "FluxTransformer2DModel": Tiny(flux, _flux_inputs, (1, 4, 6), video=False),
    "HunyuanVideoTransformer3DModel": Tiny(
        lambda depth: diffusers.HunyuanVideoTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=10,
            num_layers=depth,
            num_single_layers=depth,
            num_refiner_layers=1,
            patch_size=1,
            patch_size_t=1,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4),
        ),  # fmt: skip
        _video_inputs(
            1,
            encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]),
            pooled_projections=lambda g: torch.randn(B, 8, generator=g),
            guidance=torch.full((B,), 3000.0),
        ),  # fmt: skip
        (3, 4, 6),
    ),
    "WanTransformer3DModel": Tiny(
        lambda depth: diffusers.WanTransformer3DModel(
            **dict(WAN, num_layers=depth), cross_attn_norm=True, rope_max_seq_len=32
        ),  # fmt: skip
        _video_inputs(2),
        (3, 2, 3),
    ),
    "CogVideoXTransformer3DModel": Tiny(
        lambda depth: diffusers.CogVideoXTransformer3DModel(**dict(COGVIDEOX, num_layers=depth)),
        _cogvideox_inputs,
        (3, 4, 4),
    ),
}


def _chroma_inputs(h, w, frames, g):
    # no attention_mask: diffusers 0.42.1's checkpointed single blocks drop it (so stock checkpointing changes the
    # output); tests/test_diffusers_batch_fluxlike.py runs the pipeline's mask unscaled and scaled
    inputs = _flux_inputs(h, w, frames, g)
    del inputs["pooled_projections"]
    return inputs


def _chroma(depth):
    return diffusers.ChromaTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6), approximator_num_channels=8,
        approximator_hidden_dim=16, approximator_layers=1,
    )  # fmt: skip


TINY["ChromaTransformer2DModel"] = Tiny(_chroma, _chroma_inputs, (1, 4, 6), video=False)


def _ids_inputs(h, w, g, text: int = 5, **extra):
    """Packed latents ``[B, h w, 4]``, text ``[B, text, 32]``, Flux's ids (text zeros, image ``(0, y, x)``)."""
    inputs = dict(
        hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, text, 32, generator=g),
        img_ids=ar.grid(1, h, w), txt_ids=torch.zeros(text, 3), return_dict=False,
    )  # fmt: skip
    return dict(inputs, **extra)


def _bria(depth):
    return diffusers.BriaTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 6, 6],
    )  # fmt: skip


def _bria_fibo(depth):
    return diffusers.BriaFiboTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 6, 6], text_encoder_dim=8,
    )  # fmt: skip


def _bria_fibo_inputs(h, w, frames, g):  # one text-encoder layer per block (2 blocks at depth 1)
    layers = [torch.randn(B, 5, 8, generator=g) for _ in range(2)]
    return _ids_inputs(h, w, g, timestep=torch.rand(B, generator=g) * 1000, text_encoder_layers=layers)


def _krea2(depth):
    return diffusers.Krea2Transformer2DModel(
        in_channels=4, num_layers=depth, attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, timestep_embed_dim=16, text_hidden_dim=8, num_text_layers=2, text_num_attention_heads=2,
        text_num_key_value_heads=2, text_intermediate_size=16, num_layerwise_text_blocks=1, num_refiner_text_blocks=1,
        axes_dims_rope=(4, 6, 6),
    )  # fmt: skip


def _krea2_inputs(h, w, frames, g):  # text rows (0, 0, 0) first; the second prompt padded after 3 tokens
    return dict(
        hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, 5, 2, 8, generator=g),
        timestep=torch.rand(B, generator=g), position_ids=torch.cat([torch.zeros(5, 3), ar.grid(1, h, w)]),
        encoder_attention_mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), return_dict=False,
    )  # fmt: skip


TINY["BriaTransformer2DModel"] = Tiny(
    _bria, lambda h, w, frames, g: _ids_inputs(h, w, g, timestep=torch.rand(B, generator=g) * 1000), (1, 4, 6), False
)
TINY["BriaFiboTransformer2DModel"] = Tiny(_bria_fibo, _bria_fibo_inputs, (1, 4, 6), video=False)
TINY["Krea2Transformer2DModel"] = Tiny(_krea2, _krea2_inputs, (1, 4, 6), video=False)


def _diagonal_text(text: int, modality: float = 0.0) -> torch.Tensor:  # LongCat's and Ovis' text ids (m, i, i)
    i = torch.arange(text, dtype=torch.float32)
    return torch.stack([torch.full_like(i, modality), i, i], dim=-1)


def _longcat(depth):
    return diffusers.LongCatImageTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 6, 6],
    )  # fmt: skip


def _longcat_inputs(h, w, frames, g):  # the image (modality 1) starts after the text on y and x
    inputs = _ids_inputs(h, w, g, timestep=torch.rand(B, generator=g), txt_ids=_diagonal_text(5))
    image = ar.grid(1, h, w) + torch.tensor([1.0, 5.0, 5.0])
    return dict(inputs, img_ids=image)


def _ovis(depth):
    return diffusers.OvisImageTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip


TINY["LongCatImageTransformer2DModel"] = Tiny(_longcat, _longcat_inputs, (1, 4, 6), video=False)
TINY["OvisImageTransformer2DModel"] = Tiny(
    _ovis,
    lambda h, w, frames, g: _ids_inputs(h, w, g, timestep=torch.rand(B, generator=g), txt_ids=_diagonal_text(5)),
    (1, 4, 6),
    video=False,
)


def _ids4(t: int, h: int, w: int) -> torch.Tensor:  # FLUX.2's image ids (t, y, x, 0)
    return torch.cat([ar.grid(1, h, w) + torch.tensor([float(t), 0.0, 0.0]), torch.zeros(h * w, 1)], dim=-1)


def _text_ids4(text: int) -> torch.Tensor:  # FLUX.2's text ids (0, 0, 0, l)
    return torch.cat([torch.zeros(text, 3), torch.arange(text, dtype=torch.float32)[:, None]], dim=-1)


def _flux2(depth):
    return diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=16, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    )  # fmt: skip


def _flux2_inputs(h, w, frames, g, text: int = 5):
    return dict(
        hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, text, 32, generator=g),
        timestep=torch.rand(B, generator=g), img_ids=_ids4(0, h, w), txt_ids=_text_ids4(text), return_dict=False,
    )  # fmt: skip


def _flux3(depth):
    return diffusers.Flux3Transformer2DModel(
        in_channels=4, cond_in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, timestep_channels=16, axes_dims_rope=(4, 4, 4, 4),
    )  # fmt: skip


def _flux3_inputs(h, w, frames, g):
    # a reference image (t = 10, its own tables call) of the target's grid and text as long as the image: FLUX.3's
    # per-modality blocks then see one sequence length, so a regionally compiled block compiles once (with three
    # lengths, stock recompiles it per modality); tests/test_diffusers_batch_fluxlike.py sizes a smaller reference
    return dict(
        _flux2_inputs(h, w, frames, g, text=h * w), image_cond_hidden_states=torch.randn(B, h * w, 4, generator=g),
        image_cond_ids=_ids4(10, h, w),
    )  # fmt: skip


TINY["Flux2Transformer2DModel"] = Tiny(_flux2, _flux2_inputs, (1, 4, 6), video=False)
TINY["Flux3Transformer2DModel"] = Tiny(_flux3, _flux3_inputs, (1, 4, 6), video=False)
# the names the tests have long used for these, and Wan's image-to-video variant (image tokens through extra
# k/v projections; Wan fixes the text length at 512)
ALIASES = {"flux": "FluxTransformer2DModel", "hunyuan_video": "HunyuanVideoTransformer3DModel",
           "wan": "WanTransformer3DModel", "cogvideox": "CogVideoXTransformer3DModel", "wan_i2v": "wan_i2v"}  # fmt: skip
TINY["wan_i2v"] = Tiny(
    lambda depth: diffusers.WanTransformer3DModel(**dict(WAN, num_layers=depth), image_dim=8, added_kv_proj_dim=24),
    _video_inputs(2, 512, encoder_hidden_states_image=lambda g: torch.randn(B, 3, 8, generator=g)),
    (2, 2, 2),
)
FAMILIES = tuple(ALIASES)

# Wan's tables in other models (configs after diffusers' model tests)
WAN_BLOCK = dict(WAN, cross_attn_norm=True, rope_max_seq_len=32)
TINY["SkyReelsV2Transformer3DModel"] = Tiny(
    lambda depth: diffusers.SkyReelsV2Transformer3DModel(**dict(WAN_BLOCK, num_layers=depth)),
    _video_inputs(2),
    (3, 2, 3),
)
# the families kept in modules of their own, as Tiny fields per class name
TINY.update({name: Tiny(**fields) for entries in (IMAGE, VIDEO, VIDEOAUDIO) for name, fields in entries.items()})


def _tiny(name: str) -> Tiny:
    key = ALIASES.get(name, name)
    if key not in TINY:
        raise ValueError(f"no tiny model for {name!r}; known: {sorted(TINY)} (and {sorted(ALIASES)})")
    return TINY[key]


def inputs(name: str, h: int, w: int, *, frames: int | None = None) -> dict:
    """The inputs of ``name``'s tiny model at an ``h x w`` token grid (``frames`` latent frames for video)."""
    tiny = _tiny(name)
    frames = tiny.grid[0] if frames is None else frames
    g = torch.Generator().manual_seed(1000 * frames + 10 * h + w)
    return tiny.inputs(h, w, frames, g)


def build(name: str, *, depth: int = 1, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """``name``'s tiny random transformer (``depth`` blocks of each kind) in eval mode and its default inputs."""
    tiny = _tiny(name)
    torch.manual_seed(seed)
    model = tiny.model(depth).eval()
    frames, h, w = tiny.grid
    return model, inputs(name, h, w, frames=frames)


TINY["WanVACETransformer3DModel"] = Tiny(
    lambda depth: diffusers.WanVACETransformer3DModel(
        **dict(WAN_BLOCK, num_layers=depth), vace_layers=[0], vace_in_channels=4
    ),
    lambda h, w, frames, g: dict(
        _video_inputs(2)(h, w, frames, g), control_hidden_states=torch.randn(B, 4, frames, 2 * h, 2 * w, generator=g)
    ),
    (3, 2, 3),
)
TINY["SanaVideoTransformer3DModel"] = Tiny(
    lambda depth: diffusers.SanaVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=depth,
        num_cross_attention_heads=2,
        cross_attention_head_dim=12,
        cross_attention_dim=24,
        caption_channels=16,
        sample_size=8,
        rope_max_seq_len=32,
    ),  # fmt: skip
    _video_inputs(2, encoder_attention_mask=lambda g: torch.tensor([[1] * 5, [1] * 3 + [0] * 2])),
    (3, 2, 3),
)


def _wan_animate_inputs(h, w, frames, g):  # 2 C + 4 channels; a face video of 4 (frames - 1) frames
    return dict(
        _video_inputs(2)(h, w, frames, g), hidden_states=torch.randn(B, 12, frames, 2 * h, 2 * w, generator=g),
        encoder_hidden_states_image=torch.randn(B, 3, 16, generator=g),
        pose_hidden_states=torch.randn(B, 4, frames - 1, 2 * h, 2 * w, generator=g),
        face_pixel_values=torch.randn(B, 3, 4 * (frames - 1), 16, 16, generator=g),
    )  # fmt: skip


TINY["WanAnimateTransformer3DModel"] = Tiny(
    lambda depth: diffusers.WanAnimateTransformer3DModel(
        **dict(WAN_BLOCK, num_layers=depth, in_channels=12),
        latent_channels=4,
        image_dim=16,
        motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
        motion_encoder_size=16,
        motion_style_dim=8,
        motion_dim=4,
        motion_encoder_dim=16,
        face_encoder_hidden_dim=16,
        face_encoder_num_heads=2,
        inject_face_latents_blocks=1,
    ),  # fmt: skip
    _wan_animate_inputs,
    (3, 2, 3),
)
TINY["ChronoEditTransformer3DModel"] = Tiny(  # 2 frames: the input image and the edit, at 0 and skip - 1
    lambda depth: diffusers.ChronoEditTransformer3DModel(**dict(WAN_BLOCK, num_layers=depth)),
    _video_inputs(2),
    (2, 2, 3),
)
