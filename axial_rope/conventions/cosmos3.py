"""Cosmos 3 Omni (diffusers ``Cosmos3VLTextRotaryEmbedding``): Qwen3-VL's interleaved M-RoPE over packed coordinates.

One spectrum ``rope_theta ** (-2j / D)`` over the head, its planes dealt ``t, h, w, t, ...`` by ``rope_axes_dim``
(h and w below 3 x their share, t the rest: :func:`~axial_rope.conventions.qwen_vl.qwen3_vl`), half pairing. The
pipeline packs one joint sequence and passes its ``position_ids [3, N]``: the text (the understanding pathway,
causal) at ``(i, i, i)``; the vision latents (the generation pathway) at ``t = und_len +
unified_3d_mrope_temporal_modality_margin`` (15000) plus the frame's time (``frame x base_fps / fps`` with fps
modulation, a float), ``(h, w)`` from 0 (``unified_3d_mrope_reset_spatial_ids``); sound and action rows on their
own clocks from the same offset, ``(h, w) = (0, 0)``. ``rotary_emb(position_ids [3, 1, N])`` returns the tables of
the whole sequence, ``[1, N, D]``, which the forward cuts at ``und_len`` into the two pathways' tables. These are
the pipeline's coordinates, not a token grid to size: per-axis spectra to scale (one method, the spectrum being
shared), no ``mode``.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, register_diffusers
from .fields import field, size
from .qwen_vl import qwen3_vl

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_cosmos3.py` `Cosmos3VLTextRotaryEmbedding`"


def _rope(config):
    section = field(config, "rope_axes_dim", None)
    if section is None:  # as Cosmos3OmniTransformer.__init__: rope_scaling's mrope_section, else (24, 20, 20)
        section = (field(config, "rope_scaling", None) or {}).get("mrope_section", (24, 20, 20))
    section = tuple(section) if isinstance(section, (list, tuple)) else section  # check_mrope_section names a bad one
    return qwen3_vl(size(config, "head_dim"), float(field(config, "rope_theta")), section)


def _positions(config):
    def positions(rope, sizing, position_ids, device=None, dtype=None):
        # [3, B, N] (the forward's [3, N] with a batch of 1), or [B, N]: every axis alike, as upstream expands it
        ids = position_ids if position_ids.ndim == 3 else position_ids[None].expand(3, *position_ids.shape)
        # [B, N, 3], float32 as upstream reads them; the one method of the shared spectrum (rope.scaling repeats it)
        return ids.float().movedim(0, -1), rope.scaling[0], device, dtype

    return positions


def _layout(cos: torch.Tensor, sin: torch.Tensor, device, dtype):
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)  # [B, N, D] each


register_diffusers(
    DiffusersFamily(
        name="cosmos3",
        classes=("Cosmos3OmniTransformer",),
        rope=_rope,
        tables=("module", "rotary_emb"),  # rotary_emb(position_ids [3, 1, N], device, dtype) -> (cos, sin) [1, N, D]
        # vision_timesteps: per noisy vision token, UniPC's 999 .. 0; the model multiplies by 0.001
        timing=Timing(argument="vision_timesteps", noise=1000.0),
        positions=_positions,
        layout=_layout,
        grid_axes=(),  # positions are the pipeline's packed coordinates: scaling, no mode
        time_axis=0,
        blocks=("layers.",),
        qk_norm="rms",  # Cosmos3AttnProcessor: norm_q/k, norm_added_q/k (RMSNorms over D), then the rotation
        # float64 models, tables replaced: 1.9e-7 measured; the stock angles are float32 products at positions past
        # the 15000 margin, ours float64
        max_diff=2e-7,
        source=SOURCE,
        axes="(t, h, w): `rope_axes_dim` planes interleaved t, h, w, `rope_theta`; packed pipeline coordinates, "
        "vision after the text + `unified_3d_mrope_temporal_modality_margin`; one spectrum: one scaling for all axes",
        # unknown: grid_axes=(): the positions are the pipeline's packed coordinates, no token grid to plan against;
        # NVIDIA's model reference (docs.nvidia.com/cosmos/latest/cosmos3/model_reference.html) gives the supported
        # generation settings (256p, 480p, 720p; 5 to 300 frames), not the training sizes
        trained=(),
        # Cosmos3OmniPipeline: Wan 2.2 VAE (16 x spatial, 4 x temporal, the first frame alone), latent_patch_size 2
        units=PipelineUnits(32, frames=(4, 1)),
    )
)
