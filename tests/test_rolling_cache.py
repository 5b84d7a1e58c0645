"""Rolling KV caches (window, attention sinks, frames): kept keys re-indexed by rotating them in place.

The reference for a rolling cache is the rotation of each kept token's raw key at its re-indexed position
(``0 .. length - 1``), computed afresh; for a model, the recomputation over the kept tokens at those positions.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import U32, chain_bound

import axial_rope as ar
from axial_rope.cache import KVCache, roll_shift
from axial_rope.layers import Attention
from models.gpt import GPT, GPTConfig
from models.studies.length.positions import StudyPositions


def _raw(n_tokens, dtype, heads=2, dim=16, seed=0):
    return torch.randn(1, heads, n_tokens, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(
        dtype
    )


def _rotated(rope, raw, pos):
    """Keys ``raw [1, H, S, D]`` rotated at ``pos [S, A]``, afresh."""
    return ar.ops.rotate(raw.clone(), None, rope.rotation(pos.to(torch.float64)), "bhsd")[0]


def _stream(rope, cache, raw, chunks, positions):
    """Feed ``raw``'s tokens through ``cache`` in ``chunks``; yield (tokens kept, their re-indexed positions)."""
    kept, t = [], 0
    for n in chunks:
        slots = cache.advance(n, rope)
        cache.update(slots, _rotated(rope, raw[:, :, t : t + n], positions(slots)), raw[:, :, t : t + n])
        kept += range(t, t + n)
        if len(kept) > cache.window:  # the sinks and the latest window - sinks, in whole frames
            kept = kept[: cache.sinks] + kept[cache.sinks - cache.window :]
        t += n
        yield kept


