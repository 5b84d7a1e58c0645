"""Conventions of diffusers' axial transformers against the installed diffusers (0.42.1).

Each test runs the upstream rotary module at several sizes and compares its cos/sin tables and
rotated q/k with the convention's rope; then compares, at positions near 1e6, the rope's float64
tables with diffusers' own ``get_1d_rotary_pos_embed`` evaluated in float64 (``freqs_dtype=float64``,
float64 positions, complex output): the same per-axis formula these models assemble, without the
float32 rounding of their tables.
"""

from __future__ import annotations

import pytest
import torch
from conventions_support import (
    assert_close,
    check_documented,
    exact_tables,
    far_positions,
    max_diff,
    rotation_bound,
    seeded,
    upstream_table_bound,
)

import axial_rope as ar
from axial_rope import conventions as conv

embeddings = pytest.importorskip("diffusers.models.embeddings")


def axis_tables(axes_dim, theta: float, pos: torch.Tensor, order=None) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' per-axis tables in float64, concatenated in ``order`` (default: axis order), interleaved."""
    order = range(len(axes_dim)) if order is None else order
    cis = torch.cat(
        [
            embeddings.get_1d_rotary_pos_embed(axes_dim[a], pos[:, a].double(), theta, freqs_dtype=torch.float64)
            for a in order
        ],
        dim=-1,
    )  # complex128 [S, n]
    return cis.real.repeat_interleave(2, -1), cis.imag.repeat_interleave(2, -1)


def check_far(rope: ar.AxialRoPE, axes_dim, theta: float, order=None, atol: float = 1e-9) -> None:
    """Tables near 1e6 against the float64 upstream formula (float64 angles of ~1e6 rad: 1e-10 apart)."""
    pos = far_positions(rope.n_axes)
    cos, sin = exact_tables(rope, pos)
    ref_cos, ref_sin = axis_tables(axes_dim, theta, pos, order)
    assert_close(cos, ref_cos, atol)
    assert_close(sin, ref_sin, atol)


def check_tables(name: str, rope, pos, ref_cos, ref_sin) -> None:
    cos, sin = rope.cos_sin(pos)
    assert cos.shape == ref_cos.shape, (cos.shape, ref_cos.shape)
    check_documented(name, max_diff((cos, ref_cos), (sin, ref_sin)), upstream_table_bound(rope, pos))


def check_rotation(rope, pos, cos, sin, layout: str, seq_dim: int) -> None:
    S = pos.shape[0]
    shape = (2, S, 2, rope.rot_dim) if layout == "bshd" else (2, 2, S, rope.rot_dim)
    q, k = seeded(*shape, seed=1), seeded(*shape, seed=2)
    got_q, got_k = rope(q, k, pos, layout=layout)
    bound = upstream_table_bound(rope, pos)
    for got, x in ((got_q, q), (got_k, k)):
        want = embeddings.apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=seq_dim)
        assert_close(got, want, rotation_bound(x, bound))


@pytest.mark.parametrize("sizes", [(3, 4, 5), (0, 2, 3), (7, 1, 6)], ids=str)
def test_flux(sizes):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    L, H, W = sizes
    pos = conv.flux_positions(L, H, W)
    rope = conv.flux((16, 56, 56))
    cos, sin = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(pos)
    check_tables("flux", rope, pos, cos, sin)
    check_rotation(rope, pos, cos, sin, "bshd", 1)
    check_far(rope, (16, 56, 56), 10000.0)
    # upstream computes Flux in float64 too: at 1e6 its float32 tables are ours to float32 rounding
    far = far_positions(3)
    far_cos, _ = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(far)
    assert_close(rope.cos_sin(far)[0], far_cos, 1e-6)  # two float64 tables rounded once each: 2**-24 apart at most


@pytest.mark.parametrize(("latent", "patch"), [((3, 8, 6), (1, 2)), ((5, 4, 4), (2, 2)), ((1, 6, 10), (1, 1))], ids=str)
def test_hunyuan_video(latent, patch):
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoRotaryPosEmbed

    p_t, p = patch[0], patch[1]
    embed = HunyuanVideoRotaryPosEmbed(patch_size=p, patch_size_t=p_t, rope_dim=[16, 56, 56], theta=256.0)
    cos, sin = embed(torch.zeros(1, 4, *latent))
    pos = conv.video_grid_positions(*latent, (p_t, p, p))
    rope = conv.hunyuan_video((16, 56, 56), 256.0)
    check_tables("hunyuan_video", rope, pos, cos, sin)
    check_rotation(rope, pos, cos, sin, "bshd", 1)
    check_far(rope, (16, 56, 56), 256.0)


@pytest.mark.parametrize(("shape", "patch", "axes"), [((8, 6), (2, 2), (8, 8)), ((5, 3), (1, 1), (16, 16)),
                                                      ((2, 4, 6), (1, 2, 2), (4, 6, 6))], ids=str)  # fmt: skip
