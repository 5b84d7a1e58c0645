"""Parity with the installed libraries: each one's own (cos, sin) tables and rotation, reproduced by AxialRoPE.

Every test builds the other library's tables with its own code, then the AxialRoPE
arguments and positions that docs/conventions.md gives for it, and compares cos, sin
and the rotated q/k. Shapes are tiny; the point is the convention. The tables are held to the bound
of upstream's float32 arithmetic (``conventions_support.upstream_table_bound``: float32 angles within
``(ln theta + 7)`` roundings of |angle|, plus cos/sin's own rounding), the rotations to
``rotation_bound`` of it; a wrong axis, pairing or frequency is off by O(1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conventions_support import rotation_bound, upstream_table_bound
from helpers import LLAMA_ROPE_PARAMETERS, assert_close, llama_config, qwen_vl_config

import axial_rope as ar
from axial_rope.scaling import DynamicNTK, Llama3, LongRoPE, YaRN

diffusers_embeddings = pytest.importorskip("diffusers.models.embeddings")
timm_sincos = pytest.importorskip("timm.layers.pos_embed_sincos")
pytest.importorskip("transformers")


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    """Entry by entry within ``atol``, compared in float64."""
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32)


def check_tables(rope: ar.AxialRoPE, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    ours_cos, ours_sin = rope.cos_sin(pos)
    assert ours_cos.dtype == torch.float32 and ours_cos.shape == cos.shape, (ours_cos.shape, cos.shape)
    bound = upstream_table_bound(rope, pos)
    close(ours_cos, cos, bound)
    close(ours_sin, sin, bound)


def check_qk_rotation(rope: ar.AxialRoPE, pos: torch.Tensor, cos, sin, apply_rotary_pos_emb, head_dim: int):
    """``rope(q, k)`` in bhsd with grouped-query k (2 query heads, 1 kv head) equals the library's own
    ``apply_rotary_pos_emb`` on its tables; returns q and its expected rotation."""
    S = pos.shape[-2]
    q, k = randn(2, 2, S, head_dim), randn(2, 1, S, head_dim)
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = rope(q, k, pos, layout="bhsd")
    close(got_q, expected_q, rotation_bound(q, upstream_table_bound(rope, pos)))
    close(got_k, expected_k, rotation_bound(k, upstream_table_bound(rope, pos)))
    return q, expected_q


# -- diffusers -----------------------------------------------------------------------------


def flux_ids(text_len: int, height: int, width: int) -> torch.Tensor:
    """Flux's ids as the pipeline builds them: text all zeros, image (0, y, x)."""
    text = torch.zeros(text_len, 3)
    image = torch.zeros(height, width, 3)
    image[..., 1] = torch.arange(height)[:, None]
    image[..., 2] = torch.arange(width)[None, :]
    return torch.cat([text, image.reshape(-1, 3)])


def test_flux_pos_embed():
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    L, H, W = 3, 4, 5
    ids = flux_ids(L, H, W)
    pos = torch.cat([ar.text_positions(L, 3, step=0), ar.grid(1, H, W)])
    assert torch.equal(pos, ids)
    cos, sin = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(ids)
    rope = ar.AxialRoPE((16, 56, 56), theta=10000.0)
    check_tables(rope, pos, cos, sin)

    # rotation: Flux attention is bshd (sequence_dim=1), interleaved planes (unbind dim -1)
    q, k = randn(2, L + H * W, 3, 128), randn(2, L + H * W, 3, 128)
    expected_q = diffusers_embeddings.apply_rotary_emb(
        q, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1
    )
    expected_k = diffusers_embeddings.apply_rotary_emb(
        k, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1
    )
    got_q, got_k = rope(q, k, pos, layout="bshd")
    close(got_q, expected_q, rotation_bound(q, upstream_table_bound(rope, pos)))
    close(got_k, expected_k, rotation_bound(k, upstream_table_bound(rope, pos)))
    close(ar.apply_rope(q, cos, sin, pairing="interleaved", layout="bshd"), expected_q, rotation_bound(q, 0.0))


