"""NucleusMoE-Image (diffusers ``NucleusMoEEmbedRope``): Qwen-Image's tables (a copy of ``QwenEmbedRope``).

Per-axis spectra ``(frame, y, x)`` over ``axes_dims_rope`` (theta 10000) as complex ``freqs_cis``: each image of
the first sample's ``img_shapes`` at its frame index with y, x centred, and the text on the diagonal after the
*last* image's ``max(h // 2, w // 2)`` (Qwen-Image takes the largest image's); returned as ``(image, text)``.
Image queries attend to image and text keys, each rotated by its table.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum
from .flux import flux
from .tables import centred_image_rows, complex_tables, diagonal_text_rows, image_spacing

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_nucleusmoe_image.py` `NucleusMoEEmbedRope`"


def _positions(config):
    def positions(rope, sizing, video_fhw, device=None, max_txt_seq_len=None):
        if max_txt_seq_len is None:
            raise ValueError("NucleusMoE-Image's rotary tables need `max_txt_seq_len` (the text length)")
        shapes = video_fhw[0] if isinstance(video_fhw, list) else video_fhw  # the first sample's (all share it)
        shapes = shapes if isinstance(shapes, list) else [shapes]
        steps, scaling = image_spacing(shapes, sizing, device)
        rows = [centred_image_rows(h, w, torch.arange(idx, idx + f, device=device), steps, device)
                for idx, (f, h, w) in enumerate(shapes)]  # fmt: skip
        _, height, width = shapes[-1]  # the text starts after the last image's half extent
        text_start = torch.maximum(height // 2 * steps[0], width // 2 * steps[1])
        image = torch.cat(rows)
        pos = torch.cat([image, diagonal_text_rows(text_start, int(max_txt_seq_len), device)]).float()
        return pos, rope.scaling if sizing is None else (None, *scaling), image.shape[0]

    return positions


NUCLEUS_MOE_IMAGE_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/nucleusmoe_image/pipeline_nucleusmoe_image.py` "
    "default: `default_sample_size` 128 x `vae_scale_factor` 8"
)
register_diffusers(
    DiffusersFamily(
        name="nucleus_moe_image",
        classes=("NucleusMoEImageTransformer2DModel",),
        rope=lambda c: flux(axes_sum(c, "axes_dims_rope", "attention_head_dim")),  # per-axis spectra, theta 10000
        tables=("module", "pos_embed"),  # pos_embed(img_shapes, max_txt_seq_len=..., device=...)
        positions=_positions,
        layout=lambda cos, sin, n_image: complex_tables(cos, sin).split([n_image, cos.shape[0] - n_image]),
        grid_axes=(1, 2),
        time_axis=None,
        stock=("NucleusMoEAttnProcessor2_0",),
        processor="NucleusRopeProcessor",
        blocks=("transformer_blocks.",),
        qk_norm="rms",  # NucleusMoEAttnProcessor2_0: norm_q, norm_k, norm_added_k (RMSNorm over D), then rotation
        timing=Timing(noise=1.0),  # the pipeline passes timestep / 1000 = sigma
        max_diff=3e-9,  # float64 models, tables replaced: 2.5e-9 measured (upstream complex64 tables)
        source=SOURCE,
        axes="(frame, y, x): `axes_dims_rope`, theta 10000; y, x centred",
        trained=(TrainedGrid("NucleusMoE-Image", (1024, 1024), NUCLEUS_MOE_IMAGE_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
