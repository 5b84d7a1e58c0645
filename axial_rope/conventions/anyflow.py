"""AnyFlow (flow-map distilled Wan) and SANA-WM (camera-controlled linear-attention video), as diffusers implements
them: Wan's split of the head over ``(t, y, x)``, interleaved, theta 10000, as complex tables.

Both build Wan's table on the integer token grid and return it complex, ``[1, 1, S, D/2]``: AnyFlow as
``{"query": freqs, "key": freqs}`` in complex128 (complex64 where the device has no float64), SANA-WM in
complex64, sliced again for the camera branch (``_slice_rope_for_cam``) from the same table, so a replaced
table reaches every branch.
"""

from __future__ import annotations

import torch

from ..ops import has_float64
from ._registry import DiffusersFamily, PipelineUnits, TrainedGrid, register_diffusers
from .fields import field, kind, size
from .tables import grid_coordinates, grid_positions
from .wan import wan

__all__ = []

ANYFLOW_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_anyflow.py` `AnyFlowRotaryPosEmbed`"
SANA_WM_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_sana_wm.py` `SanaWMRotaryPosEmbed`"


def _complex(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Interleaved tables ``[S, D]`` -> the complex planes ``[1, 1, S, D/2]``."""
    return torch.complex(cos[:, ::2].to(dtype), sin[:, ::2].to(dtype))[None, None]


def _anyflow_positions(config):
    def positions(rope, sizing, layout_cfg, device):  # layout_cfg: total_frames, full_frame_shape (tokens)
        sizes = (layout_cfg["total_frames"], *layout_cfg["full_frame_shape"])
        return grid_positions(sizes, rope, sizing, device)

    return positions


def _anyflow_layout(cos: torch.Tensor, sin: torch.Tensor) -> dict[str, torch.Tensor]:
    freqs = _complex(cos, sin, torch.float64 if has_float64(cos.device) else torch.float32)
    return {"query": freqs, "key": freqs}


def _sana_wm_rope(config):
    if not field(config, "use_pe", True):
        raise ValueError(f"{kind(config)} config: use_pe is False (no RoPE)")
    return wan(size(config, "linear_head_dim"))  # SanaWMRotaryPosEmbed: theta 10000, no fhw_dim


def _sana_wm_positions(config):
    def positions(rope, sizing, fhw, device=None):  # (frames, height, width) after the patches
        return grid_positions(tuple(fhw), rope, sizing, device)

    return positions


ANYFLOW_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/anyflow/pipeline_anyflow.py` default height 480, "
    "width 832, num_frames 81 (docs `anyflow.md`: 'the canonical 81 raw frames')"
)
register_diffusers(
    DiffusersFamily(
        name="anyflow",
        classes=("AnyFlowTransformer3DModel",),
        rope=lambda c: wan(size(c, "attention_head_dim")),  # AnyFlowRotaryPosEmbed's theta is fixed at 10000
        tables=("module", "rope"),  # AnyFlowRotaryPosEmbed(layout_cfg=..., device=...)
        positions=_anyflow_positions,
        layout=_anyflow_layout,
        stock=("AnyFlowAttnProcessor",),  # the self-attention's (the cross-attention rotates nothing)
        processor="AnyFlowRopeProcessor",
        blocks=("blocks.",),
        qk_norm="rms across heads",  # AnyFlowAttnProcessor: norm_q, norm_k (RMSNorm over H * D), then apply_rotary_emb
        max_diff=9e-8,  # float64 models: stock turns by float64 (complex128) tables, ours are float32
        source=ANYFLOW_SOURCE,
        axes="(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000",
        trained=(TrainedGrid("AnyFlow", (81, 480, 832), ANYFLOW_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)

SANA_WM_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/sana_wm/pipeline_sana_wm.py` default "
    "TARGET_HEIGHT 704, TARGET_WIDTH 1280 (`cam_utils.py`), num_frames 161"
)
register_diffusers(
    DiffusersFamily(
        name="sana_wm",
        classes=("SanaWMTransformer3DModel",),
        rope=_sana_wm_rope,
        tables=("module", "rope"),  # SanaWMRotaryPosEmbed((frames, height, width), device=...)
        positions=_sana_wm_positions,
        layout=lambda cos, sin: _complex(cos, sin, torch.float32),
        blocks=("blocks.",),
        # GDN blocks (transformer_sana_wm.py): q_norm, k_norm over H * D, then a ReLU kernel, then the rotation
        qk_norm=None,
        max_diff=3e-9,  # float64 models, tables replaced; the GDN recurrence runs in float32
        source=SANA_WM_SOURCE,
        axes="(t, y, x) of `linear_head_dim`: D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000",
        trained=(TrainedGrid("SANA-WM", (161, 704, 1280), SANA_WM_TRAINED_SOURCE),),
        units=PipelineUnits(32, frames=(8, 1)),
    )
)


FAR_SOURCE = "diffusers 0.42.1 `models/transformers/transformer_anyflow_far.py` `AnyFlowCausalRotaryPosEmbed`"


def _far_positions(config):
    """``rope(far_cfg, device, clean_hidden_states=None)``: Wan's table on the full token grid for the full frames,
    and for the compressed context frames the table average-pooled over windows of ``d = compressed_patch_size /
    patch_size`` and renormalised. The mean of ``exp(i f k)`` over ``k = d j .. d j + d - 1`` is
    ``exp(i f (d j + (d - 1) / 2)) sin(d f / 2) / sin(f / 2)``, whose phase is the window's centre while ``d f / 2 <
    pi`` (every ``f <= 1`` for ``d <= 6``): the compressed tokens sit at the centres of their windows of full-grid
    tokens. Order: compressed frames, full frames (and the full frames again for the clean copy)."""
    down = tuple(c // p for c, p in zip(field(config, "compressed_patch_size"), field(config, "patch_size")))
    if max(down) > 6:
        raise ValueError(f"{kind(config)} config: compressed_patch_size / patch_size {down} above 6 pools the fastest "
                         "planes past a half turn (the pooled phase is then not a position)")  # fmt: skip

    def positions(rope, sizing, far_cfg, device=None, clean_hidden_states=None):
        frames, compressed = far_cfg["total_frames"], far_cfg["num_compressed_frames"]
        sizes = (frames, *far_cfg["full_frame_shape"])
        coords, sized_scaling = grid_coordinates(sizes, sizing, device=device)  # per axis [n_a]: affine in the index

        def at(a, index):  # the coordinate of (fractional) full-grid index `index` on axis a
            c = coords[a]
            return c[0] + (c[1] - c[0] if c.shape[0] > 1 else 1.0) * index

        def mesh(t, y, x):
            return torch.stack(torch.meshgrid(t, y, x, indexing="ij"), dim=-1).reshape(-1, 3)

        def window_centres(a, n):
            return at(a, down[a] * torch.arange(n, dtype=torch.float32, device=device) + (down[a] - 1) / 2)

        full = mesh(*(at(a, torch.arange(lo, n, dtype=torch.float32, device=device))
                      for a, (lo, n) in enumerate(zip((compressed, 0, 0), sizes))))  # fmt: skip
        pooled = mesh(window_centres(0, compressed), *(window_centres(a, n) for a, n in
                                                       zip((1, 2), far_cfg["compressed_frame_shape"])))  # fmt: skip
        parts = [pooled, full] + ([full] if clean_hidden_states is not None else [])
        return torch.cat(parts), rope.scaling if sizing is None else sized_scaling

    return positions


ANYFLOW_FAR_TRAINED_SOURCE = (
    "diffusers 0.42.1 (github.com/huggingface/diffusers) `pipelines/anyflow/pipeline_anyflow_far.py` default height "
    "480, width 832, num_frames 81"
)
register_diffusers(
    DiffusersFamily(
        name="anyflow_far",
        classes=("AnyFlowFARTransformer3DModel",),
        rope=lambda c: wan(size(c, "attention_head_dim")),  # AnyFlowCausalRotaryPosEmbed: Wan's split, theta 10000
        tables=("module", "rope"),  # rope(far_cfg=..., device=..., clean_hidden_states=...)
        positions=_far_positions,
        layout=_anyflow_layout,
        blocks=("blocks.",),
        qk_norm="rms across heads",  # AnyFlowCausalAttnProcessor: norm_q, norm_k (RMSNorm over H * D), then rotation
        max_diff=2e-7,  # float64 models, tables replaced: 1.2e-7 measured (stock complex128, ours float32 tables)
        source=FAR_SOURCE,
        axes="(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000; compressed frames at window "
        "centres",
        trained=(TrainedGrid("AnyFlow FAR", (81, 480, 832), ANYFLOW_FAR_TRAINED_SOURCE),),
        units=PipelineUnits(16, frames=(4, 1)),
    )
)