def test_hunyuan_video_rotary_pos_embed():
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoRotaryPosEmbed

    # latent [B, C, F, H, W] = [1, 4, 3, 8, 6], patch (1, 2, 2) -> a 3 x 4 x 3 token grid
    embed = HunyuanVideoRotaryPosEmbed(patch_size=2, patch_size_t=1, rope_dim=[16, 56, 56], theta=256.0)
    cos, sin = embed(torch.zeros(1, 4, 3, 8, 6))
    rope = ar.AxialRoPE((16, 56, 56), theta=256.0)
    pos = ar.grid(3, 4, 3)
    check_tables(rope, pos, cos, sin)

    q = randn(1, pos.shape[0], 2, 128)
    expected = diffusers_embeddings.apply_rotary_emb(q, (cos, sin), sequence_dim=1)
    close(rope.rotate(q, pos, layout="bshd"), expected, rotation_bound(q, upstream_table_bound(rope, pos)))


def test_wan_rotary_pos_embed():
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    embed = WanRotaryPosEmbed(attention_head_dim=128, patch_size=(1, 2, 2), max_seq_len=64, theta=10000.0)
    # Wan splits the head as t = D - 2 * 2 (D // 6), h = w = 2 (D // 6): 44, 42, 42 for D = 128
    assert (embed.t_dim, embed.h_dim, embed.w_dim) == (44, 42, 42)
    cos, sin = embed(torch.zeros(1, 4, 3, 8, 6))  # installed Wan returns real [1, S, 1, D] cos and sin
    assert cos.shape == (1, 36, 1, 128) and not cos.is_complex()
    cos, sin = cos[0, :, 0], sin[0, :, 0]
    rope = ar.AxialRoPE((44, 42, 42), theta=10000.0)
    pos = ar.grid(3, 4, 3)
    check_tables(rope, pos, cos, sin)

    # Wan's processor rotates interleaved pairs of a bshd tensor, which is diffusers' unbind-dim -1 rule
    q = randn(2, 36, 2, 128)
    expected = diffusers_embeddings.apply_rotary_emb(q, (cos, sin), sequence_dim=1)
    close(rope.rotate(q, pos, layout="bshd"), expected, rotation_bound(q, upstream_table_bound(rope, pos)))


@pytest.mark.parametrize("grid_type", ["linspace", "slice"])
def test_cogvideox_3d_rotary_pos_embed(grid_type: str):
    T, H, W = 3, 4, 6
    crops = ((1, 2), (5, 8))  # (top, left), (bottom, right): a crop not starting at 0
    cos, sin = diffusers_embeddings.get_3d_rotary_pos_embed(
        64, crops, (H, W), T, theta=10000, grid_type=grid_type, max_size=(10, 12)
    )
    # CogVideoX splits embed_dim as t = D/4, h = w = 3D/8
    rope = ar.AxialRoPE((16, 24, 24), theta=10000.0)
    if grid_type == "linspace":  # diffusers' torch linspace crop grid; time is 0 .. T-1
        pos = ar.crop_grid((0, *crops[0]), (T, *crops[1]), (T, H, W), diffusers_compat=True)
    else:  # "slice": integer positions from 0, whatever the crop
        pos = ar.grid(T, H, W)
    check_tables(rope, pos, cos, sin)

    # CogVideoX attention is bhsd (apply_rotary_emb's default sequence_dim=2)
    q, k = randn(1, 2, T * H * W, 64), randn(1, 2, T * H * W, 64)
    got_q, got_k = rope(q, k, pos, layout="bhsd")
    close(
        got_q, diffusers_embeddings.apply_rotary_emb(q, (cos, sin)), rotation_bound(q, upstream_table_bound(rope, pos))
    )
    close(
        got_k, diffusers_embeddings.apply_rotary_emb(k, (cos, sin)), rotation_bound(k, upstream_table_bound(rope, pos))
    )


@pytest.mark.parametrize("crops", [((1, 2), (5, 8)), ((0, 0), (4, 6)), ((2.5, 1), (9, 7.5))], ids=str)
def test_2d_rotary_pos_embed_crop(crops):
    """diffusers' 2-D (HunyuanDiT) table: crop grid in torch linspace, the *x* axis in the first channel half."""
    H, W = 4, 6
    cos, sin = diffusers_embeddings.get_2d_rotary_pos_embed(32, crops, (H, W))
    pos = ar.crop_grid(crops[0], crops[1], (H, W), diffusers_compat=True)  # columns (y, x), y slowest
    rope = ar.AxialRoPE((16, 16), theta=10000.0)
    check_tables(rope, pos[:, [1, 0]], cos, sin)  # channels: x then y


