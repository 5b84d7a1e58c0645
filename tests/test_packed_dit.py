"""The image DiT on packed batches of mixed sizes: equal to each image alone; the --packed trainer and benchmark.

Packed against alone is an equality, checked in float64 (``TOL``): the two differ in which tokens
each attention sum runs over (masked ones add exact zeros) and in summation order. Each output is
a chain of fewer than 1e4 float64 roundings (u = 1.1e-16), amplified less than 1e2 by the norms and
softmaxes of two blocks: below 1e-10 of the outputs' scale (1 to 10), and gradients (sums over the
~250 tokens) below 1e-10 of theirs. One float32 step remains with YaRN: items of different sizes get
different attention factors, and ``PackedRoPE`` rotates by float32 tables then (float64 inputs
too), a relative perturbation of q and k within ``u m (|a| + |b|) = 1.6e-7`` (float32's u = 6e-8,
m < 1.1); amplified less than 1e2 that is ``TOL_YARN = 2e-5`` of the scale, and 1e-4 with the
gradients' sums. A token attending across images is off by O(1).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from models.dit import PRESETS, DiT
from models.training.config import TrainConfig
from models.training.packed_data import MixedSizes, pick
from models.training.tasks import ImageTask, PackedImageTask

SIZES = [(16, 24), (32, 32), (48, 16), (8, 40)]  # pixels; the tiny DiT trains at 32 (8 x 8 tokens)
TOL, TOL_YARN = 1e-10, 2e-5  # float64 error bounds (module docstring)


def _model(**overrides) -> DiT:
    torch.manual_seed(0)
    model = DiT(replace(PRESETS["tiny"], depth=2, **overrides))
    with torch.no_grad():  # away from adaLN-Zero's zeros, so every branch counts
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval().double()


def _batch():
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, h, w, generator=gen, dtype=torch.float64) for h, w in SIZES]
    return xs, torch.tensor([100.0, 400.0, 700.0, 900.0], dtype=torch.float64), torch.tensor([0, 1, 2, 3])


@pytest.mark.parametrize("pos_mode", ["none", "yarn", "interpolate"])
def test_packed_forward_equals_each_image_alone(pos_mode):
    model = _model()
    xs, t, y = _batch()
    packed = model(xs, t, y, pos_mode=pos_mode)  # a list goes to forward_packed
    for i, (x, out) in enumerate(zip(xs, packed)):
        alone = model(x[None], t[i : i + 1], y[i : i + 1], pos_mode=pos_mode)[0]
        tol = TOL_YARN if pos_mode == "yarn" else TOL
        torch.testing.assert_close(out, alone, atol=tol, rtol=tol)


def test_packed_gradients_equal_the_per_image_sum():
    model = _model(qk_norm="rms")
    xs, t, y = _batch()
    params = list(model.parameters())
    packed = torch.autograd.grad(sum(o.square().sum() for o in model(xs, t, y, pos_mode="yarn")), params)
    alone = sum(model(x[None], t[i : i + 1], y[i : i + 1], pos_mode="yarn").square().sum() for i, x in enumerate(xs))
    for a, b in zip(packed, torch.autograd.grad(alone, params)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # YaRN: 1e-4 (module docstring)


def test_guidance_on_a_packed_batch_equals_each_image_alone():
    model = _model()
    xs, t, y = _batch()
    guided = model.forward_packed_with_cfg(xs, t, y, 3.0)
    for i, (x, out) in enumerate(zip(xs, guided)):
        torch.testing.assert_close(
            out, model.forward_with_cfg(x[None], t[i : i + 1], y[i : i + 1], 3.0)[0], atol=TOL, rtol=TOL
        )


def test_bad_packed_inputs_name_the_image():
    model = _model()
    with pytest.raises(ValueError, match="item 1: sides 30 x 32 must be divisible by the patch size 4"):
        model.forward_packed(
            [torch.randn(3, 8, 8), torch.randn(3, 30, 32)], torch.zeros(2), torch.zeros(2, dtype=torch.long)
        )
    with pytest.raises(ValueError, match="at least one image"):
        model.forward_packed([], torch.zeros(0), torch.zeros(0, dtype=torch.long))


def test_packed_task_fills_the_token_budget_with_mixed_sizes():
    sizes = MixedSizes(16, 48, 3.0, 4, seed=0)
    drawn = sizes.sizes(range(500))
    assert all(16 <= s <= 48 and s % 4 == 0 for hw in drawn for s in hw)
    assert all(max(hw) <= 3 * min(hw) for hw in drawn) and len(set(drawn)) > 30
    indices, chosen, waste = pick(sizes, 0, 256, 32 * 64, 4)
    assert sum((h // 4) * (w // 4) for h, w in chosen) <= 32 * 64 and waste < 0.01
    task = ImageTask.from_run({"preset": "tiny", "resolution": 32, "seed": 0, "packed": True})
    assert isinstance(task, PackedImageTask)
    model = task.build()
    a, b = task.loss(model, 3, 8), task.loss(model, 3, 8)
    assert torch.isfinite(a) and torch.equal(a, b)  # a pure function of seed and step (label dropout aside: eval)
    images, labels, _ = task.images(3, 8)
    assert len(images) == len(labels) and len({tuple(x.shape) for x in images}) > 1


def test_sampling_a_mix_of_sizes_in_one_batch():
    task = PackedImageTask("tiny", 32, 0)
    out = task.sample_sizes(task.build().eval(), [(16, 48), (32, 32)], [0, 1], steps=2)
    assert [tuple(x.shape) for x in out] == [(3, 16, 48), (3, 32, 32)] and all(x.abs().max() <= 1 for x in out)


def test_packed_is_a_checked_run_setting():
    from scripts.train import parse_args

    assert parse_args(["--packed", "--steps", "1"]).packed
    with pytest.raises(ValueError, match="packed"):
        TrainConfig(model="gpt", packed=True)


def test_packed_training_runs_end_to_end(tmp_path):
    from models.training.trainer import train

    cfg = TrainConfig(packed=True, steps=1, batch_size=2, out=str(tmp_path / "run"), report=False, progress=False)
    assert train(cfg)["step"] == 1


def test_the_benchmark_strategies_compute_the_same_function():
    from scripts.bench_packed import check_equal, draw_batch, main

    result = main(["--images", "6", "--repeat", "1", "--no-attention"])
    rows = {r["strategy"]: r for r in result["rows"]}
    assert rows["packed"]["padding"] == 0 and rows["padded"]["padding"] > rows["bucketed"]["padding"] > 0
    # the strategies' agreement (the benchmark's float32 max_difference) is an equality: checked in float64
    # on the benchmark's model and batch, to TOL (module docstring)
    torch.manual_seed(0)
    model = DiT(replace(PRESETS["tiny"], in_channels=3, learn_sigma=False))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    xs, targets, t, y = draw_batch(6, 0, model.config.patch_size)
    batch = ([x.double() for x in xs], targets, t.double(), y)
    assert result["max_difference"] >= 0 and check_equal(model.double(), batch, 16) < TOL


# ---- the video DiT: videos of different lengths and sizes in one sequence


def _video_model(**overrides):
    from models.video_dit import PRESETS as VIDEO_PRESETS
    from models.video_dit import VideoDiT

    torch.manual_seed(0)
    model = VideoDiT(replace(VIDEO_PRESETS["tiny"], depth=2, **overrides))
    with torch.no_grad():  # away from adaLN-Zero's zeros
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval().double()


VIDEO_SIZES = [(4, 8, 12), (2, 16, 8), (6, 8, 8)]  # frames, height, width (tiny: patch (1, 2, 2))


def _video_batch():
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, *size, generator=gen, dtype=torch.float64) for size in VIDEO_SIZES]
    return xs, torch.tensor([100.0, 500.0, 900.0], dtype=torch.float64), torch.tensor([0, 2, 3])


@pytest.mark.parametrize(
    "scaling", [None, "ntk", "dynamic"], ids=["trained", "fixed NTK on t", "length-dependent on t"]
)
def test_packed_videos_equal_each_video_alone(scaling):
    import axial_rope as ar

    method = {None: None, "ntk": ar.scaling.NTK(2.0), "dynamic": ar.scaling.DynamicNTK(2.0, 3)}[scaling]
    model = _video_model()
    xs, t, y = _video_batch()
    packed = model(xs, t, y, temporal_scaling=method)  # a list goes to forward_packed
    assert [tuple(o.shape) for o in packed] == [(3, *s) for s in VIDEO_SIZES]
    for i, (x, out) in enumerate(zip(xs, packed)):
        alone = model(x[None], t[i : i + 1], y[i : i + 1], temporal_scaling=method)[0]
        torch.testing.assert_close(out, alone, atol=TOL, rtol=TOL)


def test_packed_video_gradients_equal_the_per_video_sum():
    model = _video_model(qk_norm="rms")
    xs, t, y = _video_batch()
    params = list(model.parameters())
    packed = torch.autograd.grad(sum(o.square().sum() for o in model.forward_packed(xs, t, y)), params)
    alone = sum(model(x[None], t[i : i + 1], y[i : i + 1]).square().sum() for i, x in enumerate(xs))
    for a, b in zip(packed, torch.autograd.grad(alone, params)):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


def test_packed_videos_refuse_bad_input_by_item():
    from axial_rope.time_scaling import DyPE

    model = _video_model()
    xs, t, y = _video_batch()
    with pytest.raises(ValueError, match="item 1: sides 2 x 15 x 8 must be divisible"):
        model.forward_packed([xs[0], torch.randn(3, 2, 15, 8)], t[:2], y[:2])
    with pytest.raises(ValueError, match=r"item 0: a latent must be \[C, T, H, W\]"):
        model.forward_packed([torch.randn(3, 8, 8)], t[:1], y[:1])
    with pytest.raises(ValueError, match="y must hold one row per video"):
        model.forward_packed(xs, t, y[:2])
    with pytest.raises(ValueError, match="time-dependent"):
        model.forward_packed(xs, t, y, temporal_scaling=DyPE(2.0, 4))
    with pytest.raises(ValueError, match="at least one video"):
        model.forward_packed([], t, y)
