"""Rolling KV caches (window, attention sinks, frames): kept keys re-indexed by rotating their copies as written.

The reference for a rolling cache is the rotation of each kept token's raw key at its re-indexed position
(``0 .. length - 1``), computed afresh; for a model, the recomputation over the kept tokens at those positions.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import U32, chain_bound, one_torch_thread, perturb

import axial_rope as ar
from axial_rope.cache import KVCache, roll_shift
from axial_rope.layers import Attention
from models.gpt import GPT, GPTConfig
from models.studies.length.positions import StudyPositions

_one_thread = one_torch_thread()


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
        # equal up to float64 rounding: each kept key rotated twice at most (written, rolled), 6 u |z| each
        # (tests/helpers.py)
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


# unit roundoff of each cache dtype, and what a kept key may be off by per channel, relative to its plane's |z|: the
# write rounds the key rotated at its first position (<= u per channel, so <= sqrt(2) u of |z|, which a rotation
# keeps), and a roll rotates that copy once by the whole shift since (float32 arithmetic: 6 U32 |z|, tests/helpers.py)
# and rounds it to the cache dtype (u, float32: inside the 6 U32). Second-order terms: the factor 1 + 2 u.
_LOW = {torch.float32: U32, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _kept_key_bound(dtype) -> float:
    u = _LOW[dtype]
    return (2**0.5 * u + 6 * U32 + (u if u > U32 else 0)) * (1 + 2 * u)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kept_keys_carry_two_roundings_whatever_the_stream_length(dtype):
    # one token a step over 10x the window with evict=1: a key rolls at every step until it leaves (up to 15 rolls;
    # re-rotating the rolled key each time, as before, reached 12 u in bfloat16 and float16 here, not 2.4 u)
    window, rope = 16, ar.AxialRoPE(8, pairing="half")
    cache = KVCache(1, window, 2, 8, window=window, evict=1, dtype=dtype)
    raw = _raw(10 * window, torch.float64, dim=8)
    worst = 0.0
    for kept in _stream(rope, cache, raw, [1] * (10 * window), lambda s: s[:, None]):
        n = len(kept)  # every kept key against the raw key rotated once, in float64, at its final position
        expected = _rotated(rope, raw[:, :, kept], torch.arange(n)[:, None])
        plane = expected.unflatten(-1, (2, 4)).norm(dim=-2, keepdim=True).expand(-1, -1, -1, 2, -1).flatten(-2)
        worst = max(worst, float(((cache.k[:, :, :n].double() - expected).abs() / plane).amax()))
    assert worst <= _kept_key_bound(dtype), (worst / _LOW[dtype], _kept_key_bound(dtype) / _LOW[dtype])
    assert worst > _LOW[dtype] / 4  # the cache's dtype did round (the comparison is not float64 against itself)


def _recomputed_logits(model, idx, window, sinks, evict=1):
    """``_stream_recomputed`` teacher-forced: at each position, the model over the tokens a rolling cache would
    hold (the same ``roll_shift``), at positions ``0 .. len - 1``; its last logits ``[B, T, V]``."""
    kept, out = [], []
    for i in range(idx.shape[1]):
        del kept[sinks : sinks + roll_shift(len(kept), 1, window, sinks, evict)]
        kept.append(i)
        out.append(model(idx[:, kept], seq_len=window)[:, -1])
    return torch.stack(out, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_streamed_logits_stay_as_close_as_a_recomputation(dtype):
    # sharp attention (q and k weights of std 1: scores of order 10), so the logits read the keys' roundings
    torch.manual_seed(0)
    window, sinks = 16, 0
    exact = perturb(GPT(GPTConfig(vocab_size=29, depth=1, num_heads=2, hidden_size=16, max_seq_len=window)).double())
    with torch.no_grad():
        exact.layers[0].attention.qkv.weight[:32].normal_(0, 1.0, generator=torch.Generator().manual_seed(5))
    model = GPT(exact.config).to(dtype).eval()
    model.load_state_dict(exact.state_dict())
    idx = torch.randint(0, 29, (1, 10 * window), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = exact.stream_logits(idx, window, sinks=sinks)
        torch.testing.assert_close(_recomputed_logits(exact, idx, window, sinks), reference, atol=1e-10, rtol=0)
        streamed = model.stream_logits(idx, window, sinks=sinks).double()
        recomputed = _recomputed_logits(model, idx, window, sinks).double()
    # The two low-precision runs do the same operations but for the keys: a streamed key is the recomputed one
    # rounded once more at most (the roll; the bound above), and the recomputation carries that rounding of every
    # key and of every other operation against float64. So streaming differs from recomputing by less than the
    # recomputation's own distance from float64 (0.3x and 0.5x here; re-rotating at each roll, as before: 1.8x).
    own = (recomputed - reference).abs().amax()
    assert (streamed - recomputed).abs().amax() <= own, ((streamed - recomputed).abs().amax(), own)


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
