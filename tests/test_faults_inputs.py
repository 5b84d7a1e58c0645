"""Library inputs a careless or hostile caller passes: each case once gave a silent wrong answer or an unclear crash."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_close

import axial_rope as ar
from axial_rope.cache import KVCache
from axial_rope.layers import Attention
from axial_rope.packing import Item, greedy_pack, pack
from axial_rope.varlen import Segments, varlen_attention

# -- positions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_positions_are_refused_not_rounded(dtype):
    rope = ar.AxialRoPE(8)
    x = torch.randn(1, 2, 1, 8)
    with pytest.raises(TypeError, match="rounds coordinates"):
        rope.rotate(x, torch.tensor([256.0, 257.0]).to(dtype))  # bfloat16 holds 257 as 256
    with pytest.raises(TypeError, match="rounds coordinates"):
        ar.grid(300, dtype=dtype)


def test_integer_grids_refuse_fractional_coordinates_instead_of_truncating():
    assert torch.equal(ar.grid(3, dtype=torch.int64)[:, 0], torch.arange(3))
    with pytest.raises(ValueError, match="truncate"):
        ar.grid(4, dtype=torch.int64, scale=0.5)
    with pytest.raises(ValueError, match="truncate"):
        ar.text_positions(3, dtype=torch.int32, step=0.5)


def test_integer_positions_equal_float_positions():
    rope = ar.AxialRoPE((4, 4))
    x = torch.randn(1, 6, 2, 8)
    assert torch.equal(rope.rotate(x, ar.grid(2, 3, dtype=torch.int64)), rope.rotate(x, ar.grid(2, 3)))


@pytest.mark.slow
def test_nan_positions_are_caught_under_torch_compile():
    rope = ar.AxialRoPE((4, 4), backend="torch")
    fn = torch.compile(lambda x, pos: rope.rotate(x, pos), fullgraph=True, backend="aot_eager")
    x = torch.randn(1, 6, 2, 8)
    assert_close(fn(x, ar.grid(2, 3)), rope.rotate(x, ar.grid(2, 3), backend="reference"))
    bad = ar.grid(2, 3)
    bad[4, 1] = float("nan")
    with pytest.raises(RuntimeError, match="NaN or inf"):
        fn(x, bad)
    with pytest.raises(ValueError, match="NaN or inf"):  # eager: the same check, as a ValueError
        rope.rotate(x, bad)


# -- constructor arguments ------------------------------------------------------------------------


def test_float_axes_dim_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"axes_dim must be positive even ints.*16\.0"):
        ar.AxialRoPE(16.0)


def test_scaling_as_a_dict_is_the_method_it_describes():
    method = ar.scaling.YaRN(4.0, 64)
    x = torch.randn(1, 5, 1, 16)
    pos = torch.arange(5.0) * 40
    from_dict = ar.AxialRoPE(16, scaling=method.to_dict())
    assert from_dict.scaling == (method,)
    assert torch.equal(from_dict.rotate(x, pos), ar.AxialRoPE(16, scaling=method).rotate(x, pos))
    with pytest.raises(ValueError, match="rope_type"):
        ar.AxialRoPE(16, scaling={"factor": 2.0})
    with pytest.raises(TypeError, match="dict form"):
        ar.AxialRoPE(16, scaling=2.0)


# -- empty and degenerate shapes ------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 0, 16), (0, 6, 16)], ids=["no tokens", "no batch"])
def test_attention_on_empty_inputs_returns_empty_outputs(shape):
    attn = Attention(16, 2, ar.AxialRoPE((4, 4)))
    x = torch.randn(*shape)
    out = attn(x, ar.grid(2, 3)[: shape[1]])
    assert out.shape == shape


def test_k_with_zero_heads_is_a_clear_error():
    rope = ar.AxialRoPE((4, 4))
    with pytest.raises(ValueError, match="k has 0 heads"):
        rope(torch.randn(1, 6, 2, 8), torch.randn(1, 6, 0, 8), ar.grid(2, 3))


def test_reference_inplace_with_autograd_in_float64():
    # torch.complex saves its inputs: they must not be views of the tensor overwritten in place
    rope = ar.AxialRoPE((4, 4))
    leaf = torch.randn(1, 6, 2, 8, dtype=torch.float64, requires_grad=True)
    q = leaf * 1
    out = rope.rotate(q, ar.grid(2, 3), backend="reference", inplace=True)
    out.square().sum().backward()
    expected = torch.autograd.grad(rope.rotate(leaf, ar.grid(2, 3), backend="reference").square().sum(), leaf)[0]
    torch.testing.assert_close(leaf.grad, expected)


# -- the KV cache ---------------------------------------------------------------------------------


def _decoder(dtype=torch.float32):
    torch.manual_seed(0)
    return Attention(16, 2, ar.AxialRoPE(8, pairing="half"), causal=True).to(dtype).eval()


def test_cache_never_attends_to_slots_that_were_never_written():
    attn = _decoder()
    x = torch.randn(1, 3, 16)
    slots = torch.tensor([0, 1, 5])  # decoding skipped positions 2..4
    cache = KVCache(1, 8, 2, 8)
    with torch.no_grad():
        for i in range(3):
            out = attn(x[:, i : i + 1], cache=cache, input_pos=slots[i : i + 1])
        # the same three tokens at the same positions, without a cache: only they are attended
        full = attn(x, slots)
    assert_close(out, full[:, -1:])
    assert cache.filled.tolist() == [True, True, False, False, False, True, False, False]
    cache.reset()
    assert not cache.filled.any()


def test_cache_refuses_one_slot_written_twice_in_one_update():
    cache = KVCache(1, 8, 2, 4)
    kv = torch.randn(1, 2, 2, 4)
    with pytest.raises(ValueError, match="one slot twice"):
        cache.update(torch.tensor([3, 3]), kv, kv)


def test_cache_in_another_dtype_than_the_model():
    attn = _decoder()
    x = torch.randn(1, 4, 16)
    outs = {}
    for dtype in (torch.float32, torch.bfloat16):
        cache = KVCache(1, 8, 2, 8, dtype=dtype)
        with torch.no_grad():
            attn(x[:, :3], cache=cache, input_pos=torch.arange(3))
            outs[dtype] = attn(x[:, 3:], cache=cache, input_pos=torch.tensor([3]))
    assert outs[torch.bfloat16].dtype == torch.float32
    # the bfloat16 cache rounds k and v once (2**-8 relative): scores move by about 2**-7 |q| |k| / sqrt(D),
    # the output by 2**-8 of the values' scale and what the weights' change adds: within 2e-2 (an estimate)
    torch.testing.assert_close(outs[torch.bfloat16], outs[torch.float32], atol=2e-2, rtol=2e-2)


# -- packing and varlen: nonsense refused, numpy and torch integer sizes taken ----------------------


def test_varlen_attention_refuses_a_scale_that_is_not_a_finite_number():
    segments, q = Segments([2, 3]), torch.randn(5, 2, 8)
    for scale in (float("nan"), float("inf"), -float("inf")):  # before: NaN outputs
        with pytest.raises(ValueError, match="scale must be a finite number"):
            varlen_attention(q, q, q, segments, scale=scale)
    for scale in ("0.5", True, torch.tensor(0.5)):
        with pytest.raises(TypeError, match="scale must be a number"):
            varlen_attention(q, q, q, segments, scale=scale)
    half = varlen_attention(q, q, q, segments, scale=0.5, backend="loop")
    assert_close(half, varlen_attention(q * 0.5**0.5, q * 0.5**0.5, q, segments, scale=1.0, backend="loop"))


def test_packing_refuses_a_negative_prefix_and_bin_count():
    tokens, pos = torch.zeros(3, 4), torch.zeros(3, 2)
    with pytest.raises(
        ValueError, match=r"Item.prefix must be an int >= 0 .*, got -1"
    ):  # before: 3 tokens for a 2 x 2 grid
        Item(tokens, pos, (2, 2), prefix=-1)
    with pytest.raises(TypeError, match="prefix must be an int"):
        Item(torch.zeros(5, 4), torch.zeros(5, 2), (2, 2), prefix=True)
    for bins in (-1, 0):  # before: every item dropped
        with pytest.raises(ValueError, match=f"max_bins must be None .* or an int >= 1, got {bins}"):
            greedy_pack([3, 2], 4, max_bins=bins)
    with pytest.raises(TypeError, match="cu_seqlens must be a 1-D integer tensor"):  # before: read as 0, 1
        Segments.from_cu_seqlens(torch.tensor([False, True]))


def test_numpy_and_torch_integer_sizes_are_sizes():
    """Before: ``np.int64`` sides were "empty or non-positive", ``np.int64`` lengths refused as not an int."""
    item = Item(torch.zeros(6, 4), ar.grid(2, 3), (np.int64(2), torch.tensor(3)))
    assert item.shape == (2, 3) and all(type(s) is int for s in item.shape)
    assert pack([item]).shapes == ((2, 3),)
    plan = greedy_pack([np.int64(3), np.int32(2), torch.tensor(1)], np.int64(4), max_bins=np.int64(2))
    assert plan.bins == ((0, 2), (1,)) and plan.loads == (4, 2)
    assert Segments([np.int64(2), 3]).lengths == (2, 3)
    with pytest.raises(TypeError, match="Item.shape must hold ints, got float 2.0"):
        Item(torch.zeros(6, 4), ar.grid(2, 3), (2.0, 3))
    with pytest.raises(TypeError, match="greedy_pack: item 0 has a length of type float"):
        greedy_pack([2.0], 4)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_inplace_refuses_q_and_k_that_share_elements(layout):
    # k is q refused long since; partly overlapping views of one buffer rotated shared elements twice (off by 4.5)
    rope = ar.AxialRoPE(8)
    buf = torch.randn(1, 6, 4, 8) if layout == "bshd" else torch.randn(1, 4, 6, 8)
    heads = (slice(None), slice(None), slice(0, 2)) if layout == "bshd" else (slice(None), slice(0, 2))
    shifted = (slice(None), slice(None), slice(1, 3)) if layout == "bshd" else (slice(None), slice(1, 3))
    with torch.no_grad(), pytest.raises(ValueError, match="share memory"):
        rope(buf[heads], buf[shifted], torch.arange(6), layout, inplace=True)
    with torch.no_grad(), pytest.raises(ValueError, match="share memory"):
        rope(buf, buf, torch.arange(6), layout, inplace=True)
    # disjoint views of one buffer (the q and k heads of a fused projection) stay allowed, and are rotated once
    q, k = buf[heads], buf[(*heads[:-1], slice(2, 4))]
    expected_q, expected_k = rope(q.clone(), k.clone(), torch.arange(6), layout)
    with torch.no_grad():
        rope(q, k, torch.arange(6), layout, inplace=True)
    torch.testing.assert_close(q, expected_q, rtol=0, atol=0)
    torch.testing.assert_close(k, expected_k, rtol=0, atol=0)


def test_item_rope_names_what_the_scalings_do_not_fit():
    from axial_rope.packed_rope import item_rope
    from axial_rope.packing import Item, pack

    p = pack([Item.text(torch.randn(n, 4)) for n in (3, 5, 2)])
    with pytest.raises(ValueError, match="2 item scalings for 3 segments: pass one scaling"):
        item_rope(ar.AxialRoPE(8), [None, None], p.segments)


@pytest.mark.parametrize("watershed", [1.5, 0.0, -0.2, float("nan")])
def test_time_aware_ntk_refuses_a_watershed_outside_lumina_time(watershed):
    from axial_rope.time_scaling import TimeAwareNTK

    with pytest.raises(ValueError, match="watershed"):
        TimeAwareNTK(2.0, watershed=watershed)
