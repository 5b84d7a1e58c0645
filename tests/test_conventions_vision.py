"""ViT conventions against the installed timm (1.0.31) and transformers (5.24.0): timm's RotaryEmbeddingCat
(language and pixel bands), EVA-02's rope in a timm ``Eva`` model, RoPE-Mixed tables, DINOv3.

timm and transformers compute these tables in float32. Near 1e6 (``grid_offset=1e6``) the float64
tables are compared with the upstream formula in float64 (timm's ``build_fourier_pos_embed`` takes
float64 bands and builds the same grid) and the float32 tables within float32 angle rounding.
"""

from __future__ import annotations

import pytest
import torch
from conventions_support import (
    TWO_PI,
    angle_gap,
    assert_close,
    check_documented,
    exact_planes,
    exact_tables,
    float32_angle_bound,
    max_diff,
    rotation_bound,
    seeded,
    upstream_table_bound,
)

import axial_rope as ar
from axial_rope import conventions as conv

sincos = pytest.importorskip("timm.layers.pos_embed_sincos")

CAT_CASES = {
    # id: (RotaryEmbeddingCat kwargs, timm_positions kwargs)
    "index": ({}, {}),
    "ref-offset": ({"ref_feat_shape": [14, 12], "grid_offset": 0.5}, {"ref_feat_shape": [14, 12], "grid_offset": 0.5}),
    "xy": ({"grid_indexing": "xy", "ref_feat_shape": [8, 16]}, {"grid_indexing": "xy", "ref_feat_shape": [8, 16]}),
    "centered-max": (
        {"grid_type": "centered", "normalize_coords": "max"},
        {"grid_type": "centered", "normalize_coords": "max"},
    ),  # fmt: skip
    "half": ({"rotate_half": True}, {}),
    "pixel": ({"in_pixels": True, "max_res": 64}, {"grid_type": "pixel"}),
    "pixel-linear": ({"in_pixels": True, "max_res": 32, "linear_bands": True}, {"grid_type": "pixel"}),
}


@pytest.mark.parametrize("name", list(CAT_CASES))
@pytest.mark.parametrize("shape", [(7, 10), (4, 4)], ids=str)
def test_timm_cat(name, shape):
    kwargs, grid_kwargs = CAT_CASES[name]
    in_pixels = kwargs.get("in_pixels", False)
    rope_kwargs = {k: kwargs[k] for k in ("max_res", "linear_bands") if k in kwargs}
    embed = sincos.RotaryEmbeddingCat(32, temperature=100.0, **{"in_pixels": False, **kwargs})
    emb = embed.get_embed(list(shape))
    ref_sin, ref_cos = emb.chunk(2, -1)  # timm: sin first
    rope = conv.timm_cat(32, 100.0, in_pixels=in_pixels, rotate_half=kwargs.get("rotate_half", False), **rope_kwargs)
    pos = conv.timm_positions(shape, **grid_kwargs)
    cos, sin = rope.cos_sin(pos)
    bound = upstream_table_bound(rope, pos)  # pixel bands turn up to max_res / 2 * pi = 100 rad per unit
    check_documented("timm_cat", max_diff((cos, ref_cos), (sin, ref_sin)), bound)
    q = seeded(2, 3, pos.shape[0], 32)  # timm attention is bhsd
    want = sincos.apply_rot_embed_cat(q, emb, half=kwargs.get("rotate_half", False))
    assert_close(rope.rotate(q, pos, layout="bhsd"), want, rotation_bound(q, bound))


def test_timm_cat_far_from_the_origin():
    shape, offset = [3, 5], 1e6
    rope = conv.timm_cat(32, 100.0)
    pos = conv.timm_positions(shape, grid_offset=offset, dtype=torch.float64)
    bands = sincos.freq_bands(8, temperature=100.0, step=1).double()  # timm's float32 bands, in float64
    ref_sin, ref_cos = sincos.build_fourier_pos_embed(shape, bands=bands, grid_offset=offset, in_pixels=False,
                                                      dtype=torch.float64)  # fmt: skip
    # timm's grid is float32 (1e6 + i is exact); its bands are float32: compare the exact rope with the float32-band
    # formula per entry within the band rounding (|angle| * 2**-24), and with its own table at float32 angles
    cos, sin = exact_planes(rope, pos)
    angle = pos[:, :, None] * bands  # [S, 2, 8] float64
    gap = angle_gap(cos, sin, ref_cos.reshape(-1, 16), ref_sin.reshape(-1, 16))  # [H, W, 2, 8] -> [S, 16]
    assert bool((gap <= float32_angle_bound(angle.flatten(1), ulps=2)).all())
    emb = sincos.RotaryEmbeddingCat(32, temperature=100.0, in_pixels=False, grid_offset=offset).get_embed(shape)
    gap32 = angle_gap(*rope.cos_sin(pos), emb[:, 32:], emb[:, :32])
    assert bool((gap32[:, 0::2] <= float32_angle_bound(angle.flatten(1))).all())


