"""Frame-causal video DiT, per-frame noise levels, and streaming generation with rolling frame caches.

References: the model's own full forward (the streaming forward must equal it where the window holds every
frame), today's forward computed step by step (the ``[B]`` timestep path), attention recomputed over the kept
frames at re-indexed positions (a rolling window), and the rectified-flow formula written per frame.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import one_torch_thread, perturb

import axial_rope as ar
from axial_rope.layers import Attention, unpatchify
from models.dit import noise_level
from models.flow import noisy
from models.studies.vision.frames import sample_videos
from models.training.config import TrainConfig
from models.training.tasks import VideoTask, step_generator
from models.video_dit import PRESETS, VideoDiT, frame_causal_mask, token_frames
from models.video_streaming import forward_frames, frame_caches, sample_streaming

_one_thread = one_torch_thread()

# 2 x 2 latent frames of 4 px in patches of 2: 4 tokens a frame; two heads of 16 channels (axes (4, 6, 6))
TINY = replace(PRESETS["tiny"], hidden_size=32, depth=2, num_heads=2, causal=True)
FRAME = 4


def _model(config=TINY, dtype=torch.float64) -> VideoDiT:
    torch.manual_seed(0)
    return perturb(VideoDiT(config).to(dtype))


def _video(frames: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, frames, 4, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


LABELS = torch.tensor([1, 3])


def test_one_timestep_per_sample_is_todays_forward_bit_for_bit():
    model = _model(replace(TINY, causal=False), torch.float32)
    x, t = _video(3).float(), torch.tensor([250.0, 700.0])
    with torch.no_grad():  # the forward before per-frame timesteps, step by step
        h, grid = model.x_embedder(x)
        rotation = model.rope.rotation(ar.grid(*grid), seq_len=None, scaling=(None, None, None), t=noise_level(t))
        c = model.t_embedder(t) + model.y_embedder(LABELS)
        for block in model.blocks:
            h = block(h, c, rotation=rotation)
        want = unpatchify(model.final_layer(h, c), grid, model.config.patch_size, model.out_channels)
        assert torch.equal(model(x, t, LABELS), want)


@pytest.mark.parametrize("causal", [False, True])
def test_equal_per_frame_timesteps_equal_one_timestep_float64(causal):
    model = _model(replace(TINY, causal=causal))
    x, t = _video(3), torch.tensor([250.0, 700.0], dtype=torch.float64)
    with torch.no_grad():  # the same numbers, one projection per frame instead of per sample
        torch.testing.assert_close(model(x, t[:, None].expand(2, 3), LABELS), model(x, t, LABELS), rtol=0, atol=1e-12)


def test_per_frame_timesteps_condition_each_frame_on_its_own():
    model = _model(replace(TINY, causal=False))
    x, t = _video(3), torch.tensor([[100.0, 500.0, 900.0], [300.0, 300.0, 300.0]], dtype=torch.float64)
    with torch.no_grad():
        out = model(x, t, LABELS)
        moved = model(x, t.clone().index_fill_(1, torch.tensor([2]), 10.0), LABELS)
    # bidirectional: every frame sees frame 2's tokens, but only frame 2's modulation changed
    assert (out - moved)[:, :, 2].abs().amax() > 10 * (out - moved)[:, :, :2].abs().amax() > 0


def test_frame_causal_mask_is_block_lower_triangular():
    frames = token_frames(3, 2)
    assert frames.tolist() == [0, 0, 1, 1, 2, 2]
    want = torch.tensor([[j // 2 <= i // 2 for j in range(6)] for i in range(6)])
    assert torch.equal(frame_causal_mask(frames, frames), want)


@pytest.mark.parametrize("causal", [False, True])
def test_causal_model_ignores_later_frames(causal):
    model = _model(replace(TINY, causal=causal))
    x, t = _video(4), torch.tensor([[0.0, 0.0, 400.0, 800.0]] * 2, dtype=torch.float64)
    later = x.clone()
    later[:, :, 3] += 1.0  # only the last frame changes
    with torch.no_grad():
        diff = (model(x, t, LABELS) - model(later, t, LABELS))[:, :, :3].abs().amax()
    assert (diff == 0) if causal else (diff > 1e-3)


def test_streaming_forward_equals_the_full_causal_forward_float64():
    """Window holding every frame: frames written one by one (clean, t = 0) and the last read at its own t equal
    the model's causal forward over all of them with those per-frame timesteps."""
    model, x = _model(), _video(4)
    t_last = torch.tensor([300.0, 800.0], dtype=torch.float64)
    t = torch.cat([torch.zeros(2, 3, dtype=torch.float64), t_last[:, None]], dim=1)  # [B, 4]
    caches = frame_caches(model, 2, FRAME, 4)
    with torch.no_grad():
        full = model(x, t, LABELS)
        for f in range(3):  # the context frames' clean passes write them
            out = forward_frames(model, x[:, :, f : f + 1], 0.0, LABELS, caches=caches, cache_write=True)
            torch.testing.assert_close(out, full[:, :, f : f + 1], rtol=0, atol=1e-10)
        state = [(c.k.clone(), c.v.clone(), c.filled.clone(), c.length) for c in caches]
        for _ in range(2):  # a denoising step reads, writes nothing: twice gives the same
            out = forward_frames(model, x[:, :, 3:], t_last, LABELS, caches=caches, cache_write=False)
            torch.testing.assert_close(out, full[:, :, 3:], rtol=0, atol=1e-10)
        for c, (k, v, filled, length) in zip(caches, state):
            assert torch.equal(c.k, k) and torch.equal(c.v, v) and torch.equal(c.filled, filled) and c.length == length
        # a chunk of two frames, frame-causal within it, after two cached ones
        two = frame_caches(model, 2, FRAME, 4)
        forward_frames(model, x[:, :, :2], 0.0, LABELS, caches=two, cache_write=True)
        out = forward_frames(model, x[:, :, 2:], t[:, 2:], LABELS, caches=two, cache_write=False)
        torch.testing.assert_close(out, full[:, :, 2:], rtol=0, atol=1e-10)