@pytest.mark.parametrize(("start", "stop"), [((1, 2), (5, 8)), ((1.5, 2), (9, 8)), ((3, 0.5), (10, 4))], ids=str)
def test_crop_grid_default_is_numpy_linspace_without_endpoint(start, stop):
    sizes = (4, 6)
    pos = ar.crop_grid(start, stop, sizes)
    axes = [np.linspace(a, b, n, endpoint=False) for a, b, n in zip(start, stop, sizes)]
    expected = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 2)
    np.testing.assert_allclose(pos.double().numpy(), expected, rtol=1e-6, atol=1e-6)  # float32 positions: 6e-8 relative
    # the diffusers port differs as soon as a crop does not start at 0
    compat = ar.crop_grid(start, stop, sizes, diffusers_compat=True)
    assert (compat - pos).abs().max() > 0.1


def test_crop_grid_forms_agree_for_crops_from_zero():
    pos = ar.crop_grid((0, 0), (4, 6), (4, 6))
    assert_close(ar.crop_grid((0, 0), (4, 6), (4, 6), diffusers_compat=True), pos)  # float32 positions < 6: TOL
    assert torch.equal(pos, ar.grid(4, 6))


# -- timm ----------------------------------------------------------------------------------

TIMM_H, TIMM_W = 7, 10
TIMM_CASES = {
    # id: (RotaryEmbeddingCat kwargs, positions, pairing)
    "index": ({}, ar.grid(TIMM_H, TIMM_W), "interleaved"),
    "ref-feat-shape": (
        {"ref_feat_shape": [14, 14]},
        ar.grid(TIMM_H, TIMM_W, scale=(14 / TIMM_H, 14 / TIMM_W)),
        "interleaved",
    ),
    # timm adds grid_offset before the ref_feat_shape rescale, grid() adds offset after scale
    "ref-feat-shape-offset": (
        {"ref_feat_shape": [14, 14], "grid_offset": 0.5},
        ar.grid(TIMM_H, TIMM_W, scale=(14 / TIMM_H, 14 / TIMM_W), offset=(0.5 * 14 / TIMM_H, 0.5 * 14 / TIMM_W)),
        "interleaved",
    ),
    "xy-indexing": ({"grid_indexing": "xy"}, ar.grid(TIMM_H, TIMM_W)[:, [1, 0]], "interleaved"),
    "centered-separate": ({"grid_type": "centered"}, ar.grid(TIMM_H, TIMM_W, normalize=True), "interleaved"),
    "centered-max": (
        {"grid_type": "centered", "normalize_coords": "max"},
        ar.grid(TIMM_H, TIMM_W, normalize="max"),
        "interleaved",
    ),
    "rotate-half": ({"rotate_half": True}, ar.grid(TIMM_H, TIMM_W), "half"),
}


@pytest.mark.parametrize("name", list(TIMM_CASES))
def test_timm_rotary_embedding_cat(name: str):
    kwargs, pos, pairing = TIMM_CASES[name]
    # in_pixels=False: the language-model spectrum temperature ** (-j / (dim / 4)) per axis
    embed = timm_sincos.RotaryEmbeddingCat(64, temperature=100.0, in_pixels=False, **kwargs)
    emb = embed.get_embed([TIMM_H, TIMM_W])
    sin, cos = emb.chunk(2, dim=-1)  # timm concatenates sin BEFORE cos
    rope = ar.AxialRoPE((32, 32), theta=100.0, pairing=pairing)
    check_tables(rope, pos, cos, sin)

    # timm attention is bhsd
    q = randn(2, 3, TIMM_H * TIMM_W, 64)
    expected = timm_sincos.apply_rot_embed_cat(q, emb, half=pairing == "half")
    close(rope.rotate(q, pos, layout="bhsd"), expected, rotation_bound(q, upstream_table_bound(rope, pos)))
    close(ar.apply_rope(q, cos, sin, pairing=pairing, layout="bhsd"), expected, rotation_bound(q, 0.0))


def test_timm_rotary_embedding_cat_module_forward():
    """The module's own forward (channels-first feature map) equals rope.apply on the flattened tokens."""
    embed = timm_sincos.RotaryEmbeddingCat(16, temperature=10000.0, in_pixels=False, feat_shape=[3, 5])
    x = randn(2, 16, 3, 5)  # [B, C, H, W]
    expected = embed(x).flatten(2).transpose(1, 2)  # [B, N, C]
    tokens = x.flatten(2).transpose(1, 2)[:, :, None]  # [B, N, 1, C] bshd
    got = ar.AxialRoPE((8, 8), theta=10000.0).rotate(tokens, ar.grid(3, 5))[:, :, 0]
    close(got, expected, rotation_bound(tokens, upstream_table_bound(ar.AxialRoPE((8, 8)), ar.grid(3, 5))))


