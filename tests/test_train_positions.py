"""An image DiT fine-tuned at another size under a position mode (``TrainConfig.pos_mode``, ``base_resolution``).

The resolution study's fine-tuned arms train at 2x with interpolated or YaRN positions relative to
their base model's size; the run must train, save and reload in that mode.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import torch

from models.studies.jobs import ensure_trained
from models.training.tasks import ImageTask
from models.training.trainer import TrainConfig, load_trained


def _base(tmp_path) -> TrainConfig:
    return TrainConfig(
        steps=2, batch_size=2, resolution=16, out=str(tmp_path / "base"), progress=False, report=False, log_every=1
    )


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"pos_mode": "bogus"}, "pos_mode"),
        ({"model": "gpt", "pos_mode": "interpolate"}, "pos_mode"),
        ({"model": "video_dit", "base_resolution": 16}, "base_resolution"),
        ({"packed": True, "pos_mode": "yarn"}, "pos_mode"),
        ({"base_resolution": -1}, "base_resolution"),
    ],
)
def test_bad_position_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**changes)


def test_older_runs_without_the_fields_build_the_plain_model():
    run = {"preset": "tiny", "resolution": 16, "seed": 0}  # a config.json written before the fields existed
    task = ImageTask.from_run(run)
    assert task.config.input_size == 16 and task.config.pos_mode == "none"


def test_a_finetune_under_interpolation_trains_and_reloads_in_that_mode(tmp_path):
    torch.manual_seed(0)
    base = _base(tmp_path)
    assert ensure_trained(base) == "trained"
    tuned = replace(base, resolution=32, base_resolution=16, pos_mode="interpolate", out=str(tmp_path / "ft"))
    assert ensure_trained(tuned, start_from=base.out) == "trained"
    task, model = load_trained(tuned.out)
    assert (task.resolution, model.config.input_size, model.config.pos_mode) == (32, 16, "interpolate")
    assert ImageTask.from_run(asdict(tuned)).config == model.config
    # 8 tokens per side placed into the 4 of training: coordinate i / 2 on each axis, no frequency scaling
    pos, scaling = model.positions(8, 8)
    grid = torch.arange(8, dtype=pos.dtype) / 2
    assert torch.equal(pos, torch.cartesian_prod(grid, grid)) and scaling == (None, None)
    # the forward without pos_mode is the one under interpolation, not the plain one
    x, t, y = torch.randn(2, 3, 32, 32), torch.full((2,), 500.0), torch.tensor([0, 1])
    with torch.no_grad():
        own, interpolated, plain = (model(x, t, y, pos_mode=m) for m in (None, "interpolate", "none"))
    assert torch.equal(own, interpolated) and not torch.equal(own, plain)