def test_hunyuan_image(shape, patch, axes):
    from diffusers.models.transformers.transformer_hunyuanimage import HunyuanImageRotaryPosEmbed

    cos, sin = HunyuanImageRotaryPosEmbed(patch, axes, theta=256.0)(torch.zeros(1, 4, *shape))
    pos = ar.grid(*(n // p for n, p in zip(shape, patch)))
    rope = conv.hunyuan_image(axes, 256.0)
    check_tables("hunyuan_image", rope, pos, cos, sin)
    check_rotation(rope, pos, cos, sin, "bshd", 1)
    check_far(rope, axes, 256.0)


@pytest.mark.parametrize("size", [(32, 32), (24, 40), (40, 20), (7, 9)], ids=str)
def test_hunyuan_dit(size):
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    h, w = size
    crops = get_resize_crop_region_for_grid((h, w), 32)
    assert conv.hunyuan_dit_crop(h, w, 32) == crops
    cos, sin = embeddings.get_2d_rotary_pos_embed(88, crops, (h, w))
    pos = conv.hunyuan_dit_positions(h, w, 32)
    rope = conv.hunyuan_dit(88)
    assert rope.plane_axis[:22] == [1] * 22 and rope.plane_axis[22:] == [0] * 22  # x planes first
    check_tables("hunyuan_dit", rope, pos, cos, sin)
    check_rotation(rope, pos, cos, sin, "bshd", 1)  # HunyuanDiT attention is bshd
    check_far(rope, (44, 44), 10000.0, order=(1, 0))


@pytest.mark.parametrize(("head_dim", "latent"), [(128, (3, 8, 6)), (12, (2, 4, 4)), (64, (5, 2, 10))], ids=str)
def test_wan(head_dim, latent):
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    embed = WanRotaryPosEmbed(attention_head_dim=head_dim, patch_size=(1, 2, 2), max_seq_len=64, theta=10000.0)
    cos, sin = embed(torch.zeros(1, 4, *latent))  # [1, S, 1, D]
    cos, sin = cos[0, :, 0], sin[0, :, 0]
    rope = conv.wan(head_dim)
    assert rope.axes_dim == (embed.t_dim, embed.h_dim, embed.w_dim)
    pos = conv.video_grid_positions(*latent, (1, 2, 2))
    check_tables("wan", rope, pos, cos, sin)
    check_rotation(rope, pos, cos, sin, "bshd", 1)
    check_far(rope, rope.axes_dim, 10000.0)


@pytest.mark.parametrize("grid_type", ["linspace", "slice"])
@pytest.mark.parametrize(("dim", "sizes", "crops"), [(64, (3, 4, 6), ((1, 2), (5, 8))), (32, (2, 5, 5), ((0, 0), (5, 5)))],
                         ids=str)  # fmt: skip
def test_cogvideox(grid_type, dim, sizes, crops):
    T, H, W = sizes
    cos, sin = embeddings.get_3d_rotary_pos_embed(dim, crops, (H, W), T, grid_type=grid_type, max_size=(12, 12))
    pos = conv.cogvideox_positions(T, H, W, crops, grid_type=grid_type)
    rope = conv.cogvideox(dim)
    check_tables("cogvideox", rope, pos, cos, sin)
    check_rotation(rope, pos, cos, sin, "bhsd", 2)  # CogVideoX attention is bhsd
    check_far(rope, rope.axes_dim, 10000.0)


@pytest.mark.parametrize(("caption_lengths", "size"), [((4, 2), (4, 6)), ((1, 5), (2, 2))], ids=str)
def test_lumina2(caption_lengths, size):
    from diffusers.models.transformers.transformer_lumina2 import Lumina2RotaryPosEmbed

    axes, lens = (8, 12, 12), (32, 16, 16)
    embed = Lumina2RotaryPosEmbed(theta=10000, axes_dim=list(axes), axes_lens=list(lens), patch_size=2)
    L = max(caption_lengths)
    mask = torch.stack([torch.arange(L) < n for n in caption_lengths]).long()
    h, w = size
    _, cap_cis, img_cis, _, _, _ = embed(torch.zeros(len(caption_lengths), 4, 2 * h, 2 * w), mask)
    rope = conv.lumina2(axes, lens)
    worst = 0.0
    for b, n in enumerate(caption_lengths):
        pos = conv.lumina2_positions(n, h, w)
        ref = torch.cat([cap_cis[b, :n], img_cis[b]])  # complex128: upstream's float64 angles
        cos, sin = exact_tables(rope, pos)
        assert_close(cos, ref.real.repeat_interleave(2, -1), 1e-12)  # float64 against float64
        assert_close(sin, ref.imag.repeat_interleave(2, -1), 1e-12)
        ours = rope.cos_sin(pos)
        worst = max(
            worst, max_diff((ours[0], ref.real.repeat_interleave(2, -1)), (ours[1], ref.imag.repeat_interleave(2, -1)))
        )
        # rotation: Lumina2 rotates bshd with complex (interleaved) planes, use_real=False
        q = seeded(1, pos.shape[0], 2, sum(axes), seed=b)
        want = embeddings.apply_rotary_emb(q, ref.to(torch.complex64)[None], use_real=False)
        assert_close(rope.rotate(q, pos), want, rotation_bound(q, upstream_table_bound(rope, pos)))
    check_documented(
        "lumina2", worst, max(upstream_table_bound(rope, conv.lumina2_positions(n, h, w)) for n in caption_lengths)
    )
    check_far(rope, axes, 10000.0)


def test_axial_conventions_equal_the_plain_constructor():
    # the diffusers axial conventions are AxialRoPE(axes_dim, theta): bit-identical F
    for rope, axes, theta in [(conv.flux((16, 56, 56)), (16, 56, 56), 10000.0), (conv.wan(128), (44, 42, 42), 10000.0),
                              (conv.hunyuan_video(), (16, 56, 56), 256.0), (conv.cogvideox(64), (16, 24, 24), 10000.0)]:  # fmt: skip
        assert torch.equal(rope.freqs, ar.AxialRoPE(axes, theta).freqs)
