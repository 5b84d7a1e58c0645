"""Blocks on axial RoPE: attention (QK-norm, GQA, masks, factor placement), KV cache, DiT block, embedders, patches."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

import axial_rope as ar
from axial_rope.cache import KVCache
from axial_rope.layers import (
    Attention,
    DiTBlock,
    FinalLayer,
    LabelEmbedder,
    PatchEmbed,
    TimestepEmbedder,
    timestep_embedding,
    unpatchify,
)

# inductor's CPU code generation takes minutes on a small CI machine; AXIAL_ROPE_COMPILE_BACKEND=inductor runs it
COMPILE_BACKEND = os.environ.get("AXIAL_ROPE_COMPILE_BACKEND", "aot_eager")

SCALINGS = [
    None,
    ar.scaling.Linear(2.0),
    ar.scaling.NTK(2.0),
    ar.scaling.DynamicNTK(2.0, 8),
    ar.scaling.YaRN(4.0, 8),
    ar.scaling.Llama3(4.0, 8),
    ar.scaling.LongRoPE((1.0, 1.5, 2.0, 3.0), (1.0, 2.0, 4.0, 8.0), 8, factor=4.0),
]


def _randomize(module: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    """Perturb every parameter, so zero-initialised gates and norms are no longer special."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)
    return module


