"""LTX-Video sized by position modes: its per-head frequencies take no scaling method, but ``mode`` moves positions.

The reference is the stock model given float64 ``video_coords`` (the coordinates before the division by the base
grid), for which upstream computes float64 angles (``tests/test_conventions_ltx.py``): at the training grid the sized
model turns by the pipeline's own coordinates (``num_frames``, ``height``, ``width`` times ``rope_interpolation_scale``),
at twice it by those coordinates halved (``"interpolate"``). Both sides are float64 models through the same
processors' arithmetic on tables that agree to float64 rounding: ``TOL`` of ``tests/test_conventions_integration.py``
holds with room to spare. A wrong position (an axis not halved, the patch or the frame rate dropped) moves the
output by far more (checked: the unsized stock output at twice the grid).
"""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope import conventions as conv

diffusers = pytest.importorskip("diffusers")

from helpers import one_torch_thread  # noqa: E402
from test_conventions_integration import TOL, _ltx  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402

_one_thread = one_torch_thread()
TRAIN = (3, 4, 5)  # _ltx's token grid (t, y, x)


def _model():
    model, _ = _ltx()
    return model.double()


def _inputs(t: int, h: int, w: int) -> dict:
    g = torch.Generator().manual_seed(100 * t + 10 * h + w)
    return dict(
        hidden_states=torch.randn(2, t * h * w, 4, generator=g, dtype=torch.float64),
        encoder_hidden_states=torch.randn(2, 6, 8, generator=g, dtype=torch.float64),
        timestep=torch.rand(2, generator=g, dtype=torch.float64) * 1000,
        encoder_attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), num_frames=t, height=h, width=w,
        rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False,
    )  # fmt: skip


def _coords(t: int, h: int, w: int, scale: float = 1.0) -> torch.Tensor:
    """float64 ``video_coords`` ``[B, 3, N]``: the pipeline's coordinates (frame rate 25, VAE 8 x 32), times ``scale``."""
    pos = conv.ltx_video_positions(t, h, w, frame_rate=25.0) * scale  # [N, 3]
    return pos.T[None].expand(2, 3, -1)


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


def test_sized_at_the_training_grid_turns_by_the_pipelines_coordinates():
    model, inputs = _model(), _inputs(*TRAIN)
    stock = _run(model, dict(inputs, video_coords=_coords(*TRAIN)))  # float64 angles
    handle = set_rope_processors(model, mode="interpolate", train_size=TRAIN)
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)
    torch.testing.assert_close(_run(model, dict(inputs, video_coords=_coords(*TRAIN))), stock, atol=TOL, rtol=TOL)
    handle.remove()
    assert torch.equal(_run(model, dict(inputs, video_coords=_coords(*TRAIN))), stock)


def test_sized_at_twice_the_grid_interpolates_the_coordinates():
    model, inputs = _model(), _inputs(6, 8, 10)
    stock = _run(model, inputs)
    halved = _run(model, dict(inputs, video_coords=_coords(6, 8, 10, 0.5)))
    time_kept = _run(model, dict(inputs, video_coords=_coords(6, 8, 10) * torch.tensor([1.0, 0.5, 0.5])[:, None]))
    assert (halved - stock).abs().max() > 1e-3 and (time_kept - halved).abs().max() > 1e-3
    set_rope_processors(model, mode="interpolate", train_size=TRAIN)
    torch.testing.assert_close(_run(model, inputs), halved, atol=TOL, rtol=TOL)
    set_rope_processors(model, mode=("none", "interpolate", "interpolate"), train_size=TRAIN)  # time kept
    torch.testing.assert_close(_run(model, inputs), time_kept, atol=TOL, rtol=TOL)


def test_the_scaling_methods_and_normalize_are_refused_and_a_sized_forward_needs_its_grid():
    model, inputs = _model(), _inputs(*TRAIN)
    with pytest.raises(ValueError, match=r"no per-axis spectrum.*mode='interpolate' \(or 'none'\)"):
        set_rope_processors(model, scaling=ar.scaling.Linear(2.0))
    with pytest.raises(ValueError, match="ltx_video refuses mode 'normalize'"):
        set_rope_processors(model, mode="normalize", train_size=TRAIN)
    set_rope_processors(model, mode="interpolate", train_size=TRAIN)
    only_coords = dict(inputs, num_frames=None, height=None, width=None, video_coords=_coords(*TRAIN))
    with pytest.raises(ValueError, match="reads its token grid from the forward's num_frames, height and width"):
        _run(model, only_coords)


def test_sized_model_compiles_whole():
    model, inputs = _model(), _inputs(6, 8, 10)
    set_rope_processors(model, mode="interpolate", train_size=TRAIN)
    eager = _run(model, inputs)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs)[0], eager, atol=1e-12, rtol=1e-12)  # the same float64 ops
