"""Lumina-Image 2.0 (diffusers ``Lumina2RotaryPosEmbed``): three-axis ids for caption and image tokens; and
Lumina-Next (``LuminaNextDiT2DModel``): a 2-D grid whose planes alternate y and x."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..positions import grid, text_positions
from ..rope import AxialRoPE
from ._registry import (
    Convention,
    DiffusersFamily,
    PipelineUnits,
    Timing,
    TrainedGrid,
    builds_rope,
    register,
    register_diffusers,
)
from .fields import axes_sum, field, size
from .tables import grid_coordinates, grid_positions

__all__ = ["lumina2", "lumina2_positions", "lumina_next"]

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_lumina2.py` `Lumina2RotaryPosEmbed`"
NEXT_SOURCE = (
    "diffusers 0.42.1 `models/embeddings.py` `get_2d_rotary_pos_embed_lumina` (the pipeline's `image_rotary_emb`)"
)


@builds_rope
def lumina2(
    axes_dim_rope: Sequence[int] = (32, 32, 32), axes_lens: Sequence[int] = (300, 512, 512), theta: float = 10000.0
) -> AxialRoPE:
    """Lumina-Image 2.0 from its config: per-axis spectra over ``(index, y, x)``, interleaved (complex), ``bshd``.

    ``axes_lens`` only bounds the positions upstream's precomputed tables hold (each coordinate of
    axis ``a`` must stay below ``axes_lens[a]`` there); the frequencies do not depend on it.
    """
    if len(tuple(axes_lens)) != len(tuple(axes_dim_rope)):
        raise ValueError(f"lumina2: axes_lens {tuple(axes_lens)} needs one length per axis of {tuple(axes_dim_rope)}")
    return AxialRoPE(tuple(axes_dim_rope), theta=theta, pairing="interleaved")


def lumina2_positions(caption_length: int, height: int, width: int, *, dtype=torch.float32) -> torch.Tensor:
    """Lumina 2's ids: caption token ``i`` at ``(i, 0, 0)``, then the image grid at ``(L, y, x)``.

    ``height`` and ``width`` count tokens (after the patches). Returns ``[L + height * width, 3]``.
    """
    caption = text_positions(caption_length, 3, dtype=dtype)
    caption[:, 1:] = 0
    return torch.cat([caption, grid(1, height, width, offset=(caption_length, 0, 0), dtype=dtype)])


register(
    Convention(
        name="lumina2",
        family="lumina",
        source=SOURCE,
        axes="(index, y, x): 32, 32, 32",
        pairing="interleaved",
        positions="caption (i, 0, 0), image (L, y, x)",
        max_diff=3e-08,
        example=lambda: lumina2((4, 6, 6), (8, 8, 8)),
    )
)


@builds_rope
def lumina_next(head_dim: int = 72, theta: float = 10000.0) -> AxialRoPE:
    """Lumina-Next from its head dim: planes alternate ``y, x, y, x, ...``, each axis its own spectrum
    ``theta ** (-2i / (D/2))`` (``get_2d_rotary_pos_embed_lumina``), interleaved (complex), ``bshd``."""
    if not isinstance(head_dim, int) or head_dim % 4:
        raise ValueError(f"lumina_next: the head dim must be an int divisible by 4, got {head_dim!r}")
    n = head_dim // 4  # planes per axis
    order = [j for i in range(n) for j in (i, n + i)]  # y_0, x_0, y_1, x_1, ... of the per-axis spectra
    return AxialRoPE((head_dim // 2,) * 2, theta=theta, pairing="interleaved", plane_order=order)


def _complex(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved channel tables ``[..., D]`` -> complex ``freqs_cis`` ``[..., D/2]``."""
    return torch.complex(cos[..., 0::2], sin[..., 0::2])


def _lumina2_positions(config):
    """``(rope, sizing, latent [B, C, H, W], caption mask [B, L])``: per item, caption ``(i, 0, 0)`` for its
    ``L_i`` tokens, the image ``(L_i, y, x)``, zeros after (the batch padded to its longest)."""
    p = size(config, "patch_size")

    def positions(rope, sizing, latent, attention_mask):
        device, (h, w) = latent.device, (latent.shape[2] // p, latent.shape[3] // p)
        (ys, xs), scaling = grid_coordinates((h, w), sizing, dtype=torch.float64, device=device)
        image = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)  # [h w, 2]
        caption_lengths = attention_mask.sum(dim=1).tolist()  # a host read, as upstream's
        seq_lengths = [n + h * w for n in caption_lengths]
        rows = []
        for n in caption_lengths:
            caption = torch.zeros(n, 3, dtype=torch.float64, device=device)
            caption[:, 0] = torch.arange(n, dtype=torch.float64, device=device)
            mark = torch.full((h * w, 1), float(n), dtype=torch.float64, device=device)
            pad = torch.zeros(max(seq_lengths) - n - h * w, 3, dtype=torch.float64, device=device)
            rows.append(torch.cat([caption, torch.cat([mark, image], dim=1), pad]))
        pos = torch.stack(rows).float()  # [B, max_seq, 3]
        context = (latent, p, attention_mask.shape[1], caption_lengths, seq_lengths)
        return pos, rope.scaling if sizing is None else (None, *scaling), *context

    return positions


