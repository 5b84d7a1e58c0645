"""``apply_rope_scaling(pipe, policy="auto")``: the automatic policy for every call of a diffusers pipeline.

One call adapts a pipeline: its transformer gets :func:`~axial_rope.integrations.diffusers.set_rope_processors` with
``policy="auto"`` (image axes sized per forward by ``content`` positions, which equal the trained positions inside
the trained grid), and each call of the pipeline is planned before it runs, from the ``height``, ``width`` and
``num_frames`` it is given: the plan is checked against the decision table's limits (a clear error, or a stated
warning, before any step runs), shown as ``handle.plan``, and installed where it changes what the transformer
computes. An image plan only moves positions inside the forward, so a compiled transformer (``dynamic=True``) is not
recompiled from one size to the next; a video plan past the trained frames puts RIFLEx on the time axis for that
frame count, which changes a frequency: the tables are reinstalled, and a compiled graph specialises once per
frame count.

To read each call's arguments before the pipeline runs, the pipeline instance's class is swapped for a subclass
whose ``__call__`` plans, then calls the pipeline's own (``functools.wraps`` keeps its signature);
``handle.remove()`` puts the class and the stock transformer back.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ..conventions import PipelineUnits, diffusers_family
from .diffusers import set_rope_processors
from .diffusers_policy import FamilyPlan, plan_family

__all__ = ["RopeScaling", "apply_rope_scaling"]

_ATTR = "_axial_rope_scaling"  # where the handle lives on the pipeline instance


class RopeScaling:
    """Handle of :func:`apply_rope_scaling`.

    Attributes:
        pipe: the pipeline.
        processors: the transformer's :class:`~axial_rope.integrations.diffusers.RopeProcessors` as now installed.
        plan: the last call's :class:`~axial_rope.integrations.diffusers_policy.FamilyPlan` (before any call: the
            rule's), printable.
    """

    def __init__(self, pipe, policy: str, train_size, units: PipelineUnits | None, backend: str | None):
        self.pipe, self.policy, self.train_size, self.units, self.backend = pipe, policy, train_size, units, backend
        self.family = diffusers_family(pipe.transformer)
        self.processors = set_rope_processors(pipe.transformer, policy=policy, train_size=train_size, backend=backend)
        self.plan: FamilyPlan = self.processors.plan
        self._signature = inspect.signature(type(pipe).__call__)
        self._stock_class = type(pipe)

    def size_of(self, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
        """The call's target in pipeline units (``(frames,)`` + ``(height, width)``), or ``None`` where the pipeline
        picks it itself (``height=None`` and no default it states)."""
        bound = self._signature.bind(self.pipe, *args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        height, width = values.get("height"), values.get("width")
        if height is None or width is None:
            side = _default_side(self.pipe)
            height, width = height or side, width or side
        if height is None or width is None:
            return None
        frames = values.get("num_frames") if self.family.units.frames is not None else None
        return (int(height), int(width)) if frames is None else (int(frames), int(height), int(width))

    def before_call(self, args: tuple, kwargs: dict) -> None:
        """Plan the call (raises a clear ``ValueError`` past the policy's limits, before any step runs) and install
        the plan where it changes the transformer's computation (a video's RIFLEx on time)."""
        size = self.size_of(args, kwargs)
        rope = self.processors.rope
        plan = plan_family(self.family, rope, policy=self.policy, size=size, train_size=self.train_size,
                           units=self.units)  # fmt: skip
        if _installed(plan) != _installed(self.processors.plan):  # stock tables, or RIFLEx for another count
            self.processors = set_rope_processors(self.pipe.transformer, policy=self.policy,
                                                  size=size if _inside(plan) or plan.scaling else None,
                                                  train_size=self.train_size, units=self.units,
                                                  backend=self.backend)  # fmt: skip
        self.plan = plan

    def remove(self) -> None:
        """The pipeline's own class and the stock transformer again (idempotent)."""
        if self.pipe.__dict__.get(_ATTR) is not self:
            return
        self.processors.remove()
        self.pipe.__class__ = self._stock_class
        del self.pipe.__dict__[_ATTR]


