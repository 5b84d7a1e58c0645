"""Tiny random diffusers image transformers whose rotary tables are not a Flux-style id table: CogView4, GLM-Image,
Qwen-Image (2.0 and 2.1), Lumina-Image 2.0, Lumina-Next, OmniGen, Hunyuan-DiT (and its ControlNet), Ideogram 4;
and HiDream-I1 and PRX (Flux-style ids, their tables as 2x2 rotation matrices).

:data:`ENTRIES` holds a :class:`~models.tiny_diffusers_common.Tiny` per diffusers class name: ``model``
(``depth -> model``), ``inputs`` (``(h, w, frames, generator) -> forward kwargs`` at an ``h x w`` token grid),
``grid`` (the default ``(1, h, w)``), ``video=False``. One layer of each kind, two heads,
batch 2, with the attention masks (padded prompts) the models take.
"""

from __future__ import annotations

import diffusers
import torch
from diffusers.models.embeddings import get_2d_rotary_pos_embed, get_2d_rotary_pos_embed_lumina

from axial_rope.conventions.hunyuan import hunyuan_dit_crop
from models.tiny_diffusers_common import B, Tiny


def _mask(length: int) -> torch.Tensor:
    """A prompt mask ``[B, length]``: the first item whole, the second padded after ``length - 2`` tokens."""
    return torch.tensor([[1] * length, [1] * (length - 2) + [0] * 2])


def _cogview4(depth):
    return diffusers.CogView4Transformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=depth, attention_head_dim=8, num_attention_heads=2,
        text_embed_dim=16, time_embed_dim=8, condition_dim=4, rope_axes_dim=(16, 16),
    )  # fmt: skip


def _cogview4_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        timestep=torch.randint(0, 1000, (B,), generator=g), original_size=torch.tensor([[16.0 * h, 16.0 * w]] * B),
        target_size=torch.tensor([[16.0 * h, 16.0 * w]] * B), crop_coords=torch.zeros(B, 2), return_dict=False,
    )  # fmt: skip


def _glm(depth):
    return diffusers.GlmImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=depth, attention_head_dim=8, num_attention_heads=2,
        text_embed_dim=16, time_embed_dim=8, condition_dim=4, prior_vq_quantizer_codebook_size=32,
    )  # fmt: skip


def _glm_inputs(h, w, frames, g):
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), encoder_hidden_states=torch.randn(B, 5, 16, generator=g),
        prior_token_id=torch.randint(0, 32, (B, h * w), generator=g), prior_token_drop=torch.zeros(B, h * w, dtype=torch.bool),
        timestep=torch.randint(0, 1000, (B,), generator=g), target_size=torch.tensor([[16.0 * h, 16.0 * w]] * B),
        crop_coords=torch.zeros(B, 2), return_dict=False,
    )  # fmt: skip


def _qwen(depth):
    return diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=depth, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip


def _qwen_inputs(h, w, frames, g):  # packed latents [B, h w, 16]; one image per sample
    return dict(
        hidden_states=torch.randn(B, h * w, 16, generator=g), encoder_hidden_states=torch.randn(B, 6, 16, generator=g),
        encoder_hidden_states_mask=_mask(6), timestep=torch.rand(B, generator=g), img_shapes=[[(1, h, w)]] * B,
        return_dict=False,
    )  # fmt: skip


def _qwen21(depth):
    return diffusers.QwenImage21Transformer2DModel(
        patch_size=1, in_channels=8, out_channels=8, num_layers=depth, attention_head_dim=16, num_attention_heads=2,
        context_in_dim=16, mlp_ratio=2, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip


def _qwen21_inputs(h, w, frames, g):
    """Text, a 2 x 2 condition image, more text, then the target (``h w`` divisible by 4: one vision-language slot
    per 2 x 2 latent tokens); the prompt mask pads the second sample."""
    mask = torch.tensor([False] * 3 + [True] + [False] * 2 + [True] * (h * w // 4))
    return dict(
        hidden_states=torch.randn(B, 4 + h * w, 8, generator=g), encoder_hidden_states=torch.randn(B, 6, 16, generator=g),
        timestep=torch.rand(B, generator=g), img_shapes=[[(1, 2, 2), (1, h, w)]] * B, img_mask=mask[None].expand(B, -1),
        encoder_hidden_states_mask=torch.tensor([[True] * 6, [True] * 5 + [False]]), return_dict=False,
    )  # fmt: skip


def _lumina2(depth):
    return diffusers.Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=depth, num_refiner_layers=depth,
        num_attention_heads=2, num_kv_heads=1, multiple_of=16, axes_dim_rope=(4, 6, 6), axes_lens=(64, 64, 64),
        cap_feat_dim=16,
    )  # fmt: skip


def _lumina2_inputs(h, w, frames, g):  # the second caption padded: its image ids start 2 earlier
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, 6, 16, generator=g), encoder_attention_mask=_mask(6), return_dict=False,
    )  # fmt: skip


def _lumina_next(depth):
    return diffusers.LuminaNextDiT2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=depth, num_attention_heads=2,
        num_kv_heads=1, multiple_of=16, learn_sigma=False, cross_attention_dim=16,
    )  # fmt: skip


def _lumina_next_inputs(h, w, frames, g):  # the pipeline's grid of tables (384 x 384 there), head dim 16
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, 6, 16, generator=g), encoder_mask=_mask(6),
        image_rotary_emb=get_2d_rotary_pos_embed_lumina(16, 32, 32), cross_attention_kwargs={}, return_dict=False,
    )  # fmt: skip


