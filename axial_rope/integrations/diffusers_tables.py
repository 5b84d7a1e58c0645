"""The rotary tables of a diffusers transformer, computed by axial_rope: the module that replaces its producer.

Most diffusers transformers compute their rotary tables once per forward, in one module (Flux's
``pos_embed(ids)``, HunyuanVideo's and Wan's ``rope(hidden_states)``), and pass them to every
attention processor as ``image_rotary_emb``. :class:`RotaryTables` takes that module's place: it
reads the same input, computes positions, scaling and tables with an :class:`~axial_rope.AxialRoPE`
inside the forward (tensor ops, symbolic sizes welcome), and returns the tables in the stock
layout. Every processor downstream, stock or not, then rotates by scaled tables as the model
passes them: no side channel, nothing recorded between calls, so ``torch.compile`` (fullgraph,
regional, dynamic sizes) and ``torch.export`` see the whole rotation.

Where the tables are a forward argument (CogVideoX: its pipeline computes them), a forward pre-hook
of the transformer replaces the argument by the tables of the latent grid (:func:`argument_hook`).
A time-dependent scaling reads the sampling time from the transformer's own ``timestep``:
a forward pre-hook writes ``max(timestep) / noise_timestep`` into the tables module's ``time``
buffer (an in-place copy into a buffer, which compile and export trace as they do a KV cache's).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from ..conventions._tables import Sizing
from ..ops import rotation_tables
from ..ops.common import channel_table
from ..rope import AxialRoPE

__all__ = ["RotaryTables", "argument_hook", "time_hook"]


class RotaryTables(nn.Module):
    """The tables a diffusers transformer's rotary module returns, computed by ``rope`` (scaled, sized, timed).

    Args:
        rope: the rotary layout (axes, theta, scaling) of the model, interleaved as diffusers' tables.
        positions: ``(rope, sizing, *inputs, **kwargs) -> (pos [S, A], scaling per axis)`` from the replaced module's
            inputs, or ``(pos, scaling, F)`` where the model passes its own frequency matrix in (a weight: the
            tables turn by it, ``F`` ``[A, n]`` or per head ``[H, A, n]``).
        layout: ``(cos, sin) [S, D] -> what the replaced module returns`` (e.g. Wan's ``[1, S, 1, D]``); one marked
            with :func:`~axial_rope.conventions._tables.reads_inputs` also gets the module's inputs.
        sizing: per-forward sizing (``mode``, ``train_size``), or ``None``.
        time_dependent: hold the sampling time in the ``time`` buffer (set by :func:`time_hook`).
        stock: the module replaced (kept to be put back, not a submodule: the state dict is unchanged);
            its attributes stay readable here (``transformer.rope.patch_size``), as code reading them expects.
    """

    def __init__(self, rope: AxialRoPE, positions: Callable, layout: Callable, sizing: Sizing | None = None,
                 *, time_dependent: bool = False, stock: nn.Module | None = None):  # fmt: skip
        super().__init__()
        self.__dict__["stock"] = stock
        self.rope, self.positions, self.layout, self.sizing = rope, positions, layout, sizing
        self.time_dependent = time_dependent
        if time_dependent:  # the noise level of this forward, 0-d float64 (written by the transformer's pre-hook)
            self.register_buffer("time", torch.ones((), dtype=torch.float64), persistent=False)

    def tables(self, *inputs, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin ``[S, D]`` (per-head ``F``: ``[S, H, D]``) in the rope's pairing, attention factor
        included."""
        pos, scaling, *freqs = self.positions(self.rope, self.sizing, *inputs, **kwargs)
        rotation = self.rope.rotation(pos, scaling=scaling, t=self.time if self.time_dependent else None)
        if freqs:  # the model's own F (a weight), as a learned rope turns: float32 F, float64 angles, its gradient
            rotation = rotation._replace(freqs=freqs[0], turns=None)
        return rotation_channel_tables(rotation)

    def forward(self, *inputs, **kwargs):
        cos, sin = self.tables(*inputs, **kwargs)
        if getattr(self.layout, "reads_inputs", False):
            return self.layout(cos, sin, *inputs, **kwargs)
        return self.layout(cos, sin)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            stock = self.__dict__.get("stock")
            if stock is None:
                raise
            return getattr(stock, name)

    def extra_repr(self) -> str:
        sizing = "" if self.sizing is None else f", sizing={self.sizing}"
        return f"time_dependent={self.time_dependent}{sizing}"


def rotation_channel_tables(rotation) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotation's float32 tables in its pairing's channel layout, ``[S, 2n]`` (one batch row of positions)."""
    cos, sin = rotation_tables(rotation, torch.float32)
    return channel_table(cos[0], rotation.pairing), channel_table(sin[0], rotation.pairing)


def _slot(transformer: nn.Module, name: str) -> int | None:
    """The positional index of ``forward``'s argument ``name`` (``None``: keyword-only), read once at install:
    the hooks then find it without ``inspect`` at call time, which compiled code cannot trace."""
    params = [p for p in inspect.signature(transformer.forward).parameters.values() if p.kind != p.VAR_KEYWORD]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if name not in names and name not in {p.name for p in params}:
        raise TypeError(f"{type(transformer).__name__}.forward has no argument {name!r}")
    return names.index(name) if name in names else None


def _get(args, kwargs, name: str, slot: int | None):
    if name in kwargs:
        return kwargs[name]
    return args[slot] if slot is not None and slot < len(args) else None


def time_hook(transformer: nn.Module, tables: RotaryTables, noise_timestep: float, data_timestep: float = 0.0):
    """A forward pre-hook writing the noise level ``max((timestep - data_timestep) / (noise_timestep - data_timestep))``
    into ``tables.time`` (torch ops: no host sync); ``data_timestep`` is the timestep of clean data (0, or 1 for the
    models whose time runs from noise at 0 to data at 1).

    The batch (both halves of guidance) shares the step's time; per-token timesteps (Wan 2.2) give their
    maximum, the noised tokens'. A forward without ``timestep`` is refused: the scaling would have no time.
    """
    slot = _slot(transformer, "timestep")

    def hook(module, args, kwargs):
        timestep = _get(args, kwargs, "timestep", slot)
        if timestep is None:
            raise ValueError("a time-dependent scaling reads each forward's `timestep`; this forward got none")
        span = noise_timestep - data_timestep
        level = ((torch.as_tensor(timestep).detach().to(torch.float64) - data_timestep) / span).amax()
        tables.time.copy_(level.to(tables.time.device))

    return transformer.register_forward_pre_hook(hook, with_kwargs=True)


def argument_hook(transformer: nn.Module, name: str, tables: RotaryTables, source: str):
    """A forward pre-hook replacing the forward argument ``name`` (the tables a pipeline passes in) by
    ``tables(argument source)``: for models whose tables come from outside (CogVideoX: from ``hidden_states``)."""
    slot, source_slot = _slot(transformer, name), _slot(transformer, source)

    def hook(module, args, kwargs):
        if _get(args, kwargs, name, slot) is None:  # the stock model would not rotate: neither do we
            return None
        new = tables(_get(args, kwargs, source, source_slot))
        if name in kwargs or slot is None or slot >= len(args):
            return args, {**kwargs, name: new}
        return (*args[:slot], new, *args[slot + 1 :]), kwargs

    return transformer.register_forward_pre_hook(hook, with_kwargs=True)
