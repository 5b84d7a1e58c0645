"""Multimodal RoPE: Qwen2-VL, Qwen2.5-VL (absolute time), Qwen3-VL (interleaved) against transformers 5.24.0,
their position ids against transformers' own ``get_rope_index``, and VideoRoPE against a transcription of
the authors' code (github.com/Wiselnn570/VideoRoPE, commit 7712ca3, ``modeling_videorope.py``).
"""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from conventions_support import (
    EPS32,
    angle_gap,
    assert_close,
    check_documented,
    exact_tables,
    max_diff,
    rotation_bound,
    seeded,
    upstream_table_bound,
)
from helpers import qwen_vl_config

import axial_rope as ar
from axial_rope import conventions as conv

pytest.importorskip("transformers")


def upstream_rope_index(model_cls, segments, merge: int, tokens_per_second=None) -> torch.Tensor:
    """transformers' ``get_rope_index`` on a sequence of text runs and grids -> position ids ``[S, 3]``."""
    types, images, videos, seconds = [], [], [], []
    for segment in segments:
        if isinstance(segment, int):
            types += [0] * segment
            continue
        t, h, w, *timed = segment
        kind = 2 if timed else 1
        (videos if timed else images).append([t, h, w])
        seconds += list(timed)
        types += [kind] * (t * (h // merge) * (w // merge))
    vision = SimpleNamespace(spatial_merge_size=merge, tokens_per_second=tokens_per_second)
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = partial(model_cls.get_vision_position_ids, fake)
    ids = torch.zeros(1, len(types), dtype=torch.long)
    position_ids, _ = model_cls.get_rope_index(
        fake, ids, torch.tensor([types]), torch.tensor(images) if images else None,
        torch.tensor(videos) if videos else None, second_per_grid_ts=torch.tensor(seconds) if seconds else None,
    )  # fmt: skip
    return position_ids[:, 0].T.float()  # [S, 3]


def check_model(name: str, rope, embed, apply, pos: torch.Tensor, head_dim: int) -> None:
    cos, sin = embed(torch.zeros(1), pos.T[:, None].long())  # position_ids [3, B, S]
    ours = rope.cos_sin(pos[None])
    bound = upstream_table_bound(rope, pos)
    check_documented(name, max_diff((ours[0], cos), (ours[1], sin)), bound)
    S = pos.shape[0]
    q, k = seeded(1, 2, S, head_dim, seed=1), seeded(1, 1, S, head_dim, seed=2)
    want_q, want_k = apply(q, k, cos, sin)
    got_q, got_k = rope(q, k, pos[None], layout="bhsd")
    assert_close(got_q, want_q, rotation_bound(q, bound))
    assert_close(got_k, want_k, rotation_bound(k, bound))
    # positions near 1e6: upstream's float32 angles, per entry within (ln theta + 5) float32 roundings
    far = pos + 1e6
    far_cos, far_sin = embed(torch.zeros(1), far.T[:, None].long())
    n = head_dim // 2
    exact_cos, exact_sin = exact_tables(rope, far)
    angle = far.abs().amax() * rope.freqs.abs().amax(0)  # [n]: the largest |angle| of each plane
    bound = angle * (math.log(rope.theta[0]) + 5) * EPS32 + 2 * EPS32  # see test_conventions_llm.check_far
    assert bool((angle_gap(exact_cos[:, :n], exact_sin[:, :n], far_cos[0, :, :n], far_sin[0, :, :n]) <= bound).all())


SEGMENTS = [3, (1, 4, 6), 2, (2, 4, 4), 2]


def test_qwen2_vl():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

    params = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
    embed = qwen2.Qwen2VLRotaryEmbedding(qwen_vl_config(Qwen2VLTextConfig, params, 32))
    pos = conv.mrope_positions(SEGMENTS, spatial_merge_size=2)
    assert torch.equal(pos, upstream_rope_index(qwen2.Qwen2VLModel, SEGMENTS, 2))
    rope = conv.qwen2_vl(32, 1e6, (4, 6, 6))
    check_model("qwen2_vl", rope, embed, qwen2.apply_rotary_pos_emb, pos, 32)


@pytest.mark.parametrize("seconds", [0.5, 2.0, 1.0 / 3.0])
def test_qwen2_5_vl_absolute_time(seconds):
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen25
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig

    params = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]}
    embed = qwen25.Qwen2_5_VLRotaryEmbedding(qwen_vl_config(Qwen2_5_VLTextConfig, params, 32))
    segments = [4, (1, 4, 4), 3, (4, 4, 6, seconds), 2]  # an image, then a video of 4 temporal patches
    pos = conv.mrope_positions(segments, spatial_merge_size=2, tokens_per_second=25)
    assert torch.equal(pos, upstream_rope_index(qwen25.Qwen2_5_VLModel, segments, 2, tokens_per_second=25))
    video_t = pos[4 + 4 + 3 : 4 + 4 + 3 + 24][:, 0].unique()  # the 4 x 2 x 3 video tokens
    assert torch.equal(video_t - video_t[0], torch.floor(torch.arange(4.0) * 25 * seconds))  # seconds, not frames
    rope = conv.qwen2_5_vl(32, 1e6, (4, 6, 6))
    check_model("qwen2_5_vl", rope, embed, qwen25.apply_rotary_pos_emb, pos, 32)