def _lumina2_layout(cos, sin, latent, p, caption_width, caption_lengths, seq_lengths):
    """``Lumina2RotaryPosEmbed``'s outputs: the patched latent ``[B, h w, p p C]``, the caption, image and joint
    ``freqs_cis`` (caption rows past each length zero), the caption and sequence lengths."""
    freqs = _complex(cos, sin)  # [B, max_seq, D/2]
    b, c, height, width = latent.shape
    image_len = (height // p) * (width // p)
    caption = freqs.new_zeros(b, caption_width, freqs.shape[-1])
    image = freqs.new_zeros(b, image_len, freqs.shape[-1])
    for i, (n, total) in enumerate(zip(caption_lengths, seq_lengths)):
        caption[i, :n] = freqs[i, :n]
        image[i] = freqs[i, n:total]
    patched = latent.view(b, c, height // p, p, width // p, p).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2)
    return patched, caption, image, freqs, caption_lengths, seq_lengths


def _lumina_next_positions(config):
    p = size(config, "patch_size")

    def positions(rope, sizing, latent):  # latent [B, C, H, W]: the integer token grid (y, x)
        sizes = (latent.shape[2] // p, latent.shape[3] // p)
        return *grid_positions(sizes, rope, sizing, latent.device), sizes

    return positions


_REVERSED_TIME = dict(timing=Timing(noise=0.0, clean=1.0))  # the pipelines pass 1 - t / 1000 (0 is noise)
LUMINA2_TRAINED_SOURCE = "github.com/Alpha-VLLM/Lumina-Image-2.0 README model table (resolution 1024); arXiv:2503.21758"
register_diffusers(
    DiffusersFamily(
        name="lumina2",
        classes=("Lumina2Transformer2DModel",),
        rope=lambda c: lumina2(
            axes_sum(c, "axes_dim_rope", "hidden_size", "num_attention_heads"), field(c, "axes_lens")
        ),
        tables=("module", "rope_embedder"),  # rope_embedder(latent, caption mask): also patches the latent
        positions=_lumina2_positions,
        layout=_lumina2_layout,
        grid_axes=(1, 2),
        time_axis=None,
        stock=("Lumina2AttnProcessor2_0",),
        processor="Lumina2RopeProcessor",
        blocks=("layers.", "noise_refiner.", "context_refiner."),
        qk_norm="rms",  # Lumina2AttnProcessor2_0: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb
        max_diff=9e-8,  # float64 models: upstream rotates float32 copies of q, k (x.float(), complex64)
        source=SOURCE,
        axes="(index, y, x): `axes_dim_rope`, theta 10000",
        **_REVERSED_TIME,
        trained=(TrainedGrid("Lumina-Image-2.0", (1024, 1024), LUMINA2_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
LUMINA_NEXT_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/lumina/pipeline_lumina.py` default: the "
    "transformer's `sample_size` 128 x `vae_scale_factor` 8"
)
register_diffusers(
    DiffusersFamily(
        name="lumina_next",
        classes=("LuminaNextDiT2DModel",),
        rope=lambda c: lumina_next(size(c, "hidden_size") // size(c, "num_attention_heads")),
        # the pipeline's [384, 384, D/2] grid (its time-aware NTK / linear factors above the default size); the
        # model slices the latent's [h, w]: ours is that grid
        tables=("argument", "image_rotary_emb"),
        positions=_lumina_next_positions,
        layout=lambda cos, sin, sizes: _complex(cos, sin).view(*sizes, -1),
        grid_axes=(0, 1),
        time_axis=None,
        stock=("LuminaAttnProcessor2_0",),
        processor="LuminaNextRopeProcessor",
        blocks=("layers.",),
        qk_norm="layer across heads",  # LuminaAttnProcessor2_0: norm_q, norm_k (LayerNorm over H * D), then rotation
        max_diff=7e-8,  # the same float32 rotation
        source=NEXT_SOURCE,
        axes="(y, x): planes alternating y, x, D/4 each, theta 10000",
        **_REVERSED_TIME,
        trained=(TrainedGrid("Lumina-Next-SFT", (1024, 1024), LUMINA_NEXT_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
