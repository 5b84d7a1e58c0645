"""Qwen-Image (2.0 and 2.1), as diffusers implements them: ``(frame, y, x)`` per-axis spectra over centred images.

Both tables modules return complex ``freqs_cis`` (interleaved planes) from three per-axis spectra
``theta ** (-2i / d_a)`` (``axes_dims_rope``, theta 10000). An image of ``h x w`` tokens sits at ``y = i -
ceil(h / 2)``, ``x = j - ceil(w / 2)`` (centred on 0, ``scale_rope``); the positions of its other tokens differ:

- Qwen-Image (``QwenEmbedRope``): image ``k`` of a sample's list (the target, then references) has frame ``k``;
  the text, rotated too, follows at ``(m, m, m)`` from ``m = max(h // 2, w // 2)`` over the images. Its layered
  variant (``QwenEmbedLayer3DRope``) puts the last image (the condition) at frame -1 and starts the text past the
  layer count too. The module returns ``(image freqs, text freqs)``.
- Qwen-Image 2.1 (``QwenImage21Rope``): one joint sequence of text runs and images (``image_pad_mask``); text
  advances one position per token on all three axes, an image freezes the frame at the position reached and
  advances it by ``max(h, w)``. The module returns the joint ``freqs_cis``.

Sized (``mode``), the spacing of the image axes is what :func:`~axial_rope.positions_for_size` gives the largest
image of the forward (``1 / s`` interpolating), the centring and the frame/text advances are taken in that spacing.
"""

from __future__ import annotations

import torch

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import axes_sum, field
from .flux import flux
from .tables import centred_image_rows, complex_tables, diagonal_text_rows, image_spacing

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_qwenimage.py` `QwenEmbedRope`, `QwenEmbedLayer3DRope`"
SOURCE_21 = "diffusers 0.42.1 `models/transformers/transformer_qwenimage21.py` `QwenImage21Rope`"


def _qwen_positions(config):
    layered = bool(field(config, "use_layer3d_rope", False))

    def positions(rope, sizing, video_fhw, device=None, max_txt_seq_len=None):
        if max_txt_seq_len is None:
            raise ValueError("Qwen-Image's rotary tables need `max_txt_seq_len` (the text length)")
        shapes = video_fhw[0] if isinstance(video_fhw, list) else video_fhw  # the first sample's (all share it)
        shapes = shapes if isinstance(shapes, list) else [shapes]
        steps, scaling = image_spacing(shapes, sizing, device)
        rows, text_start = [], torch.zeros((), dtype=torch.float64, device=device)
        last = len(shapes) - 1
        for idx, (frame, height, width) in enumerate(shapes):
            frames = torch.arange(idx, idx + frame, device=device)
            if layered and idx == last:  # the condition image: frame -1
                frames = torch.full((frame,), -1, device=device)
            rows.append(centred_image_rows(height, width, frames, steps, device))
            text_start = torch.maximum(text_start, torch.maximum(height // 2 * steps[0], width // 2 * steps[1]))
        if layered:
            text_start = torch.clamp(text_start, min=last)
        image = torch.cat(rows)
        pos = torch.cat([image, diagonal_text_rows(text_start, int(max_txt_seq_len), device)]).float()
        return pos, rope.scaling if sizing is None else (None, *scaling), image.shape[0]

    return positions


def _qwen21_positions(config):
    def positions(rope, sizing, img_shapes, image_pad_mask, device=None):
        is_image = image_pad_mask.tolist()  # a host read of the layout, as upstream's
        steps, scaling = image_spacing(img_shapes, sizing, device)
        rows, cursor, position = [], 0, torch.zeros((), dtype=torch.float64, device=device)
        for _, height, width in img_shapes:
            start = is_image.index(True, cursor)
            rows.append(diagonal_text_rows(position, start - cursor, device))
            position = position + (start - cursor)
            rows.append(centred_image_rows(height, width, position[None], steps, device))
            position = position + torch.maximum(height * steps[0], width * steps[1])
            cursor = start + height * width
        rows.append(diagonal_text_rows(position, len(is_image) - cursor, device))
        return torch.cat(rows).float(), rope.scaling if sizing is None else (None, *scaling)

    return positions


_COMMON = dict(
    rope=lambda c: flux(axes_sum(c, "axes_dims_rope", "attention_head_dim")),  # per-axis spectra, theta 10000
    tables=("module", "pos_embed"),
    grid_axes=(1, 2),
    time_axis=None,
    blocks=("transformer_blocks.",),
    timing=Timing(noise=1.0),  # the pipelines pass timestep / 1000 = sigma
    axes="(frame, y, x): `axes_dims_rope`, theta 10000; y, x centred",
)
QWEN_IMAGE_TRAINED_SOURCE = (
    "github.com/QwenLM/Qwen-Image README aspect_ratios: 1:1 1328 x 1328, 16:9 1664 x 928, 9:16 928 x 1664, 4:3, 3:4, "
    "3:2, 2:3 between; arXiv:2508.02324"
)
register_diffusers(
    DiffusersFamily(
        name="qwen_image",
        classes=("QwenImageTransformer2DModel",),
        positions=_qwen_positions,  # pos_embed(img_shapes, max_txt_seq_len=..., device=...)
        layout=lambda cos, sin, n_image: complex_tables(cos, sin).split([n_image, cos.shape[0] - n_image]),
        stock=("QwenDoubleStreamAttnProcessor2_0",),
        processor="QwenImageRopeProcessor",
        qk_norm="rms",  # QwenDoubleStreamAttnProcessor2_0: norm_q/k, norm_added_q/k (RMSNorm over D), then rotation
        max_diff=8e-10,  # float64 models, at the training size; the tables' float32 rounding
        source=SOURCE,
        **_COMMON,
        trained=(
            TrainedGrid("Qwen-Image", (1328, 1328), QWEN_IMAGE_TRAINED_SOURCE),
            TrainedGrid("Qwen-Image", (928, 1664), QWEN_IMAGE_TRAINED_SOURCE),
            TrainedGrid("Qwen-Image", (1664, 928), QWEN_IMAGE_TRAINED_SOURCE),
        ),
        units=PipelineUnits(16),
    )
)
QWEN_IMAGE_21_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/qwenimage21/pipeline_qwenimage21.py` default "
    "`output_resolution` 1024"
)
register_diffusers(
    DiffusersFamily(
        name="qwen_image_21",
        classes=("QwenImage21Transformer2DModel",),
        positions=_qwen21_positions,  # pos_embed(img_shapes[0], image_pad_mask, device=...)
        layout=complex_tables,
        stock=("QwenImage21AttnProcessor", "QwenImage21FlexAttnProcessor"),
        qk_norm="rms",  # QwenImage21AttnProcessor: norm_q, norm_k (RMSNorm over D), then apply_rotary_emb_qwen
        max_diff=2e-9,
        source=SOURCE_21,
        **_COMMON,
        trained=(TrainedGrid("Qwen-Image 2.1", (1024, 1024), QWEN_IMAGE_21_TRAINED_SOURCE),),
        units=PipelineUnits(16),
    )
)