# -- transformers: one axis, half pairing --------------------------------------------------


LONG = [1.0 + 0.25 * i for i in range(32)]
# transformers forms angles in float32 (position * float32 inv_freq): within upstream_table_bound of the
# float64 angles AxialRoPE uses (positions up to ~100 here)
LLAMA_CASES = {
    # id: (rope_parameters, axial_rope scaling, max_position_embeddings, positions (per sample))
    "default": (LLAMA_ROPE_PARAMETERS["default"], None, 4096, [0, 7]),
    "yarn": (LLAMA_ROPE_PARAMETERS["yarn"], YaRN(4.0, 1024), 4096, [0, 20]),
    "llama3": (LLAMA_ROPE_PARAMETERS["llama3"], Llama3(8.0, 1024, 1.0, 4.0), 8192, [5, 30]),
    # length-dependent methods: both sides use max(position_ids) + 1 as the length seen
    "dynamic-beyond-max": (
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        DynamicNTK(2.0, 64),
        64,
        [0, 90],
    ),
    "longrope-long": (
        {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "short_factor": [1.0] * 32,
            "long_factor": LONG,
            "original_max_position_embeddings": 64,
        },
        LongRoPE([1.0] * 32, LONG, 64, factor=4.0),
        256,
        [0, 100],
    ),
}


@pytest.mark.parametrize("name", list(LLAMA_CASES))
def test_llama_rotary_embedding(name: str):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    params, scaling, max_pos, starts = LLAMA_CASES[name]
    S, D = 6, 64
    position_ids = torch.stack([torch.arange(s, s + S) for s in starts])  # [B, S], one offset per sample
    embed = LlamaRotaryEmbedding(llama_config(D, params, max_pos, num_key_value_heads=1))
    cos, sin = embed(torch.zeros(1, dtype=torch.float32), position_ids)  # [B, S, D]
    rope = ar.AxialRoPE(D, theta=params["rope_theta"], scaling=scaling, pairing="half")
    pos = position_ids[..., None].float()  # [B, S, 1]
    check_tables(rope, pos, cos, sin)
    q, expected_q = check_qk_rotation(rope, pos, cos, sin, apply_rotary_pos_emb, D)
    close(ar.apply_rope(q, cos, sin, pairing="half", layout="bhsd"), expected_q, rotation_bound(q, 0.0))
    # and bshd: the same numbers, transposed
    got_q_bshd = rope.rotate(q.transpose(1, 2), pos, layout="bshd")
    close(got_q_bshd.transpose(1, 2), expected_q, rotation_bound(q, upstream_table_bound(rope, pos)))


