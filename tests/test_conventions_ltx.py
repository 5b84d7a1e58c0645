"""LTX-Video, LTX-2 and Mochi: per-head frequency models against the installed diffusers (0.42.1).

LTX: upstream accepts float64 ``video_coords`` (LTX-2: float64 ``coords``), which gives float64
angles from its float32 schedule, so the float64 comparison is tight (1e-9) up to coordinates near
1e6; its default float32 grid path is compared within its own float32 angle error. Mochi computes in
float32 only; far from the origin it is compared within that error, per entry.
"""

from __future__ import annotations

import pytest
import torch
from conventions_support import (
    angle_gap,
    assert_close,
    check_documented,
    exact_planes,
    float32_angle_bound,
    max_diff,
    rotated_unit_bound,
    rotation_bound,
    seeded,
    upstream_table_bound,
)

from axial_rope import conventions as conv

EPS32_TABLE = 2.0**-24  # a float64 table rounded once (upstream's, in its float32 rotation)
ltx_module = pytest.importorskip("diffusers.models.transformers.transformer_ltx")
ltx2_module = pytest.importorskip("diffusers.models.transformers.transformer_ltx2")


def per_head(table: torch.Tensor, heads: int) -> torch.Tensor:
    """An upstream table over the hidden size ``[S, H * D]`` -> ``[S, H, D]`` (head h owns channels h*D..)."""
    return table.reshape(table.shape[0], heads, -1)


def ours_channels(rope, pos):
    """float64 channel tables ``[S, H, D]`` of the rope (interleaved or half, per head)."""
    cos, sin = exact_planes(rope, pos)
    expand = (
        (lambda t: t.repeat_interleave(2, -1)) if rope.pairing == "interleaved" else (lambda t: torch.cat([t, t], -1))
    )
    return expand(cos), expand(sin)


@pytest.mark.parametrize(("heads", "head_dim", "grid"), [(2, 16, (3, 4, 5)), (3, 20, (2, 3, 2)), (2, 32, (1, 5, 4))],
                         ids=str)  # fmt: skip
def test_ltx_video(heads, head_dim, grid):
    dim = heads * head_dim  # 32: 5 frequencies and 1 padding plane; 60: no padding; 64: 2 padding planes
    embed = ltx_module.LTXVideoRotaryPosEmbed(dim, patch_size=1, patch_size_t=1)
    rope = conv.ltx_video(heads, head_dim)
    pos = conv.ltx_video_positions(*grid, frame_rate=25.0)
    hidden = torch.zeros(1, pos.shape[0], dim)
    # float64 coordinates: upstream's float32 schedule, float64 angles
    ref_cos, ref_sin = embed(hidden, video_coords=pos.T[None])
    cos, sin = ours_channels(rope, pos)
    assert_close(cos, per_head(ref_cos[0], heads), 1e-9)
    assert_close(sin, per_head(ref_sin[0], heads), 1e-9)
    padding = (rope.freqs[0] == 0).all(0)  # head 0's zero columns: the leading padding planes
    assert int(padding.sum()) == (dim % 6) // 2 and bool(padding[: (dim % 6) // 2].all())
    # the pipeline's path: float32 grid times rope_interpolation_scale, float32 angles
    grid_cos, grid_sin = embed(hidden, *grid, rope_interpolation_scale=(8 / 25, 32, 32))
    ours32 = rope.cos_sin(pos)  # [S, H, D]
    bound = float32_angle_bound(torch.full((), torch.pi / 2 * 10000 * 2))  # |angle| <= theta pi / 2 * |2 g - 1|
    diff = max_diff((ours32[0], per_head(grid_cos[0], heads)), (ours32[1], per_head(grid_sin[0], heads)))
    check_documented("ltx_video", diff, float(bound))
    # the positions helper is upstream's grid, times the interpolation scale
    coords = embed._prepare_video_coords(1, *grid, (8 / 25, 32, 32), "cpu")[0]  # [S, 3] fractions of the base
    assert_close(
        pos / torch.tensor([20.0, 2048.0, 2048.0], dtype=torch.float64), coords, 1e-12, rtol=4 * EPS32_TABLE
    )  # float32 coords: a few roundings
    # rotation on the hidden size, then split into heads: the convention rotates per head
    q = seeded(2, pos.shape[0], dim, seed=1)
    want = ltx_module.apply_rotary_emb(q.double(), (ref_cos, ref_sin))
    got = rope.rotate(q.double().unflatten(2, (heads, head_dim)), pos).flatten(2)
    assert_close(got, want, 1e-9)


