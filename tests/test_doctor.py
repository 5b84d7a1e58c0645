"""The RoPE doctor on healthy models (no false alarm), its report, its bad-input messages and its command line."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import axial_rope as ar
from axial_rope.doctor import DoctorError, doctor, extrapolation_map
from axial_rope.doctor.__main__ import main
from axial_rope.doctor.attention import entropy_changes, sink_concentration
from axial_rope.doctor.extrapolation import Method
from models import tiny_transformers
from models.tiny_defects import LLAMA_YARN_MROPE, seeded


@pytest.mark.parametrize("name", [*tiny_transformers.NAMES, LLAMA_YARN_MROPE])
def test_healthy_transformers_families_raise_no_alarm(name):
    with seeded(None, name) as (model, inputs):
        report = doctor(model, example_inputs=inputs)
    assert report.healthy, str(report)
    assert report.sites and all(s.error <= s.bound for s in report.sites)
    assert all(s.pairing is not None for s in report.sites)  # q and k were read at every site


def _reference_models():
    from models.dit import PRESETS as DIT
    from models.dit import DiT
    from models.gpt import GPT
    from models.gpt import PRESETS as GPT_PRESETS
    from models.video_dit import PRESETS as VIDEO
    from models.video_dit import VideoDiT

    gen = torch.Generator().manual_seed(0)
    c = DIT["tiny"]
    dit = (DiT(c).eval(), (torch.randn(2, c.in_channels, 16, 16, generator=gen), torch.rand(2, generator=gen),
                           torch.randint(0, c.num_classes, (2,), generator=gen)))  # fmt: skip
    v = VIDEO["tiny"]
    video = (VideoDiT(v).eval(), (torch.randn(2, v.in_channels, 2, 8, 8, generator=gen), torch.rand(2, generator=gen),
                                  torch.randint(0, v.num_classes, (2,), generator=gen)))  # fmt: skip
    gpt = (GPT(GPT_PRESETS["tiny"]).eval(), (torch.randint(0, 256, (2, 12), generator=gen),))
    return {"dit": dit, "video_dit": video, "gpt": gpt}


@pytest.mark.parametrize("name", ["dit", "video_dit", "gpt", "test_vit_axial_rope", "vit_small_patch16_axial_rope"])
def test_healthy_reference_models_and_timm_vits_raise_no_alarm(name):
    if "vit" in name:
        timm = pytest.importorskip("timm")
        import axial_rope.integrations.timm  # noqa: F401  (registers the models)

        model, inputs = timm.create_model(name).eval(), None  # the doctor builds an image
    else:
        model, inputs = _reference_models()[name]
    report = doctor(model, example_inputs=inputs)
    assert report.healthy, str(report)
    assert report.source == "axial_rope" and report.sites


def test_report_prints_and_round_trips_through_json():
    with seeded(None, "llama-llama3") as (model, inputs):
        report = doctor(model, size=64, example_inputs=inputs, sinks=2)
    text = str(report)
    assert "healthy" in text and "extrapolation map" in text and "model.rotary_emb" in text
    data = json.loads(report.to_json())
    assert data["healthy"] and data["source"] == "transformers"
    (axis,) = data["map"]["axes"]
    assert (axis["trained"], axis["planned"]) == (8, 64)  # original_max_position_embeddings, the planned length
    assert set(axis["methods"]) == {"none", "interpolate", "ntk", "yarn", "config", "observed"}
    # a healthy model runs its config: the frequencies fitted from its tables count the same unseen planes
    assert axis["methods"]["observed"]["unseen"] == axis["methods"]["config"]["unseen"]


def test_map_counts_the_planes_turning_past_their_trained_angle():
    # Llama 3 at 8x: against the direct count from the spectrum (wavelength 2 pi / F over the trained 8 tokens)
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 64,
              "rope_parameters": tiny_transformers.LLAMA3}  # fmt: skip
    result = extrapolation_map(config, 64)
    (axis,) = result.axes
    inv = ar.inv_freq(32, 5e5)[0]
    seen = inv * 8  # the largest angle of each plane over the trained extent
    assert axis.beyond == [j for j in range(16) if 2 * math.pi / float(inv[j]) > 8]
    assert axis.methods["none"]["unseen"] == int(((seen < 2 * math.pi) & (inv * 64 > seen)).sum())
    assert axis.methods["interpolate"]["unseen"] == 0  # positions / 8: every plane stays within its trained angle
    scaled = ar.inv_freq(32, 5e5, ar.scaling.Llama3(8.0, 8))[0]
    assert axis.methods["config"]["unseen"] == int(((seen < 2 * math.pi) & (scaled * 64 > seen)).sum())


def test_entropy_change_of_uniform_attention_is_the_log_of_the_length_ratio():
    # q = 0: every key gets the same weight at any length, so the entropy is log(length), whatever the rope
    rope = ar.AxialRoPE(8, pairing="half")
    q = torch.zeros(1, 4, 2, 8)
    k = torch.randn(1, 4, 2, 8, generator=torch.Generator().manual_seed(0))
    changes = entropy_changes(rope, (q, k), {"none": Method(rope.freqs)}, 0, 16, 256, 1.0)
    assert changes["none"] == pytest.approx(math.log(256 / 16), abs=1e-9)


def test_sink_concentration_of_equal_planes_is_the_mean_resultant_length():
    rope = ar.AxialRoPE(8, theta=4.0, pairing="half")  # 4 planes, F = 4 ** (-j / 4)
    ones = torch.ones(1, 3, 1, 8)  # every plane of q and k of magnitude sqrt(2): equal weights
    out = sink_concentration(rope, (ones, ones), 0, 8, 64, 1.0, 2)
    F = ar.inv_freq(8, 4.0)[0]
    d = torch.arange(9, 65, dtype=torch.float64)  # distances beyond the trained 8
    direct = torch.polar(torch.ones(56, 4, dtype=torch.float64), d[:, None] * F).mean(-1).abs()
    assert out["peak_mean"] == pytest.approx(float(direct.max()), abs=1e-12)
    assert out["peak_distance"] == int(d[direct.argmax()])


def test_picture_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 64}
    from axial_rope.doctor.picture import draw

    path = draw(extrapolation_map(config, 256), str(tmp_path / "map.png"))
    assert (tmp_path / "map.png").stat().st_size > 1000 and path.endswith("map.png")


class _NoRope(nn.Module):
    def forward(self, x):
        return x


def test_bad_input_names_what_to_pass():
    with pytest.raises(TypeError, match="cannot hook _NoRope"):
        doctor(_NoRope())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        doctor("llama")
    with seeded(None, "llama") as (model, inputs):
        with pytest.raises(DoctorError, match="example_inputs="):  # a forward that fails on the inputs given
            doctor(model, example_inputs={"input_ids": torch.zeros(2, 3, 4)})
        with pytest.raises(DoctorError, match="size must be"):
            doctor(model, size=(64, 64), example_inputs=inputs)
        model.config.model_type = "not_a_model"  # a config it does not know: what to pass instead
        with pytest.raises(DoctorError, match="pass config= an axial_rope.AxialRoPE"):
            doctor(model, example_inputs=inputs)
        # ... and passing it works
        report = doctor(model, config=ar.AxialRoPE(32, pairing="half"), example_inputs=inputs)
        assert report.healthy, str(report)


def test_a_diffusers_model_needs_its_inputs():
    pytest.importorskip("diffusers")
    from models.tiny_diffusers import build

    model, _ = build("flux")
    with pytest.raises(DoctorError, match="pass example_inputs="):
        doctor(model)


def test_importing_the_doctor_imports_no_optional_library():
    import subprocess
    import sys

    code = ("import sys, axial_rope, axial_rope.doctor; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'transformers', 'diffusers', 'matplotlib', 'timm'}))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_command_line_prints_a_report_and_writes_json(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
                                  "max_position_embeddings": 64}))  # fmt: skip
    main(["--config", str(config), "--size", "256", "--json", str(tmp_path / "map.json")])
    assert "axis position: trained 64, planned 256" in capsys.readouterr().out
    assert json.loads((tmp_path / "map.json").read_text())["axes"][0]["planned"] == 256
    main(["models.tiny_defects:healthy_llama", "--no-autocast", "--json", "-"])
    assert json.loads(capsys.readouterr().out)["healthy"] is True


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "give a TARGET"),
        (["nothing_here"], "module:name"),
        (["no_such_module:x"], "cannot import"),
        (["torch:zeros"], "raised"),  # a factory that needs arguments
        (["math:pi"], "not a torch.nn.Module"),
        (["models.tiny_defects:healthy_llama", "--size", "64", "64"], "size must be"),
        (["--config", "/nonexistent/config.json"], "cannot read"),
        (["models.tiny_defects:healthy_llama", "--config", "x.json"], "without a model"),
    ],
)
def test_command_line_errors_are_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert words in err