def _hidream(depth):  # after diffusers' own test, without the MoE (num_routed_experts=0: a plain feed-forward),
    # whose expert routing reads token counts on the host (.cpu().numpy()), which no compiled graph can hold
    return diffusers.HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=0, num_activated_experts=2,
        axes_dims_rope=(4, 6, 6), max_resolution=(32, 32), llama_layers=(0, 1), force_inference_output=True,
    )  # fmt: skip


def _hidream_inputs(h, w, frames, g):  # a non-square grid is padded to max_seq tokens with zero ids, as stock does
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timesteps=torch.rand(B, generator=g) * 1000,
        encoder_hidden_states_t5=torch.randn(B, 5, 8, generator=g),
        encoder_hidden_states_llama3=torch.randn(2, B, 5, 4, generator=g), pooled_embeds=torch.randn(B, 8, generator=g),
        return_dict=False,
    )  # fmt: skip


def _prx(depth):
    model = diffusers.PRXTransformer2DModel(
        in_channels=4, patch_size=2, context_in_dim=8, hidden_size=32, mlp_ratio=2.0, num_heads=2, depth=depth,
        axes_dim=[8, 8],
    )  # fmt: skip
    with torch.no_grad():  # its adaLN modulation starts at zero (every block's gate 0): drawn, so attention counts
        for block in model.blocks:
            torch.nn.init.normal_(block.modulation.lin.weight, std=0.1)
            torch.nn.init.normal_(block.modulation.lin.bias, std=0.1)
    return model


def _prx_inputs(h, w, frames, g):  # the second prompt padded after 3 tokens
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timestep=torch.rand(B, generator=g),
        encoder_hidden_states=torch.randn(B, 5, 8, generator=g),
        attention_mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]), return_dict=False,
    )  # fmt: skip


HUNYUAN_DIT = dict(
    num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8, hidden_size=16,
    cross_attention_dim=16, cross_attention_dim_t5=16, pooled_projection_dim=8, text_len=5, text_len_t5=4,
)  # fmt: skip


def _hunyuan_dit(depth):  # 2 depth blocks: the second half takes the skip connections
    return diffusers.HunyuanDiT2DModel(**HUNYUAN_DIT, num_layers=2 * depth, learn_sigma=False)


def hunyuan_dit_inputs(h, w, frames, g):
    """Hunyuan-DiT's inputs, the pipeline's crop-grid tables included (its base square: 512 // 8 // 2 tokens)."""
    crop = hunyuan_dit_crop(h, w, 32)
    return dict(
        hidden_states=torch.randn(B, 4, 2 * h, 2 * w, generator=g), timestep=torch.randint(0, 1000, (B,), generator=g).float(),
        encoder_hidden_states=torch.randn(B, 5, 16, generator=g), text_embedding_mask=_mask(5),
        encoder_hidden_states_t5=torch.randn(B, 4, 16, generator=g), text_embedding_mask_t5=_mask(4),
        image_meta_size=torch.tensor([[16.0 * h, 16.0 * w, 16.0 * h, 16.0 * w, 0, 0]] * B), style=torch.zeros(B, dtype=torch.long),
        image_rotary_emb=get_2d_rotary_pos_embed(8, crop, (h, w)), return_dict=False,
    )  # fmt: skip


ENTRIES: dict[str, Tiny] = {
    "CogView4Transformer2DModel": Tiny(
        model=_cogview4,
        inputs=_cogview4_inputs,
        grid=(1, 4, 6),
        video=False,
        mode="yarn",  # rows span L at any size
    ),
    "GlmImageTransformer2DModel": Tiny(model=_glm, inputs=_glm_inputs, grid=(1, 4, 6), video=False),
    "QwenImageTransformer2DModel": Tiny(model=_qwen, inputs=_qwen_inputs, grid=(1, 4, 6), video=False),
    "QwenImage21Transformer2DModel": Tiny(
        model=_qwen21,
        inputs=_qwen21_inputs,
        grid=(1, 4, 6),
        video=False,
        no_fullgraph="QwenImage21Rope reads image_pad_mask on the host (tolist) to lay out the sequence",
    ),
    "Lumina2Transformer2DModel": Tiny(
        model=_lumina2,
        inputs=_lumina2_inputs,
        grid=(1, 4, 6),
        video=False,
        no_fullgraph="Lumina2RotaryPosEmbed reads the caption lengths on the host (tolist) to size the sequence",
    ),  # fmt: skip
    "LuminaNextDiT2DModel": Tiny(model=_lumina_next, inputs=_lumina_next_inputs, grid=(1, 4, 6), video=False),
    "HiDreamImageTransformer2DModel": Tiny(
        model=_hidream,
        inputs=_hidream_inputs,
        grid=(1, 4, 6),
        video=False,
        no_dynamic="its patchify branches on whether the latent is square (else padded to max_seq tokens)",
    ),
    "PRXTransformer2DModel": Tiny(model=_prx, inputs=_prx_inputs, grid=(1, 4, 6), video=False),
    "HunyuanDiT2DModel": Tiny(
        model=_hunyuan_dit,
        inputs=hunyuan_dit_inputs,
        grid=(1, 4, 6),
        video=False,
        mode="yarn",  # the crop grid spreads every size over the base square: "interpolate" is near stock
    ),
}
