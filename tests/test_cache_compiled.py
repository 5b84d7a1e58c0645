"""Every KV-cache user compiled (``fullgraph=True``) against the same model eager.

The slots of a cache are reserved on the host by ``KVCache.advance`` (where rolls also happen); the compiled
forward only writes tensors, so a compiled model streams, decodes and samples exactly as the eager one. Before,
``update`` moved ``length`` only eagerly and every compiled step wrote slot 0 (stream logits 0.07 off from the
second position on). Models run in float64 with ``backend="eager"`` (dynamo's graphs, no code generation), one
GPT case through AOT autograd (inductor with AXIAL_ROPE_COMPILE_BACKEND=inductor). Compiled and eager evaluate the same float64 operations, except that the torch
backend's rotation is one complex multiply eagerly and a traced expression compiled: a few float64 roundings
(1e-16 relative) through a tiny model, far below the 1e-12 the comparisons allow; a cache that skips or
overwrites a slot is off by O(1e-2).
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from helpers import one_torch_thread, perturb

from models.gpt import GPT, GPTConfig
from models.video_dit import PRESETS, VideoDiT
from models.video_streaming import forward_frames, frame_caches, sample_streaming

_one_thread = one_torch_thread()

# inductor's CPU code generation takes minutes on a small CI machine; AXIAL_ROPE_COMPILE_BACKEND=inductor runs it
COMPILE_BACKEND = os.environ.get("AXIAL_ROPE_COMPILE_BACKEND", "aot_eager")

LABELS = torch.tensor([1, 3])


def _close(got, want, atol=1e-12):
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gpt() -> GPT:
    """The issue's model: one layer, two heads of 8 channels, 29 tokens."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=29, depth=1, num_heads=2, hidden_size=16)).double().eval()


def _idx(length: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 29, (batch, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("sinks", "evict", "chunk"), [(1, 1, 1), (0, 1, 1), (2, 3, 2)])
def test_compiled_stream_logits_equal_eager(sinks, evict, chunk):
    model, idx = _gpt(), _idx(20)
    with torch.no_grad():
        eager = model.stream_logits(idx, 4 if sinks < 2 else 8, sinks=sinks, evict=evict, chunk=chunk)
        model.compile(backend="eager", fullgraph=True)
        compiled = model.stream_logits(idx, 4 if sinks < 2 else 8, sinks=sinks, evict=evict, chunk=chunk)
    _close(compiled, eager)


@pytest.mark.parametrize("window", [None, 8])
def test_compiled_generation_equals_eager_static_and_rolling(window):
    model, prompt = _gpt(), _idx(5, batch=2)
    kw = {"temperature": 0, "return_logits": True, "window": window, "sinks": 0 if window is None else 2}
    with torch.no_grad():
        tokens, logits = model.generate(prompt, 20, **kw)
        model.compile(backend="eager", fullgraph=True)
        compiled_tokens, compiled_logits = model.generate(prompt, 20, **kw)
    assert torch.equal(compiled_tokens, tokens)
    _close(compiled_logits, logits)


def test_compiled_static_cache_reserves_its_slots_on_the_host():
    # the static path of generate takes its slots from advance(), so the cache's length is right after a compiled
    # decode: a later advance continues after the tokens written, never over them
    model, prompt = _gpt(), _idx(3)
    model.compile(backend="eager", fullgraph=True)
    caches = model.new_caches(1, 8)
    with torch.no_grad():
        for n in (3, 1, 1):
            model(prompt[:, :n], [cache.advance(n) for cache in caches][0], caches, seq_len=8)
    assert caches[0].length == 5 and caches[0].filled.tolist() == [True] * 5 + [False] * 3


def test_functionalized_stream_logits_equal_eager():
    # AOT autograd turns the cache writes into graph outputs copied back into the buffers (what inductor compiles);
    # inductor itself: AXIAL_ROPE_COMPILE_BACKEND=inductor (its C++ build takes about a minute on 2 cores), with
    # its own kernels summing float64 in other orders: 1e-10 leaves 1e-6 relative room
    model, idx = _gpt(), _idx(10)
    with torch.no_grad():
        eager = model.stream_logits(idx, 4, sinks=1)
        model.compile(backend=COMPILE_BACKEND, fullgraph=True)
        compiled = model.stream_logits(idx, 4, sinks=1)
    _close(compiled, eager, atol=1e-10)


# -- a frame-causal video DiT, each block compiled (regional compilation) ---------------------------------------

TINY = replace(PRESETS["tiny"], hidden_size=32, depth=2, num_heads=2, causal=True)
FRAME = 4  # 2 x 2 latent frames of 4 px in patches of 2


def _video_model() -> VideoDiT:
    torch.manual_seed(0)
    return perturb(VideoDiT(TINY).double())


def _video(frames: int) -> torch.Tensor:
    return torch.randn(2, 3, frames, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _compile_blocks(model: VideoDiT) -> None:
    for block in model.blocks:
        block.compile(backend="eager", fullgraph=True)


def _frames(model: VideoDiT, x: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    """Write, read and roll through a two-frame window: each frame read at a timestep, then written clean."""
    caches, outs, lengths = frame_caches(model, 2, FRAME, 2), [], []
    t = torch.tensor([300.0, 800.0], dtype=torch.float64)
    with torch.no_grad():
        for f in range(x.shape[2]):
            frame = x[:, :, f : f + 1]
            for cache in caches:
                cache.make_room(FRAME, model.rope)
            outs.append(forward_frames(model, frame, t, LABELS, caches=caches, cache_write=False))
            outs.append(forward_frames(model, frame, 0.0, LABELS, caches=caches, cache_write=True))
            lengths.append(caches[0].length)
    return outs, lengths


def test_compiled_blocks_stream_frames_as_eager():
    model, x = _video_model(), _video(4)
    eager, eager_lengths = _frames(model, x)
    _compile_blocks(model)
    compiled, lengths = _frames(model, x)
    assert lengths == eager_lengths == [FRAME, 2 * FRAME, 2 * FRAME, 2 * FRAME]
    for got, want in zip(compiled, eager):
        _close(got, want)


def test_compiled_blocks_sample_streaming_as_eager():
    model, noise = _video_model(), _video(3)
    eager = sample_streaming(model, noise, LABELS, window=2, steps=2, cfg_scale=2.0)
    _compile_blocks(model)
    _close(sample_streaming(model, noise, LABELS, window=2, steps=2, cfg_scale=2.0), eager)