def _reference_attention(attn: Attention, x, pos, rope, mask=None, causal=False, gain=1.0):
    """Attention spelled out: projections, norm, rope.apply, softmax(q k^T * scale) v, all in x's dtype."""
    B, S, _ = x.shape
    H, Hk, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    w = attn.qkv.weight if attn.fused_qkv else torch.cat([attn.to_q.weight, attn.to_k.weight, attn.to_v.weight])
    b = attn.qkv.bias if attn.fused_qkv else torch.cat([attn.to_q.bias, attn.to_k.bias, attn.to_v.bias])
    q, k, v = F.linear(x, w, b).split([H * D, Hk * D, Hk * D], -1)
    q, k, v = q.view(B, S, H, D), k.view(B, S, Hk, D), v.view(B, S, Hk, D)
    if attn.qk_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rope.rotate(q, pos), rope.rotate(k, pos)
    k, v = k.repeat_interleave(H // Hk, 2), v.repeat_interleave(H // Hk, 2)
    logits = torch.einsum("bshd,bthd->bhst", q, k) * gain / math.sqrt(D)
    if causal:
        logits = logits.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    out = torch.einsum("bhst,bthd->bshd", logits.softmax(-1), v).reshape(B, S, H * D)
    return attn.proj(out)


# -- Attention -------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(3, 5), (1, 7), (2, 3, 5)])
@pytest.mark.parametrize("qk_norm", [None, "rms", "layer"])
@pytest.mark.parametrize("fused_qkv,num_kv_heads", [(True, 4), (False, 2), (True, 1)])
def test_attention_matches_spelled_out_reference_odd_shapes(sizes, qk_norm, fused_qkv, num_kv_heads):
    head_dim = 24
    axes_dim = (8, 8) if len(sizes) == 2 else (4, 8, 8)  # partial rotary for 3D: 20 of 24 channels
    rope = ar.AxialRoPE(axes_dim)
    attn = _randomize(
        Attention(96, 4, rope, num_kv_heads=num_kv_heads, fused_qkv=fused_qkv, qk_norm=qk_norm, head_dim=head_dim)
    ).double()
    pos = ar.grid(*sizes)
    x = torch.randn(3, pos.shape[0], 96, dtype=torch.float64)
    out = attn(x, pos)
    assert out.shape == x.shape
    # float64 bound: the two differ in summation order only, each output a chain of sums of < 200 terms
    # (projections, scores, softmax, values): < 200 * 4 u = 1e-13 of the terms' scale (u = 1.1e-16)
    torch.testing.assert_close(out, _reference_attention(attn, x, pos, rope), atol=1e-10, rtol=1e-10)


def test_attention_rms_qk_norm_goes_through_the_fused_norm_and_rotation(monkeypatch):
    import axial_rope.attention as attention

    rope = ar.AxialRoPE((8, 8))
    attn = Attention(64, 4, rope, qk_norm="rms")
    calls = []
    original = attention.norm_rotate
    monkeypatch.setattr(attention, "norm_rotate", lambda *a, **k: calls.append(1) or original(*a, **k))
    attn(torch.randn(1, 6, 64), ar.grid(2, 3))
    assert calls == [1]


def test_attention_factor_placements_agree_at_full_rotary_and_differ_at_partial():
    yarn = ar.scaling.YaRN(4.0, 8)
    af = yarn.attention_scale()
    x = torch.randn(2, 12, 64, dtype=torch.float64)
    pos = ar.grid(3, 4) * 5  # far enough for YaRN's frequencies to matter
    # full rotary: logits scale by af^2 in both placements
    rope = ar.AxialRoPE((8, 8), scaling=yarn)
    a_rope = _randomize(Attention(64, 4, rope)).double()
    a_soft = Attention(64, 4, rope, factor_placement="softmax").double()
    a_soft.load_state_dict(a_rope.state_dict())
    # float64 on both sides (the softmax placement rotates float64 q and k without the factor): af * af in
    # the softmax scale against af in each of q and k, a few roundings apart, < 1e-13 as above; the 1e-6
    # this test used assumed float32 tables
    torch.testing.assert_close(a_soft(x, pos), a_rope(x, pos), atol=1e-10, rtol=1e-10)
    # partial rotary (16 of 24 channels): the softmax placement scales every channel
    x = torch.randn(2, 12, 96, dtype=torch.float64)
    rope = ar.AxialRoPE((8, 8), scaling=yarn)
    a_rope = _randomize(Attention(96, 4, rope)).double()
    a_soft = Attention(96, 4, rope, factor_placement="softmax").double()
    a_soft.load_state_dict(a_rope.state_dict())
    unit = ar.AxialRoPE((8, 8), scaling=ar.scaling.YaRN(4.0, 8, attention_factor=1.0))
    expected = _reference_attention(a_soft, x, pos, unit, gain=af * af)
    torch.testing.assert_close(a_soft(x, pos), expected, atol=1e-10, rtol=1e-10)
    assert (a_soft(x, pos) - a_rope(x, pos)).abs().max() > 1e-4


def test_attention_factor_softmax_rejects_different_factors_per_axis():
    rope = ar.AxialRoPE((8, 8), scaling=(ar.scaling.YaRN(4.0, 8), None))
    attn = Attention(64, 4, rope, factor_placement="softmax")
    with pytest.raises(ValueError, match="one factor for all axes"):
        attn(torch.randn(1, 4, 64), ar.grid(2, 2))


def test_causal_attention_ignores_future_tokens_and_combines_with_mask():
    rope = ar.AxialRoPE(16)
    attn = _randomize(Attention(64, 4, rope, causal=True, num_kv_heads=2)).double()
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    pos = torch.arange(9)
    y = attn(x, pos)
    x2 = x.clone()
    x2[:, 5:] += 1.0
    # masked keys add exact zeros: only a different split of the float64 sums could move an output, by
    # < 40 * 2 u of its scale (O(1)): 1e-14
    torch.testing.assert_close(attn(x2, pos)[:, :5], y[:, :5], atol=1e-12, rtol=0)
    # a key-padding mask (last two keys hidden) on top of causality; bool and additive masks agree
    keep = torch.ones(9, 9, dtype=torch.bool)
    keep[:, 7:] = False
    y_bool = attn(x, pos, mask=keep)
    y_float = attn(x, pos, mask=torch.zeros(9, 9, dtype=torch.float64).masked_fill(~keep, float("-inf")))
    expected = _reference_attention(attn, x, pos, rope, mask=keep, causal=True)
    torch.testing.assert_close(y_bool[:, :7], expected[:, :7], atol=1e-10, rtol=1e-10)  # float64: as above
    # the two masks may take different SDPA kernels: other summation orders, < 40 * 4 u of O(1) outputs
    torch.testing.assert_close(y_float[:, :7], y_bool[:, :7], atol=1e-12, rtol=0)


def test_attention_rejects_bad_arguments():
    rope = ar.AxialRoPE((16, 16))
    with pytest.raises(ValueError, match="rot_dim"):
        Attention(64, 4, rope)  # head_dim 16 < 32
    with pytest.raises(ValueError, match="num_kv_heads"):
        Attention(64, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="qk_norm"):
        Attention(64, 4, qk_norm="batch")
    with pytest.raises(ValueError, match=r"pos \(or rotation=\) is required"):
        Attention(128, 4, rope)(torch.randn(1, 4, 128))
    with pytest.raises(ValueError, match="input_pos"):
        Attention(128, 4, rope)(torch.randn(1, 4, 128), ar.grid(2, 2), cache=KVCache(1, 8, 4, 32))


# -- KV cache --------------------------------------------------------------------


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_cached_decoding_equals_full_causal_attention(scaling, num_kv_heads):
    rope = ar.AxialRoPE(8, scaling=scaling, pairing="half")
    attn = _randomize(Attention(64, 4, rope, num_kv_heads=num_kv_heads, head_dim=16, causal=True, qk_norm="rms"))
    attn = attn.double()  # an equality: float64, where the decode and the full pass differ by < 1e-13 as above
    total, prompt = 13, 5
    x = torch.randn(2, total, 64, dtype=torch.float64)
    full = attn(x, torch.arange(total), seq_len=total)
    cache = KVCache(2, total, num_kv_heads, 16, dtype=torch.float64)
    outs = [attn(x[:, :prompt], cache=cache, input_pos=torch.arange(prompt), seq_len=total)]
    for i in range(prompt, total):
        outs.append(attn(x[:, i : i + 1], cache=cache, input_pos=torch.tensor([i]), seq_len=total))
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-10, rtol=1e-10)