def test_llama_partial_rotary_tables():
    """Partial rotary (GPT-NeoX, Phi): a 32-wide half-paired table rotates the first 32 of 48 channels."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    embed = LlamaRotaryEmbedding(
        llama_config(32, {"rope_type": "default", "rope_theta": 10000.0}, num_key_value_heads=1)
    )
    position_ids = torch.arange(5)[None]
    cos, sin = embed(torch.zeros(1), position_ids)
    q, k = randn(1, 2, 5, 48), randn(1, 2, 5, 48)
    rot_q, _ = apply_rotary_pos_emb(q[..., :32], k[..., :32], cos, sin)
    expected = torch.cat([rot_q, q[..., 32:]], dim=-1)
    close(ar.apply_rope(q, cos[0], sin[0], pairing="half", layout="bhsd"), expected, rotation_bound(q, 0.0))
    rope = ar.AxialRoPE(32, pairing="half")
    close(
        rope.rotate(q, torch.arange(5), layout="bhsd"),
        expected,
        rotation_bound(q, upstream_table_bound(rope, torch.arange(5.0))),
    )


def mrope_positions() -> torch.Tensor:
    """Two samples of M-RoPE ids [B, S, 3]: text, a 2 x 3 x 4 video grid after it, text again.

    Sample 1 is sample 0 shifted by 5 (as after left padding), so per-sample positions are exercised.
    """
    L = 3
    one = torch.cat(
        [ar.text_positions(L, 3), ar.grid(2, 3, 4, offset=L), ar.text_positions(2, 3, start=L + 4)]
    )  # the trailing text starts at max(previous) + 1
    return torch.stack([one, one + 5])


def test_qwen2_vl_mrope():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

    params = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}
    embed = qwen2.Qwen2VLRotaryEmbedding(qwen_vl_config(Qwen2VLTextConfig, params, 128))
    pos = mrope_positions()  # [B, S, 3]
    cos, sin = embed(torch.zeros(1), pos.permute(2, 0, 1).long())  # position_ids [3, B, S]
    # mrope_section counts planes: axes_dim is twice it; one spectrum over 128 cut into sections
    rope = ar.AxialRoPE((32, 48, 48), theta=1000000.0, pairing="half", spectrum="split")
    check_tables(rope, pos, cos, sin)

    # transformers 5.x rotates with the Llama rule on the recomposed table (no apply_multimodal_rotary_pos_emb)
    check_qk_rotation(rope, pos, cos, sin, qwen2.apply_rotary_pos_emb, 128)


def test_qwen3_vl_interleaved_mrope():
    qwen3 = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    params = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20], "mrope_interleaved": True}
    embed = qwen3.Qwen3VLTextRotaryEmbedding(qwen_vl_config(Qwen3VLTextConfig, params, 128))
    pos = mrope_positions()
    cos, sin = embed(torch.zeros(1), pos.permute(2, 0, 1).long())
    # planes cycle t, h, w, t, h, w, ... until h and w (20 planes each) run out; t keeps the last 4
    rope = ar.AxialRoPE((48, 40, 40), theta=5000000.0, pairing="half", spectrum="cycled")
    assert rope.plane_axis[:6] == [0, 1, 2, 0, 1, 2] and rope.plane_axis[-4:] == [0, 0, 0, 0]
    check_tables(rope, pos, cos, sin)
    check_qk_rotation(rope, pos, cos, sin, qwen3.apply_rotary_pos_emb, 128)


# -- DINOv3: normalised coordinates ----------------------------------------------------------


def dinov3_tables(H: int, W: int, D: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DINOv3's published RoPE (rope_position_encoding.py), written out independently in float64.

    coords: cell centres in [-1, 1] per axis ("separate"); periods base ** (2j / (D/2)), j < D/4;
    angles 2 pi coords / periods, flattened per axis (y then x), then tiled twice (half pairing).
    """
    coords_h = torch.arange(0.5, H, dtype=torch.float64) / H * 2 - 1
    coords_w = torch.arange(0.5, W, dtype=torch.float64) / W * 2 - 1
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).reshape(-1, 2)  # [HW, 2]
    periods = base ** (2 * torch.arange(D // 4, dtype=torch.float64) / (D // 2))  # [D/4]
    angles = (2 * math.pi * coords[:, :, None] / periods).flatten(1)  # [HW, D/2]
    angles = angles.tile(2)  # [HW, D]
    return angles.cos(), angles.sin()


@pytest.mark.parametrize(("H", "W"), [(4, 4), (5, 7)])
def test_dinov3_normalised_coordinates(H: int, W: int):
    D, base = 64, 100.0
    cos, sin = dinov3_tables(H, W, D, base)
    # angle = 2 pi c / base ** (2j / (D/2)) = (2 pi c) * theta ** (-2j / d_axis) with d_axis = D/2:
    # the 2 pi goes into the positions as a per-axis scale
    rope = ar.AxialRoPE((D // 2, D // 2), theta=base, pairing="half")
    pos = ar.grid(H, W, normalize=True, scale=2 * math.pi)
    check_tables(rope, pos, cos, sin)

    # DINOv3 rotates the patch tokens of a bhsd q with rotate_half
    q = randn(1, 2, H * W, D)
    half = torch.cat([-q[..., D // 2 :], q[..., : D // 2]], dim=-1)
    expected = q * cos.float() + half * sin.float()
    close(rope.rotate(q, pos, layout="bhsd"), expected, rotation_bound(q, upstream_table_bound(rope, pos)))

    # timm's port agrees with the formula (and so with AxialRoPE)
    port = timm_sincos.RotaryEmbeddingDinoV3(D, temperature=base)
    port_sin, port_cos = port.get_embed([H, W]).chunk(2, dim=-1)
    close(port_cos, cos, upstream_table_bound(rope, pos))
    close(port_sin, sin, upstream_table_bound(rope, pos))
