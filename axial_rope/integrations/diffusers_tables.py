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
from dataclasses import dataclass

import torch
from torch import nn

from ..ops import rotation_tables
from ..ops.common import channel_table
from ..positions import grid, positions_for_size
from ..rope import AxialRoPE

__all__ = ["Sizing", "RotaryTables", "argument_hook", "time_hook", "flux_positions", "latent_grid"]


@dataclass(frozen=True)
class Sizing:
    """``mode`` per grid axis and the training token grid: each forward's positions and scaling come from
    :func:`axial_rope.positions_for_size` (grid axes: video ``(t, y, x)``, Flux ``(y, x)``)."""

    train_size: tuple[int, ...]
    mode: tuple[str, ...]


def latent_grid(latent_shape, patch: tuple[int, int, int], *, channels_first: bool = True) -> tuple:
    """The token grid ``(t, y, x)`` of a latent video ``[B, C, F, H, W]`` (``channels_first=False``:
    ``[B, F, C, H, W]``, CogVideoX), cut by ``patch`` as the model's patch embedding cuts it. Symbolic sizes stay
    symbolic."""
    frames, height, width = (latent_shape[2], latent_shape[3], latent_shape[4]) if channels_first else (
        latent_shape[1], latent_shape[3], latent_shape[4])  # fmt: skip
    p_t, p_h, p_w = patch
    return -(-frames // p_t), height // p_h, width // p_w


def flux_positions(ids: torch.Tensor, rope: AxialRoPE, sizing: Sizing | None) -> tuple[torch.Tensor, tuple]:
    """Flux ids ``[S, 3]`` (index, y, x; text rows first) -> positions and scaling per axis.

    With ``sizing``, the image grid is ``max + 1`` of the integer y and x ids (one host read of the
    extent, so a sized Flux forward is not captured whole by ``torch.compile(fullgraph=True)``; a fixed
    ``scaling`` is), and each id ``i`` becomes the coordinate :func:`~axial_rope.positions_for_size`
    gives grid index ``i`` (text ids, 0, stay 0 in every mode allowed here).
    """
    pos = ids.float()
    if sizing is None:
        return pos, rope.scaling
    yx = pos[:, 1:].round().long()
    if bool((yx < 0).any()) or not torch.equal(yx.to(pos.dtype), pos[:, 1:]):
        raise ValueError("sizing Flux positions needs integer y/x ids >= 0 (an image grid)")
    h, w = (int(v) + 1 for v in yx.amax(0))
    sized = positions_for_size((h, w), sizing.train_size, sizing.mode, dtype=pos.dtype, device=pos.device)
    axes = sized.pos.view(h, w, 2)
    sized_pos = torch.stack([pos[:, 0], axes[:, 0, 0][yx[:, 0]], axes[0, :, 1][yx[:, 1]]], dim=-1)
    return sized_pos, (None, *sized.scaling)


def grid_positions(sizes: tuple, rope: AxialRoPE, sizing: Sizing | None, device) -> tuple[torch.Tensor, tuple]:
    """A token grid ``(t, y, x)`` -> positions ``[t y x, 3]`` and scaling per axis (sized, or the rope's own)."""
    if sizing is None:
        return grid(*sizes, device=device), rope.scaling
    sized = positions_for_size(sizes, sizing.train_size, sizing.mode, device=device)
    return sized.pos, sized.scaling


class RotaryTables(nn.Module):
    """The tables a diffusers transformer's rotary module returns, computed by ``rope`` (scaled, sized, timed).

    Args:
        rope: the rotary layout (axes, theta, scaling) of the model, interleaved as diffusers' tables.
        positions: ``(rope, sizing, *inputs) -> (pos [S, 3], scaling per axis)`` from the replaced module's inputs.
        layout: ``(cos, sin) [S, D] -> what the replaced module returns`` (e.g. Wan's ``[1, S, 1, D]``).
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

    def tables(self, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin ``[S, D]``, interleaved, attention factor included."""
        pos, scaling = self.positions(self.rope, self.sizing, *inputs)
        rotation = self.rope.rotation(pos, scaling=scaling, t=self.time if self.time_dependent else None)
        return rotation_channel_tables(rotation)

    def forward(self, *inputs):
        return self.layout(*self.tables(*inputs))

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


def time_hook(transformer: nn.Module, tables: RotaryTables, noise_timestep: float):
    """A forward pre-hook writing ``max(timestep) / noise_timestep`` into ``tables.time`` (torch ops: no host sync).

    The batch (both halves of guidance) shares the step's time; per-token timesteps (Wan 2.2) give their
    maximum, the noised tokens'. A forward without ``timestep`` is refused: the scaling would have no time.
    """
    slot = _slot(transformer, "timestep")

    def hook(module, args, kwargs):
        timestep = _get(args, kwargs, "timestep", slot)
        if timestep is None:
            raise ValueError("a time-dependent scaling reads each forward's `timestep`; this forward got none")
        level = torch.as_tensor(timestep).detach().to(torch.float64).amax() / noise_timestep
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