@pytest.mark.parametrize("sinks", [0, 4])
def test_rolled_keys_equal_keys_rotated_afresh_at_reindexed_positions_float64(sinks):
    rope = ar.AxialRoPE(16, pairing="half")
    cache = KVCache(1, 16, 2, 16, window=16, sinks=sinks, dtype=torch.float64)
    assert (
        roll_shift(15, 5, 16, sinks, 1) == 4
        and roll_shift(15, 1, 16, sinks, 6) == 0
        and roll_shift(16, 1, 16, sinks, 6) == 6
        and roll_shift(5, 3, 16, 4, 6) == 0
    )
    chunks = [10, 3, 1, 1, 5, 12, 1, 1, 1, 12, 7, 2]
    raw = _raw(sum(chunks), torch.float64)
    for kept in _stream(rope, cache, raw, chunks, lambda s: s[:, None]):
        n = len(kept)
        assert cache.length == n <= 16 and bool(cache.filled[:n].all()) and not bool(cache.filled[n:].any())
        expected = _rotated(rope, raw[:, :, kept], torch.arange(n)[:, None])
        # equal up to float64 rounding: each kept key rotated at most 12 times, 6 u |z| each (tests/helpers.py)
        torch.testing.assert_close(cache.k[:, :, :n], expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(cache.v[:, :, :n], raw[:, :, kept], atol=0, rtol=0)  # values just move
        assert not cache.k[:, :, n:].any()


def test_video_cache_rolls_whole_frames_and_reindexes_time_only():
    rope = ar.AxialRoPE((4, 6, 6))  # t, y, x
    frame = 4  # a 2 x 2 frame
    cache = KVCache(1, 20, 2, 16, window=16, sinks=4, frame=frame, dtype=torch.float64)
    yx = ar.grid(2, 2).to(torch.float64)  # [4, 2]

    def positions(slots):  # (t = frame index, y, x)
        return torch.cat([(slots // frame)[:, None].double(), yx.repeat(len(slots) // frame, 1)], 1)

    chunks = [8, 4, 4, 8, 4, 12, 4, 4]
    raw = _raw(sum(chunks), torch.float64)
    for kept in _stream(rope, cache, raw, chunks, positions):
        n = len(kept)
        expected = _rotated(rope, raw[:, :, kept], positions(torch.arange(n)))
        torch.testing.assert_close(cache.k[:, :, :n], expected, atol=1e-12, rtol=0)


def test_float32_error_is_bounded_by_the_rolls_a_key_survives():
    # one token a step over 3x the window: a key is re-rotated once per step until it leaves (window - sinks
    # rolls at most). Each rotation errs by at most 6 u |z| per channel (tests/helpers.py) and keeps |z|.
    window, sinks = 16, 4
    rope = ar.AxialRoPE(16, pairing="half")
    cache = KVCache(1, window, 2, 16, window=window, sinks=sinks)
    raw = _raw(3 * window, torch.float32)
    *_, kept = _stream(rope, cache, raw, [1] * (3 * window), lambda s: s[:, None])  # the last kept list
    expected = _rotated(rope, raw[:, :, kept].double(), torch.arange(window)[:, None])
    plane = expected.unflatten(-1, (2, 8)).norm(dim=-2).amax()  # the largest |z| (half pairing: i, i + 8)
    bound = (window - sinks + 1) * 6 * U32 * plane
    err = (cache.k.double() - expected).abs().amax()
    assert err <= bound, (err, bound)
    assert err > 0  # the keys were re-rotated in float32, not recomputed


def test_rotating_by_d_then_minus_d_returns_the_keys_float32():
    rope = ar.AxialRoPE(16, pairing="half")
    keys = _raw(64, torch.float32)
    d = torch.full((64, 1), 1000.0, dtype=torch.float64)
    there = ar.ops.rotate(keys.clone(), None, rope.rotation(d), "bhsd", inplace=True)[0]
    assert (there - keys).abs().amax() > 0.1  # it did rotate
    back = ar.ops.rotate(there, None, rope.rotation(-d), "bhsd", inplace=True)[0]  # in place, as a roll does
    # two rotations, 6 u |z| each (tests/helpers.py): 7.2e-7 |z|, within 1e-6 of the plane's size
    plane = keys.double().unflatten(-1, (2, 8)).norm(dim=-2, keepdim=True).expand(-1, -1, -1, 2, -1).flatten(-2)
    assert ((back.double() - keys.double()).abs() <= 2 * 6 * U32 * plane).all()


def test_a_million_positions_out_the_cache_matches_a_short_stream():
    # positions are re-indexed, so after 2**20 tokens they are as small (and as exact) as after a few windows
    window, sinks, chunk = 1024, 4, 510
    rope = ar.AxialRoPE(8, pairing="half")
    cache = KVCache(1, window, 1, 8, window=window, sinks=sinks)
    keys = torch.randn(1, 1, chunk, 8, generator=torch.Generator().manual_seed(0))  # the same chunk every time
    rotated = {}
    for step in range(2**20 // chunk + 1):  # noqa: B007 (read after the loop)
        slots = cache.advance(chunk, rope)
        start = int(slots[0])
        if start not in rotated:
            rotated[start] = _rotated(rope, keys.double(), slots[:, None]).float()
        cache.update(slots, rotated[start], keys)
    assert (step + 1) * chunk >= 2**20 and int(slots[-1]) < window
    # kept: the sinks (first chunk's first 4), then the last 2 chunks' tokens, minus what the roll dropped
    n = cache.length
    tail = n - sinks
    expected_raw = torch.cat([keys[:, :, :sinks], torch.cat([keys, keys], 2)[:, :, -tail:]], 2)
    expected = _rotated(rope, expected_raw.double(), torch.arange(n)[:, None])
    plane = expected.unflatten(-1, (2, 4)).norm(dim=-2).amax()
    assert (cache.k[:, :, :n].double() - expected).abs().amax() <= 2 * 6 * U32 * plane  # rotated twice at most


# -- the language model --------------------------------------------------------------------------------------


def _gpt(dtype, depth=1):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, depth=depth, num_heads=2, hidden_size=32, max_seq_len=16)
    return GPT(config).to(dtype).eval()


@pytest.mark.parametrize(("sinks", "evict"), [(0, 1), (4, 1), (4, 5)])
@pytest.mark.parametrize("prompt", [5, 40])  # shorter than the window, and a chunked prefill
def test_streaming_generation_with_the_cache_equals_recomputation_float64(sinks, evict, prompt):
    model, window = _gpt(torch.float64), 16
    idx = torch.randint(0, 64, (2, prompt), generator=torch.Generator().manual_seed(1))
    kw = {"temperature": 0, "return_logits": True, "window": window, "sinks": sinks, "evict": evict}
    tokens, logits = model.generate(idx, 3 * window, **kw)
    ref_tokens, ref_logits = model.generate(idx, 3 * window, use_cache=False, **kw)
    assert torch.equal(tokens, ref_tokens) and tokens.shape == (2, prompt + 3 * window)
    torch.testing.assert_close(logits, ref_logits, atol=1e-10, rtol=0)


def test_streaming_generation_float32_within_its_bound_and_same_greedy_tokens():
    window = 16
    reference = _gpt(torch.float64)
    idx = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(2))
    kw = {"temperature": 0, "return_logits": True, "window": window, "sinks": 4}
    ref_tokens, ref_logits = reference.generate(idx, 3 * window, use_cache=False, **kw)
    model = _gpt(torch.float32)
    tokens, logits = model.generate(idx, 3 * window, **kw)
    # projections, attention over the window and the feed-forward sum at most 128 terms each (5 stages), and
    # the keys' re-rotations add 12 * 6 u of their size (far less): relative to the logits' scale
    tol = chain_bound(U32, 128, 5) * ref_logits.abs().amax().item()
    assert tol < 2e-4
    top2 = ref_logits.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).amin() > 4 * tol  # no near tie: the greedy tokens are well defined
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits.double(), ref_logits, atol=tol, rtol=0)


def test_streaming_goes_past_the_context_and_deeper_models_differ_from_recomputation():
    model, window = _gpt(torch.float64, depth=2), 16
    idx = torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(3))
    kw = {"temperature": 0, "return_logits": True, "window": window, "sinks": 4}
    _, logits = model.generate(idx, 2 * window, **kw)
    _, ref = model.generate(idx, 2 * window, use_cache=False, **kw)
    steps = window - idx.shape[1]  # until the first roll both see every token: equal
    torch.testing.assert_close(logits[:, :steps], ref[:, :steps], atol=1e-10, rtol=0)
    # after it, the second layer's cached states still carry evicted tokens (StreamingLLM's cache does too)
    assert (logits[:, steps + 1 :] - ref[:, steps + 1 :]).abs().amax() > 1e-6


