"""AnyFlow (flow-map distilled Wan) and SANA-WM (camera-controlled linear-attention video), as diffusers implements
them: Wan's split of the head over ``(t, y, x)``, interleaved, theta 10000, as complex tables.

Both build Wan's table on the integer token grid and return it complex, ``[1, 1, S, D/2]``: AnyFlow as
``{"query": freqs, "key": freqs}`` in complex128 (complex64 where the device has no float64), SANA-WM in
complex64, sliced again for the camera branch (``_slice_rope_for_cam``) from the same table, so a replaced
table reaches every branch.
"""

from __future__ import annotations

import torch

from ..ops.common import has_float64
from ._fields import field, kind, size
from ._registry import DiffusersFamily, register_diffusers
from ._tables import grid_positions
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


register_diffusers(
    DiffusersFamily(
        name="anyflow",
        classes=("AnyFlowTransformer3DModel",),
        rope=lambda c: wan(size(c, "attention_head_dim")),  # AnyFlowRotaryPosEmbed's theta is fixed at 10000
        tables=("module", "rope"),  # AnyFlowRotaryPosEmbed(layout_cfg=..., device=...)
        positions=_anyflow_positions,
        layout=_anyflow_layout,
        blocks=("blocks.",),
        max_diff=9e-8,  # float64 models: stock turns by float64 (complex128) tables, ours are float32
        source=ANYFLOW_SOURCE,
        axes="(t, y, x): D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000",
    )
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
        max_diff=3e-9,  # float64 models, tables replaced; the GDN recurrence runs in float32
        source=SANA_WM_SOURCE,
        axes="(t, y, x) of `linear_head_dim`: D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6), theta 10000",
    )
)
