"""The adapter as a diffusers hook among diffusers' own: first-block cache, group offloading (block and leaf level)
and layerwise casting, installed before or after ours; accelerate's CPU offload (sequential and whole-model); and a model built the way ``from_pretrained`` builds it (parameters on the meta
device, then loaded). Tiny Flux (two double and two single blocks), float64; "equal" is bit for bit (the same
operations run), except where a hook's own arithmetic differs (said at the assertion).

diffusers' context parallelism is tested in tests/test_diffusers_context_parallel.py (two processes).
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from diffusers.hooks import FirstBlockCacheConfig, HookRegistry  # noqa: E402
from test_diffusers_families import _double  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

FLUX = "FluxTransformer2DModel"
_, H, W = tiny.TINY[FLUX].grid
TRAINED = (H, W)


def _model(seed: int = 0) -> torch.nn.Module:
    model, _ = tiny.build(FLUX, depth=2, seed=seed)
    return model.double()


def _inputs(factor: int) -> dict:
    return _double(tiny.inputs(FLUX, factor * H, factor * W))


def _run(model, inputs) -> torch.Tensor:
    HookRegistry.check_if_exists_or_initialize(model).reset_stateful_hooks()  # each run a first step: a new size
    with torch.no_grad(), model.cache_context("cond"):  # (first-block cache needs one; the others ignore it)
        return model(**inputs)[0]


HOOKS = {
    "first block cache": lambda m: m.enable_cache(FirstBlockCacheConfig(threshold=0.05)),
    "group offloading": lambda m: m.enable_group_offload(torch.device("cpu"), torch.device("cpu"),
                                                         offload_type="block_level", num_blocks_per_group=1),
    "leaf-level group offloading": lambda m: m.enable_group_offload(torch.device("cpu"), torch.device("cpu"),
                                                                    offload_type="leaf_level"),
    "layerwise casting": lambda m: m.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn,
                                                              compute_dtype=torch.float64),
}  # fmt: skip


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours first", "theirs first"])
@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_the_adapter_composes_with_diffusers_hooks(hook, ours_first):
    def install(model, **ours):
        if ours_first:
            handle = set_rope_processors(model, **ours)
            HOOKS[hook](model)
        else:
            HOOKS[hook](model)
            handle = set_rope_processors(model, **ours)
        return handle

    at_1x, at_2x = _inputs(1), _inputs(2)
    # at 1x the plan keeps the model's tables: the same as the unscaled adapter with the same hook
    unscaled, planned = _model(), _model()
    install(unscaled)
    install(planned, policy="auto", train_size=TRAINED)
    assert torch.equal(_run(planned, at_1x), _run(unscaled, at_1x))
    # at 2x: the same as the explicit install of the plan with the same hook
    explicit = _model()
    install(explicit, mode="content", train_size=TRAINED)
    got = _run(planned, at_2x)
    assert torch.equal(got, _run(explicit, at_2x))
    if hook != "layerwise casting":  # (float8 storage rounds the weights: not the model without it)
        alone = _model()
        set_rope_processors(alone, mode="content", train_size=TRAINED)
        assert torch.equal(got, _run(alone, at_2x))  # a first forward: nothing cached, offloading moves no value
    # removing ours leaves theirs working: the model with their hook alone
    planned._axial_rope_processors.remove()
    theirs = _model()
    HOOKS[hook](theirs)
    assert torch.equal(_run(planned, at_2x), _run(theirs, at_2x))


def test_built_on_the_meta_device_then_loaded_as_from_pretrained_does():
    eager = _model()
    set_rope_processors(eager, policy="auto", train_size=TRAINED)
    want = _run(eager, _inputs(2))
    with torch.device("meta"):
        model = tiny.TINY[FLUX].model(2).double().eval()
    handle = set_rope_processors(model, policy="auto", train_size=TRAINED)  # before the weights exist
    assert handle.rope.freqs.device.type == "cpu"  # the tables' frequencies were not put on the meta device
    model.load_state_dict(_model().state_dict(), assign=True)  # accelerate's and diffusers' loading: assign
    assert torch.equal(_run(model, _inputs(2)), want)
    # and the FSDP way: to_empty then the weights, which recomputes the frequencies on the new device
    with torch.device("meta"):
        model = tiny.TINY[FLUX].model(2).double().eval()
    set_rope_processors(model, policy="auto", train_size=TRAINED)
    model.to_empty(device="cpu")
    model.load_state_dict(_model().state_dict())
    assert torch.equal(_run(model, _inputs(2)), want)


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours first", "offload first"])
@pytest.mark.parametrize("offload", ["sequential", "model"])
def test_cpu_offload_runs_the_installed_model(offload, ours_first):
    # accelerate's hooks, as diffusers' enable_sequential_cpu_offload / enable_model_cpu_offload place them (here with
    # the CPU as the execution device): weights on the meta device or offloaded between calls. Our processors read
    # a norm's weights only where calling it would do nothing more (diffusers_processors._hooked)
    import accelerate

    explicit = _model()
    set_rope_processors(explicit, policy="auto", train_size=TRAINED)
    want = _run(explicit, _inputs(2))
    model = _model()
    install = lambda: set_rope_processors(model, policy="auto", train_size=TRAINED)  # noqa: E731
    if ours_first:
        install()
    if offload == "sequential":
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    else:
        accelerate.cpu_offload_with_hook(model, execution_device=torch.device("cpu"))
    if not ours_first:
        install()
    assert torch.equal(_run(model, _inputs(2)), want)
