"""Run the RoPE of diffusers' video, image and audio transformers through axial_rope, scaled for other sizes.

``set_rope_processors(transformer)`` adapts any class in :data:`SUPPORTED`: every diffusers class that a family
record of :mod:`axial_rope.conventions` covers (one :class:`~axial_rope.conventions._registry.DiffusersFamily`
each; ``docs/integrations.md`` has their table and count, written from the records), through diffusers' own
extension points:

- **the tables** (with ``scaling`` or ``mode``): where the record says the model computes its rotary tables, ours
  are computed instead by :class:`~axial_rope.integrations.diffusers_tables.RotaryTables`, from the same input,
  with scaled frequencies or sized positions. A tables module (Flux ``pos_embed``, HunyuanVideo and Wan
  ``rope``, ...) stays in place, of its own class, and answers through diffusers' hook registry; a model method
  is shadowed on the instance; tables passed as a forward argument (CogVideoX's) are replaced by a forward
  pre-hook. Every attention processor downstream, stock or not, rotates by them.
- **the processors**: in the families whose record names one (Flux, HunyuanVideo, Wan, CogVideoX, LTX-Video),
  the stock attention processors of the rotary blocks are swapped, through ``set_attn_processor``, for
  processors that rotate by the tables passed in on axial_rope's backends (fused Triton kernels on GPU); other
  processors (IP-adapter, a user's) are left as they are, and rotate by the same tables.

Unscaled, the model keeps its own tables and the output equals the stock model's. Nothing is kept
between forwards: positions and tables are computed inside each forward from its inputs, so the
adapted model compiles (fullgraph, regional, dynamic sizes), exports and checkpoints activations
as the stock one does. A scaling that could not act is refused at installation, with the reason (an axis with
no channels, a mode the family's positions make void, any scaling of a family whose tables are the model's own).

A time-dependent scaling (:mod:`axial_rope.time_scaling`: ``DyPE``, ``TimeAwareNTK``) reads the
sampling time from the transformer's own ``timestep`` argument, in a pre-hook, so the pipeline
needs no extra call per step: ``t = max(timestep) / noise_timestep``, where ``noise_timestep`` is the
timestep of pure noise. Flux: 1 (``FluxPipeline`` passes ``timestep = sigma``, the transformer
multiplies by 1000 itself); HunyuanVideo, Wan: 1000 (flow-match ``timesteps = 1000 sigma``; Wan 2.2's
per-token timesteps give their maximum, the noised tokens'); CogVideoX: 1000 (its DDIM/DPM step
index over ``num_train_timesteps``: a time fraction, not a flow sigma).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..conventions._registry import DIFFUSERS, DiffusersFamily, diffusers_family
from ..conventions._tables import Sizing
from ..ops import BACKENDS
from ..positions import POSITION_MODES
from ..scaling import RIFLEx, Scaling
from .diffusers_ltx import LTXVideoRopeProcessor
from .diffusers_processors import (
    CogVideoXRopeProcessor,
    FluxRopeProcessor,
    HunyuanVideoRopeProcessor,
    WanRopeProcessor,
)
from .diffusers_tables import RotaryTables, answer_with, argument_hook, grid_hook, time_hook

__all__ = ["set_rope_processors", "remove_rope_processors", "RopeProcessors", "SUPPORTED"]

_ATTR = "_axial_rope_processors"  # where the handle lives on the transformer instance
_TABLES = "_axial_rope_tables"  # the tables module standing in for a model method or feeding the blocks' argument
# axial_rope's processors, by the name a family record gives
_PROCESSORS = {cls.__name__: cls for cls in (FluxRopeProcessor, HunyuanVideoRopeProcessor, WanRopeProcessor,
                                             CogVideoXRopeProcessor, LTXVideoRopeProcessor)}  # fmt: skip

SUPPORTED = tuple(sorted(DIFFUSERS))  # every class a record in axial_rope.conventions covers


class RopeProcessors:
    """Handle of an installed adaptation; :meth:`remove` restores the stock model.

    Attributes:
        rope: the :class:`~axial_rope.AxialRoPE` of the model (scaled as installed).
        tables: the :class:`~axial_rope.integrations.diffusers_tables.RotaryTables` computing the tables
            (``None`` unscaled: the model's own tables).
        names: the processor names (keys of ``transformer.attn_processors``) that were replaced.
        hooks: the forward pre-hooks installed on the transformer (the sampling time; CogVideoX's tables).
    """

    def __init__(self, transformer, rope, tables, originals: dict, names: list[str], hooks: list, undo=None):
        self.transformer, self.rope, self.tables, self.hooks = transformer, rope, tables, hooks
        self.originals = originals  # every processor before installation, by name ({}: none replaced)
        self.names = names
        self._undo = undo or []  # per tables site, what puts the stock one back (run in reverse order)

    def remove(self) -> None:
        """Put the stock tables module and processors back and drop the hooks (idempotent).

        A processor replaced since installation (``fuse_qkv_projections()``, ``set_attn_processor``) is
        left as it is now: only processors that are still ours go back to the originals.
        """
        if getattr(self.transformer, _ATTR, None) is not self:
            return
        if self.names:  # a family without processors of ours (and a model without attn_processors) has none
            current = dict(self.transformer.attn_processors)
            ours = {name: self.originals[name] for name in self.names if _is_ours(current[name])}
            current.update(ours)
            self.transformer.set_attn_processor(current)
        for hook in self.hooks:
            hook.remove()
        for undo in reversed(self._undo):
            undo()
        if _TABLES in self.transformer._modules:  # the method's stand-in, the blocks' tables
            delattr(self.transformer, _TABLES)
        delattr(self.transformer, _ATTR)


def _is_ours(processor) -> bool:
    return type(processor).__module__.startswith("axial_rope.")


def set_rope_processors(
    transformer: torch.nn.Module,
    *,
    scaling: Scaling | None | Sequence[Scaling | None] = None,
    mode: str | Sequence[str] | None = None,
    train_size: Sequence[int] | None = None,
    backend: str | None = None,
    noise_timestep: float | None = None,
) -> RopeProcessors:
    """Run the transformer's RoPE through axial_rope: fast processors, and scaled tables where asked.

    Args:
        transformer: an instance of a class in :data:`SUPPORTED`.
        scaling: ``None`` (output equals the stock model's), one method of
            :mod:`axial_rope.scaling` for every axis, or a tuple with one per axis in the
            model's axis order (Flux: ``(text/reference index, y, x)``; video: ``(t, y, x)``),
            e.g. ``(RIFLEx(k=4, test_length=40), None, None)``. A time-dependent method
            (:mod:`axial_rope.time_scaling`, e.g. ``(None, DyPE(4.0, 64), DyPE(4.0, 64))`` for Flux at
            4x its 64-token grid) follows each forward's ``timestep`` (see ``noise_timestep``).
        mode: instead of a fixed ``scaling``, size every forward's token grid against the grid the
            model was trained at (``train_size``): one of :data:`axial_rope.POSITION_MODES` (or one per
            grid axis), applied by :func:`axial_rope.positions_for_size`, so a forward at twice the
            training resolution gets, e.g., interpolated positions or per-axis YaRN. Grid axes:
            video ``(t, y, x)``; Flux ``(y, x)`` of the image ids (``"normalize"`` is refused for Flux:
            it would move the text ids off 0).
        train_size: the training token grid, ``(t, y, x)`` (video) or ``(y, x)`` (Flux), with ``mode``; a
            family with one grid axis (Mochi's time, the audio models' sequence) gives ``(n,)``, the tokens its
            rope counts (a prepended global, memory or timestep token included). A forward at that grid equals
            the stock model; nothing else can check it (no config records the training resolution:
            ``docs/integrations.md``, "`train_size` counts tokens").
        backend: axial_rope backend (``None`` automatic, ``"torch"``, ``"triton"``, ``"reference"``).
        noise_timestep: with a time-dependent scaling, the transformer's ``timestep`` at pure noise:
            the sampling time is ``max((timestep - clean) / (noise_timestep - clean))``, ``clean`` the family's
            ``clean_timestep`` (0; 1 where time runs from noise at 0 to clean at 1: Lumina, MiniMax). Default:
            the family's (Flux 1, the others 1000; Lumina 0; the module docstring lists why).

    Returns:
        A :class:`RopeProcessors` handle; ``handle.remove()`` (or
        :func:`remove_rope_processors`) restores the stock model.

    Raises:
        TypeError: for any other model (the message lists the supported classes).
        ValueError: for an unknown ``backend``, a ``scaling`` that does not fit the model's axes (or any
            ``scaling`` of a family without per-axis spectra, an attention factor where the tables are angles),
            a bad ``mode`` (one the family cannot take, or one its positions make void: the record's
            ``refused_modes``) or ``train_size``, a scaling on an axis with no channels, and any scaling, mode or
            ``train_size`` of a family served unscaled only (tables ``"fixed"``).
    """
    family = diffusers_family(transformer)
    if backend not in (None, *BACKENDS):
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    name = type(transformer).__name__
    if not family.scalable and (scaling is not None or mode is not None or train_size is not None):
        raise ValueError(
            f"{name} ({family.name}) is served unscaled only: its processors rotate by the model's own tables, which "
            "the adapter does not replace, so a scaling, mode or train_size could not act; leave them unset, got "
            f"scaling={scaling!r}, mode={mode!r}, train_size={train_size!r}"
        )
    sizing = _sizing(family, mode, train_size, scaling)
    if not family.spectrum and scaling is not None:
        modes = [m for m in ("interpolate", "none", "normalize") if m not in dict(family.refused_modes)]
        raise ValueError(
            f"{name} ({family.name}) turns by learned or per-head frequencies, no per-axis spectrum: the scaling "
            f"methods do not apply; size positions with mode={modes[0]!r} (or {', '.join(map(repr, modes[1:]))}) "
            "instead"
        )
    rope = family.rope(transformer.config)
    widths = None if family.widths is None else tuple(family.widths(transformer.config))
    columns = None if widths is None or all(widths) else tuple(a for a, d in enumerate(widths) if d)
    if scaling is not None:
        rope = _scaled(family, rope, scaling, name, widths)
    if not family.amplitude and rope.scaled:
        raise ValueError(
            f"{name} ({family.name}) takes its tables as angles, which carry no amplitude: a scaling with an "
            f"attention factor ({rope.scaling}) cannot be served; use one without (Linear, NTK, ...)"
        )
    rope.backend = backend
    clean = family.clean_timestep
    if noise_timestep is not None and (
        not rope.time_dependent or not (noise_timestep - clean) * (family.noise_timestep - clean) > 0
    ):
        side = "> 0" if clean == 0 else f"on the side of {family.noise_timestep} from the clean {clean}"
        raise ValueError(f"noise_timestep ({side}) goes with a time-dependent scaling, got {noise_timestep!r}")
    previous = getattr(transformer, _ATTR, None)
    if previous is not None:  # re-install from the stock model, not on top of ours
        previous.remove()

    device = next(iter(transformer.parameters())).device
    rope = rope.to(device)
    scaled = sizing is not None or any(s is not None for s in rope.scaling)
    tables, hooks, undo = None, [], []
    if scaled:
        where, attr = family.tables
        config = transformer.config
        by_grid = sizing is not None and family.grid is not None
        # the record's tables module, then (LTX-2) the model's further ones: each its own rope, positions and layout
        made = [(rope, family.positions(config), family.layout, attr,
                 None if family.frequencies is None else family.frequencies(config))]  # fmt: skip
        for producer in family.producers:
            more = producer.rope(config) if scaling is None else _scaled(family, producer.rope(config), scaling, name)
            more.backend = backend
            made.append((more.to(device), producer.positions(config), producer.layout, producer.tables[1], None))
        built = []  # (attribute, its stock module or None, our tables)
        for rope_of, positions, layout, attribute, frequencies in made:
            stock = getattr(transformer, attribute) if where == "module" else None
            built.append((attribute, stock, RotaryTables(
                rope_of, positions, layout, sizing, time_dependent=rope_of.time_dependent, stock=stock,
                grid_axes=len(family.grid_axes) if by_grid else 0, frequencies=frequencies, columns=columns,
            ).to(device)))  # fmt: skip
        tables = built[0][2]
        every = [t for _, _, t in built]
        if rope.time_dependent:  # registered first (hooks run in order): the time is set before the tables
            noise = family.noise_timestep if noise_timestep is None else noise_timestep
            hooks.append(time_hook(transformer, every, noise, clean, family.timestep))
        if by_grid:  # the grid of the whole forward, for every call of the tables modules
            names, read = family.grid
            hooks.append(grid_hook(transformer, every, names, read(config)))
        if where == "module":
            for attribute, stock, ours in built:
                undo.append(_stand_in(transformer, attribute, stock, ours))
        elif where == "method":  # a model method computes them: an instance attribute shadows it
            transformer.add_module(_TABLES, tables)  # a submodule, so .to() and compile see it
            object.__setattr__(transformer, attr, tables)
            undo.append(lambda: transformer.__dict__.pop(attr))  # the class's method is found again
        elif where == "block argument":  # each rotary block takes them as an argument: a pre-hook per block
            transformer.add_module(_TABLES, tables)
            for block in _rotary_blocks(transformer, family.blocks):
                hooks.append(argument_hook(block, attr, tables, "hidden_states"))
        else:
            hooks.append(argument_hook(transformer, attr, tables, "hidden_states"))

    originals, names = {}, []
    if family.processor is not None:  # else the stock processors stay (the model may not even list them)
        originals = dict(transformer.attn_processors)
        # exact types: a subclass (e.g. a user's processor) may do more than the stock one; it stays, and rotates
        # by the same tables
        names = [n for n in originals if n.startswith(family.blocks) and type(originals[n]).__name__ in family.stock]
        ours = _PROCESSORS[family.processor]
        new = {n: ours(backend, originals[n]) if n in names else p for n, p in originals.items()}
        transformer.set_attn_processor(new)
    handle = RopeProcessors(transformer, rope, tables, originals, names, hooks, undo)
    setattr(transformer, _ATTR, handle)
    return handle


def _stand_in(transformer: torch.nn.Module, attribute: str, stock, ours: RotaryTables):
    """Our tables in place of the stock tables module ``transformer.<attribute>``; returns the undo. A module stays,
    of its own class (code may inspect it: ``isinstance(model.pos_embed, QwenEmbedLayer3DRope)``), and answers
    through diffusers' hook registry; a plain object (Z-Image's ``RopeEmbedder``, which no hook reaches) is replaced
    by ours."""
    if isinstance(stock, torch.nn.Module):
        return answer_with(stock, ours)
    setattr(transformer, attribute, ours)

    def undo() -> None:
        delattr(transformer, attribute)  # our module goes; the plain object is set again
        setattr(transformer, attribute, stock)

    return undo


def _rotary_blocks(transformer: torch.nn.Module, prefixes: tuple[str, ...]) -> list[torch.nn.Module]:
    """The blocks the processor prefixes name (``"layers."``: ``layers.0``, ``layers.1``, ...)."""
    return [
        m for n, m in transformer.named_modules() if any(n.startswith(p) and n[len(p) :].isdigit() for p in prefixes)
    ]


def _axis_names(family: DiffusersFamily, n_axes: int) -> tuple[str, ...]:
    if n_axes == 1 and family.time_axis == 0:
        return ("t",)
    if n_axes == 3 and family.time_axis == 0:
        return ("t", "y", "x")
    if n_axes == 3 and family.grid_axes == (1, 2):
        return ("index", "y", "x")
    return ("y", "x") if n_axes == 2 else tuple(f"axis {a}" for a in range(n_axes))


def _scaled(family: DiffusersFamily, rope, scaling, name: str, widths: tuple[int, ...] | None = None):
    """``rope`` with ``scaling`` (one method, or one per axis), or a ``ValueError`` naming the family and the axis.

    ``widths``: the channels of each position column where one may have none (the rope then turns by the others
    only): a per-axis ``scaling`` names every column, and one of width 0 must be ``None`` (nothing turns by it)."""
    words = _axis_names(family, rope.n_axes if widths is None else len(widths))
    kept = tuple(range(len(words))) if widths is None else tuple(a for a, d in enumerate(widths) if d)
    if widths is not None and isinstance(scaling, (list, tuple)):
        if len(scaling) != len(widths):
            raise ValueError(f"{name} ({family.name}: axes {words}): scaling needs one method (or None) per axis "
                             f"({len(widths)}), got {len(scaling)}")  # fmt: skip
        for a, d in enumerate(widths):
            if not d and scaling[a] is not None:
                raise ValueError(
                    f"{name} ({family.name}): axis {a} ({words[a]}) has no channels (widths {widths}): nothing turns "
                    f"by it, so the scaling {scaling[a]!r} cannot act there; pass None for it"
                )
        scaling = tuple(scaling[a] for a in kept)
    try:
        methods = rope._methods(scaling)
    except ValueError as err:
        raise ValueError(f"{name} ({family.name}: axes {words}): {err}") from err
    for a, method in zip(kept, methods):
        if isinstance(method, RIFLEx) and family.time_axis != a:
            what = "has no time axis" if family.time_axis is None else f"has its time on axis {family.time_axis}"
            raise ValueError(
                f"{name} ({family.name}) {what}: RIFLEx (a temporal method) cannot scale its axis {a} ({words[a]})"
            )
    try:
        return rope.with_scaling(scaling)
    except ValueError as err:
        raise ValueError(f"{name} ({family.name}: axes {words}): {err}") from err


def _sizing(family: DiffusersFamily, mode, train_size, scaling) -> Sizing | None:
    """The per-forward sizing of ``mode`` and ``train_size``, checked; ``None`` without ``mode``."""
    if mode is None:
        if train_size is not None:
            raise ValueError("train_size goes with mode (how to size positions against it)")
        return None
    if scaling is not None:
        raise ValueError("pass either scaling (fixed per-axis methods) or mode (sized per forward), not both")
    n_axes = len(family.grid_axes)
    if not n_axes:
        raise ValueError(
            f"{family.name}'s positions are coordinates its pipeline computes, not a token grid that mode could size: "
            "pass scaling (per-axis methods) instead"
        )
    modes = (mode,) * n_axes if isinstance(mode, str) else tuple(mode)
    if len(modes) != n_axes or any(m not in POSITION_MODES for m in modes):
        raise ValueError(f"mode must be one of {POSITION_MODES} or one per grid axis ({n_axes}), got {mode!r}")
    for m in modes:
        why = dict(family.refused_modes).get(m)
        if why is not None:
            raise ValueError(f"{family.name} refuses mode {m!r}: {why}")
    if family.grid_axes != tuple(range(n_axes)) and "normalize" in modes:  # an id axis (text, index) stays
        raise ValueError(
            f"{family.name} refuses mode 'normalize': it would centre the image grid while the rows outside it "
            "(text, other images) keep their ids on the same axes; use 'interpolate', 'ntk' or 'yarn'"
        )
    refused = ("ntk", "yarn") if not family.spectrum else ("yarn",) if not family.amplitude else ()
    if set(modes) & set(refused):
        why = "has no per-axis spectrum to scale" if not family.spectrum else "takes angles (no attention factor)"
        raise ValueError(f"{family.name} {why}: mode {mode!r} is refused; use 'interpolate', 'none' or 'normalize'")
    axes = {3: "(t, y, x)", 2: "(y, x)"}.get(n_axes, "(t)" if family.time_axis in family.grid_axes else "(axis)")
    sizes = None if train_size is None or isinstance(train_size, (str, bytes)) else tuple(train_size)
    if (
        sizes is None
        or len(sizes) != n_axes
        or any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in sizes)
    ):
        raise ValueError(
            f"mode needs train_size, the training token grid {axes}: {n_axes} positive ints, got {train_size!r}"
        )
    return Sizing(sizes, modes)


def remove_rope_processors(transformer: torch.nn.Module) -> None:
    """Restore what :func:`set_rope_processors` replaced.

    Raises:
        ValueError: if no axial_rope processors are installed on ``transformer``.
    """
    handle = getattr(transformer, _ATTR, None)
    if handle is None:
        raise ValueError(f"no axial_rope processors are installed on this {type(transformer).__name__}")
    handle.remove()
