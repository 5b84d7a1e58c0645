"""Tiny random diffusers transformers of the Flux-like families (Flux-style id tables and their relatives): Chroma,
Bria, Bria-Fibo, Krea 2, LongCat-Image, Ovis-Image, FLUX.2, FLUX.3. :data:`ENTRIES`: a :class:`Tiny` per class name.
"""

from __future__ import annotations

import diffusers
import torch

import axial_rope as ar
from models.tiny_diffusers_common import B, Tiny, flux_inputs

ENTRIES: dict[str, Tiny] = {}


def _chroma_inputs(h, w, frames, g):
    # no attention_mask: diffusers 0.42.1's checkpointed single blocks drop it (so stock checkpointing changes the
    # output); tests/test_diffusers_batch_fluxlike.py runs the pipeline's mask unscaled and scaled
    inputs = flux_inputs(h, w, frames, g)
    del inputs["pooled_projections"]
    return inputs


def _chroma(depth):
    return diffusers.ChromaTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=depth, num_single_layers=depth, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6), approximator_num_channels=8,
        approximator_hidden_dim=16, approximator_layers=1,
    )  # fmt: skip


ENTRIES["ChromaTransformer2DModel"] = Tiny(_chroma, _chroma_inputs, (1, 4, 6), video=False)


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


ENTRIES["BriaTransformer2DModel"] = Tiny(
    _bria, lambda h, w, frames, g: _ids_inputs(h, w, g, timestep=torch.rand(B, generator=g) * 1000), (1, 4, 6), False
)
ENTRIES["BriaFiboTransformer2DModel"] = Tiny(_bria_fibo, _bria_fibo_inputs, (1, 4, 6), video=False)
ENTRIES["Krea2Transformer2DModel"] = Tiny(_krea2, _krea2_inputs, (1, 4, 6), video=False)


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


ENTRIES["LongCatImageTransformer2DModel"] = Tiny(_longcat, _longcat_inputs, (1, 4, 6), video=False)
ENTRIES["OvisImageTransformer2DModel"] = Tiny(
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


ENTRIES["Flux2Transformer2DModel"] = Tiny(_flux2, _flux2_inputs, (1, 4, 6), video=False)
ENTRIES["Flux3Transformer2DModel"] = Tiny(_flux3, _flux3_inputs, (1, 4, 6), video=False)
