"""The RoPE doctor: check that a live model rotates as its config says, and map what a planned size extrapolates.

``report = doctor(model, config=None, size=None)`` runs one forward of ``model`` on small inputs (twice: once as
it is, once under ``torch.autocast``) with hooks at its rotary sites, reads the rotation the model actually
applied (tables, pairing, widths, angles) and compares it with what the config prescribes through this library's
records (:func:`axial_rope.rope_from_config`, the diffusers family records, the model's own
:class:`~axial_rope.AxialRoPE`). Each difference is named by the incident that explains it
(:data:`CLASSES`), with its numbers. With ``size`` (a planned length or token grid) the report carries the
extrapolation map (:mod:`axial_rope.doctor.extrapolation`). ``python -m axial_rope.doctor`` is the command line.

Served: transformers models whose model type has a record (:data:`axial_rope.conventions.MODEL_TYPES`),
diffusers transformers with a family record, and models built from this library's layers (the reference DiTs
and language model, the timm ViTs of :mod:`axial_rope.integrations.timm`). Importing this module imports none
of transformers, diffusers or matplotlib: each is imported when a model of its kind (or a picture) needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .diagnose import diagnose
from .findings import CLASSES, Finding
from .report import Report

__all__ = ["CLASSES", "DoctorError", "Finding", "Report", "doctor", "extrapolation_map"]


class DoctorError(ValueError):
    """The doctor cannot examine this model as asked; the message says what to pass instead."""


def _site_for(model: nn.Module, config, example_inputs):
    """The source that knows ``model``'s rotary sites (transformers, diffusers, or this library's layers)."""
    from .sites_transformers import is_transformers_model

    if is_transformers_model(model):
        from .sites_transformers import TransformersSite

        return TransformersSite(model, config, example_inputs)
    if type(model).__module__.startswith("diffusers.") or any(
        c.__module__.startswith("diffusers.") for c in type(model).__mro__[1:]
    ):
        from .sites_diffusers import DiffusersSite

        return DiffusersSite(model, config, example_inputs)
    from .sites_axial import AxialSite

    return AxialSite(model, config, example_inputs)


def _forward(model: nn.Module, inputs) -> None:
    with torch.no_grad():
        if isinstance(inputs, dict):
            model(**inputs)
        elif isinstance(inputs, (tuple, list)):
            model(*inputs)
        else:
            model(inputs)


def _autocast_forward(model: nn.Module, inputs) -> None:
    device = next(iter(model.parameters()), torch.empty(0)).device.type
    with torch.autocast(device, dtype=torch.bfloat16):
        _forward(model, inputs)


def doctor(
    model: nn.Module,
    config=None,
    size: int | Sequence[int] | None = None,
    *,
    example_inputs=None,
    train_size: int | Sequence[int] | None = None,
    sinks: int | None = None,
    autocast: bool = True,
) -> Report:
    """Examine ``model``'s rotation against its config's records; map extrapolation to ``size``.

    Args:
        model: a transformers model, a diffusers transformer, or a model of this library's layers.
        config: its config (default ``model.config``; for this library's models the model's own rope).
        size: the planned length (one axis) or token grid (one extent per axis the map sizes), or ``None``.
        example_inputs: the keyword arguments of one forward (a dict; a tuple for positional ones) on small
            inputs. Built by the doctor where it can (transformers: random token ids; timm ViTs: an image);
            diffusers models need them.
        train_size: the trained extent per mapped axis, where the records do not know it.
        sinks: with ``size``, the number of sink tokens of a streaming model: the map adds the per-head phase
            concentration against them (:mod:`axial_rope.doctor.extrapolation`).
        autocast: also run the forward under ``torch.autocast`` (bfloat16) to check the tables survive it.

    Returns:
        A :class:`Report` (``print(report)``; ``report.to_dict()`` for JSON; ``report.alarms``).

    Raises:
        TypeError: a model the doctor cannot hook (no rotary site it knows), with what it can examine.
        ValueError (:class:`DoctorError`): a config it does not know, inputs it cannot build or a forward that fails
            on them, a size that does not fit the axes; the message says what to pass.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        site = _site_for(model, config, example_inputs)
    except ValueError as error:
        raise DoctorError(f"cannot examine {type(model).__name__}: {error}") from None
    observations = _run(site, _forward, "plain")
    notes = []
    if autocast:
        try:
            more = _run(site, _autocast_forward, "autocast")
        except DoctorError as error:
            notes.append(f"the autocast pass did not run: {error}")
            more = []
        for obs in more:
            obs.autocast = True
        observations += more
    unobservable = getattr(site, "unobservable", None)
    if not observations and unobservable is not None:
        notes.append(unobservable)
    elif not observations:
        raise DoctorError(
            f"the forward of {type(model).__name__} never reached a rotary site the doctor hooked "
            f"({', '.join(site.describe_sites())}): pass example_inputs= that run the attention"
        )
    findings, sites = diagnose(observations)
    notes += sorted({n for obs in observations for n in obs.notes})
    from .extrapolation import build_map

    first = next((o for o in observations if not o.autocast), None)
    try:
        extrapolation = None if first is None else build_map(first.rope, site.axes(), size, train_size, sinks,
                                                             observations)  # fmt: skip
    except ValueError as error:
        raise DoctorError(str(error)) from None
    if extrapolation is not None:
        findings += extrapolation.findings
    return Report(type(model).__name__, site.source, site.prescribed(), sites, findings, extrapolation, notes)


def _run(site, forward, name: str) -> list:
    try:
        return site.run(forward)
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, AttributeError) as error:
        raise DoctorError(
            f"the {name} forward of {type(site.model).__name__} failed on the inputs "
            f"({_shapes(site.inputs)}): {type(error).__name__}: {error}. Pass example_inputs= (the keyword "
            "arguments of one forward on small inputs)"
        ) from None


def _shapes(inputs) -> str:
    items = inputs.items() if isinstance(inputs, dict) else enumerate(inputs if isinstance(inputs, (list, tuple))
                                                                      else [inputs])  # fmt: skip
    return ", ".join(f"{k}: {list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}" for k, v in items)


def extrapolation_map(config, size: int | Sequence[int] | None = None, *, train_size=None):
    """The extrapolation map of a config alone (no model, no forward): a transformers ``config.json`` (dict or
    ``PretrainedConfig``) or a diffusers transformer's (its ``_class_name`` a served class).

    Returns:
        An :class:`~axial_rope.doctor.extrapolation.ExtrapolationMap` (``print`` it, ``to_dict()``), or ``None``
        where no axis has a trained extent (pass ``train_size``).
    """
    from ..configs import rope_from_config
    from ..conventions import DIFFUSERS
    from .extrapolation import build_map

    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    try:
        rope = rope_from_config(config)
        if get("_class_name") in DIFFUSERS:
            from .sites_diffusers import family_axes

            axes = family_axes(DIFFUSERS[get("_class_name")], rope.n_axes)
        else:
            from .sites_transformers import config_axes

            text = get("text_config") or config
            axes = config_axes(text, rope.n_axes == 3 and rope.spectrum in ("split", "cycled"))
        return build_map(rope, axes, size, train_size)
    except ValueError as error:
        raise DoctorError(f"cannot map this config: {error}") from None
