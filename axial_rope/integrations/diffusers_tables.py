"""The rotary tables of a diffusers transformer, computed by axial_rope: the module that replaces its producer.

Most diffusers transformers compute their rotary tables once per forward, in one module (Flux's
``pos_embed(ids)``, HunyuanVideo's and Wan's ``rope(hidden_states)``), and pass them to every
attention processor as ``image_rotary_emb``. :class:`RotaryTables` takes that module's place: it
reads the same input, computes positions, scaling and tables with an :class:`~axial_rope.AxialRoPE`
inside the forward (tensor ops, symbolic sizes welcome), and returns the tables in the stock
layout. Every processor downstream, stock or not, then rotates by scaled tables as the model
passes them: no side channel, nothing recorded between calls, so ``torch.compile`` (fullgraph,
regional, dynamic sizes) and ``torch.export`` see the whole rotation.

Where it is installed (the stock module answering through its hook, a shadowed method, a replaced argument) is
:mod:`~axial_rope.integrations.diffusers_sites`' business. A time-dependent scaling reads the sampling time from the
transformer's own ``timestep``: before each forward the installation writes its noise level into the tables
module's ``time`` buffer (an in-place copy into a buffer, which compile and export trace as they do a KV cache's).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import torch
from torch import nn

from ..conventions.tables import Sizing
from ..ops import channel_table, rotation_tables
from ..rope import AxialRoPE

__all__ = ["RotaryTables", "forward_argument", "replace_argument", "rotation_channel_tables"]

class RotaryTables(nn.Module):
    """The tables a diffusers transformer's rotary module returns, computed by ``rope`` (scaled, sized, timed).

    Args:
        rope: the rotary layout (axes, theta, scaling) of the model, interleaved as diffusers' tables.
        positions: ``(rope, sizing, *inputs, **kwargs) -> (pos, scaling per axis, *context)`` from the replaced
            module's inputs (positional or by keyword, as the model passes them): ``pos`` ``[S, A]`` (one table for
            the batch) or ``[B, S, A]`` (one per item); ``context``, optional, is whatever the layout needs besides
            the tables (a split point, lengths, the module's inputs themselves for a grid-shaped output).
        layout: ``(cos, sin, *context) -> what the replaced module returns``, from ``[S, D]`` (``[B, S, D]``)
            tables (e.g. Wan's ``[1, S, 1, D]``).
        sizing: per-forward sizing (``mode``, ``train_size``), or ``None``.
        time_dependent: hold the sampling time in the ``time`` buffer (set before each forward by the installation: :func:`~axial_rope.integrations.diffusers_sites.time_step`).
        stock: the module replaced (kept to be put back, not a submodule: the state dict is unchanged);
            its attributes stay readable here (``transformer.rope.patch_size``), as code reading them expects.
        grid_axes: hold this forward's token grid (``grid_axes`` extents, set by :func:`~axial_rope.integrations.diffusers_sites.grid_step`) in the
            ``grid`` buffer, and size by it (``sizing.grid``): for models computing their tables in several calls.
        frequencies: ``(*inputs, **kwargs) -> F`` (``[A, n]`` or per head ``[H, A, n]``): the frequency matrix the
            replaced module receives (a learned weight), used in place of the rope's; ``None``: the rope's.
        columns: the columns of ``pos`` the rope turns by, where others have no channels (an unrotated axis, e.g.
            ``axes_dims_rope=(0, 4, 4)``); ``None``: every column.
        untwisting: Untwisting RoPE (:class:`~axial_rope.methods.Untwisting`) on the reference keys that
            ``references`` (``pos -> bool [..., S]``) marks, over the planes ``bands``
            (:func:`~axial_rope.methods.frequency_bands`, float64 ``[n]``): the output gains a last element, the keys'
            per-channel factor ``[S, D]`` (``[B, S, D]``; 1 off the reference rows), which our processors apply to the
            rotated keys (a per-plane scale commutes with the plane's turn).
    """

    def __init__(self, rope: AxialRoPE, positions: Callable, layout: Callable, sizing: Sizing | None = None,
                 *, time_dependent: bool = False, stock: object | None = None, grid_axes: int = 0,
                 frequencies: Callable | None = None, columns: tuple[int, ...] | None = None,
                 untwisting=None, references: Callable | None = None, bands: torch.Tensor | None = None):  # fmt: skip
        super().__init__()
        self.frequencies, self.columns = frequencies, columns
        self.untwisting, self.references = untwisting, references
        if untwisting is not None:  # float64 [n] (float32 where the rope's device has no float64), moved with .to()
            self.register_buffer("bands", bands.to(rope.freqs.device, rope.freqs.dtype), persistent=False)
        self.__dict__["stock"] = stock  # a module, or a plain object (Z-Image's RopeEmbedder)
        self.rope, self.positions, self.layout, self.sizing = rope, positions, layout, sizing
        self.time_dependent, self.sized_by_grid = time_dependent, bool(grid_axes)
        if time_dependent:  # the noise level of this forward, 0-d (written by the transformer's pre-hook); float32,
            # which every device has: the rope takes it to float64 where the device has that
            self.register_buffer("time", torch.ones((), dtype=torch.float32), persistent=False)
        if grid_axes:  # this forward's token grid, int64 [grid_axes] (written by the transformer's pre-hook)
            self.register_buffer("grid", torch.ones(grid_axes, dtype=torch.long), persistent=False)

    def tables(self, *inputs, **kwargs) -> tuple:
        """float32 cos and sin ``[S, D]`` (``[B, S, D]`` for positions per item) in the rope's pairing, attention
        factor included, then the positions' context (and, with ``untwisting``, the keys' factor last)."""
        sizing = self.sizing
        if sizing is not None and self.sized_by_grid:
            sizing = dataclasses.replace(sizing, grid=self.grid)
        pos, scaling, *context = self.positions(self.rope, sizing, *inputs, **kwargs)
        reference = None if self.untwisting is None else self.references(pos)  # bool [S] ([B, S]), before columns go
        if sizing is not None and isinstance(scaling, tuple) and len(scaling) == len(self.rope.scaling):
            # an axis the sizing leaves unscaled keeps the rope's own method (the policy's RIFLEx on time)
            scaling = tuple(s if s is not None else own for s, own in zip(scaling, self.rope.scaling))
        if self.columns is not None:  # the unrotated columns go: their scaling (sized) too; the rope's has none
            scaling = tuple(scaling[c] for c in self.columns) if len(scaling) == pos.shape[-1] else scaling
            pos = pos[..., list(self.columns)]
        rotation = self.rope.rotation(pos, scaling=scaling, t=self.time if self.time_dependent else None)
        if self.frequencies is not None:  # the model's own (learned) F, as this forward passes it
            rotation = rotation._replace(freqs=self.frequencies(*inputs, **kwargs), turns=None)
        tables = rotation_channel_tables(rotation, batched=pos.ndim == 3)
        if reference is not None:
            context = [*context, self._key_scale(reference, rotation.pairing)]
        return (*tables, *context)

    def _key_scale(self, reference: torch.Tensor, pairing: str) -> torch.Tensor:
        """Untwisting's factor of the keys, float32 ``[S, D]`` (``[B, S, D]``) in the pairing's channel layout."""
        s = self.untwisting.scale(self.bands, self.time if self.untwisting.scheduled else None)  # [n]
        factor = torch.where(reference[..., None], s, torch.ones_like(s))  # [S, n] ([B, S, n])
        return channel_table(factor, pairing).float()

    def forward(self, *inputs, **kwargs):
        if self.untwisting is None:
            return self.layout(*self.tables(*inputs, **kwargs))
        *tables, key_scale = self.tables(*inputs, **kwargs)
        return (*self.layout(*tables), key_scale)  # the stock tuple, then the keys' factor

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


def rotation_channel_tables(rotation, *, batched: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotation's float32 tables in its pairing's channel layout, ``[S, 2n]`` (one batch row of positions), or
    ``[B, S, 2n]`` with ``batched``."""
    cos, sin = rotation_tables(rotation, torch.float32)
    if not batched:
        cos, sin = cos[0], sin[0]
    return channel_table(cos, rotation.pairing), channel_table(sin, rotation.pairing)


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


def forward_argument(module: nn.Module, name: str) -> Callable[[tuple, dict], object]:
    """``(args, kwargs) -> module.forward``'s argument ``name`` as a call passes it (``None`` if absent); its slot is
    read here, once: compiled code cannot trace ``inspect``."""
    slot = _slot(module, name)
    return lambda args, kwargs: _get(args, kwargs, name, slot)


def replace_argument(module: nn.Module, name: str, tables: RotaryTables, source: str):
    """``(args, kwargs) -> (args, kwargs)`` of a call of ``module`` with its argument ``name`` (the tables a pipeline or
    a model function passes in) replaced by ``tables(argument source)``; ``None`` stays ``None`` (stock would not
    rotate either)."""
    slot, read_source = _slot(module, name), forward_argument(module, source)

    def step(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if _get(args, kwargs, name, slot) is None:
            return args, kwargs
        new = tables(read_source(args, kwargs))
        if name in kwargs or slot is None or slot >= len(args):
            return args, {**kwargs, name: new}
        return (*args[:slot], new, *args[slot + 1 :]), kwargs

    return step
