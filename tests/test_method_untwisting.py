"""Untwisting RoPE (arXiv 2602.05013) against its formula, transcribed here in float64.

The project page (untwisting-rope.github.io, "Frequency-Aware Modulation"): plane ``d`` of the reference keys is
scaled by ``s_d = s_hf + (s_lf - s_hf) (d / (D/2 - 1)) ** beta``, and "Timestep Scheduling": both scales rise
linearly over the denoising steps. The queries and the other keys are untouched; the angles stay RoPE's.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close
from rotation_oracle import planes

import axial_rope as ar
from axial_rope import ops
from axial_rope.methods import Untwisting, frequency_bands

HF, LF, BETA = (0.25, 0.75), (1.0, 1.4), 2.0


def _seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _page_scale(n: int, t: float) -> torch.Tensor:
    """The page's ``s_d`` for ``n`` planes ordered from the highest frequency, at noise level ``t``."""
    progress = 1.0 - t  # 0 at the first step, 1 at the last
    s_hf = HF[0] + (HF[1] - HF[0]) * progress
    s_lf = LF[0] + (LF[1] - LF[0]) * progress
    d = torch.arange(n, dtype=torch.float64) / (n - 1)
    return s_hf + (s_lf - s_hf) * d**BETA


@pytest.mark.parametrize("t", [1.0, 0.6, 0.0])
def test_scale_is_the_project_pages_formula_on_one_axis(t):
    rope = ar.AxialRoPE(16, theta=100.0)
    bands = frequency_bands(rope.freqs)
    got = Untwisting(HF, LF, BETA).scale(bands, torch.tensor(t, dtype=torch.float64))
    assert_close(got, _page_scale(8, t))
    assert got[0] < got[-1]  # the highest frequency damped most


def test_bands_count_within_each_modulated_axis_and_leave_the_others_alone():
    rope = ar.AxialRoPE((4, 6, 6), theta=(100.0, 50.0, 50.0))  # Flux-like (t, y, x) sections of 2, 3, 3 planes
    bands = frequency_bands(rope.freqs, axes=(1, 2))
    scale = Untwisting(HF, LF, BETA).scale(bands, torch.tensor(0.5, dtype=torch.float64))
    assert torch.equal(scale[:2], torch.ones(2, dtype=torch.float64))  # axis 0 untouched
    assert_close(scale[2:5], _page_scale(3, 0.5))
    assert_close(scale[5:8], _page_scale(3, 0.5))
    # planes in another order are ranked by their frequency, not their index
    shuffled = rope.freqs[:, [7, 6, 5, 4, 3, 2, 1, 0]]
    assert torch.equal(frequency_bands(shuffled, axes=(1, 2)), bands.flip(0))


def test_only_the_reference_keys_are_scaled_and_the_angles_stay_ropes():
    rope = ar.AxialRoPE((4, 6), theta=100.0, pairing="half")
    pos = ar.grid(2, 3).repeat(2, 1)  # a target image and a reference image on the same grid
    reference = torch.tensor([[False] * 6 + [True] * 6])
    r = rope.rotation(pos)
    bands = frequency_bands(r.freqs)
    t = torch.tensor(0.3, dtype=torch.float64)
    pair = Untwisting(HF, LF, BETA).rotation(r, reference, bands, t)
    q, k = _seeded(1, 12, 2, 12, seed=1), _seeded(1, 12, 2, 12, seed=2)
    got_q, got_k = ops.rotate(q, k, pair, "bshd", "torch")
    # independent transcription: z * exp(i pos @ F), reference key planes times s_d (per axis, from the highest)
    angle = pos.double() @ rope.freqs  # [S, n]
    s = torch.cat([_page_scale(2, 0.3), _page_scale(3, 0.3)])
    amp = torch.where(reference[0, :, None], s, torch.ones_like(s))  # [S, n]
    want_q = planes(q, 5, "half") * torch.polar(torch.ones_like(angle), angle)[None, :, None]
    want_k = planes(k, 5, "half") * torch.polar(amp, angle)[None, :, None]
    assert_close(torch.view_as_real(planes(got_q, 5, "half")), torch.view_as_real(want_q))
    assert_close(torch.view_as_real(planes(got_k, 5, "half")), torch.view_as_real(want_k))
    assert torch.equal(got_q[..., 10:], q[..., 10:]) and torch.equal(got_k[..., 10:], k[..., 10:])


def test_schedule_traces_with_t_as_a_tensor_fullgraph():
    rope = ar.AxialRoPE((4, 6), theta=100.0)
    pos = ar.grid(2, 3).repeat(2, 1)
    reference = torch.tensor([[False] * 6 + [True] * 6])
    bands = frequency_bands(rope.freqs)
    untwist = Untwisting(HF, LF, BETA)

    def step(q, k, t):
        return ops.rotate(q, k, untwist.rotation(rope.rotation(pos), reference, bands, t), "bshd")

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q, k = _seeded(1, 12, 2, 10, seed=3).float(), _seeded(1, 12, 2, 10, seed=4).float()
    for t in (0.9, 0.2):  # one graph serves every step
        t = torch.tensor(t, dtype=torch.float64)
        for got, want in zip(compiled(q, k, t), step(q, k, t)):
            assert_close(got, want)
    assert (compiled(q, k, torch.tensor(0.9))[1] - compiled(q, k, torch.tensor(0.2))[1]).abs().max() > 1e-3


def test_bad_arguments_are_refused_by_name():
    rope = ar.AxialRoPE((4, 6), theta=100.0)
    r = rope.rotation(ar.grid(2, 3))
    bands = frequency_bands(r.freqs)
    with pytest.raises(ValueError, match="reference"):
        Untwisting().rotation(r, torch.ones(1, 5, dtype=torch.bool), bands, 0.5)
    with pytest.raises(ValueError, match="reference"):
        Untwisting().rotation(r, torch.ones(1, 6), bands, 0.5)  # not bool
    with pytest.raises(ValueError, match="pass t"):
        Untwisting().rotation(r, torch.ones(1, 6, dtype=torch.bool), bands)
    with pytest.raises(ValueError, match="bands"):
        Untwisting().rotation(r, torch.ones(1, 6, dtype=torch.bool), bands[:3], 0.5)
    with pytest.raises(ValueError, match="freqs"):
        frequency_bands(r.freqs[None].expand(2, -1, -1))  # per-head F
    with pytest.raises(ValueError, match="axes"):
        frequency_bands(r.freqs, axes=(2,))
    with pytest.raises(ValueError, match="beta"):
        Untwisting(beta=0.0)
    with pytest.raises(ValueError, match="high"):
        Untwisting(high=(-0.1, 0.5))
    assert Untwisting(high=0.5, low=1.2).scale(bands).shape == (5,)  # unscheduled: no t needed


def test_position_methods_page_examples_run():
    """docs/position-methods.md's code blocks run as written, in one namespace as a reader's session would."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "position-methods.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 6
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/position-methods.md:example", "exec"), namespace)
    assert namespace["pair"].key.freqs.shape == (1, 8) and namespace["video_rope"].freqs.shape == (2, 3, 8)
