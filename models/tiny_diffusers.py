"""Tiny random diffusers transformers and their inputs at any latent size: the one place the tests, the
benchmarks and the compile report build them (configs after diffusers' own model tests; nothing downloaded).

``build(family)`` gives ``(model, inputs)`` at the family's default latent grid; ``inputs(family, h, w,
frames=...)`` gives the same model's inputs at another one (a ``h x w`` token grid, ``frames`` latent frames
for video), seeded by the size so that repeated calls agree.
"""

from __future__ import annotations

import diffusers
import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed

import axial_rope as ar

__all__ = ["FAMILIES", "build", "flux", "inputs", "COGVIDEOX", "WAN"]

B = 2  # batch

WAN = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=32,
    ffn_dim=32,
    num_layers=1,
    qk_norm="rms_norm_across_heads",
)
COGVIDEOX = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    time_embed_dim=2,
    text_embed_dim=16,
    num_layers=1,
    sample_width=8,
    sample_height=8,
    sample_frames=9,
    patch_size=2,
    temporal_compression_ratio=4,
    max_text_seq_length=5,
    use_rotary_positional_embeddings=True,
)
# the default latent grid of each family's inputs: (frames, h, w) in tokens
DEFAULT_GRID = {
    "flux": (1, 4, 6),
    "hunyuan_video": (3, 4, 6),
    "wan": (3, 2, 3),
    "wan_i2v": (2, 2, 2),
    "cogvideox": (3, 4, 4),
}


def flux(depth: int = 1, heads: int = 2, axes_dims_rope: tuple[int, int, int] = (4, 6, 6)):
    """A Flux with ``depth`` double- and single-stream blocks of ``heads`` heads (head dim ``sum(axes_dims_rope)``);
    ``flux(1, 24, (16, 56, 56))`` has FLUX.1's block sizes."""
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=sum(axes_dims_rope),
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
        axes_dims_rope=axes_dims_rope,
    )  # fmt: skip


def _model(family: str, depth: int = 1):
    if family == "flux":
        return flux(depth)
    if family == "hunyuan_video":
        return diffusers.HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=depth,
            num_single_layers=depth, num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16,
            pooled_projection_dim=8, rope_axes_dim=(2, 4, 4),
        )  # fmt: skip
    if family == "wan":
        return diffusers.WanTransformer3DModel(**dict(WAN, num_layers=depth), cross_attn_norm=True, rope_max_seq_len=32)
    if family == "wan_i2v":  # image-to-video: image tokens attend through extra k/v projections
        return diffusers.WanTransformer3DModel(**dict(WAN, num_layers=depth), image_dim=8, added_kv_proj_dim=24)
    if family == "cogvideox":
        return diffusers.CogVideoXTransformer3DModel(**dict(COGVIDEOX, num_layers=depth))
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def inputs(family: str, h: int, w: int, *, frames: int | None = None) -> dict:
    """The inputs of ``family``'s tiny model at an ``h x w`` token grid (``frames`` latent frames for video)."""
    g = torch.Generator().manual_seed(1000 * (frames or 1) + 10 * h + w)
    frames = DEFAULT_GRID[family][0] if frames is None else frames
    if family == "flux":
        return dict(
            hidden_states=torch.randn(B, h * w, 4, generator=g), encoder_hidden_states=torch.randn(B, 5, 32, generator=g),
            pooled_projections=torch.randn(B, 32, generator=g), timestep=torch.rand(B, generator=g),
            img_ids=ar.grid(1, h, w), txt_ids=torch.zeros(5, 3), return_dict=False,
        )  # fmt: skip
    if family == "cogvideox":  # patch 2; the pipeline's tables of the grid (crop (0, 0)-(h, w): integer positions)
        return dict(
            hidden_states=torch.randn(B, frames, 4, 2 * h, 2 * w, generator=g),
            encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
            timestep=torch.randint(0, 1000, (B,), generator=g),
            image_rotary_emb=get_3d_rotary_pos_embed(16, ((0, 0), (h, w)), (h, w), frames), return_dict=False,
        )  # fmt: skip
    patch = 2 if family.startswith("wan") else 1
    text = 512 if family == "wan_i2v" else 5  # Wan's image-to-video fixes the text length at 512
    extra = {}
    if family == "hunyuan_video":
        extra = dict(encoder_attention_mask=torch.tensor([[1] * 5, [1] * 3 + [0] * 2]),
                     pooled_projections=torch.randn(B, 8, generator=g), guidance=torch.full((B,), 3000.0))  # fmt: skip
    if family == "wan_i2v":
        extra = dict(encoder_hidden_states_image=torch.randn(B, 3, 8, generator=g))
    return dict(
        hidden_states=torch.randn(B, 4, frames, patch * h, patch * w, generator=g),
        timestep=torch.rand(B, generator=g) * 1000,
        encoder_hidden_states=torch.randn(B, text, 16, generator=g),
        return_dict=False,
        **extra,
    )


def build(family: str, *, depth: int = 1, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """``family``'s tiny random transformer (``depth`` blocks of each kind) in eval mode and its default inputs."""
    torch.manual_seed(seed)
    model = _model(family, depth).eval()
    frames, h, w = DEFAULT_GRID[family]
    return model, inputs(family, h, w, frames=frames)


FAMILIES = tuple(DEFAULT_GRID)
