"""Tiny random diffusers transformers and their inputs at any latent size: the one place the tests, the
benchmarks and the compile report build them (configs after diffusers' own model tests; nothing downloaded).

``build(family)`` gives ``(model, inputs)`` at the family's default token grid; ``inputs(family, h, w,
frames=...)`` gives the same model's inputs at another one (an ``h x w`` token grid, ``frames`` latent frames
for video), seeded by the size so that repeated calls agree. A family is one :class:`Tiny` in :data:`TINY`,
keyed by the name of its diffusers class; the families past the first five sit in ``models/tiny_diffusers_*.py``
(what they share in ``tiny_diffusers_common.py``).
"""

from __future__ import annotations

import diffusers
import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed

from models.tiny_diffusers_common import COGVIDEOX, WAN, B, Tiny, flux, flux_inputs, video_inputs
from models.tiny_diffusers_cosmos3_longcat_audio import ENTRIES as COSMOS3_LONGCAT_AUDIO
from models.tiny_diffusers_flux import ENTRIES as FLUXLIKE
from models.tiny_diffusers_image import ENTRIES as IMAGE
from models.tiny_diffusers_last import ENTRIES as LAST
from models.tiny_diffusers_more import ENTRIES as MORE
from models.tiny_diffusers_video import ENTRIES as VIDEO
from models.tiny_diffusers_videoaudio import ENTRIES as VIDEOAUDIO
from models.tiny_diffusers_wan import ENTRIES as WAN_TABLES

__all__ = [
    "B",
    "COGVIDEOX",
    "FAMILIES",
    "TINY",
    "Tiny",
    "WAN",
    "build",
    "flux",
    "flux_inputs",
    "inputs",
    "train_size",
    "video_inputs",
]


def _cogvideox_inputs(h, w, frames, g):  # patch 2; the pipeline's tables (crop (0, 0)-(h, w): integer positions)
    return dict(
        hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g),
        image_rotary_emb=get_3d_rotary_pos_embed(16, ((0, 0), (h, w)), (h, w), frames), return_dict=False,
    )  # fmt: skip


TINY: dict[str, Tiny] = {
    "FluxTransformer2DModel": Tiny(flux, flux_inputs, (1, 4, 6), video=False),
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
        video_inputs(
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
        video_inputs(2),
        (3, 2, 3),
    ),
    "CogVideoXTransformer3DModel": Tiny(
        lambda depth: diffusers.CogVideoXTransformer3DModel(**dict(COGVIDEOX, num_layers=depth)),
        _cogvideox_inputs,
        (3, 4, 4),
    ),
}


# the names the tests have long used for these, and Wan's image-to-video variant (image tokens through extra
# k/v projections; Wan fixes the text length at 512)
ALIASES = {"flux": "FluxTransformer2DModel", "hunyuan_video": "HunyuanVideoTransformer3DModel",
           "wan": "WanTransformer3DModel", "cogvideox": "CogVideoXTransformer3DModel", "wan_i2v": "wan_i2v"}  # fmt: skip
TINY["wan_i2v"] = Tiny(
    lambda depth: diffusers.WanTransformer3DModel(**dict(WAN, num_layers=depth), image_dim=8, added_kv_proj_dim=24),
    video_inputs(2, 512, encoder_hidden_states_image=lambda g: torch.randn(B, 3, 8, generator=g)),
    (2, 2, 2),
)
FAMILIES = tuple(ALIASES)
# the families kept in modules of their own (models/tiny_diffusers_*.py), a Tiny per class name
for entries in (COSMOS3_LONGCAT_AUDIO, FLUXLIKE, IMAGE, LAST, MORE, VIDEO, VIDEOAUDIO, WAN_TABLES):
    TINY.update(entries)


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


def train_size(name: str) -> tuple[int, ...]:
    """The default grid on the family's grid axes, as the family's rope counts it (a tiny model's own ``train_size``
    first: the audio models' sequences with their prepended tokens, OmniGen's text, time and image tokens): video
    (t, y, x), images (y, x); one axis: time (frames) for video (Mochi), the sequence of ``h * w`` tokens of a 1-D
    model."""
    from axial_rope.conventions._registry import DIFFUSERS

    tiny = _tiny(name)
    if tiny.train_size is not None:
        return tiny.train_size
    frames, h, w = tiny.grid
    n_axes = len(DIFFUSERS[ALIASES.get(name, name)].grid_axes)
    return {3: (frames, h, w), 2: (h, w), 1: (frames,) if tiny.video else (h * w,)}[n_axes]


def build(name: str, *, depth: int = 1, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """``name``'s tiny random transformer (``depth`` blocks of each kind) in eval mode and its default inputs."""
    tiny = _tiny(name)
    torch.manual_seed(seed)
    model = tiny.model(depth).eval()
    frames, h, w = tiny.grid
    return model, inputs(name, h, w, frames=frames)
