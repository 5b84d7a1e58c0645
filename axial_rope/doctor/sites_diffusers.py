"""The doctor's view of a diffusers transformer: the tables its family record says where to find.

A family record (:class:`~axial_rope.conventions.DiffusersFamily`) names where the model's tables come
from (a submodule, a model method, a forward argument, a block argument) and how to compute them from that
site's inputs: ``positions(config)`` gives the positions (and a context), ``layout`` lays channel tables out as
the site returns them. The doctor records each call of the site (an instance attribute standing in front of
the submodule or method for the forward, a forward pre-hook for an argument), and renders any rotation through
the same ``layout`` at the same inputs: the prescribed one and every alternative the diagnosis tries.
"""

from __future__ import annotations

import torch
from torch import nn

from ..conventions import diffusers_family
from ..ops import channel_table, rotation_tables
from .observe import Observation

__all__ = ["DiffusersSite", "family_axes"]


def _tensors(value) -> list[torch.Tensor]:
    """The tensors of a (nested) tables structure, float64 (complex128) copies, in order."""
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return [value.detach().cpu().to(torch.complex128)]
        return [value.detach().cpu().double()] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _on_cpu(value):
    """Tensors of a (nested) call's arguments on the CPU, where the records' ropes compute (the model may be on
    an accelerator, possibly without float64)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    return value


def _lowest_dtype(value) -> torch.dtype:
    dtypes = [t.real.dtype if t.is_complex() else t.dtype for t in _flat(value)]
    return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else torch.float32


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() or value.is_complex() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    return []


def family_axes(family, n: int):
    """The map's axes of a family record's rope of ``n`` axes: names, kinds (time, space; a lone non-time grid axis
    is a sequence) and the trained extent of each grid axis (the largest over the released checkpoints, tokens)."""
    from .extrapolation import MapAxes

    spatial = [a for a in family.grid_axes if a != family.time_axis]
    names, kinds = [], []
    for a in range(n):
        if a == family.time_axis:
            names.append("t"), kinds.append("time")
        elif a in spatial and len(spatial) == 2:
            names.append("yx"[spatial.index(a)]), kinds.append("space")
        elif a in spatial:
            names.append("sequence"), kinds.append("sequence")
        else:
            names.append(f"axis {a}"), kinds.append(None)
    trained = [None] * n
    for grid in (family.units.tokens(t.size) for t in family.trained):
        for a, extent in zip(family.grid_axes, grid):
            trained[a] = max(trained[a] or 0, extent)
    return MapAxes(tuple(names), tuple(trained), tuple(kinds), spectrum=family.spectrum)


class _Recorder:
    """Stands in front of a tables submodule or method for one forward: calls it and records the call."""

    def __init__(self, stock, calls: list, producer):
        self.stock, self.calls, self.producer = stock, calls, producer

    def __call__(self, *args, **kwargs):
        out = self.stock(*args, **kwargs)
        self.calls.append((self.producer, args, kwargs, out))
        return out

    def __getattr__(self, name):  # code reading the stock module's attributes (rope.patch_size) still sees them
        return getattr(self.stock, name)


class DiffusersSite:
    """A diffusers transformer's tables sites, from its family record."""

    source = "diffusers"

    def __init__(self, model: nn.Module, config=None, example_inputs=None):
        self.model = model
        self.family = diffusers_family(model)  # TypeError naming the served classes
        self.config = config if config is not None else model.config
        if example_inputs is None:
            raise ValueError(
                f"a {type(model).__name__} forward needs the pipeline's inputs (latents, text states, timestep, ids): "
                "pass example_inputs= (a dict of one forward's keyword arguments at a small size)"
            )
        self.inputs = example_inputs
        family, config = self.family, self.config
        self.unobservable = None
        if family.positions is None:
            self.unobservable = (f"{type(model).__name__} ({family.name}) rotates by fixed tables its record does not "
                                 "derive from inputs: not observed")  # fmt: skip
        own = None if family.frequencies is None else family.frequencies(config)
        self.producers = [(family.tables[1], family.rope(config), family.positions, family.layout, own)]
        self.producers += [(p.tables[1], p.rope(config), p.positions, p.layout, None) for p in family.producers]
        self.producers = [(a, r, None if p is None else p(config), lay, f) for a, r, p, lay, f in self.producers]

    def prescribed(self) -> dict[str, str]:
        return {f"{self.family.name}: {attr}": f"AxialRoPE({rope.extra_repr()})"
                for attr, rope, *_ in self.producers}  # fmt: skip

    def axes(self):
        return family_axes(self.family, self.producers[0][1].n_axes)

    def describe_sites(self) -> list[str]:
        return [f"{self.family.tables[0]} {attr}" for attr, *_ in self.producers]

    def run(self, forward) -> list[Observation]:
        if self.unobservable is not None:
            return []
        kind, attr = self.family.tables
        calls, undo = [], []
        if kind in ("module", "method"):
            for producer in self.producers:
                name = producer[0]
                held = self.model.__dict__.get(name)
                object.__setattr__(self.model, name, _Recorder(getattr(self.model, name), calls, producer))
                undo.append((name, held))
        else:
            targets = [self.model] if kind == "argument" else [
                m for n, m in self.model.named_modules()
                if any(n.startswith(p) and n[len(p):].isdigit() for p in self.family.blocks)]  # fmt: skip
            for target in targets:
                undo.append(target.register_forward_pre_hook(self._argument_hook(attr, calls), with_kwargs=True))
        try:
            forward(self.model, self.inputs)
        finally:
            for item in undo:
                if isinstance(item, tuple):
                    name, held = item
                    if held is None:
                        del self.model.__dict__[name]
                    else:
                        object.__setattr__(self.model, name, held)
                else:
                    item.remove()
        return [obs for i, call in enumerate(calls) if (obs := self._observation(call, i)) is not None]

    def _argument_hook(self, attr: str, calls: list):
        producer = self.producers[0]

        def hook(module, args, kwargs):
            tables = kwargs.get(attr)
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if tables is not None and hidden is not None:
                calls.append((producer, (hidden,), {}, tables))

        return hook

    def _observation(self, call, index: int) -> Observation | None:
        (attr, rope, positions, layout, frequencies), args, kwargs, out = call
        args, kwargs = _on_cpu(args), _on_cpu(kwargs)
        observed = _tensors(out)
        if not observed:
            return None
        pos, scaling, *context = positions(rope, None, *args, **kwargs)
        batched = pos.ndim == 3  # one table per sample
        pos = pos.double() if batched else pos.double()[None]
        rotation = rope.rotation(pos, scaling=scaling)
        learned = frequencies is not None
        if learned:  # the model's own (learned) F, as this forward hands it
            rotation = rotation._replace(freqs=frequencies(*args, **kwargs).detach().double(), turns=None)

        def render(rot) -> list[torch.Tensor]:
            cos, sin = rotation_tables(rot._replace(turns=None), torch.float64)
            cos, sin = channel_table(cos, rot.pairing), channel_table(sin, rot.pairing)
            if not batched:
                cos, sin = cos[0], sin[0]
            return _tensors(layout(cos, sin, *context))

        if self.family.tables[0] == "argument":  # a pipeline's lookup table: the rows the model reads
            observed = _cropped(_tensors(_looked_up(out)), render(rotation))
        own = scaling == rope.scaling
        return Observation(f"{attr}", rope, pos, rotation, observed, _lowest_dtype(out), render,
                           learned=learned, layout=type(out).__name__, wrap=not self.family.amplitude,
                           scaling=None if own else scaling)  # fmt: skip


def _looked_up(tables):
    """A pipeline's ``(tables per axis, index per axis)`` (Allegro's ``get_3d_rotary_pos_embed_allegro``: per axis
    ``(cos, sin)`` rows and ``[A, 1, S]`` token rows) as the rows each token reads; other structures as they are."""
    if (isinstance(tables, tuple) and len(tables) == 2 and isinstance(tables[1], torch.Tensor)
            and not tables[1].is_floating_point() and tables[1].ndim == 3):  # fmt: skip
        per_axis, index = tables
        return tuple(tuple(t[index[a, 0]] for t in pair) for a, pair in enumerate(per_axis))
    return tables


def _cropped(observed: list[torch.Tensor], rendered: list[torch.Tensor]) -> list[torch.Tensor]:
    """A pipeline's larger grid (Lumina-Next's ``[384, 384, D/2]``, which the model slices) cut to the rendered
    extent, where it is larger on every axis."""
    if len(observed) != len(rendered):
        return observed
    out = []
    for a, b in zip(observed, rendered):
        if a.ndim == b.ndim and all(x >= y for x, y in zip(a.shape, b.shape)):
            a = a[tuple(slice(0, y) for y in b.shape)]
        out.append(a)
    return out
