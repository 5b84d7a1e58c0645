"""The checks every diffusers family record gets, on its tiny model (``models/tiny_diffusers.py``).

For each served class with a tiny model: unscaled, the adapted model equals stock; with its tables replaced at
the training size it runs on the record's unscaled tables; at twice the training grid (twice the frames for
video) a scaling changes the output and it stays finite; ``handle.remove()`` restores stock bit for bit;
activation checkpointing gives the same gradients. Batch 2 throughout, with the attention masks the tiny
inputs carry. Models and inputs are float64 (positions and the model's own tables as they are), so the
remaining differences are the float32 rounding of the model's tables: ``TOL``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
import torch

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS

diffusers = pytest.importorskip("diffusers")

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_tables import RotaryTables  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

# float64 models against each other, upstream's float32 tables (|angle| 8 u + 2 u at the few-radian angles of
# tiny grids, u = 2**-24), carried through a block or two at O(1) logits: 1e-5 (test_integrations_diffusers)
TOL = 1e-5
CLASSES = sorted(name for name in DIFFUSERS if name in tiny.TINY)
_TABLES = ("img_ids", "txt_ids", "image_rotary_emb", "video_coords")  # positions and tables keep their dtype


def _double(inputs: dict, dtype: torch.dtype = torch.float64) -> dict:
    return {k: v if k in _TABLES else _as_double(v, dtype) for k, v in inputs.items()}


def _as_double(value, dtype):  # tensors, and lists of them (Z-Image's latents and captions, Bria-Fibo's text layers)
    if isinstance(value, (list, tuple)):
        return type(value)(_as_double(v, dtype) for v in value)
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _model(name: str):
    model, inputs = tiny.build(name)
    dtype = tiny.TINY[name].dtype  # float64, unless the stock model cannot run in it
    return model.to(dtype), _double(inputs, dtype)


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


def _twice(name: str) -> dict:
    """Inputs at twice the default token grid on each grid axis (and twice the frames for video)."""
    frames, h, w = tiny.TINY[name].grid
    video = tiny.TINY[name].video
    return _double(tiny.inputs(name, 2 * h, 2 * w, frames=2 * frames if video else frames), tiny.TINY[name].dtype)


_train_size = tiny.train_size  # the batch tests import it from here


def _replacing(name: str) -> dict:
    """An install that replaces the tables and leaves the positions as they are: the tiny model's ``mode`` at its
    training grid (as the rope counts it: a 1-D audio model's sequence includes its prepended tokens), or (no grid)
    a linear scaling by 1."""
    if not DIFFUSERS[name].grid_axes:
        return dict(scaling=ar.scaling.Linear(1.0))
    return dict(mode=tiny.TINY[name].mode, train_size=_train_size(name))


def _sized(name: str) -> dict:
    """Resolution scaling for the twice-as-large inputs: the tiny model's ``mode`` (``"interpolate"``; ``"yarn"``
    where the model's own positions interpolate already) against the default grid, or (positions the pipeline
    computes, no grid: ``grid_axes=()``) linear interpolation by 2 on every axis."""
    if not DIFFUSERS[name].grid_axes:
        return dict(scaling=ar.scaling.Linear(2.0))
    return dict(mode=tiny.TINY[name].mode, train_size=_train_size(name))


@pytest.mark.parametrize("name", CLASSES)
def test_unscaled_equals_stock(name):
    model, inputs = _model(name)
    stock = _run(model, inputs)
    set_rope_processors(model)
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)


def records_tables(model) -> dict[str, RotaryTables]:
    """The record's unscaled :class:`RotaryTables` of ``model`` by the attribute each stands for: its own tables
    module (or method), then its further producers (LTX-2); the stock one's other attributes readable through it
    (none where the tables are an argument)."""
    family, config = DIFFUSERS[type(model).__name__], model.config
    own = None if family.frequencies is None else family.frequencies(config)
    made = [(family.tables[1], family.rope, family.positions, family.layout, own)]
    made += [(p.tables[1], p.rope, p.positions, p.layout, None) for p in family.producers]
    return {
        attr: RotaryTables(
            rope(config), positions(config), layout, None, stock=getattr(model, attr, None), frequencies=f
        )
        for attr, rope, positions, layout, f in made
    }


@contextmanager
def answered_by_the_records_tables(model):
    """The stock model with each tables module (or method) the record replaces answering with the record's
    unscaled tables (:func:`records_tables`): stock arithmetic on the adapter's tables. An instance attribute
    stands in front of the submodule or method of that name."""
    stand_ins = records_tables(model)
    stock = {attr: model.__dict__.get(attr) for attr in stand_ins}  # a plain object (Z-Image's) lives there
    for attr, stand_in in stand_ins.items():
        object.__setattr__(model, attr, stand_in)
    try:
        yield
    finally:
        for attr, held in stock.items():
            if held is None:
                del model.__dict__[attr]  # the submodule or class method of that name shows again
            else:
                object.__setattr__(model, attr, held)


@pytest.mark.parametrize("name", [n for n in CLASSES if DIFFUSERS[n].scalable])
def test_tables_replaced_at_the_training_size_are_the_records_unscaled_tables(name):
    # sized at the training grid (or scaled by 1), the positions stay as they are. Where the stock processors rotate
    # by the replaced module's (or method's) tables, the model then runs on the record's unscaled tables: bit for
    # bit the stock model with that module answering with them, on any CPU (how far those tables sit from
    # upstream's float32 ones is the tables tests' bound, test_diffusers_batch_*). Tables a pipeline passes as
    # arguments, or a fused processor's rotation from positions, are held to TOL against stock (their angles are
    # a few radians at the tiny grids). The difference from stock is the docs' "max diff": one machine's
    # measurement (AXIAL_ROPE_MEASURE=1 prints it), not a bound (another CPU's float32 libm rounds upstream's
    # tables otherwise: an AVX-512 Xeon measured Z-Image at 4.0e-8 where the docs' AVX2 EPYC had 1.3e-8).
    family = DIFFUSERS[name]
    model, inputs = _model(name)
    stock = _run(model, inputs)
    exact = family.processor is None and family.tables[0] in ("module", "method")
    if exact:
        with answered_by_the_records_tables(model):
            on_ours = _run(model, inputs)
        assert torch.equal(_run(model, inputs), stock)  # the stand-ins removed: stock again
    handle = set_rope_processors(model, **_replacing(name))
    assert handle.tables is not None
    replaced = _run(model, inputs)
    if os.environ.get("AXIAL_ROPE_MEASURE"):
        print(f"MEASURED {name} {float((replaced - stock).abs().max()):.3g}")
    if exact:
        assert torch.equal(replaced, on_ours)
    else:
        torch.testing.assert_close(replaced, stock, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("name", [n for n in CLASSES if DIFFUSERS[n].scalable])
def test_scaling_at_twice_the_size_changes_the_output_and_stays_finite(name):
    model, _ = _model(name)
    inputs = _twice(name)
    stock = _run(model, inputs)
    handle = set_rope_processors(model, **_sized(name))
    scaled = _run(model, inputs)
    assert torch.isfinite(scaled).all()
    assert (scaled - stock).abs().max() > 1e-4  # the positions were squeezed into the trained range (or, for
    # models that squeeze their own, extrapolated with YaRN)
    handle.remove()
    assert torch.equal(_run(model, inputs), stock)  # remove() restores stock bit for bit


@pytest.mark.parametrize("name", [n for n in CLASSES if DIFFUSERS[n].scalable])
def test_activation_checkpointing_gives_the_same_gradients(name):
    if not tiny.TINY[name].model(1)._supports_gradient_checkpointing:
        pytest.skip(f"{name} does not support gradient checkpointing")
    if tiny.TINY[name].no_checkpointing:
        pytest.skip(f"stock {name}: {tiny.TINY[name].no_checkpointing}")

    def grads(checkpointing: bool):
        model, inputs = _model(name)
        set_rope_processors(model, **_sized(name))
        if checkpointing:
            model.enable_gradient_checkpointing()
        model.train()
        model(**inputs)[0].square().sum().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and plain
    for key, value in plain.items():  # the same arithmetic recomputed: equal to its rounding (float64, or float32)
        tol = 1e-10 if value.dtype == torch.float64 else 1e-5
        torch.testing.assert_close(checkpointed[key], value, atol=tol, rtol=tol)