def test_ltx_video_far_from_the_origin():
    heads, head_dim = 2, 24
    embed = ltx_module.LTXVideoRotaryPosEmbed(heads * head_dim, patch_size=1, patch_size_t=1)
    rope = conv.ltx_video(heads, head_dim)
    pos = torch.tensor([[1e6, 3.0, 5.0], [1e6 + 7.3, 2e5, 1e6], [0.0, 1e6, 64.0]], dtype=torch.float64)
    ref_cos, ref_sin = embed(torch.zeros(1, 3, heads * head_dim), video_coords=pos.T[None])
    cos, sin = ours_channels(rope, pos)
    # angles up to 1e5 * 1.6e4 rad: float64 keeps them to ~1e-7 rad on both sides
    assert_close(cos, per_head(ref_cos[0], heads), 1e-6)
    assert_close(sin, per_head(ref_sin[0], heads), 1e-6)


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
@pytest.mark.parametrize(("heads", "head_dim", "latent", "patch"), [(2, 16, (3, 4, 5), (1, 1)), (4, 10, (4, 4, 6), (2, 2))],
                         ids=str)  # fmt: skip
def test_ltx2_video(rope_type, heads, head_dim, latent, patch):
    p_t, p = patch
    dim = heads * head_dim
    embed = ltx2_module.LTX2AudioVideoRotaryPosEmbed(dim, patch_size=p, patch_size_t=p_t, rope_type=rope_type,
                                                     num_attention_heads=heads)  # fmt: skip
    rope = conv.ltx2(heads, head_dim, rope_type=rope_type)
    pos = conv.ltx2_positions(*latent, fps=24.0, patch_size=p, patch_size_t=p_t)
    bounds = embed.prepare_video_coords(1, *latent, "cpu", fps=24.0)  # [1, 3, S, 2] float32
    # midpoints, as upstream's forward takes them: float32 bounds and their mean, a few roundings
    assert_close(pos, bounds.mean(-1)[0].T, 1e-12, rtol=4 * EPS32_TABLE)
    ref_cos, ref_sin = embed(pos.T[None])  # float64 midpoints -> float64 angles
    if rope_type == "split":  # [1, H, S, D/2] per head, half pairing
        ref_cos, ref_sin = (torch.cat([t[0], t[0]], -1).transpose(0, 1) for t in (ref_cos, ref_sin))
    else:
        ref_cos, ref_sin = per_head(ref_cos[0], heads), per_head(ref_sin[0], heads)
    cos, sin = ours_channels(rope, pos)
    assert_close(cos, ref_cos, 1e-9)
    assert_close(sin, ref_sin, 1e-9)
    ours32 = rope.cos_sin(pos)
    ref32_cos, ref32_sin = embed(bounds)  # upstream's own float32 path from its float32 bounds
    if rope_type == "split":
        ref32_cos, ref32_sin = (torch.cat([t[0], t[0]], -1).transpose(0, 1) for t in (ref32_cos, ref32_sin))
    else:
        ref32_cos, ref32_sin = per_head(ref32_cos[0], heads), per_head(ref32_sin[0], heads)
    diff = max_diff((ours32[0], ref32_cos), (ours32[1], ref32_sin))
    check_documented("ltx2", diff, float(float32_angle_bound(torch.full((), torch.pi / 2 * 10000 * 2))))
    # rotation: interleaved over the hidden size, or each head's halves (apply_split_rotary_emb)
    q = seeded(1, pos.shape[0], dim, seed=3, dtype=torch.float64)
    upstream = embed(pos.T[None])
    if rope_type == "split":
        want = ltx2_module.apply_split_rotary_emb(q, upstream)
    else:
        want = ltx2_module.apply_interleaved_rotary_emb(q, upstream)
    got = rope.rotate(q.unflatten(2, (heads, head_dim)), pos).flatten(2)
    # upstream rotates in float32 (x.float()) by float64 tables: its rounding of q, tables and arithmetic
    assert_close(got, want, rotation_bound(q, EPS32_TABLE))


def test_ltx2_far_from_the_origin():
    heads, head_dim = 2, 24
    embed = ltx2_module.LTX2AudioVideoRotaryPosEmbed(heads * head_dim, rope_type="split", num_attention_heads=heads)
    rope = conv.ltx2(heads, head_dim, rope_type="split")
    pos = torch.tensor([[1e6, 3.0, 5.0], [1e6 + 0.25, 2e5, 1e6], [0.0, 1e6, 64.0]], dtype=torch.float64)
    ref_cos, ref_sin = (torch.cat([t[0], t[0]], -1).transpose(0, 1) for t in embed(pos.T[None]))
    cos, sin = ours_channels(rope, pos)
    assert_close(cos, ref_cos, 1e-6)  # float64 angles up to 1.6e9 rad on both sides: ~1e-7 rad apart
    assert_close(sin, ref_sin, 1e-6)