def _inside(plan: FamilyPlan) -> bool:
    """Whether a planned call keeps the trained positions on every axis (the model's own tables serve it)."""
    return all(a.target is not None and a.target <= a.trained for a in plan.plan.axes)


def _installed(plan: FamilyPlan) -> tuple:
    """What an installation for ``plan`` computes: the stock tables, or sized ones with a time scaling."""
    return ("stock",) if _inside(plan) else ("sized", plan.scaling)


def _default_side(pipe) -> int | None:
    """The side a pipeline uses when a call gives none: ``default_sample_size * vae_scale_factor`` (Flux, Qwen-Image,
    ...), where the pipeline states both."""
    side, scale = getattr(pipe, "default_sample_size", None), getattr(pipe, "vae_scale_factor", None)
    return side * scale if isinstance(side, int) and isinstance(scale, int) else None


@functools.cache
def _planning_class(cls: type) -> type:
    """A subclass of the pipeline class whose ``__call__`` plans the call first (one per pipeline class)."""

    @functools.wraps(cls.__call__)
    def __call__(self, *args, **kwargs):
        handle = self.__dict__.get(_ATTR)
        if handle is not None:
            handle.before_call(args, kwargs)
        return cls.__call__(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})  # fmt: skip


def apply_rope_scaling(
    pipe, *, policy: str = "auto", train_size=None, units: PipelineUnits | None = None, backend: str | None = None
) -> RopeScaling:
    """Plan the RoPE scaling of ``pipe``'s transformer for every call, from the call's size.

    Args:
        pipe: a diffusers pipeline whose ``transformer`` is served (:data:`~axial_rope.integrations.diffusers.
            SUPPORTED`) and whose ``__call__`` takes ``height`` and ``width`` (and ``num_frames`` for video).
        policy: ``"auto"`` (:mod:`axial_rope.policy`).
        train_size: the trained token grid, in place of the record's training sizes (a fine-tune of your own).
        units: how this pipeline's pixels and frames map to tokens, in place of the record's (the released VAE and
            patch; a pipeline built with another VAE gives its own).
        backend: the axial_rope backend of the processors.

    Returns:
        A :class:`RopeScaling` handle: ``handle.plan`` (the last call's), ``handle.remove()``.

    Raises:
        TypeError: a pipeline without a ``transformer`` module, or one no record serves.
        ValueError: an unknown policy; a pipeline whose call takes no ``height`` or ``width`` (an audio pipeline:
            plan its transformer with ``set_rope_processors(..., policy="auto", size=(tokens,))``); a size past the
            policy's limits, at the call.
    """
    transformer = getattr(pipe, "transformer", None)
    if not isinstance(transformer, torch.nn.Module):
        raise TypeError(f"apply_rope_scaling adapts a pipeline's `transformer`; {type(pipe).__name__} has none")
    family = diffusers_family(transformer)
    parameters = inspect.signature(type(pipe).__call__).parameters
    wanted = ("height", "width") + (("num_frames",) if family.units.frames is not None else ())
    missing = [name for name in wanted if name not in parameters]
    if missing:
        raise ValueError(
            f"apply_rope_scaling reads {', '.join(wanted)} from each call; {type(pipe).__name__}.__call__ has no "
            f"{missing[0]!r} argument: plan its transformer once with set_rope_processors(pipe.transformer, "
            "policy='auto', size=...) instead"
        )
    previous = pipe.__dict__.get(_ATTR)
    if previous is not None:
        previous.remove()
    handle = RopeScaling(pipe, policy, train_size, units, backend)
    pipe.__dict__[_ATTR] = handle
    pipe.__class__ = _planning_class(type(pipe))
    return handle
