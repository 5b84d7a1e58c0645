"""Time-dependent scaling (DyPE, Lumina-Next) in the reference DiTs, their samplers and pipelines, and in
set_rope_processors driven by a scheduler: the time of every step reaches the rope, nothing recompiles per step."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import one_torch_thread, perturb

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # models/ is not installed: import it from the repository root
    sys.path.insert(0, str(ROOT))

import axial_rope as ar  # noqa: E402
from axial_rope.scaling import YaRN  # noqa: E402
from axial_rope.time_scaling import DyPE, TimeAwareNTK  # noqa: E402
from models import dit, video_dit  # noqa: E402
from models.dit import DiT, DiTConfig  # noqa: E402
from models.flow import classifier_free_guidance, sample_euler  # noqa: E402

_one_thread = one_torch_thread()

# kappa(t) = 2 t^2 = 1 at t = 1 / sqrt(2): every DyPE method equals its static counterpart there
KAPPA_ONE = 1000 / math.sqrt(2)


@pytest.fixture(scope="module")
def model() -> DiT:
    """The tiny image DiT trained (as configured) at 16 px: a 4 x 4 token grid; run at 32 px (8 x 8) below.

    float64: the modes' equalities compare frequencies built on other paths (a last bit apart, angles
    < 10 rad: 1e-15 rad) through the same model, within helpers.chain_bound(U64, 256, 20) = 5e-12 of the
    outputs' scale; the default float64 tolerance (1e-7) holds that, and TOL = 1e-10 where one is named.
    """
    torch.manual_seed(0)
    return perturb(DiT(DiTConfig(**{**dit.PRESETS["tiny"].__dict__, "input_size": 16}))).double()


TOL = 1e-10  # float64 (the fixture's docstring)


def _out(model, t: float, **kw) -> torch.Tensor:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        return model(x, torch.full((2,), t, dtype=torch.float64), torch.tensor([0, 3]), **kw)


def test_dype_mode_is_yarn_where_kappa_is_one_and_follows_t(model):
    torch.testing.assert_close(_out(model, KAPPA_ONE, pos_mode="dype"), _out(model, KAPPA_ONE, pos_mode="yarn"))
    assert (_out(model, 200.0, pos_mode="dype") - _out(model, 200.0, pos_mode="yarn")).abs().max() > 1e-4
    # Dy-YaRN at t = 0: the unscaled spectrum with YaRN's attention factor (0.1 ln 2 + 1), as the authors' code
    static = (YaRN(2.0, 4, beta_fast=1e9, beta_slow=1e9),) * 2  # a ramp that keeps every pair, the same factor
    torch.testing.assert_close(_out(model, 0.0, pos_mode="dype"), _out(model, 0.0, scaling=static))


def test_explicit_time_scaling_per_call_and_lumina_mode(model):
    linear = DyPE(2.0, 4, method="linear", lambda_s=1.0)  # kappa = t^2: the full factor at t = 1, none at 0
    torch.testing.assert_close(_out(model, 0.0, scaling=linear), _out(model, 0.0, pos_mode="none"))
    interpolated = _out(model, 1000.0, pos_mode="interpolate")  # positions / 2 = frequencies / 2
    torch.testing.assert_close(_out(model, 1000.0, scaling=linear), interpolated, rtol=TOL, atol=TOL)
    lumina = TimeAwareNTK(2.0, head_dim=32)  # the tiny preset's head dim, as the mode builds it
    torch.testing.assert_close(_out(model, 300.0, pos_mode="time_aware_ntk"), _out(model, 300.0, scaling=lumina))
    assert (_out(model, 300.0, pos_mode="time_aware_ntk") - _out(model, 900.0, pos_mode="time_aware_ntk")).abs().max()
    # at the training size nothing is scaled, whatever the time
    x, y = torch.randn(1, 3, 16, 16, dtype=torch.float64), torch.tensor([1])
    with torch.no_grad():
        t = torch.tensor([300.0], dtype=torch.float64)
        torch.testing.assert_close(model(x, t, y, pos_mode="dype"), model(x, t, y))


def test_time_modes_need_one_time_per_batch_and_no_packing(model):
    with pytest.raises(ValueError, match="one time per call"):
        model(torch.randn(2, 3, 32, 32).double(), torch.tensor([100.0, 900.0]), torch.tensor([0, 1]), pos_mode="dype")
    with pytest.raises(ValueError, match="not for packed batches"):
        model([torch.randn(3, 32, 32)], torch.tensor([100.0]), torch.tensor([0]), pos_mode="dype")
    assert set(dit.TIME_MODES) < set(dit.POS_MODES) and DiTConfig(pos_mode="dype").pos_mode == "dype"


def test_the_sampler_binds_each_steps_time(model, monkeypatch):
    seen = []
    level = dit.noise_level

    def spy(t):
        seen.append(float(t[0]) / 1000)
        return level(t)

    monkeypatch.setattr(dit, "noise_level", spy)
    labels, noise = torch.tensor([0, 2]), torch.randn(2, 3, 32, 32, dtype=torch.float64)
    sample_euler(lambda x, t: model.forward_with_cfg(x, t, labels, 2.0, pos_mode="dype"), noise, 4)
    assert seen == pytest.approx([1.0, 0.75, 0.5, 0.25])  # one forward (both guidance halves) per step


def test_compiled_dit_does_not_recompile_per_step(model):
    from test_time_scaling import Compiles

    torch._dynamo.reset()
    backend = Compiles()
    compiled = torch.compile(model, backend=backend)
    x, y = torch.randn(2, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 1])
    with torch.no_grad():
        for step, t in enumerate((1000.0, 750.0, 500.0, 250.0)):
            t = torch.full((2,), t, dtype=torch.float64)
            out = compiled(x, t, y, pos_mode="dype")
            torch.testing.assert_close(out, model(x, t, y, pos_mode="dype"), rtol=TOL, atol=TOL)
            if step == 0:
                graphs = backend.count
    assert backend.count == graphs  # graphs (and graph breaks) of the first step, reused by every later step


def test_image_pipeline_takes_the_time_mode(model):
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT2DModel
    from models.pipeline import AxialDiTPipeline

    model = copy.deepcopy(model).float()  # the pipeline's dtype; the same arithmetic on both sides below
    wrapped = AxialDiT2DModel.from_reference(model)
    pipe = AxialDiTPipeline(wrapped)
    pipe.set_progress_bar_config(disable=True)
    labels, noise = torch.tensor([1, 3]), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    out = {
        m: pipe(labels, 32, 32, 4, 2.0, pos_mode=m, latents=noise, output_type="pt").images for m in ("dype", "yarn")
    }
    with torch.no_grad():
        ref = sample_euler(lambda x, t: model.forward_with_cfg(x, t, labels, 2.0, pos_mode="dype"), noise, 4)
    torch.testing.assert_close(out["dype"], (ref.clamp(-1, 1) + 1) / 2, rtol=0, atol=1e-5)  # see test_pipeline
    assert (out["dype"] - out["yarn"]).abs().max() > 1e-3


def test_video_dit_and_pipeline_take_a_time_dependent_temporal_scaling():
    torch.manual_seed(0)
    model = perturb(video_dit.VideoDiT(video_dit.PRESETS["tiny"]))
    x, y = torch.randn(1, 3, 8, 8, 8), torch.tensor([2])
    dype = DyPE(2.0, 4, method="linear", lambda_s=1.0)
    with torch.no_grad():  # float64: frequencies a last bit apart through the same model (see the fixture)
        m64, x64 = copy.deepcopy(model).double(), x.double()
        t = {v: torch.tensor([v], dtype=torch.float64) for v in (0.0, 1000.0)}
        at = {v: m64(x64, t[v], y, temporal_scaling=dype) for v in (0.0, 1000.0)}
        torch.testing.assert_close(at[0.0], m64(x64, t[0.0], y), rtol=TOL, atol=TOL)
        torch.testing.assert_close(
            at[1000.0], m64(x64, t[1000.0], y, temporal_scaling=ar.scaling.Linear(2.0)), rtol=TOL, atol=TOL
        )
    pytest.importorskip("diffusers")
    from models.diffusers_models import AxialDiT3DModel
    from models.pipeline import AxialVideoDiTPipeline

    pipe = AxialVideoDiTPipeline(AxialDiT3DModel.from_reference(model))
    pipe.set_progress_bar_config(disable=True)
    noise = torch.randn(1, 3, 8, 8, 8, generator=torch.Generator().manual_seed(1))
    kw = dict(num_frames=8, height=8, width=8, num_inference_steps=3, guidance_scale=2.0, latents=noise)
    out = pipe([2], temporal_scaling=dype.to_dict(), output_type="pt", **kw).frames  # a dict, as configs hold it
    null = model.y_embedder.null_label

    def velocity(x, t):
        return classifier_free_guidance(model, x, t, y, null, 2.0, temporal_scaling=dype)

    ref = sample_euler(velocity, noise, 3)
    torch.testing.assert_close(out, (ref.clamp(-1, 1) + 1).transpose(1, 2) / 2, rtol=0, atol=1e-5)  # as above


def test_set_rope_processors_follows_a_schedulers_steps():
    # a stock diffusers transformer driven by the project's scheduler loop (models.pipeline.denoise): the
    # processors read each step's time from the forward's timestep, the schedule's sigma, with no call per step
    diffusers = pytest.importorskip("diffusers")
    from test_time_scaling import tiny_flux

    from axial_rope.integrations.diffusers import set_rope_processors
    from models.pipeline import denoise

    flux, inputs = tiny_flux()
    handle = set_rope_processors(flux, scaling=(None, DyPE(2.0, 4), DyPE(2.0, 4)))
    seen = []

    def velocity(x, t):  # FluxPipeline passes timestep = sigma (t / 1000)
        out = flux(**(inputs | {"hidden_states": x, "timestep": t / 1000}))[0]
        seen.append(float(handle.tables.time))
        return out

    pipe = SimpleNamespace(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), progress_bar=lambda steps: steps)
    with torch.no_grad():
        denoise(pipe, velocity, inputs["hidden_states"], 4, None)
    assert seen == pytest.approx([1.0, 0.75, 0.5, 0.25], abs=1e-6)
    handle.remove()
