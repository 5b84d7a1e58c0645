"""VideoRoPE (Wei et al., 2025, arXiv:2502.05173): low-frequency time, interleaved space, diagonal layout.

Transcribed from the authors' code (github.com/Wiselnn570/VideoRoPE, commit 7712ca3,
``videorope-transformer/modeling_videorope.py``: ``apply_m_modify_multimodal_rotary_pos_emb`` and
``get_t_scale_rope_index``), which the tests re-derive independently:

- *low-frequency temporal allocation*: one spectrum ``theta ** (-2j / D)`` over the head; the
  last ``mrope_section[0]`` planes (the lowest frequencies) listen to time;
- *interleaved spatial planes*: the first ``h + w`` planes alternate ``y, x, y, x, ...``;
- *diagonal layout*: a grid token's ``y`` and ``x`` are centred on the frame and shifted by its
  time, ``y = t + i - (H - 1) // 2``, so the frame's centre sits on the ``(t, t, t)`` diagonal
  that text tokens walk along;
- *adjustable temporal spacing*: ``t = start + delta * frame`` (``delta = 2`` in the paper).

Half pairing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..frequencies import Frequencies
from ..rope import AxialRoPE
from ..scaling import base_inv_freq
from ._registry import Convention, builds_rope, register
from .qwen_vl import check_mrope_section

__all__ = ["videorope", "videorope_positions"]

SOURCE = "VideoRoPE `videorope-transformer/modeling_videorope.py` (commit 7712ca3)"
CITATION = "Wei et al. 2025, arXiv:2502.05173"


@builds_rope
def videorope(head_dim: int = 128, rope_theta: float = 1000000.0, mrope_section: Sequence[int] = (16, 24, 24)):
    """VideoRoPE's frequency allocation (Qwen2-VL config fields): spatial planes interleaved, time last."""
    t, h, w = check_mrope_section(mrope_section, head_dim)
    spatial = [1 if j % 2 == 0 else 2 for j in range(h + w)]  # y, x, y, x, ... on the high frequencies
    model = Frequencies.axial(spatial + [0] * t, base_inv_freq(head_dim, rope_theta), n_axes=3)
    return AxialRoPE.from_frequencies(model, pairing="half")


def videorope_positions(
    segments: Sequence[int | Sequence[int]],
    *,
    temporal_spacing: float = 2.0,
    spatial_merge_size: int = 1,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """VideoRoPE position ids ``[S, 3]`` (``t, y, x``): text runs (``int``) and ``(t, h, w)`` grids in patches.

    A grid after position ``p`` (the previous segment's last time + 1) puts frame ``f`` at
    ``t = p + delta * f`` and its tokens at ``(t, t + i - (H - 1) // 2, t + j - (W - 1) // 2)``; text after
    it resumes at the grid's last time + 1.
    """
    rows, current = [], 0.0
    for segment in segments:
        if isinstance(segment, int) and not isinstance(segment, bool):
            rows.append((current + torch.arange(segment, dtype=torch.float64))[:, None].expand(segment, 3))
            current = current + segment
            continue
        t, h, w = (int(v) for v in segment)
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        frames = current + temporal_spacing * torch.arange(t, dtype=torch.float64)
        ft, fy, fx = torch.meshgrid(frames, torch.arange(gh, dtype=torch.float64) - (gh - 1) // 2,
                                    torch.arange(gw, dtype=torch.float64) - (gw - 1) // 2, indexing="ij")  # fmt: skip
        rows.append(torch.stack([ft, ft + fy, ft + fx], dim=-1).reshape(-1, 3))
        current = float(frames[-1]) + 1
    return torch.cat(rows).to(dtype) if rows else torch.zeros(0, 3, dtype=dtype)


register(
    Convention(
        name="videorope",
        family="videorope",
        source=SOURCE,
        axes="(t, y, x): first h + w planes alternate y, x; last t planes (lowest frequencies) on t",
        pairing="half",
        positions="diagonal layout: y, x centred and shifted by t; t spaced by delta = 2",
        max_diff=3e-08,
        example=lambda: videorope(16, 10000.0, (2, 3, 3)),
        reference=CITATION,
    )
)