def test_qwen3_vl_interleaved():
    qwen3 = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    params = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5], "mrope_interleaved": True}
    embed = qwen3.Qwen3VLTextRotaryEmbedding(qwen_vl_config(Qwen3VLTextConfig, params, 32))
    # a video as Qwen3-VL feeds it: one (1, h, w) grid per frame, each after its timestamp text
    segments = [3, 2, (1, 4, 4), 2, (1, 4, 4), 1]
    pos = conv.mrope_positions(segments, spatial_merge_size=2)
    assert torch.equal(pos, upstream_rope_index(qwen3.Qwen3VLModel, segments, 2))
    rope = conv.qwen3_vl(32, 5e6, (6, 5, 5))
    assert rope.plane_axis[:6] == [0, 1, 2, 0, 1, 2] and rope.plane_axis[-1:] == [0]
    check_model("qwen3_vl", rope, embed, qwen3.apply_rotary_pos_emb, pos, 32)
    assert torch.equal(ar.rope_from_config(embed.config).freqs, rope.freqs)


@pytest.mark.parametrize("section", [(24, 20, 20), (16, 24, 24), (4, 6, 6), (8, 12, 12), (2, 7, 5), (6, 5, 5)])
def test_qwen3_vl_interleaved_follows_transformers_for_every_section(section):
    """transformers caps the h and w strides at 3 x their section: where h or w has more planes than t,
    the axes do not get their section's count (a round robin would give q off by up to 0.09)."""
    qwen3 = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    head_dim = 2 * sum(section)
    params = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": list(section), "mrope_interleaved": True}
    embed = qwen3.Qwen3VLTextRotaryEmbedding(qwen_vl_config(Qwen3VLTextConfig, params, head_dim))
    pos = torch.stack([torch.arange(9.0), torch.arange(9.0) * 3 % 7, 20 - torch.arange(9.0)], dim=-1)  # [S, 3]
    rope = ar.rope_from_config(embed.config)
    assert torch.equal(rope.freqs, conv.qwen3_vl(head_dim, 5e6, section).freqs)
    cos, sin = embed(torch.zeros(1), pos.T[:, None].long())
    ours = rope.cos_sin(pos[None])
    assert max_diff((ours[0], cos), (ours[1], sin)) <= 1e-5
    q, k = seeded(1, 2, 9, head_dim, seed=1), seeded(1, 1, 9, head_dim, seed=2)
    want_q, want_k = qwen3.apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = rope(q, k, pos[None], layout="bhsd")
    assert_close(got_q, want_q, 1e-5)
    assert_close(got_k, want_k, 1e-5)
    # the rule itself: plane j is h when j % 3 == 1 and j < 3 x h's section, w likewise, else t
    h, w = section[1], section[2]
    rule = [1 if j % 3 == 1 and j < 3 * h else 2 if j % 3 == 2 and j < 3 * w else 0 for j in range(sum(section))]
    assert rope.plane_axis == rule


# -- VideoRoPE: a transcription of the authors' code, written out independently -----------------------


def videorope_reference_positions(segments, delta: float) -> torch.Tensor:
    """``get_t_scale_rope_index``: text from the last t + 1; a grid centred on (H-1)//2, (W-1)//2 and shifted by t."""
    rows, next_start = [], 0.0
    for segment in segments:
        if isinstance(segment, int):
            for i in range(segment):
                rows.append([next_start + i] * 3)
            next_start += segment
            continue
        T, H, W = segment
        for f in range(T):
            t = next_start + f * delta
            for y in range(H):
                for x in range(W):
                    rows.append([t, t + y - (H - 1) // 2, t + x - (W - 1) // 2])
        next_start = next_start + (T - 1) * delta + 1
    return torch.tensor(rows, dtype=torch.float64)


def videorope_reference_tables(pos: torch.Tensor, head_dim: int, theta: float, section) -> tuple:
    """``apply_m_modify_multimodal_rotary_pos_emb``: per-axis cos of one spectrum, then the channel layout
    (h+w alternating h, w), (t), repeated for the second half (half pairing)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = pos.T[:, :, None] * inv  # [3, S, D/2]
    t, h, w = section
    rows = [1 if j % 2 == 0 else 2 for j in range(h + w)] + [0] * t
    planes = torch.stack([angles[r, :, j] for j, r in enumerate(rows)], -1)  # [S, D/2]
    return torch.cat([planes, planes], -1).cos(), torch.cat([planes, planes], -1).sin()


@pytest.mark.parametrize(("segments", "delta"), [([3, (2, 3, 4), 2], 2.0), ([1, (3, 4, 4), 4, (1, 2, 5), 1], 1.0)],
                         ids=str)  # fmt: skip
def test_videorope(segments, delta):
    pos = conv.videorope_positions(segments, temporal_spacing=delta, dtype=torch.float64)
    assert torch.equal(pos, videorope_reference_positions(segments, delta))
    rope = conv.videorope(32, 1e6, (4, 6, 6))
    assert rope.plane_axis == [1, 2] * 6 + [0] * 4  # interleaved space on the high frequencies, time last
    for shift in (0.0, 1e6):
        ref_cos, ref_sin = videorope_reference_tables(pos + shift, 32, 1e6, (4, 6, 6))
        cos, sin = exact_tables(rope, pos + shift)
        assert_close(cos, ref_cos, 1e-9)
        assert_close(sin, ref_sin, 1e-9)
    ref_cos, ref_sin = videorope_reference_tables(pos, 32, 1e6, (4, 6, 6))
    ours = rope.cos_sin(pos.float())
    # a float64 transcription: ours rounded once, 2**-24 from it
    check_documented("videorope", max_diff((ours[0], ref_cos), (ours[1], ref_sin)), EPS32)
