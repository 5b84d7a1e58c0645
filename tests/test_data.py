"""Generated training data: deterministic per seed, resolution-independent, correctly split."""

from __future__ import annotations

import math

import pytest
import torch

from models.training.data import CLASSES, MovingShapes, Shapes, StdlibText


def test_shapes_are_deterministic_per_seed_and_index():
    a, la = Shapes(seed=3).batch(range(8), 16)
    b, lb = Shapes(seed=3).batch(range(8), 16)
    assert torch.equal(a, b) and torch.equal(la, lb)
    c, _ = Shapes(seed=4).batch(range(8), 16)
    assert not torch.equal(a, c)
    # a sample does not depend on the batch it is drawn in
    d, _ = Shapes(seed=3).batch([5, 2], 16)
    assert torch.equal(d[0], a[5]) and torch.equal(d[1], a[2])


def test_shapes_range_labels_and_every_class_appears():
    images, labels = Shapes().batch(range(64), 16)
    assert images.shape == (64, 3, 16, 16) and images.dtype == torch.float32
    assert images.min() >= -1 and images.max() <= 1
    assert set(labels.tolist()) == set(range(len(CLASSES)))


def test_same_scene_at_two_resolutions():
    low, _ = Shapes().batch(range(4), 16)
    high, _ = Shapes().batch(range(4), 64)
    # box-downsampling the 64 px render gives the 16 px render up to anti-aliasing at edges
    pooled = torch.nn.functional.avg_pool2d(high, 4)
    assert (pooled - low).abs().mean() < 0.05


def test_shape_covers_a_sensible_area():
    images, labels = Shapes().batch(range(32), 32)
    foreground = (images > -0.79).any(1).float().mean((1, 2))  # fraction of pixels covered
    assert foreground.min() > 0.03 and foreground.max() < 0.5


def test_still_shapes_are_upright():
    # a square fills its axis-aligned bounding box; rotated by 45 degrees it would fill half of it
    images, labels = Shapes().batch(range(64), 32)
    for mask in (images[labels == 1] > -0.5).any(1):
        rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert mask.sum() / box > 0.85


def test_moving_shapes_move_and_stay_inside():
    video, labels = MovingShapes(seed=1).batch(range(4), 16, frames=12)
    assert video.shape == (4, 12, 3, 16, 16)
    first, _ = Shapes(seed=1, angle_range=2 * math.pi).batch(range(4), 16)
    assert torch.equal(video[:, 0], first)  # frame 0 is the still image (at any angle)
    assert (video[:, 1:] - video[:, :-1]).abs().mean() > 0.005  # things move
    params = MovingShapes(seed=1).params(0, frames=200)
    size = params["size"][0]
    assert (params["center"] >= size - 1e-6).all() and (params["center"] <= 1 - size + 1e-6).all()


@pytest.fixture(scope="module")
def corpus():
    return StdlibText("train"), StdlibText("val")


def test_stdlib_split_is_disjoint_and_fixed(corpus):
    train, val = corpus
    assert len(train) > 1_000_000 and len(val) > 50_000
    assert val.files > 0 and train.files > 20 * val.files
    x, y = train.batch(step=7, batch_size=3, length=16)
    x2, _ = train.batch(step=7, batch_size=3, length=16)
    assert torch.equal(x, x2) and torch.equal(x[:, 1:], y[:, :-1])
    assert x.dtype == torch.int64 and int(x.max()) < 256


def test_stdlib_bad_split():
    with pytest.raises(ValueError, match="split"):
        StdlibText("test")


def test_counter_based_uniform_in_range_and_balanced():
    from models.training.data import uniform

    u = uniform(7, torch.arange(20_000), 4)
    assert u.min() >= 0 and u.max() < 1
    assert torch.equal(u[5:9], uniform(7, torch.arange(5, 9), 4))  # a pure function of (seed, index, field)
    torch.testing.assert_close(u.mean(0), torch.full((4,), 0.5), atol=0.01, rtol=0)
    assert abs(float(torch.corrcoef(u.T)[0, 1])) < 0.03  # fields are not copies of each other
    assert not torch.equal(u, uniform(8, torch.arange(20_000), 4))