def test_cache_holds_keys_rotated_exactly_once():
    rope = ar.AxialRoPE(16)
    attn = _randomize(Attention(32, 2, rope, causal=True)).double()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    cache = KVCache(1, 8, 2, 16, dtype=torch.float64)
    attn(x[:, :3], cache=cache, input_pos=torch.arange(3))
    for i in range(3, 6):
        attn(x[:, i : i + 1], cache=cache, input_pos=torch.tensor([i]))
    _, k_raw, v = attn._project(x)  # [B, S, H, D], unrotated
    once = rope.rotate(k_raw, torch.arange(6)).transpose(1, 2)
    twice = rope.rotate(rope.rotate(k_raw, torch.arange(6)), torch.arange(6)).transpose(1, 2)
    # the same float64 rotation of the same keys: within 6 u |z| = 1e-15 |z| (helpers.TOL)
    torch.testing.assert_close(cache.k[:, :, :6], once, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache.v[:, :, :6], v.transpose(1, 2), atol=1e-12, rtol=0)
    assert (cache.k[:, :, 1:6] - twice[:, :, 1:6]).abs().amax() > 1e-3  # re-rotation would be caught
    assert cache.k[:, :, 6:].abs().max() == 0  # unwritten slots untouched


def test_cache_overflow_and_bad_shapes_raise_clear_errors():
    cache = KVCache(2, 4, 2, 8)
    k = torch.randn(2, 2, 1, 8)
    with pytest.raises(ValueError, match="overflow.*max_seq_len=4"):
        cache.update(torch.tensor([4]), k, k)
    with pytest.raises(ValueError, match=r"\[B, H_kv, S, D\]"):
        cache.update(torch.tensor([0, 1]), k, k)
    with pytest.raises(ValueError, match="max_batch_size"):
        cache.update(torch.tensor([0]), torch.randn(3, 2, 1, 8), torch.randn(3, 2, 1, 8))
    with pytest.raises(ValueError, match="max_seq_len"):
        KVCache(1, 0, 1, 8)
    # a smaller batch uses the first rows
    k_all, _ = cache.update(torch.tensor([3]), k[:1], k[:1])
    assert k_all.shape == (1, 2, 4, 8) and torch.equal(cache.k[0, :, 3], k[0, :, 0])


# -- DiT block and friends -------------------------------------------------------


@pytest.mark.parametrize("qk_norm", [None, "rms"])
def test_dit_block_is_identity_at_init_and_final_layer_zero(qk_norm):
    block = DiTBlock(64, 4, ar.AxialRoPE((8, 8)), qk_norm=qk_norm)
    x, c = torch.randn(2, 15, 64), torch.randn(2, 64)
    assert torch.equal(block(x, c, ar.grid(3, 5)), x)
    assert FinalLayer(64, 2, 3)(x, c).abs().max() == 0