@pytest.mark.parametrize("depth", [1, 2])
def test_stream_logits_without_sinks_are_a_sliding_window_at_every_depth_float64(depth):
    # a rolling cache of W tokens with sinks 0 keeps what a sliding window of W sees, at every layer: the keys
    # re-indexed to 0 .. W - 1 keep their distances to the query, which is all RoPE's scores read
    model, window = _gpt(torch.float64, depth), 8
    idx = torch.randint(0, 64, (2, 5 * window), generator=torch.Generator().manual_seed(4))
    sliding = GPT(replace(model.config, max_seq_len=5 * window), positions=StudyPositions(window=window)).double()
    sliding = sliding.eval()
    sliding.load_state_dict(model.state_dict())
    with torch.no_grad():
        streamed, expected = model.stream_logits(idx, window), sliding(idx)
    torch.testing.assert_close(streamed, expected, atol=1e-10, rtol=0)
    with torch.no_grad():  # sinks change what a token sees from the first chunk that overflows the window on
        sunk = model.stream_logits(idx, window, sinks=2, evict=3, chunk=3)
    fits = window // 3 * 3  # the tokens of the chunks before the first roll
    torch.testing.assert_close(sunk[:, :fits], expected[:, :fits], atol=1e-10, rtol=0)
    assert (sunk[:, fits:] - expected[:, fits:]).abs().amax() > 1e-3
    with pytest.raises(ValueError, match="chunk"):
        model.stream_logits(idx, window, sinks=2, chunk=7)


