"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL multimodal RoPE (M-RoPE), as transformers implements them.

One spectrum ``theta ** (-2j / D)`` over the head; ``mrope_section`` (planes per axis ``t, h, w``)
cuts it into contiguous sections (Qwen2-VL, Qwen2.5-VL) or interleaves it ``t, h, w, t, ...``
(Qwen3-VL, ``mrope_interleaved``: h and w take planes up to 3 x their section, t the others, as
transformers does; :func:`~axial_rope.frequencies.plane_axes`). Half pairing. Positions (:func:`mrope_positions`): text tokens sit at
``(i, i, i)``; a vision grid starts where the text stopped, and the next text resumes after
``max(h, w)`` (transformers 5.x ``get_rope_index``); Qwen2.5-VL spaces video frames by absolute
time, ``tokens_per_second * seconds_per_grid``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..rope import AxialRoPE
from ._registry import Convention, builds_rope, register

__all__ = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "mrope_positions", "check_mrope_section"]

QWEN2_SOURCE = "transformers 5.24.0 `models/qwen2_vl/modeling_qwen2_vl.py` `Qwen2VLRotaryEmbedding`, `get_rope_index`"
QWEN25_SOURCE = (
    "transformers 5.24.0 `models/qwen2_5_vl/modeling_qwen2_5_vl.py` `Qwen2_5_VLRotaryEmbedding`, `get_rope_index`"
)
QWEN3_SOURCE = "transformers 5.24.0 `models/qwen3_vl/modeling_qwen3_vl.py` `Qwen3VLTextRotaryEmbedding`"


def check_mrope_section(mrope_section: Sequence[int], head_dim: int, name: str = "mrope_section") -> tuple[int, ...]:
    """``mrope_section`` as a tuple of 3 plane counts summing to ``head_dim / 2`` (``ValueError`` naming the field)."""
    if not isinstance(mrope_section, (list, tuple)):
        raise ValueError(f"{name} must be a list of 3 ints (planes for t, h, w), got {mrope_section!r}")
    section = tuple(mrope_section)
    if len(section) != 3 or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in section):
        raise ValueError(f"{name} must be 3 positive ints (planes for t, h, w), got {mrope_section!r}")
    if 2 * sum(section) != head_dim:
        raise ValueError(
            f"{name} {list(section)} counts {sum(section)} planes, head_dim {head_dim} has {head_dim // 2}"
        )
    return section


@builds_rope
def qwen2_vl(head_dim: int = 128, rope_theta: float = 1000000.0, mrope_section: Sequence[int] = (16, 24, 24)):
    """Qwen2-VL's M-RoPE: contiguous sections ``t | h | w`` of one spectrum, half pairing (``spectrum="split"``)."""
    section = check_mrope_section(mrope_section, head_dim)
    return AxialRoPE(tuple(2 * s for s in section), theta=rope_theta, pairing="half", spectrum="split")


@builds_rope
def qwen2_5_vl(head_dim: int = 128, rope_theta: float = 1000000.0, mrope_section: Sequence[int] = (16, 24, 24)):
    """Qwen2.5-VL: Qwen2-VL's frequencies; videos timed by :func:`mrope_positions` with ``tokens_per_second``."""
    return qwen2_vl(head_dim, rope_theta, mrope_section)


@builds_rope
def qwen3_vl(head_dim: int = 128, rope_theta: float = 5000000.0, mrope_section: Sequence[int] = (24, 20, 20)):
    """Qwen3-VL's interleaved M-RoPE: planes ``t, h, w, t, h, w, ...`` (``spectrum="cycled"``), half pairing.

    h and w take planes ``1, 4, 7, ...`` and ``2, 5, 8, ...`` below 3 x their section, t the others
    (transformers' rule: with h or w's section above t's, the axes get other counts than their sections).
    """
    section = check_mrope_section(mrope_section, head_dim)
    return AxialRoPE(tuple(2 * s for s in section), theta=rope_theta, pairing="half", spectrum="cycled")