def test_reset_parameters_holds_each_layers_part_of_dits_init():
    # a trained (here: perturbed) block is the identity again once its adaLN modulation is reset
    block = _randomize(DiTBlock(64, 4, ar.AxialRoPE((8, 8)), qk_norm="rms"))
    x, c = torch.randn(2, 15, 64), torch.randn(2, 64)
    block.reset_parameters()
    assert torch.equal(block(x, c, ar.grid(3, 5)), x)
    final = _randomize(FinalLayer(64, 2, 3))
    final.reset_parameters()
    assert final(x, c).abs().max() == 0
    # attention and MLP: xavier-uniform weights, zero biases, unit QK-norm weights
    block.attn.reset_parameters()
    block.mlp.reset_parameters()
    for linear in (block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2):
        fan_out, fan_in = linear.weight.shape
        assert linear.weight.abs().max() <= math.sqrt(6 / (fan_in + fan_out)) and linear.bias.abs().max() == 0
    assert torch.equal(block.attn.q_norm.weight, torch.ones(16))
    # embedders: N(0, init_std), zero biases; the patch kernel as a linear map
    labels = _randomize(LabelEmbedder(1000, 64, init_std=0.5))
    labels.reset_parameters()
    assert labels.embedding_table.weight.std().item() == pytest.approx(0.5, rel=0.05)
    steps = _randomize(TimestepEmbedder(64))
    steps.reset_parameters()
    assert steps.mlp[0].weight.std().item() == pytest.approx(0.02, rel=0.1) and steps.mlp[2].bias.abs().max() == 0
    patch = _randomize(PatchEmbed((1, 2, 2), 3, 64))
    patch.reset_parameters()
    assert patch.proj.weight.abs().max() <= math.sqrt(6 / (64 + 12)) and patch.proj.bias.abs().max() == 0


