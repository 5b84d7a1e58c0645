"""diffusers pipelines with a tiny random transformer, end to end at twice the training size, scaled by one call.

Components after diffusers' own pipeline tests (tiny VAEs and transformers); the text encoders cannot be
built offline, so the pipelines take precomputed prompt embeddings. Each test: the pipeline runs at twice
the trained resolution (video: and twice the frames) with ``set_rope_processors(pipe.transformer, mode=...,
train_size=...)``, the output is finite, differs from the unscaled run, and ``remove()`` gives the unscaled
run back exactly. docs/integrations.md shows the same one call per family.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402


def _compare(run, install):
    """``run(output_type)`` unscaled, installed (``install()`` returns the handle), and after removal.

    The difference is read on the denoised latents (a tiny random VAE flattens it in the decoded pixels);
    the decoded output must be finite."""
    plain = run("latent")
    handle = install()
    scaled, pixels = run("latent"), run("pt")
    handle.remove()
    assert torch.isfinite(pixels).all() and torch.isfinite(scaled).all()
    assert (scaled - plain).abs().max() > 1e-4
    assert torch.equal(run("latent"), plain)


def flux_pipeline():
    """A tiny FluxPipeline: trained at 16 x 16 px, latents 16 x 16 (vae_scale_factor 1), packed 2 x 2: an 8 x 8 token
    grid (2 px per token); and its call with precomputed prompt embeddings."""
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1, latent_channels=1,
        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",), norm_num_groups=1,
        sample_size=32, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035,
    )  # fmt: skip
    torch.manual_seed(0)
    pipe = diffusers.FluxPipeline(diffusers.FlowMatchEulerDiscreteScheduler(), vae, None, None, None, None,
                                  tiny.flux(1).eval())  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    call = lambda height=32, width=32, output_type="latent": pipe(  # noqa: E731
        height=height, width=width, prompt_embeds=torch.ones(1, 5, 32), pooled_prompt_embeds=torch.ones(1, 32),
        num_inference_steps=2, guidance_scale=1.0, output_type=output_type, generator=torch.Generator().manual_seed(0),
    ).images  # fmt: skip
    return pipe, call


def test_flux_pipeline_at_twice_the_training_resolution():
    pipe, call = flux_pipeline()
    _compare(lambda output_type: call(output_type=output_type),
             lambda: set_rope_processors(pipe.transformer, mode="yarn", train_size=(8, 8)))  # fmt: skip


def wan_pipeline():
    """A tiny WanPipeline: trained at 16 x 16 px, 5 frames: latents 2 x 2 x 2 (x8 spatial, x4 temporal, +1), patches
    (1, 2, 2): a 2 x 1 x 1 token grid (16 px per token); and its call."""
    vae = diffusers.AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                     temperal_downsample=[False, True, True])  # fmt: skip
    torch.manual_seed(0)
    transformer = diffusers.WanTransformer3DModel(**dict(tiny.WAN, in_channels=16, out_channels=16, text_dim=32),
                                                  cross_attn_norm=True, rope_max_seq_len=32).eval()  # fmt: skip
    pipe = diffusers.WanPipeline(None, None, vae, diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0), transformer)
    pipe.set_progress_bar_config(disable=True)
    call = lambda height=32, width=32, num_frames=9, output_type="latent": pipe(  # noqa: E731
        height=height, width=width, num_frames=num_frames, prompt_embeds=torch.ones(1, 8, 32), num_inference_steps=2,
        guidance_scale=1.0, output_type=output_type, generator=torch.Generator().manual_seed(0),
    ).frames  # fmt: skip
    return pipe, call


def test_wan_pipeline_at_twice_the_resolution_and_frames():
    pipe, call = wan_pipeline()
    _compare(lambda output_type: call(output_type=output_type),
             lambda: set_rope_processors(pipe.transformer, mode="interpolate", train_size=(2, 1, 1)))  # fmt: skip


def test_hunyuan_video_pipeline_at_twice_the_resolution_and_frames():
    vae = diffusers.AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        norm_num_groups=4, spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformer, _ = tiny.build("hunyuan_video")
    pipe = diffusers.HunyuanVideoPipeline(None, None, transformer, vae, diffusers.FlowMatchEulerDiscreteScheduler(),
                                          None, None)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    # trained at 16 x 16 px, 5 frames: a latent grid of 2 x 2 x 2 tokens (patch 1)
    run = lambda output_type: pipe(  # noqa: E731
        height=32, width=32, num_frames=9, prompt_embeds=torch.ones(1, 5, 16), pooled_prompt_embeds=torch.ones(1, 8),
        prompt_attention_mask=torch.ones(1, 5, dtype=torch.bool), num_inference_steps=2, guidance_scale=1.0,
        output_type=output_type, generator=torch.Generator().manual_seed(0),
    ).frames  # fmt: skip
    _compare(run, lambda: set_rope_processors(pipe.transformer, mode="interpolate", train_size=(2, 2, 2)))


def qwen_image_pipeline():
    """A tiny QwenImagePipeline: trained at 32 x 32 px, latents 8 x 8 (vae_scale_factor 4), packed 2 x 2: a 4 x 4 token
    grid (8 px per token); and its call."""
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                           temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                           latents_std=[1.0] * 4)  # fmt: skip
    transformer, _ = tiny.build("QwenImageTransformer2DModel")  # packed latents of 4 channels x 2 x 2
    pipe = diffusers.QwenImagePipeline(diffusers.FlowMatchEulerDiscreteScheduler(), vae, None, None, transformer)
    pipe.set_progress_bar_config(disable=True)
    call = lambda height=64, width=64, output_type="latent": pipe(  # noqa: E731
        height=height, width=width, prompt_embeds=torch.ones(1, 6, 16),
        prompt_embeds_mask=torch.ones(1, 6, dtype=torch.long), num_inference_steps=2, true_cfg_scale=1.0,
        output_type=output_type, generator=torch.Generator().manual_seed(0),
    ).images  # fmt: skip
    return pipe, call


def test_qwen_image_pipeline_at_twice_the_training_resolution():
    pipe, call = qwen_image_pipeline()
    _compare(lambda output_type: call(output_type=output_type),
             lambda: set_rope_processors(pipe.transformer, mode="yarn", train_size=(4, 4)))  # fmt: skip


def hunyuan_video_1_5_pipeline():
    """A tiny HunyuanVideo15Pipeline: trained at 8 x 8 px, 5 frames: latents 3 x 2 x 2 (x4 spatial, x2 temporal, +1),
    patch 1 (4 px per token); and its call."""
    from diffusers.guiders import ClassifierFreeGuidance

    torch.manual_seed(0)
    transformer = diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1, num_refiner_layers=1,
        mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
        rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v",
    ).eval()  # fmt: skip
    vae = diffusers.AutoencoderKLHunyuanVideo15(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16), layers_per_block=1,
        spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
        upsample_match_channel=False,
    ).eval()  # fmt: skip
    pipe = diffusers.HunyuanVideo15Pipeline(None, None, transformer, vae, diffusers.FlowMatchEulerDiscreteScheduler(
        shift=7.0), None, None, ClassifierFreeGuidance(guidance_scale=1.0))  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    call = lambda height=16, width=16, num_frames=9, output_type="latent": pipe(  # noqa: E731
        height=height, width=width, num_frames=num_frames, prompt_embeds=torch.ones(1, 6, 16),
        prompt_embeds_mask=torch.ones(1, 6, dtype=torch.long), prompt_embeds_2=torch.ones(1, 4, 32),
        prompt_embeds_mask_2=torch.ones(1, 4, dtype=torch.long), num_inference_steps=2, output_type=output_type,
        generator=torch.Generator().manual_seed(0),
    ).frames  # fmt: skip
    return pipe, call


def test_hunyuan_video_1_5_pipeline_at_twice_the_resolution_and_frames():
    pipe, call = hunyuan_video_1_5_pipeline()
    _compare(lambda output_type: call(output_type=output_type),
             lambda: set_rope_processors(pipe.transformer, mode="interpolate", train_size=(3, 2, 2)))  # fmt: skip