def mrope_positions(
    segments: Sequence[int | Sequence[float]],
    *,
    spatial_merge_size: int = 1,
    tokens_per_second: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """M-RoPE position ids ``[S, 3]`` (``t, h, w``) of a sequence of text runs and vision grids.

    Args:
        segments: in order, an ``int`` (that many text tokens), ``(t, h, w)`` (an image or video grid in
            patches, ``grid_thw``; frames one step apart) or ``(t, h, w, seconds_per_grid)`` (a Qwen2.5-VL
            video: frame ``i`` at ``floor(i * tokens_per_second * seconds_per_grid)``, in float32 as transformers
            computes it). Qwen3-VL passes
            each video frame as its own ``(1, h, w)`` grid between its timestamp texts.
        spatial_merge_size: patches merged per token along h and w (2 in the released models).
        tokens_per_second: Qwen2.5-VL's ``vision_config.tokens_per_second``, for timed videos.

    A grid of ``T x H x W`` tokens (``H = h / merge``) starting at ``p`` gets ``(p + t_i, p + y, p + x)``;
    the next segment starts at ``p + max(H, W)``, text advances one per token.
    """
    rows, current = [], 0
    for segment in segments:
        if isinstance(segment, int) and not isinstance(segment, bool):
            rows.append((current + torch.arange(segment, dtype=torch.float64))[:, None].expand(segment, 3))
            current += segment
            continue
        t, h, w, *timed = segment
        grid_t, grid_h, grid_w = int(t), int(h) // spatial_merge_size, int(w) // spatial_merge_size
        frames = torch.arange(grid_t, dtype=torch.float64)
        if timed:
            if tokens_per_second is None:
                raise ValueError("mrope_positions: a timed video (t, h, w, seconds) needs tokens_per_second")
            # as transformers: seconds a float32 tensor, times tokens_per_second and the frame index in float32,
            # truncated (.long()); 1/3 s at 25 tokens/s puts frame 3 at 25, not float64's 24
            interval = torch.tensor(float(timed[0]), dtype=torch.float32) * tokens_per_second
            frames = (torch.arange(grid_t) * interval).long().to(torch.float64)
        mesh = torch.meshgrid(frames, torch.arange(grid_h, dtype=torch.float64),
                              torch.arange(grid_w, dtype=torch.float64), indexing="ij")  # fmt: skip
        rows.append(torch.stack(mesh, dim=-1).reshape(-1, 3) + current)
        current += max(grid_h, grid_w)
    if not rows:
        return torch.zeros(0, 3, dtype=dtype)
    pos = torch.cat(rows)
    if not bool((pos.abs() < 2**24).all()) and dtype == torch.float32:
        raise ValueError("mrope_positions: positions past 2**24 are not exact in float32; pass dtype=torch.float64")
    return pos.to(dtype)


register(
    Convention(
        name="qwen2_vl",
        family="qwen_vl",
        source=QWEN2_SOURCE,
        axes="(t, h, w): `mrope_section` 16, 24, 24 planes, contiguous sections of one spectrum",
        pairing="half",
        positions="text (i, i, i); grid from the text position, next text after max(h, w)",
        max_diff=4e-07,
        example=lambda: qwen2_vl(16, 10000.0, (2, 3, 3)),
    )
)
register(
    Convention(
        name="qwen2_5_vl",
        family="qwen_vl",
        source=QWEN25_SOURCE,
        axes="as Qwen2-VL",
        pairing="half",
        positions="as Qwen2-VL; video t = floor(i x tokens_per_second x seconds_per_grid)",
        max_diff=2e-06,
        example=lambda: qwen2_5_vl(16, 10000.0, (2, 3, 3)),
    )
)
register(
    Convention(
        name="qwen3_vl",
        family="qwen_vl",
        source=QWEN3_SOURCE,
        axes="(t, h, w): `mrope_section` 24, 20, 20 planes interleaved t, h, w (h, w below 3 x section), t the rest",
        pairing="half",
        positions="as Qwen2-VL; each video frame its own grid",
        max_diff=2e-07,
        example=lambda: qwen3_vl(16, 10000.0, (4, 2, 2)),
    )
)