def test_dit_block_gradients_reach_every_parameter():
    block = _randomize(DiTBlock(64, 4, ar.AxialRoPE((8, 8)), qk_norm="layer", num_kv_heads=2))
    final = _randomize(FinalLayer(64, (1, 2, 2), 3))
    x, c = torch.randn(2, 15, 64, requires_grad=True), torch.randn(2, 64)
    final(block(x, c, ar.grid(3, 5)), c).square().sum().backward()
    for name, p in [*block.named_parameters(), *final.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("shift", [(7.0, -3.0), (1000.0, 250.0)])
def test_dit_block_output_unchanged_when_every_position_shifts(shift):
    block = _randomize(DiTBlock(64, 4, ar.AxialRoPE((8, 8)), qk_norm="rms"), std=0.3).double()
    x, c = torch.randn(2, 12, 64, dtype=torch.float64), torch.randn(2, 64, dtype=torch.float64)
    pos = ar.grid(3, 4)
    y = block(x, c, pos)
    # float64: angles up to 1e3 rad move by 1e3 * 2**-53 = 1e-13 rad, the block's outputs by less than 1e-11
    torch.testing.assert_close(block(x, c, pos + torch.tensor(shift)), y, atol=1e-9, rtol=1e-9)


def test_text_tokens_with_own_positions_shift_with_the_image_or_break_invariance():
    # Flux-style: 3 text tokens at position 0 on both axes, image tokens after them
    block = _randomize(DiTBlock(64, 4, ar.AxialRoPE((8, 8))), std=0.3).double()
    text, image = ar.text_positions(3, 2, step=0), ar.grid(3, 4, offset=1)
    x, c = torch.randn(1, 15, 64, dtype=torch.float64), torch.randn(1, 64, dtype=torch.float64)
    pos = torch.cat([text, image])
    y = block(x, c, pos)
    shift = torch.tensor([5.0, 9.0])
    torch.testing.assert_close(block(x, c, pos + shift), y, atol=1e-9, rtol=1e-9)  # float64: as above
    # the text tokens keep their own positions: moving only the image changes text-image attention
    moved = torch.cat([text, image + shift])
    assert (block(x, c, moved) - y).abs().max() > 1e-3


def test_per_sample_positions_and_bfloat16_block():
    # pos [B, S, n_axes]: each sample its own offset; translation invariance makes the outputs equal
    block = _randomize(DiTBlock(64, 4, ar.AxialRoPE((8, 8)), qk_norm="rms"), std=0.3).double()
    x, c = torch.randn(1, 6, 64).expand(2, -1, -1), torch.randn(1, 64).expand(2, -1)
    pos = torch.stack([ar.grid(2, 3), ar.grid(2, 3, offset=(40.0, -7.0))])
    y = block(x.double(), c.double(), pos)
    # an equality, in float64: angles up to 43 rad apart, 5e-15 rad of rounding; the block moves it < 1e-11
    torch.testing.assert_close(y[0], y[1], atol=1e-9, rtol=1e-9)
    y16 = block.to(torch.bfloat16)(x.bfloat16(), c.bfloat16(), pos)
    assert y16.dtype == torch.bfloat16
    # bf16 rounding of weights and activations: 2**-9 relative each, some 20 along a path through the block:
    # about 4e-2 of the output's norm (to first order)
    assert (y16.double() - y).norm() / y.norm() < 0.05


def test_label_embedder_drops_labels_for_guidance():
    emb = LabelEmbedder(10, 8, dropout_prob=0.5)
    labels = torch.arange(10)
    emb.eval()
    torch.testing.assert_close(emb(labels), emb.embedding_table(labels))
    forced = emb(labels, force_drop_ids=torch.ones(10, dtype=torch.long))
    torch.testing.assert_close(forced, emb.embedding_table(torch.full((10,), emb.null_label)))
    emb.train()
    dropped = emb.token_drop(torch.arange(10).repeat(100))
    assert 0.4 < (dropped == 10).float().mean() < 0.6
    with pytest.raises(ValueError, match="dropout_prob"):
        LabelEmbedder(10, 8, dropout_prob=0.0).token_drop(labels)


def test_timestep_embedding_odd_width_and_values():
    t = torch.tensor([0.0, 3.5])
    e = timestep_embedding(t, 7)
    assert e.shape == (2, 7) and torch.all(e[:, -1] == 0)
    torch.testing.assert_close(e[0, :3], torch.ones(3))  # cos(0)
    assert TimestepEmbedder(32)(t).shape == (2, 32)


@pytest.mark.parametrize(
    "patch,sizes", [((2, 2), (6, 10)), (3, (9, 3)), ((1, 2, 2), (3, 6, 10)), ((2, 1, 3), (4, 5, 3))]
)
def test_patch_embed_then_unpatchify_is_the_identity(patch, sizes):
    channels = 3
    embed = PatchEmbed(patch, channels, 1)
    n = len(embed.patch_size)
    dim = channels * math.prod(embed.patch_size)
    embed = PatchEmbed(patch, channels, dim)
    with torch.no_grad():  # token channel j = pixel (*patch offset, c): the layout unpatchify reads
        weight = torch.eye(dim).view(dim, *embed.patch_size, channels).movedim(-1, 1)
        embed.proj.weight.copy_(weight)
        embed.proj.bias.zero_()
    x = torch.randn(2, channels, *sizes)
    tokens, grid = embed(x)
    assert grid == tuple(s // p for s, p in zip(sizes, embed.patch_size)) and len(grid) == n
    assert tokens.shape == (2, math.prod(grid), dim)
    torch.testing.assert_close(unpatchify(tokens, grid, embed.patch_size, channels), x)


def test_patch_embed_rejects_sizes_not_divisible_by_the_patch():
    with pytest.raises(ValueError, match="divisible"):
        PatchEmbed(2, 3, 8)(torch.randn(1, 3, 6, 7))
    with pytest.raises(ValueError, match="5-D"):
        PatchEmbed((1, 2, 2), 3, 8)(torch.randn(1, 3, 6, 6))


@pytest.mark.slow
def test_dit_block_compiles_fullgraph_on_cpu():
    torch._dynamo.reset()
    block = _randomize(DiTBlock(32, 2, ar.AxialRoPE((8, 8)), qk_norm="rms")).eval().double()
    x, c, pos = torch.randn(1, 6, 32, dtype=torch.float64), torch.randn(1, 32, dtype=torch.float64), ar.grid(2, 3)
    # aot_eager: dynamo's full-graph capture and AOT autograd without inductor's C++ build (minutes on 2 cores)
    compiled = torch.compile(block, fullgraph=True, backend=COMPILE_BACKEND)
    with torch.no_grad():  # float64: the compiled graph may sum in another order, < 1e-13 apart as above
        torch.testing.assert_close(compiled(x, c, pos), block(x, c, pos), atol=1e-10, rtol=1e-10)
