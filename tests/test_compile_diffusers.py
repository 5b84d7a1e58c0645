"""diffusers' own compile checks (``tests/models/testing_utils/compile.py``, ``TorchCompileTesterMixin``) on every
family ``set_rope_processors`` serves: unscaled, with a fixed scaling, and with a per-timestep (DyPE) scaling.

The Dynamo-level checks run with ``backend="eager"`` (what they test is tracing: graph breaks and
recompiles, not code generation); one family goes through inductor and AOTInductor, as diffusers'
``test_compile_works_with_aot`` does.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import axial_rope as ar
from axial_rope.time_scaling import DyPE

diffusers = pytest.importorskip("diffusers")

from test_conventions_integration import _ltx  # noqa: E402
from test_diffusers_families import _train_size  # noqa: E402

from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

# every served class with a tiny model (models/tiny_diffusers.py); LTX-Video's fixed tables: unscaled below
FAMILIES = sorted(name for name, family in DIFFUSERS.items() if name in tiny.TINY and family.scalable)


def _variants(name: str) -> tuple[str, ...]:
    """Unscaled, a fixed scaling and a per-timestep (DyPE) one; a rope without per-axis spectra (learned or per-head
    frequencies) takes neither, and is sized per forward instead (``mode="interpolate"``). Unscaled only where a fused
    processor of ours is installed: without one, an unscaled install leaves the stock model as it was
    (tests/test_diffusers_families.py checks it equals stock), whose compile is diffusers' own."""
    record = DIFFUSERS[name]
    scaled = ("scaled", "timed") if record.spectrum else ("sized",)
    return (("unscaled",) if record.processor else ()) + scaled


CASES = [(name, variant) for name in FAMILIES for variant in _variants(name)]


def _scaling(variant: str, n_axes: int, amplitude: bool = True):
    """Per axis: the last two axes (y, x; a 1-D model's one) scaled, the others not; DyPE's linear and YaRN forms for
    the timed variant (NTK for tables of angles, which carry no attention factor)."""
    if variant == "unscaled":
        return None
    yarn = "yarn" if amplitude else "ntk"
    methods = (ar.scaling.Linear(2.0), ar.scaling.YaRN(2.0, 2) if amplitude else ar.scaling.NTK(2.0)) if (
        variant == "scaled") else (DyPE(2.0, 2, method="linear"), DyPE(2.0, 2, method=yarn))  # fmt: skip
    return ((None,) * n_axes + methods)[-n_axes:]


def _skip_stock(family: str, *, dynamic: bool = False) -> None:
    """Skip a check the stock model itself fails: a whole-forward compile (host reads deciding its shapes) or, with
    ``dynamic``, one graph over sizes (a stock model that recompiles per size)."""
    t = tiny.TINY[family]
    why = t.no_fullgraph or (t.no_dynamic if dynamic else "")
    if why:
        pytest.skip(f"{family}: {why}")


def _model(family: str, variant: str):
    model, inputs = tiny.build(family)
    record = DIFFUSERS[family]
    if variant == "sized":
        set_rope_processors(model, mode="interpolate", train_size=_train_size(family))
    else:
        rope = record.rope(model.config)
        scaling = _scaling(variant, rope.n_axes, record.amplitude)
        if rope.spectrum in ("split", "cycled") and scaling is not None:  # one spectrum shared by the axes (M-RoPE):
            scaling = scaling[-1]  # one method for all of them
        set_rope_processors(model, scaling=scaling)
    return model, inputs


def _later_step(family: str, inputs: dict) -> dict:
    """The next sampling step: another timestep (the forward argument the record names), same shapes and dtypes."""
    name = DIFFUSERS[family].timing.argument
    return dict(inputs, **{name: (inputs[name] * 0.5).to(inputs[name].dtype)})


def _graphs(model) -> int:
    """Graphs a compiled adapted model makes: its forward, and one per pre-hook of the adapter on the transformer
    (the step's time written into a buffer; CogVideoX's tables replacing the pipeline's argument), each traced whole;
    a hook on a block (ACE-Step's tables argument) is traced inside the forward."""
    return 1 + len(model._forward_pre_hooks)


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _close(got, want):
    """Compiled against eager: the torch backend's eager path (one complex multiply) and its traced expression
    path round the rotation differently, by up to 2 float32 ulps of each rotated channel (4 u |x|, u = 2**-24),
    carried through two blocks of O(1) activations: 1e-5 bounds it with room."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("family", "variant"), CASES)
def test_fullgraph_without_recompiling(family, variant):
    _skip_stock(family)
    model, inputs = _model(family, variant)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in (inputs, _later_step(family, inputs)):
            _close(_run(compiled, step), _run(model, step))
    assert counter.frame_count == _graphs(model)  # none added by the second step


@pytest.mark.parametrize(("family", "variant"), CASES)
def test_repeated_blocks_compile_once(family, variant):
    model, inputs = _model(family, variant)
    if not model._repeated_blocks:
        pytest.skip(f"{type(model).__name__} declares no _repeated_blocks")
    if tiny.TINY[family].no_repeated:
        pytest.skip(f"stock {family}: {tiny.TINY[family].no_repeated}")
    torch._dynamo.reset()
    expected = [_run(model, step) for step in (inputs, _later_step(family, inputs))]
    model.compile_repeated_blocks(fullgraph=True, backend="eager")
    with torch._dynamo.config.patch(recompile_limit=1):
        for step, want in zip((inputs, _later_step(family, inputs)), expected):
            _close(_run(model, step), want)


@pytest.mark.parametrize(("family", "variant"), CASES)
def test_dynamic_sizes_compile_once(family, variant):
    _skip_stock(family, dynamic=True)
    model, inputs = _model(family, variant)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    with torch.fx.experimental._config.patch(use_duck_shape=False):
        for h, w in ((4, 4), (4, 8), (8, 8)):
            sized = tiny.inputs(family, h, w)  # diffusers' get_dummy_inputs(height, width)
            with torch._dynamo.config.patch(error_on_recompile=True):
                out = _run(compiled, sized)
            _close(out, _run(model, sized))
    assert counter.frame_count == _graphs(model)


def test_ltx_video_fullgraph_without_recompiling():
    model, inputs = _ltx()
    set_rope_processors(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in (inputs, _later_step("LTXVideoTransformer3DModel", inputs)):
            _close(_run(compiled, step), _run(model, step))


def test_export_and_aot_inductor_package_equal_eager(tmp_path):
    # diffusers' test_compile_works_with_aot on the scaled, time-dependent Flux: export (the pre-hook and its
    # buffer write included), compile the package with AOTInductor, load it, run it at another timestep
    from torch._inductor.package import load_package

    model, inputs = _model("FluxTransformer2DModel", "timed")
    exported = torch.export.export(model, args=(), kwargs=inputs)
    later = _later_step("FluxTransformer2DModel", inputs)
    _close(exported.module()(**later)[0], _run(model, later))
    path = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "flux.pt2"))
    loaded = load_package(path, run_single_threaded=True)
    for step in (inputs, later):  # inductor's fused kernels: the same bound as the traced path's
        _close(loaded(**step)[0], _run(model, step))
