"""The general frequency model: spectra as constructors of F (bit for bit), any plane-to-axis map, per-head F
(fixed or learnable), unrotated planes, the position map, serialisation, and the conventions registry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conventions_support import exact_planes, seeded
from helpers import assert_close

import axial_rope as ar
from axial_rope import conventions as conv
from axial_rope.frequencies import Frequencies, PositionTransform
from axial_rope.scaling import NTK, RIFLEx, YaRN

ROOT = Path(__file__).resolve().parents[1]

SPECTRUM_CASES = [
    ((16, 56, 56), 10000.0, None, "per_axis"),
    ((8, 12), (100.0, 1000.0), (RIFLEx(2, 20), NTK(2.0)), "per_axis"),
    ((32, 48, 48), 1e6, YaRN(4.0, 64), "split"),
    ((48, 40, 40), 5e6, None, "cycled"),
    (64, 10000.0, {"rope_type": "linear", "factor": 2.0}, "per_axis"),
]


@pytest.mark.parametrize(("axes_dim", "theta", "scaling", "spectrum"), SPECTRUM_CASES, ids=str)
def test_spectra_are_constructors_of_the_same_F(axes_dim, theta, scaling, spectrum):
    rope = ar.AxialRoPE(axes_dim, theta, scaling, spectrum=spectrum)
    model = Frequencies.from_spectrum(axes_dim, theta, scaling, spectrum)
    assert rope.frequency_model == model and torch.equal(rope.freqs, model.freqs)
    scale = model.scale if model.scale is not None else torch.ones(model.n_pairs, dtype=torch.float64)
    assert torch.equal(rope.scale, scale)
    assert model.plane_axis == rope.plane_axis and model.axes_dim == rope.axes_dim
    # the same model through from_frequencies rotates identically, on every backend
    custom = ar.AxialRoPE.from_frequencies(model, pairing=rope.pairing)
    pos = ar.grid(*[3, 4, 2][: rope.n_axes]) * 7.0
    x = seeded(2, pos.shape[0], 2, rope.rot_dim + 4)
    for backend in ("reference", "torch"):
        assert torch.equal(custom.rotate(x, pos, backend=backend), rope.rotate(x, pos, backend=backend))


def test_any_plane_to_axis_map_and_unrotated_planes():
    values = torch.tensor([1.0, 0.5, 0.25, 0.125, 0.0625, 0.03])
    model = Frequencies.axial([1, 0, None, 1, 2, None], values, n_axes=3)
    assert model.plane_axis == [1, 0, None, 1, 2, None] and model.axes_dim == (2, 4, 2)
    assert model.unrotated.tolist() == [False, False, True, False, False, True]
    for pairing in ("interleaved", "half"):
        rope = ar.AxialRoPE.from_frequencies(model, pairing=pairing)
        pos = torch.tensor([[3.0, 5.0, 7.0], [1e6, -2.0, 0.5]])
        cos, sin = exact_planes(rope, pos)
        angle = pos.double() @ model.freqs
        assert_close(cos, angle.cos())
        assert_close(sin, angle.sin())
        x = seeded(1, 2, 1, 12, dtype=torch.float64)
        y = rope.rotate(x, pos)
        plane = (lambda j: [2 * j, 2 * j + 1]) if pairing == "interleaved" else (lambda j: [j, j + 6])
        for j in (2, 5):  # unrotated planes pass through bit for bit
            assert torch.equal(y[..., plane(j)], x[..., plane(j)])


def test_partial_rotary_as_a_mask_equals_a_narrower_rotary_width():
    # interleaved planes past r are the same channels either way: masking them equals rot_dim = r
    masked = Frequencies.from_spectrum(32).masked(torch.arange(16) < 6)
    x = seeded(1, 5, 2, 32, dtype=torch.float64)
    pos = torch.arange(5.0) * 11
    wide = ar.AxialRoPE.from_frequencies(masked)
    narrow_F = Frequencies.from_spectrum(32).freqs[:, :6]
    narrow = ar.AxialRoPE.from_frequencies(Frequencies(narrow_F))
    torch.testing.assert_close(wide.rotate(x, pos), narrow.rotate(x, pos), rtol=0, atol=1e-15)


def test_per_head_fixed_frequencies_rotate_each_head_with_its_own_F():
    gen = torch.Generator().manual_seed(0)
    F = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)  # [H, n_axes, n]: mixed, per head
    rope = ar.AxialRoPE.from_frequencies(Frequencies(F))
    assert rope.learned_freqs is None and rope.freqs.shape == (3, 2, 4)
    pos, x = ar.grid(3, 4), seeded(2, 12, 3, 10, dtype=torch.float64)
    for layout in ("bshd", "bhsd"):
        xl = x if layout == "bshd" else x.transpose(1, 2)
        out = rope.rotate(xl, pos, layout=layout, backend="torch")
        assert_close(out, rope.rotate(xl, pos, layout=layout, backend="reference"))
        out = out if layout == "bshd" else out.transpose(1, 2)
        for h in range(3):
            single = ar.AxialRoPE.from_frequencies(Frequencies(F[h]))
            assert_close(out[:, :, h : h + 1], single.rotate(x[:, :, h : h + 1], pos))
    cos, _ = rope.cos_sin(pos)
    assert cos.shape == (12, 3, 8)
    with pytest.raises(ValueError, match="per-head frequencies are for 3 heads"):
        rope.rotate(seeded(1, 12, 2, 8), pos)


def test_mixed_frequencies_keep_scores_relative():
    gen = torch.Generator().manual_seed(1)
    rope = ar.AxialRoPE.from_frequencies(Frequencies(torch.randn(2, 3, 6, generator=gen, dtype=torch.float64)))
    q, k = seeded(1, 5, 2, 12, seed=2, dtype=torch.float64), seeded(1, 5, 2, 12, seed=3, dtype=torch.float64)
    pos = torch.randint(-20, 20, (5, 3)).double()
    scores = lambda p: torch.einsum("bshd,bthd->hst", *rope(q, k, p))  # noqa: E731
    shifted = scores(pos + torch.tensor([1e5, -3.0, 7.5], dtype=torch.float64))
    # float64 angles of ~1e5 rad are exact to ~1e-11 rad: the scores move by less than 1e-9
    torch.testing.assert_close(shifted, scores(pos), rtol=0, atol=1e-9)


def test_learnable_model_per_head_and_dtype_moves():
    model = Frequencies(torch.randn(2, 3, 4, dtype=torch.float64) * 0.1)
    rope = ar.AxialRoPE.from_frequencies(model, learnable=True)
    assert rope.learned_freqs.shape == (2, 3, 4) and rope.learned_freqs.dtype == torch.float32
    out = rope.rotate(seeded(1, 6, 2, 8), ar.grid(1, 2, 3))
    out.square().sum().backward()
    assert rope.learned_freqs.grad.abs().sum() > 0
    fixed = ar.AxialRoPE.from_frequencies(model).to(torch.bfloat16)
    assert fixed.freqs.dtype == torch.float64 and torch.equal(fixed.freqs, model.freqs)
    with pytest.raises(ValueError, match="frequency model"):
        fixed.with_scaling(YaRN(2.0, 16))
    assert fixed.with_scaling(None) is fixed


@pytest.mark.parametrize("normalize", [None, "separate", "max", "min"])
@pytest.mark.parametrize("center", [False, True])
def test_position_map_equals_the_grid_options(normalize, center):
    transform = PositionTransform(scale=(2.0, 0.5), offset=(-1.0, 3.0), center=center, normalize=normalize)
    mapped = transform(ar.grid(5, 3)[None])[0]
    expected = ar.grid(5, 3, normalize=normalize or False, center=center, scale=(2.0, 0.5), offset=(-1.0, 3.0),
                       dtype=torch.float64)  # fmt: skip
    torch.testing.assert_close(mapped, expected, rtol=0, atol=1e-15)
    # through a rope: rotating integer positions with the map equals rotating the mapped positions
    rope = ar.AxialRoPE.from_frequencies(Frequencies.from_spectrum((8, 8), transform=transform))
    plain = ar.AxialRoPE((8, 8))
    x = seeded(1, 15, 1, 16, dtype=torch.float64)
    assert_close(rope.rotate(x, ar.grid(5, 3)), plain.rotate(x, expected))


def test_position_map_keeps_the_position_checks():
    rope = conv.ltx_video(2, 12)
    x = seeded(1, 2, 2, 12)
    with pytest.raises(ValueError, match="NaN or inf"):
        rope.rotate(x, torch.tensor([[0.0, float("nan"), 1.0], [1.0, 2.0, 3.0]]))
    with pytest.raises(TypeError, match="rounds coordinates"):
        rope.rotate(x, torch.zeros(2, 3, dtype=torch.bfloat16))
    assert rope.rotate(x, torch.zeros(2, 3, dtype=torch.int64)).shape == x.shape  # integers pass


def test_serialisation_round_trip():
    for rope in (conv.ltx_video(2, 12), conv.dinov3(16), conv.p_rope(16), ar.AxialRoPE((8, 8), scaling=YaRN(2.0, 16))):
        model = rope.frequency_model
        again = Frequencies.from_dict(json.loads(json.dumps(model.to_dict())))
        assert again == model
        rebuilt = ar.AxialRoPE.from_frequencies(again, pairing=rope.pairing)
        pos = torch.rand(4, rope.n_axes) * 10
        x = seeded(1, 4, model.num_heads or 1, rope.rot_dim)
        assert torch.equal(rebuilt.rotate(x, pos), rope.rotate(x, pos))


def test_frequency_model_errors_name_the_field():
    with pytest.raises(ValueError, match="freqs must have 2 or 3 dims"):
        Frequencies(torch.zeros(4))
    with pytest.raises(ValueError, match="scale has 3 planes"):
        Frequencies(torch.zeros(1, 4), scale=torch.ones(3))
    with pytest.raises(ValueError, match="NaN or inf"):
        Frequencies(torch.tensor([[float("inf")]]))
    with pytest.raises(ValueError, match="scale has 3 entries"):
        Frequencies(torch.zeros(2, 4), transform=PositionTransform(scale=(1.0, 2.0, 3.0)))
    with pytest.raises(ValueError, match="normalize"):
        PositionTransform(normalize="box")
    with pytest.raises(ValueError, match="keep must have one entry per plane"):
        Frequencies.from_spectrum(8).masked([True])
    with pytest.raises(ValueError, match="plane axes must be ints"):
        Frequencies.axial([0, 3], [1.0, 1.0], n_axes=2)
    with pytest.raises(ValueError, match="leave theta, scaling and spectrum"):
        ar.AxialRoPE(Frequencies.from_spectrum(8), theta=100.0)
    with pytest.raises(ValueError, match="unknown key"):
        Frequencies.from_dict({"freqs": [[1.0]], "shift": 2})


# -- the registry and its docs ------------------------------------------------------------------------------


def test_registry_covers_fifteen_conventions_each_tested_and_documented():
    assert len(conv.REGISTRY) >= 15
    tests = "".join(p.read_text() for p in (ROOT / "tests").glob("test_conventions_*.py"))
    docs = (ROOT / "docs" / "conventions.md").read_text()
    assert conv.table() in docs, "docs/conventions.md must hold axial_rope.conventions.table() verbatim"
    for name, c in conv.REGISTRY.items():
        # check_documented(name, ...) directly or through the files' check_tables / check_model helpers
        assert re.search(rf"check_\w+\(\s*\"{name}\"", tests), f"{name} has no upstream comparison test"
        assert (ROOT / "docs" / "img" / "conventions" / f"{c.family}.png").is_file(), f"no picture for {c.family}"
        assert isinstance(c.example(), ar.AxialRoPE)
        assert c.source and (c.reference == "upstream" or "arXiv" in c.reference)


def test_conventions_page_examples_run():
    # every python block of docs/conventions.md, in one namespace as a reader's session would run them
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "conventions.md").read_text(), flags=re.S)
    assert len(blocks) >= 10
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/conventions.md:block{i}", "exec"), namespace)
