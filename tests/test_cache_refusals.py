"""What rolling and static KV caches, and the language model streaming through them, refuse: each with a
``ValueError`` that names the argument, the value and what was expected, before any state changes."""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope.cache import KVCache
from models.gpt import GPT, GPTConfig
from models.studies.length.positions import StudyPositions


def _gpt(dtype):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, depth=1, num_heads=2, hidden_size=32, max_seq_len=16)).to(dtype).eval()


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


def _write(cache, n, rope, dim=8):
    slots = cache.advance(n, rope)
    cache.update(slots, *(torch.ones(1, 1, n, dim),) * 2)
    return slots


@pytest.mark.parametrize("sinks", [0, 2])
def test_a_chunk_larger_than_the_window_is_refused_even_when_nothing_can_roll(sinks):
    # empty, or holding only its sinks, the cache has nothing to drop: 5 tokens never fit 4 slots
    rope, cache = ar.AxialRoPE(8), KVCache(1, 8, 1, 8, window=4, sinks=sinks)
    with pytest.raises(ValueError, match="5 new tokens do not fit a window of 4 holding 0 .* feed at most 4 at a time"):
        cache.advance(5, rope)
    assert cache.length == 0
    if sinks:
        _write(cache, 2, rope)  # the sinks alone
        with pytest.raises(
            ValueError, match="3 new tokens do not fit a window of 4 holding 2 with 2 sinks: .*at most 2"
        ):
            cache.advance(3, rope)
    assert _write(cache, 4 - cache.length, rope).tolist()[-1] == 3 and cache.length == 4


def test_rolling_cache_arguments_are_checked_before_the_first_roll():
    rope = ar.AxialRoPE(8)
    for time_axis in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"time_axis must be an int >= 0 .*got {time_axis!r}"):
            KVCache(1, 4, 1, 8, window=4, time_axis=time_axis)
    cache = KVCache(1, 4, 1, 8, window=4, time_axis=3)  # the rope's axes are known at the first advance
    with pytest.raises(ValueError, match=r"time_axis \(3\) is not an axis of the rope's 1-axis positions"):
        cache.advance(1, rope)
    with pytest.raises(ValueError, match=r"rope.rot_dim = sum\(axes_dim\) = 16 exceeds the cache's head_dim = 8"):
        KVCache(1, 4, 1, 8, window=4).advance(1, ar.AxialRoPE(16))
    with pytest.raises(ValueError, match=r"evict \(2\) goes with a rolling cache \(window=\)"):
        KVCache(1, 4, 1, 8, evict=2)
    # a roll that keeps nothing re-rotates nothing, and still refuses a rope it could not re-index with
    cache, dynamic = KVCache(1, 2, 1, 8, window=2, evict=2), ar.AxialRoPE(8, scaling=ar.scaling.DynamicNTK(4.0, 4))
    _write(cache, 2, rope)
    for call in (lambda: cache.roll(2, dynamic), lambda: cache.advance(2, dynamic), lambda: cache.advance(1, None)):
        with pytest.raises(ValueError, match="fixed frequencies|pass the layer's rope"):
            call()
    assert cache.length == 2 and bool(cache.filled.all())


def test_to_empty_leaves_an_empty_cache():
    rope = ar.AxialRoPE(8)
    for cache in (KVCache(1, 4, 1, 8), KVCache(1, 4, 1, 8, window=4)):
        _write(cache, 3, rope)
        assert cache.to_empty(device="cpu") is cache
        assert cache.length == 0 and not cache.filled.any() and not cache.k.any() and not cache.v.any()
        assert _write(cache, 2, rope).tolist() == [0, 1]  # slots from 0 again


def test_language_model_arguments_name_themselves():
    model, idx = _gpt(torch.float32), torch.zeros(1, 6, dtype=torch.long)
    cases = [
        (lambda: model.generate(idx, 2, window=0), "window must be a positive int, got 0"),
        (lambda: model.generate(idx, 2, window=4, evict=9), r"evict \(9\) must be whole frames"),
        (lambda: model.generate(idx, 2, evict=2), "evict goes with a rolling window"),
        (lambda: model.generate(idx[:, :0], 2), r"idx \(the prompt\) must be int token ids \[B, S\] with S >= 1"),
        (lambda: model.generate(idx[:, :0], 2, window=4), r"idx \(the prompt\) must be .* got torch.int64 \(1, 0\)"),
        (lambda: model.generate(idx[0], 2), r"idx \(the prompt\) must be int token ids \[B, S\].* \(6,\)"),
        (lambda: model.generate(idx, 0), "max_new_tokens must be an int > 0, got 0"),
        (lambda: model.stream_logits(idx[:, :0], 4), r"idx must be int token ids \[B, S\] with S >= 1"),
        (lambda: model.stream_logits(idx[0], 4), r"idx must be int token ids \[B, S\] with S >= 1, got .* \(6,\)"),
        (lambda: model.stream_logits(idx, 4, chunk=2.0), r"chunk must be an int in \[1, window - sinks = 4\], got 2.0"),
        (lambda: model(idx[0]), r"idx must be int token ids \[B, S\], got torch.int64 \(6,\)"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