@pytest.mark.parametrize(("img", "ref"), [(56, (4, 4)), (84, (4, 4))], ids=str)  # the pretraining grid and 1.5x
def test_eva02_model_tables(img, ref):
    eva = pytest.importorskip("timm.models.eva")
    model = eva.Eva(img_size=img, patch_size=14, embed_dim=48, depth=1, num_heads=2, use_rot_pos_emb=True,
                    ref_feat_shape=ref, num_classes=0)  # fmt: skip
    emb = model.rope.get_embed()  # the table every block receives [N, 2 * head_dim]
    ref_sin, ref_cos = emb.chunk(2, -1)
    grid = img // 14
    rope = conv.eva02(48, 2)
    pos = conv.timm_positions((grid, grid), ref_feat_shape=ref)
    cos, sin = rope.cos_sin(pos)
    bound = upstream_table_bound(rope, pos)
    check_documented("eva02", max_diff((cos, ref_cos), (sin, ref_sin)), bound)
    # the block's queries (patch tokens; EvaAttention leaves the class token unrotated), rotated as timm does
    attn = model.blocks[0].attn
    with torch.no_grad():
        q = attn.qkv(seeded(1, grid * grid + 1, 48, seed=2)).reshape(1, -1, 3, 2, 24).permute(2, 0, 3, 1, 4)[0]
    ours = rope.rotate(q[:, :, 1:], pos, layout="bhsd")
    assert_close(ours, sincos.apply_rot_embed_cat(q[:, :, 1:], emb), rotation_bound(q, bound))


@pytest.mark.parametrize("grid_indexing", ["xy", "ij"])
@pytest.mark.parametrize("shape", [(3, 5), (6, 4)], ids=str)
def test_timm_mixed(grid_indexing, shape):
    torch.manual_seed(0)
    embed = sincos.RotaryEmbeddingMixed(64, depth=2, num_heads=4, temperature=10.0, grid_indexing=grid_indexing)
    emb = embed.get_embed(list(shape))  # [depth, H, N, 2 * head_dim]
    ropes = conv.timm_mixed(embed.freqs, grid_indexing=grid_indexing)
    pos = ar.grid(*shape)
    worst, bound = 0.0, max(upstream_table_bound(rope, pos) for rope in ropes)
    for block, rope in enumerate(ropes):
        ref_sin, ref_cos = emb[block].chunk(2, -1)  # [H, N, D]
        cos, sin = rope.cos_sin(pos)  # [N, H, D]
        worst = max(worst, max_diff((cos.transpose(0, 1), ref_cos), (sin.transpose(0, 1), ref_sin)))
        q = seeded(2, 4, pos.shape[0], 16, seed=block)
        want = sincos.apply_rot_embed_cat(q, emb[block])
        assert_close(rope.rotate(q, pos, layout="bhsd"), want, rotation_bound(q, bound))
    check_documented("timm_mixed", worst, bound)
    # near 1e6, against timm's formula in float64 (get_mixed_freqs: t_x * freqs[0] + t_y * freqs[1], in float32
    # there, where 1e6 keeps no angle): (t_x, t_y) are the grid's channels, (x, y) for "xy"
    far = pos.double() + 1e6
    t_x, t_y = (far[:, 1], far[:, 0]) if grid_indexing == "xy" else (far[:, 0], far[:, 1])
    freqs = embed.freqs.detach().double()[:, 0]  # block 0: [2, H, n]
    angle = t_x[:, None, None] * freqs[0] + t_y[:, None, None] * freqs[1]  # [N, H, n]
    cos, sin = exact_planes(ropes[0], far)
    assert_close(cos, angle.cos(), 1e-9)
    assert_close(sin, angle.sin(), 1e-9)


@pytest.mark.parametrize(("head_dim", "size"), [(64, (4, 4)), (32, (5, 7)), (16, (1, 3))], ids=str)
def test_dinov3_transformers(head_dim, size):
    dino = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
    from transformers import DINOv3ViTConfig

    config = DINOv3ViTConfig(
        hidden_size=2 * head_dim, num_attention_heads=2, patch_size=4, image_size=16, rope_theta=100.0
    )
    H, W = size
    ref_cos, ref_sin = dino.DINOv3ViTRopePositionEmbedding(config).eval()(torch.zeros(1, 3, 4 * H, 4 * W))
    rope = conv.dinov3(head_dim, 100.0)
    pos = ar.grid(H, W)  # integer grid: the position map normalises it to the patch centres
    cos, sin = rope.cos_sin(pos)
    bound = upstream_table_bound(rope, pos)
    check_documented("dinov3", max_diff((cos, ref_cos), (sin, ref_sin)), bound)
    q = seeded(1, 2, H * W, head_dim)
    want = q * ref_cos + dino.rotate_half(q) * ref_sin  # transformers' apply_rotary_pos_emb on the patch tokens
    assert_close(rope.rotate(q, pos, layout="bhsd"), want, rotation_bound(q, bound))
    # the position map equals DINOv3's coordinates, 2 pi c / period in float64
    periods = 100.0 ** (4 * torch.arange(head_dim // 4, dtype=torch.float64) / head_dim)
    coords = dino.get_patches_center_coordinates(H, W, torch.float64, "cpu")
    angle = (TWO_PI * coords[:, :, None] / periods).flatten(1)
    cos64, _ = exact_tables(rope, pos)
    assert_close(cos64, torch.cat([angle, angle], -1).cos(), 1e-12)
    # a grid far from the origin: the map reads its extent, not its origin
    assert_close(exact_tables(rope, pos + 1e6)[0], cos64, 1e-9)


@pytest.mark.parametrize("normalize", ["separate", "max", "min"])
def test_dinov3_timm_normalize_and_periods(normalize):
    kwargs = {"temperature": 100.0, "normalize_coords": normalize}
    for extra in ({}, {"min_period": 0.5, "max_period": 40.0, "temperature": None}):
        embed = sincos.RotaryEmbeddingDinoV3(32, **{**kwargs, **extra})
        ref_sin, ref_cos = embed.get_embed([5, 3]).chunk(2, -1)
        rope = conv.dinov3(32, 100.0 if not extra else None, normalize_coords=normalize,
                           min_period=extra.get("min_period"), max_period=extra.get("max_period"))  # fmt: skip
        cos, sin = rope.cos_sin(ar.grid(5, 3))
        assert max_diff((cos, ref_cos), (sin, ref_sin)) <= upstream_table_bound(rope, ar.grid(5, 3))
