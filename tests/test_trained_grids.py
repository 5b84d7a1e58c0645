"""The released checkpoints' training sizes the family records carry (``DiffusersFamily.trained``) and how a
pipeline's size maps to tokens (``DiffusersFamily.units``): what ``policy="auto"`` plans against.

Every record has sizes read from a model card, a repository or a paper, or is listed here with the reason it has
none; each size gives a positive token grid on the family's grid axes; and for Flux, Wan, HunyuanVideo, CogVideoX,
Qwen-Image and LTX-Video that grid is the one the stock diffusers pipeline's own latent code (and, where the model
has one, its stock tables module) builds for that size.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import axial_rope.conventions  # noqa: F401  (registers the records)
from axial_rope.conventions._registry import DIFFUSERS, DiffusersFamily, trained_table

# families whose records carry no training size (the policy then asks for train_size), with the reason
UNKNOWN: dict[str, str] = {
    "joyimage_edit": "an editing model sized by the input image's bucket; no published training size",
    "joyimage_edit_plus": "an editing model sized by its last reference image's bucket; no published training size",
    "ace_step": "ACE-Step 1.5 generates 10 s to 10 min; the clip lengths it was trained on are not published",
    "stable_audio_3": "the training clip length is not published (the duration is a conditioning input)",
    "minimax_music3": "the transformer's training sequence length is not published",
    "mochi": "sizes time alone (grid_axes (0,)): PipelineUnits.tokens returns (t, y, x), not (t,)",
    "omnigen": "one axis over the packed text and image sequence: not a token grid PipelineUnits.tokens returns",
    "minimax_h3": "grid_axes=(): the positions are the pipeline's packed coordinates, no token grid to size",
    "cosmos3": "grid_axes=(): the positions are the pipeline's packed coordinates, no token grid to size",
    "longcat_audio": "the training clip length is not published (arXiv:2603.29339, the model card)",
}

# a source names where it was read: a model card or repository address, or a paper's arXiv number
CITED = re.compile(r"huggingface\.co/\S+|github\.com/\S+|arXiv:\d{4}\.\d{4,5}")

FAMILIES: dict[str, DiffusersFamily] = {f.name: f for f in DIFFUSERS.values()}


def test_every_family_has_cited_training_sizes_or_a_reason():
    assert not set(UNKNOWN) - set(FAMILIES), f"listed families without a record: {set(UNKNOWN) - set(FAMILIES)}"
    for name, f in FAMILIES.items():
        if name in UNKNOWN:
            assert f.trained == (), f"{name} has training sizes: drop it from UNKNOWN"
            continue
        assert f.trained, f"{name}: no training size and no reason in UNKNOWN"
        for g in f.trained:
            assert g.checkpoint and CITED.search(g.source), f"{name} {g}: the source names no card, repo or paper"


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if f.trained))
def test_trained_sizes_give_a_positive_token_grid_on_the_grid_axes(name):
    f = FAMILIES[name]
    for g in f.trained:
        lengths = (1,) if f.units.pixels is None else (3,) if f.units.frames else (2, 3)  # tokens; video; image
        assert all(isinstance(s, int) and s > 0 for s in g.size) and len(g.size) in lengths, g
        tokens = f.units.tokens(g.size)
        assert len(tokens) == len(f.grid_axes), (g, tokens, f.grid_axes)
        assert all(isinstance(t, int) and t > 0 for t in tokens), (g, tokens)


def _sizes(name: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    f = FAMILIES[name]
    assert f.trained, name
    return [(g.size, f.units.tokens(g.size)) for g in f.trained]


# The stock pipelines' latent code, called unbound on the few attributes it reads (the factors their __init__ sets
# from the released VAE and transformer configs), in diffusers 0.42.1.
diffusers = pytest.importorskip("diffusers")


def test_flux_tokens_are_flux_pipelines_image_ids():
    # pipelines/flux/pipeline_flux.py: prepare_latents packs 2 x 2 latents of an 8x VAE; _prepare_latent_image_ids
    # gives the rope's (0, y, x) ids of the packed grid
    from diffusers import FluxPipeline

    pipe = SimpleNamespace(vae_scale_factor=8, _pack_latents=FluxPipeline._pack_latents,
                           _prepare_latent_image_ids=FluxPipeline._prepare_latent_image_ids)  # fmt: skip
    for (height, width), tokens in _sizes("flux"):
        _, ids = FluxPipeline.prepare_latents(pipe, 1, 64, height, width, torch.float32, "cpu", None)
        assert (int(ids[:, 1].max()) + 1, int(ids[:, 2].max()) + 1) == tokens


def test_wan_tokens_are_wan_pipelines_latents_cut_by_its_rope():
    # pipelines/wan/pipeline_wan.py prepare_latents (VAE 4 frames, 8 x 8 pixels); WanRotaryPosEmbed cuts the latent
    # video into the (1, 2, 2) patches of the released configs and returns one table row per token
    from diffusers import WanPipeline
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    pipe = SimpleNamespace(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8)
    rope = WanRotaryPosEmbed(attention_head_dim=12, patch_size=(1, 2, 2), max_seq_len=1024)
    for (frames, height, width), tokens in _sizes("wan"):
        latents = WanPipeline.prepare_latents(pipe, 1, 1, height, width, frames, torch.float32, "cpu", None)
        assert tuple(latents.shape[2:]) == (tokens[0], 2 * tokens[1], 2 * tokens[2])
        cos, _ = rope(latents)
        assert cos.shape[1] == tokens[0] * tokens[1] * tokens[2]


def test_hunyuan_video_tokens_are_its_pipelines_latents_cut_by_its_rope():
    # pipelines/hunyuan_video/pipeline_hunyuan_video.py prepare_latents (VAE 4 frames, 8 x 8 pixels);
    # HunyuanVideoRotaryPosEmbed's rope_sizes with the released patch_size 2, patch_size_t 1
    from diffusers import HunyuanVideoPipeline
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoRotaryPosEmbed

    pipe = SimpleNamespace(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8)
    rope = HunyuanVideoRotaryPosEmbed(patch_size=2, patch_size_t=1, rope_dim=[4, 4, 4])
    for (frames, height, width), tokens in _sizes("hunyuan_video"):
        latents = HunyuanVideoPipeline.prepare_latents(pipe, 1, 1, height, width, frames, torch.float32, "cpu", None)
        cos, _ = rope(latents)
        assert tuple(latents.shape[2:]) == (tokens[0], 2 * tokens[1], 2 * tokens[2])
        assert cos.shape[0] == tokens[0] * tokens[1] * tokens[2]


def test_cogvideox_tokens_are_its_pipelines_rotary_grid():
    # pipelines/cogvideo/pipeline_cogvideox.py: prepare_latents [B, F', C, H', W'], then
    # _prepare_rotary_positional_embeddings over F' latent frames (CogVideoX 1.0: patch_size 2, patch_size_t None)
    from diffusers import CogVideoXPipeline

    config = SimpleNamespace(patch_size=2, patch_size_t=None, sample_width=90, sample_height=60, attention_head_dim=64)
    pipe = SimpleNamespace(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8,
                           scheduler=SimpleNamespace(init_noise_sigma=1.0), transformer=SimpleNamespace(config=config))  # fmt: skip
    for (frames, height, width), tokens in _sizes("cogvideox"):
        latents = CogVideoXPipeline.prepare_latents(pipe, 1, 1, frames, height, width, torch.float32, "cpu", None)
        assert latents.shape[1] == tokens[0]
        cos, _ = CogVideoXPipeline._prepare_rotary_positional_embeddings(pipe, height, width, latents.shape[1], "cpu")
        assert cos.shape[0] == tokens[0] * tokens[1] * tokens[2]
        assert (height // (8 * 2), width // (8 * 2)) == tokens[1:]  # the method's grid_height, grid_width


def test_qwen_image_tokens_are_its_pipelines_img_shapes():
    # pipelines/qwenimage/pipeline_qwenimage.py: prepare_latents packs 2 x 2 latents of an 8x VAE, and __call__ hands
    # the rope img_shapes = (1, height // vae_scale_factor // 2, width // vae_scale_factor // 2)
    from diffusers import QwenImagePipeline

    pipe = SimpleNamespace(vae_scale_factor=8, _pack_latents=QwenImagePipeline._pack_latents)
    for (height, width), tokens in _sizes("qwen_image"):
        latents = QwenImagePipeline.prepare_latents(pipe, 1, 16, height, width, torch.float32, "cpu", None)
        assert (height // 8 // 2, width // 8 // 2) == tokens
        assert latents.shape[1] == tokens[0] * tokens[1]


@pytest.mark.parametrize("name", ["ltx_video"])
def test_ltx_tokens_are_its_pipelines_latent_grid(name):
    # pipelines/ltx/pipeline_ltx.py: prepare_latents packs the latents of a 32 x 32 pixel, 8 frame VAE into patches
    # of 1 (the released configs), and __call__ sizes the rope by latent_num_frames = (num_frames - 1) // 8 + 1,
    # latent_height = height // 32, latent_width = width // 32
    from diffusers import LTXPipeline

    pipe = SimpleNamespace(vae_spatial_compression_ratio=32, vae_temporal_compression_ratio=8,
                           transformer_spatial_patch_size=1, transformer_temporal_patch_size=1,
                           _pack_latents=LTXPipeline._pack_latents)  # fmt: skip
    for (frames, height, width), tokens in _sizes(name):
        latents = LTXPipeline.prepare_latents(pipe, 1, 1, height, width, frames, torch.float32, "cpu", None)
        assert ((frames - 1) // 8 + 1, height // 32, width // 32) == tokens
        assert latents.shape[1] == tokens[0] * tokens[1] * tokens[2]


def test_trained_table_has_a_row_per_size_and_one_per_unknown_family():
    rows = trained_table().splitlines()[2:]
    assert len(rows) == sum(len(f.trained) for f in FAMILIES.values()) + len(UNKNOWN)
    assert "| wan | Wan2.1/2.2 T2V, I2V 14B | 81 x 720 x 1280 | 21 x 45 x 80 |" in trained_table()
    assert "| flux | FLUX.1 [dev], [schnell] | 1024 x 1024 | 64 x 64 |" in trained_table()