def test_rolling_frame_cache_equals_the_forward_over_the_kept_frames_float64():
    """One block: its cached keys and values depend on the frame alone, so with a rolling window of 3 frames the
    streaming forward of frame f equals the causal forward over frames f - 2 .. f at positions 0, 1, 2."""
    model, x = _model(replace(TINY, depth=1)), _video(6)
    caches = frame_caches(model, 2, FRAME, 3)
    t_new = torch.tensor([300.0, 800.0], dtype=torch.float64)
    with torch.no_grad():
        for f in range(6):
            for cache in caches:  # a read never rolls: the roll comes first, as sample_streaming makes it
                cache.make_room(FRAME, model.rope)
            read = forward_frames(model, x[:, :, f : f + 1], t_new, LABELS, caches=caches, cache_write=False)
            kept = x[:, :, max(0, f - 2) : f + 1]
            t = torch.zeros(2, kept.shape[2], dtype=torch.float64)
            t[:, -1] = t_new
            torch.testing.assert_close(read, model(kept, t, LABELS)[:, :, -1:], rtol=0, atol=1e-10)
            forward_frames(model, x[:, :, f : f + 1], 0.0, LABELS, caches=caches, cache_write=True)
            assert caches[0].length == min(f + 1, 3) * FRAME  # positions stay within the window


