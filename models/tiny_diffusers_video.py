"""Tiny random diffusers video transformers whose tables come from the latent's shape and the pipeline's extra
inputs (HunyuanVideo 1.5's and Motif-Video's latent grids, Framepack's frame indices, HunyuanImage 2.1's latent image, EasyAnimate's base region, Cosmos's frame rate). :data:`ENTRIES` holds a :class:`~models.tiny_diffusers_common.Tiny` per diffusers
class name. One layer of each kind, two heads, batch 2.
"""

from __future__ import annotations

import diffusers
import torch

from models.tiny_diffusers_common import B, Tiny, video_inputs


def _cosmos(depth):  # without the learned absolute embedding: not RoPE, and float32 only (its norm refuses float64)
    return diffusers.CosmosTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=depth, mlp_ratio=2.0,
        text_embed_dim=16, adaln_lora_dim=4, max_size=(16, 32, 32), concat_padding_mask=False,
        extra_pos_embed_type=None,
    )  # fmt: skip


def _cosmos_inputs(h, w, frames, g):  # patch (1, 2, 2); a 30 fps video: frames 24 / 30 of a base frame apart
    return dict(
        hidden_states=torch.randn(B, 4, frames, 2 * h, 2 * w, generator=g),
        timestep=torch.rand(B, generator=g),  # sigma (Cosmos Predict 2.5): 1 at pure noise
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), fps=30, return_dict=False,
    )  # fmt: skip


def _mask(g, text: int = 5):  # the second item's text padded
    return torch.tensor([[1] * text, [1] * (text - 2) + [0] * 2])


def _hunyuan15(depth):
    return diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, num_refiner_layers=1, text_embed_dim=16,
        attention_head_dim=8, num_layers=depth, mlp_ratio=2.0, text_embed_2_dim=8, image_embed_dim=12,
        rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v",
    )  # fmt: skip


_hunyuan15_inputs = video_inputs(
    1, encoder_attention_mask=_mask, encoder_hidden_states_2=lambda g: torch.randn(B, 4, 8, generator=g),
    encoder_attention_mask_2=torch.ones(B, 4), image_embeds=torch.zeros(B, 3, 12),
)  # fmt: skip
_HUNYUAN15_HOST = (
    "its forward branches on the image embeddings' values (`torch.all(image_embeds == 0)`) and gathers the valid "
    "text tokens by boolean masks"
)


def _easyanimate(depth):  # patch 15: the 60 x 90 base region is 4 x 6 tokens, the default grid
    return diffusers.EasyAnimateTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=15,
        num_layers=depth, mmdit_layers=depth, text_embed_dim=16, time_embed_dim=8,
    )  # fmt: skip


def _easyanimate_inputs(h, w, frames, g):
    return dict(video_inputs(15)(h, w, frames, g), timestep=torch.randint(0, 1000, (B,), generator=g))


def _motif(depth):
    return diffusers.MotifVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=depth,
        num_single_layers=depth, patch_size=1, text_embed_dim=16, rope_axes_dim=(2, 4, 4),
    )  # fmt: skip


def _hunyuan_image(depth):
    return diffusers.HunyuanImageTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, num_refiner_layers=1, text_embed_dim=16,
        attention_head_dim=8, num_layers=depth, num_single_layers=depth, rope_axes_dim=(4, 4),
    )  # fmt: skip


def _image_inputs(h, w, frames, g):  # a latent image [B, 4, H, W], patch 1
    return dict(
        hidden_states=torch.randn(B, 4, h, w, generator=g), timestep=torch.rand(B, generator=g) * 1000,
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), encoder_attention_mask=_mask(g), return_dict=False,
    )  # fmt: skip


def _framepack(depth):
    return diffusers.HunyuanVideoFramepackTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, num_refiner_layers=1, text_embed_dim=16,
        attention_head_dim=10, num_layers=depth, num_single_layers=depth, patch_size=2, pooled_projection_dim=8,
        rope_axes_dim=(2, 4, 4), has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True,
    )  # fmt: skip


def _framepack_inputs(h, w, frames, g):  # patch 2; indices as the vanilla sampler lays them out
    latent = lambda f: torch.randn(B, 4, f, 2 * h, 2 * w, generator=g)  # noqa: E731
    return dict(
        hidden_states=latent(frames), timestep=torch.rand(B, generator=g) * 1000,
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), encoder_attention_mask=_mask(g),
        pooled_projections=torch.randn(B, 8, generator=g), image_embeds=torch.randn(B, 3, 16, generator=g),
        guidance=torch.full((B,), 3000.0), indices_latents=torch.arange(8, 8 + frames),
        latents_clean=latent(2), indices_latents_clean=torch.tensor([0, 7]),
        latents_history_2x=latent(2), indices_latents_history_2x=torch.tensor([5, 6]),
        latents_history_4x=latent(4), indices_latents_history_4x=torch.arange(1, 5), return_dict=False,
    )  # fmt: skip


ENTRIES: dict[str, Tiny] = {
    "CosmosTransformer3DModel": Tiny(model=_cosmos, inputs=_cosmos_inputs, grid=(3, 4, 4)),
    "HunyuanVideo15Transformer3DModel": Tiny(
        model=_hunyuan15, inputs=_hunyuan15_inputs, grid=(3, 4, 6), no_fullgraph=_HUNYUAN15_HOST
    ),
    "EasyAnimateTransformer3DModel": Tiny(
        model=_easyanimate,
        inputs=_easyanimate_inputs,
        grid=(3, 4, 6),
        no_dynamic="its crop of the base region branches on the aspect ratio (as the tables do)",
    ),
    "MotifVideoTransformer3DModel": Tiny(
        model=_motif,
        inputs=video_inputs(1, encoder_attention_mask=_mask),
        grid=(3, 4, 6),
        dtype=torch.float32,  # its time embedding is float32 always (Timesteps), with no cast to float64 weights
    ),
    "HunyuanImageTransformer2DModel": Tiny(
        model=_hunyuan_image,
        inputs=_image_inputs,
        grid=(1, 4, 6),
        video=False,
        no_checkpointing="its checkpointed blocks get keyword arguments diffusers' checkpoint function refuses",
    ),
    "HunyuanVideoFramepackTransformer3DModel": Tiny(
        model=_framepack,
        inputs=_framepack_inputs,
        grid=(3, 4, 6),
        no_dynamic="its 4x-history patch embedding makes one token of a tiny history: a size-1 guard, so sizes recompile",
    ),
}