def test_ltx2_audio():
    heads, head_dim = 2, 12
    embed = ltx2_module.LTX2AudioVideoRotaryPosEmbed(heads * head_dim, modality="audio", scale_factors=[4],
                                                     num_attention_heads=heads)  # fmt: skip
    rope = conv.ltx2(heads, head_dim, modality="audio")
    pos = conv.ltx2_audio_positions(7, scale_factor=4, shift=2)
    bounds = embed.prepare_audio_coords(1, 7, "cpu", shift=2)  # [1, 1, S, 2]
    assert_close(pos[:, 0], bounds.mean(-1)[0, 0], 1e-12, rtol=4 * EPS32_TABLE)  # float32 bounds and mean
    ref_cos, ref_sin = embed(pos.T[None])
    cos, sin = ours_channels(rope, pos)
    assert_close(cos, per_head(ref_cos[0], heads), 1e-9)
    assert_close(sin, per_head(ref_sin[0], heads), 1e-9)


@pytest.mark.filterwarnings("ignore:In CPU autocast")  # MochiRoPE's float32 autocast block warns on CPU
@pytest.mark.parametrize(("heads", "head_dim", "grid"), [(2, 16, (2, 3, 4)), (3, 8, (1, 6, 2))], ids=str)
def test_mochi(heads, head_dim, grid):
    from diffusers.models.transformers.transformer_mochi import MochiRoPE

    freqs = seeded(3, heads, head_dim // 2, seed=4) * 0.2  # a trained-looking pos_frequencies [3, H, D/2]
    rope = conv.mochi(heads, head_dim, freqs)
    upstream = MochiRoPE()
    pos = conv.mochi_positions(*grid, dtype=torch.float64)
    assert_close(pos, upstream._get_positions(*grid, dtype=torch.float64), 1e-12)
    ref_cos, ref_sin = upstream(freqs, *grid, dtype=torch.float32)  # [S, H, D/2], float32 angles
    ours = rope.cos_sin(pos)  # [S, H, D], interleaved
    diff = max_diff((ours[0][..., 0::2], ref_cos), (ours[1][..., 0::2], ref_sin))
    # float32 einsum of 3 products: 16 ulps of sum |pos_a F_a| (as below)
    bound = upstream_table_bound(rope, pos, ulps=16)
    check_documented("mochi", diff, bound)
    # Mochi's processor: bshd, x[..., 0::2] / x[..., 1::2] planes
    q = seeded(1, pos.shape[0], heads, head_dim, seed=5)
    even, odd = q[..., 0::2].float(), q[..., 1::2].float()
    want = torch.stack([even * ref_cos - odd * ref_sin, even * ref_sin + odd * ref_cos], -1).flatten(-2)
    assert_close(rope.rotate(q, pos), want, rotation_bound(q, bound))
    # away from the origin (1e3): upstream's float32 angles, within their rounding per entry
    mid = pos + 1e3
    mid_cos, mid_sin = upstream._create_rope(freqs, mid)
    terms = torch.einsum("sa,ahn->shn", mid.abs(), freqs.double().abs())  # sum_a |pos_a F_a|: what float32 rounds
    cos, sin = exact_planes(rope, mid)
    bound = float32_angle_bound(terms, ulps=16)  # einsum: 3 float32 products and their sums
    assert bool((angle_gap(cos, sin, mid_cos, mid_sin) <= bound).all())
    assert rotated_unit_bound(bound) < 0.1  # far below an O(1) mistake (wrong axis or head)
    # near 1e6, where float32 keeps no angle (0.5 rad off), against upstream's formula in float64:
    # _create_rope is einsum("nd,dhf->nhf", pos, freqs), then cos and sin
    far = pos + 1e6
    angle = torch.einsum("nd,dhf->nhf", far, freqs.double())
    cos, sin = exact_planes(rope, far)
    assert_close(cos, angle.cos(), 1e-9)
    assert_close(sin, angle.sin(), 1e-9)


def test_mochi_learnable_parameter_is_per_head():
    rope = conv.mochi(2, 8, learnable=True)
    assert rope.learned_freqs.shape == (2, 3, 4) and bool((rope.learned_freqs == 0).all())
    q = seeded(1, 6, 2, 8)
    out = rope.rotate(q, conv.mochi_positions(1, 2, 3))
    out.square().sum().backward()
    assert rope.learned_freqs.grad is not None