def test_attention_reads_the_cache_without_writing_float64():
    """``cache_write=False``: the queries see the cached slots and the new tokens, and the cache is untouched;
    through a rolling frame cache this equals attention over the kept frames at re-indexed positions."""
    torch.manual_seed(0)
    rope = ar.AxialRoPE((4, 6, 6))
    attn = Attention(32, 2, rope, qk_norm="rms").double().eval()
    yx = ar.grid(2, 2, dtype=torch.float64)
    pos = lambda t: torch.cat([t.double().repeat_interleave(FRAME)[:, None], yx.repeat(len(t), 1)], 1)  # noqa: E731
    frames = torch.randn(1, 5 * FRAME, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cache = ar.KVCache(1, 3 * FRAME, 2, 16, window=3 * FRAME, frame=FRAME, dtype=torch.float64)
    with torch.no_grad():
        for f in range(5):
            new = frames[:, f * FRAME : (f + 1) * FRAME]
            slots = cache.advance(FRAME, rope)  # rolls first: the kept frames and the new one fit the window
            before = (cache.k.clone(), cache.v.clone(), cache.filled.clone(), cache.length)
            read = attn(new, pos(slots[::FRAME] // FRAME), cache=cache, input_pos=slots, cache_write=False)
            after = (cache.k, cache.v, cache.filled, cache.length)
            assert all(torch.equal(a, b) for a, b in zip(before[:3], after[:3])) and before[3] == after[3]
            kept = torch.arange(max(0, f - 2), f + 1)
            tokens = torch.cat([frames[:, i * FRAME : (i + 1) * FRAME] for i in kept.tolist()], dim=1)
            want = attn(tokens, pos(torch.arange(len(kept))))[:, -FRAME:]
            torch.testing.assert_close(read, want, rtol=0, atol=1e-12)
            wrote = attn(new, pos(slots[::FRAME] // FRAME), cache=cache, input_pos=slots)
            torch.testing.assert_close(wrote, read, rtol=0, atol=1e-12)


def test_a_read_never_rolls_and_reads_what_the_write_after_make_room_sees_float64():
    """``cache_write=False`` leaves a full cache as it was (no roll, no slot reserved) and says how to make room;
    after ``make_room`` (what sample_streaming calls before a chunk's steps) the read attends to exactly what the
    chunk's write pass then attends to: the same output at the same timestep."""
    model, x = _model(replace(TINY, depth=1)), _video(3)
    caches = frame_caches(model, 2, FRAME, 2)
    t = torch.tensor([300.0, 800.0], dtype=torch.float64)
    with torch.no_grad():
        for f in range(2):
            forward_frames(model, x[:, :, f : f + 1], 0.0, LABELS, caches=caches, cache_write=True)
        state = [(c.k.clone(), c.v.clone(), c.filled.clone(), c.length) for c in caches]
        with pytest.raises(
            ValueError, match=r"do not fit beside the 2 cached .* call cache.make_room\(4, model.rope\)"
        ):
            forward_frames(model, x[:, :, 2:], t, LABELS, caches=caches, cache_write=False)
        for c, (k, v, filled, length) in zip(caches, state):
            assert torch.equal(c.k, k) and torch.equal(c.v, v) and torch.equal(c.filled, filled) and c.length == length
        for cache in caches:
            cache.make_room(FRAME, model.rope)
        assert caches[0].length == FRAME  # the oldest frame dropped, nothing reserved
        read = forward_frames(model, x[:, :, 2:], t, LABELS, caches=caches, cache_write=False)
        assert caches[0].length == FRAME
        wrote = forward_frames(model, x[:, :, 2:], t, LABELS, caches=caches, cache_write=True)
        assert caches[0].length == 2 * FRAME
    torch.testing.assert_close(read, wrote, rtol=0, atol=1e-12)


def test_streaming_sampler_generates_past_the_window_within_its_positions():
    model, noise = _model(), _video(5)
    out = sample_streaming(model, noise, LABELS, window=2, steps=2, cfg_scale=2.0)
    assert out.shape == noise.shape and torch.equal(out, sample_streaming(model, noise, LABELS, window=2, steps=2,
                                                                          cfg_scale=2.0))  # fmt: skip
    assert out.abs().max() <= 1
    # the first frame has no context: the plain guided Euler sampler's one-frame video
    first = sample_videos(model, LABELS, noise[:, :, :1], 2.0, 2, None)
    torch.testing.assert_close(out[:, :, :1], first, rtol=0, atol=1e-10)
    # chunks of two frames over a window of four: the full causal sampler of the same four frames
    two = sample_streaming(model, noise[:, :, :2], LABELS, window=4, steps=2, cfg_scale=2.0, chunk=2)
    torch.testing.assert_close(two, sample_videos(model, LABELS, noise[:, :, :2], 2.0, 2, None), rtol=0, atol=1e-10)


def test_bad_streaming_and_causal_inputs_name_the_argument():
    model = _model()
    with pytest.raises(ValueError, match=r"got shape \(2, 2\); one per latent frame: \[B, T\] = \[2, 3\]"):
        model(_video(3), torch.zeros(2, 2, dtype=torch.float64), LABELS)
    from axial_rope.parallel import ContextParallel

    for m, t in ((model, torch.zeros(2)), (_model(replace(TINY, causal=False)), torch.zeros(2, 3))):
        with pytest.raises(ValueError, match="context_parallel takes neither a causal config"):
            m(_video(3), t.double(), LABELS, context_parallel=ContextParallel())
    with pytest.raises(ValueError, match="forward_packed is bidirectional"):
        model.forward_packed([_video(2)[0]], torch.zeros(1), LABELS[:1])
    with pytest.raises(ValueError, match="frame-causal model"):
        forward_frames(_model(replace(TINY, causal=False)), _video(1), 0.0, LABELS, caches=[], cache_write=True)
    with pytest.raises(ValueError, match="one KVCache per block"):
        forward_frames(model, _video(1), 0.0, LABELS, caches=[], cache_write=True)
    with pytest.raises(ValueError, match="window must be a positive int"):
        frame_caches(model, 2, FRAME, 0)
    with pytest.raises(ValueError, match="tokens_per_frame must be a positive int .*got 0"):
        frame_caches(model, 2, 0, 2)
    with pytest.raises(ValueError, match="chunk must be an int"):
        sample_streaming(model, _video(2), LABELS, window=2, chunk=3)
    with pytest.raises(ValueError, match=r"window must be a positive int \(latent frames kept\), got 0"):
        sample_streaming(model, _video(2), LABELS, window=0)
    with pytest.raises(ValueError, match=r"noise must be \[B, C, T, H, W\] with T >= 1 frames, got \(2, 3, 0, 4, 4\)"):
        sample_streaming(model, _video(2)[:, :, :0], LABELS, window=2)
    with pytest.raises(ValueError, match="per-frame t must be"):
        noisy(_video(3), torch.zeros(2, 2), _video(3))
    with pytest.raises(ValueError, match="causal must be False for model 'dit'"):
        TrainConfig(model="dit", causal=True)
    with pytest.raises(ValueError, match="causal must be False .* context_parallel 2"):
        TrainConfig(model="video_dit", causal=True, context_parallel=2)


def test_train_flag_causal_sets_the_run_and_the_task():
    from models.training.run_checks import check_run
    from scripts.train import parse_args

    cfg = parse_args(["--model", "video_dit", "--causal", "--out", "runs/never_written"])
    assert cfg.causal and check_run(cfg).config.causal
    assert not parse_args(["--model", "video_dit", "--out", "runs/never_written"]).causal


def test_diffusion_forcing_loss_draws_one_noise_level_per_frame():
    task = VideoTask("tiny", 4, 3, seed=0, causal=True)
    model = task.build()
    assert model.config.causal
    seen = {}

    class Spy(torch.nn.Module):  # the model, recording what the loss feeds it
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, t, y=None, **kw):
            seen["x"], seen["t"] = x, t
            return self.model(x, t, y, **kw)

    spy = Spy()

    loss = task.loss(spy, step=5, batch_size=2)
    t = seen["t"] / 1000
    assert t.shape == (2, 3) and len(set(t.flatten().tolist())) == 6  # independent levels
    x0, _ = task.inputs(range(10, 12))
    noise = torch.randn(2, *task.shape(), generator=step_generator(0, 5, "noise"))
    for f in range(3):  # each frame at its own level: (1 - t) x0 + t eps
        want = (1 - t[:, f, None, None, None]) * x0[:, :, f] + t[:, f, None, None, None] * noise[:, :, f]
        torch.testing.assert_close(seen["x"][:, :, f], want, rtol=0, atol=1e-6)  # float32, two roundings
    assert torch.isfinite(loss)
    VideoTask("tiny", 4, 3, seed=0).loss(spy, step=5, batch_size=2)  # bidirectional: one level per clip
    assert seen["t"].shape == (2,)


def test_causal_per_frame_forward_compiles_two_graphs_over_four_frame_counts():
    from torch._dynamo.testing import CompileCounter

    model, counter = _model(dtype=torch.float32), CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for frames in (3, 5, 6, 7):
            x, t = _video(frames).float(), torch.rand(2, frames, generator=torch.Generator().manual_seed(frames)) * 1000
            # the same graph of ops as eager, so the same float32 roundings
            torch.testing.assert_close(compiled(x, t, LABELS), model(x, t, LABELS), rtol=0, atol=0)
    # as the bidirectional model (test_compile_models): the first call specialises, the recompile is dynamic
    assert counter.frame_count == 2


def test_causal_run_trains_saves_and_reloads_causal(tmp_path):
    import json

    from models.training.trainer import load_trained, train

    out = tmp_path / "causal"
    cfg = TrainConfig(model="video_dit", steps=2, batch_size=2, resolution=8, frames=3, causal=True, out=str(out),
                      progress=False, val_every=2, ckpt_every=2)  # fmt: skip
    train(cfg)
    assert json.loads((out / "config.json").read_text())["causal"] is True
    task, model = load_trained(out)
    assert task.config.causal and model.config.causal