# -- 3-D: frames through one attention layer --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_frame_cache_attention_equals_attention_over_the_kept_frames(dtype):
    torch.manual_seed(0)
    rope = ar.AxialRoPE((4, 6, 6))
    attn = Attention(64, 4, rope, num_kv_heads=2).to(dtype).eval()
    frame, window, sinks = 4, 12, 4  # 2 x 2 frames; the first frame and the latest two
    yx = ar.grid(2, 2).to(torch.float64)
    pos = lambda t: torch.cat([t.repeat_interleave(frame)[:, None].double(), yx.repeat(len(t), 1)], 1)
    cache = KVCache(1, window, 2, 16, window=window, sinks=sinks, frame=frame, dtype=dtype)
    frames = torch.randn(1, 8 * frame, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    kept, t = [], 0
    for n in [2, 1, 1, 2, 1, 1]:  # frames per call
        x = frames[:, t * frame : (t + n) * frame].to(dtype)
        slots = cache.advance(n * frame, rope)
        with torch.no_grad():
            out = attn(x, pos(slots[::frame] // frame), cache=cache, input_pos=slots)
        kept += range(t, t + n)
        if len(kept) > window // frame:
            kept = kept[: sinks // frame] + kept[(sinks - window) // frame :]
        t += n
        idx = torch.cat([torch.arange(f * frame, (f + 1) * frame) for f in kept])
        with torch.no_grad():  # every kept frame attends to every other: the new frames' rows are compared
            ref = attn(frames[:, idx].to(dtype), pos(torch.arange(len(kept))))[:, -n * frame :]
        # float32: the projections and attention sum at most 64 terms (4 stages, tests/helpers.py)
        tol = 1e-10 if dtype == torch.float64 else chain_bound(U32, 64, 4) * ref.abs().amax().item()
        torch.testing.assert_close(out, ref, atol=tol, rtol=0)


# -- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, "window must be a positive int"),
        ({"window": -4}, "window must be a positive int"),
        ({"window": 8, "sinks": -1}, "sinks must be an int >= 0"),
        ({"window": 8, "sinks": 8}, r"sinks \(8\) must be fewer than the window"),
        ({"sinks": 2}, "sinks go with a rolling cache"),
        ({"window": 2, "frame": 4}, "window shorter than one frame"),
        ({"window": 6, "frame": 4}, "whole frames of 4 tokens"),
        ({"window": 8, "sinks": 2, "frame": 4}, "whole frames of 4 tokens"),
        ({"window": 32}, r"window \(32\) exceeds the cache's max_seq_len \(16\)"),
        ({"frame": 0}, "frame must be a positive int"),
        ({"window": 8, "evict": 0}, "evict must be a positive int"),
        (
            {"window": 8, "sinks": 2, "evict": 7},
            r"evict \(7\) must be whole frames of 1 tokens, at most window - sinks \(6\)",
        ),
        ({"window": 8, "frame": 2, "evict": 3}, "evict .* must be whole frames of 2 tokens"),
    ],
)
def test_bad_rolling_arguments_raise_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVCache(1, 16, 2, 8, **kwargs)


def test_rolling_caches_refuse_positions_that_go_backwards_skip_or_do_not_fit():
    rope = ar.AxialRoPE(8)
    cache = KVCache(1, 8, 1, 8, window=8, sinks=2)
    k = torch.zeros(1, 1, 3, 8)
    cache.update(cache.advance(3, rope), k, k)
    for bad in ([0, 1, 2], [4, 5, 6], [2, 3, 4]):  # backwards, skipping, rewriting: nothing reserved
        with pytest.raises(ValueError, match=r"reserved, in order \(none is reserved\)"):
            cache.update(torch.tensor(bad), k, k)
    cache.advance(3, rope)
    for bad in ([2, 3, 4], [4, 5, 6]):  # not the slots reserved
        with pytest.raises(ValueError, match=r"reserved, in order \(3..5\), got input_pos"):
            cache.update(torch.tensor(bad), k, k)
    cache.update(torch.arange(3, 6), k, k)
    cache.update(cache.advance(2, rope), *(torch.zeros(1, 1, 2, 8),) * 2)  # full
    with pytest.raises(ValueError, match="holding 8 with 2 sinks: feed at most 6 at a time"):
        cache.advance(7, rope)
    with pytest.raises(ValueError, match="pass the layer's rope"):
        cache.advance(1)
    with pytest.raises(ValueError, match="fixed frequencies and no position map"):
        cache.advance(1, ar.AxialRoPE(8, scaling=ar.scaling.DynamicNTK(4.0, 4)))
    with pytest.raises(ValueError, match="whole frames of 4 tokens, got 3"):
        KVCache(1, 8, 1, 8, window=8, frame=4).advance(3, rope)
    with pytest.raises(ValueError, match="roll\\(\\) is for a rolling cache"):
        KVCache(1, 8, 1, 8).roll(1, rope)


def test_static_cache_advance_raises_past_its_length_and_generate_refuses_other_position_schemes():
    cache = KVCache(1, 4, 1, 8)
    assert cache.advance(4).tolist() == [0, 1, 2, 3]
    cache.update(torch.arange(4), *(torch.zeros(1, 1, 4, 8),) * 2)
    with pytest.raises(ValueError, match="exceed max_seq_len=4 .*window=, keeps a stream going"):
        cache.advance(1)
    idx = torch.zeros(1, 3, dtype=torch.long)
    alibi = GPT(
        GPTConfig(vocab_size=16, depth=1, num_heads=2, hidden_size=16), positions=StudyPositions(position="alibi")
    )
    with pytest.raises(ValueError, match="streams RoPE softmax attention.*position='alibi'"):
        alibi.generate(idx, 2, window=8)
    with pytest.raises(ValueError, match="sinks go with a rolling window"):
        _gpt(torch.float32).generate(idx, 2, sinks=2)
    with pytest.raises(ValueError, match=r"sinks \(8\) must be fewer than the window"):
        _gpt(torch.float32).generate(idx, 2, window=8, sinks=8, use_cache=False)
