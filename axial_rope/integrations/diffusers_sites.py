"""Where a diffusers transformer's rotary tables come from, each kind of place a class that installs the adapter's
tables there and returns its undo; and the one diffusers hook that holds an installation together.

A family record names its tables site as ``(kind, name)`` (:class:`~axial_rope.conventions.DiffusersFamily`
``tables``); :data:`SITES` maps each kind to its class, so a new kind of site is one new class here:

- :class:`ModuleSite` ``("module", attr)``: a submodule computes the tables each forward (Flux ``pos_embed``, Wan
  ``rope``); it stays in place and answers with ours through its own diffusers hook (a plain object that is not a
  module, Z-Image's ``RopeEmbedder``, is replaced instead);
- :class:`MethodSite` ``("method", name)``: a method of the model computes them; an instance attribute shadows it;
- :class:`ArgumentSite` ``("argument", name)``: the pipeline passes them to ``forward``; the installation's hook
  replaces the argument before each forward;
- :class:`BlockArgumentSite` ``("block argument", name)``: each rotary block takes them as an argument, computed in
  a plain function; a hook per block replaces it;
- :class:`FixedSite` ``("fixed", attr)``: the model's own tables only (nothing to install).

:class:`RopeAdapterHook` is the installation itself: a ``diffusers.hooks.ModelHook`` named :data:`HOOK` on the
transformer's ``HookRegistry``. Registering it installs every part (sites, processors) and removing it, through
``handle.remove()`` or diffusers' own ``HookRegistry.remove_hook(HOOK)``, undoes each part in reverse order. Its
``pre_forward`` runs the per-forward steps (the sampling time, the forward's grid, an argument's tables) before the
model computes anything, so they compose with diffusers' other hooks (caches, offloading, casting, context
parallel) as those compose with each other.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from .diffusers_tables import RotaryTables, forward_argument, replace_argument

__all__ = ["HOOK", "SITES", "ArgumentSite", "BlockArgumentSite", "FixedSite", "MethodSite", "ModuleSite",
           "RopeAdapterHook", "Site"]  # fmt: skip

HOOK = "axial_rope"  # the installation's hook on the transformer, and every site hook it registers
CHILD = "_axial_rope_tables"  # our tables module, where it is a child of the transformer or of the stock module

Undo = Callable[[], None]
Step = Callable[[tuple, dict], tuple[tuple, dict]]  # (args, kwargs) of the transformer's forward -> new ones


class Site:
    """Where a family's tables come from: ``install(transformer, tables) -> undo``, plus an optional per-forward
    step on the transformer's arguments (:meth:`step`)."""

    kind = ""

    def __init__(self, name: str, blocks: tuple[str, ...] = ()):
        self.name, self.blocks = name, blocks

    def install(self, transformer: nn.Module, tables: RotaryTables) -> Undo:
        raise NotImplementedError

    def step(self, transformer: nn.Module, tables: RotaryTables) -> Step | None:
        """What runs before each forward of the transformer (``None``: nothing)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _child(parent: nn.Module, tables: RotaryTables) -> Undo:
    """``tables`` as ``parent``'s child :data:`CHILD` (so ``.to()``, offloading and compile see it; its buffers are
    non-persistent: the state dict is unchanged)."""
    parent.add_module(CHILD, tables)
    return lambda: parent._modules.pop(CHILD, None)


class _Answer(ModelHook):
    """``new_forward`` stands for a stock tables module's forward: our tables answer the same call."""

    def __init__(self, tables: RotaryTables):
        super().__init__()
        self.tables = tables

    def new_forward(self, module: nn.Module, *args, **kwargs):
        return self.tables(*args, **kwargs)


class _ReplaceArgument(ModelHook):
    """A block's hook: its argument ``name`` becomes ``tables(source)`` (``None`` stays ``None``: stock would not
    rotate either)."""

    def __init__(self, block: nn.Module, name: str, tables: RotaryTables, source: str = "hidden_states"):
        super().__init__()
        self.step = replace_argument(block, name, tables, source)

    def pre_forward(self, module: nn.Module, *args, **kwargs):
        return self.step(args, kwargs)


def _register(module: nn.Module, hook: ModelHook) -> Undo:
    registry = HookRegistry.check_if_exists_or_initialize(module)
    registry.register_hook(hook, HOOK)
    return lambda: registry.remove_hook(HOOK, recurse=False)


class ModuleSite(Site):
    """``transformer.<name>`` computes the tables: it keeps its place, class and state (code may inspect it:
    ``isinstance(model.pos_embed, QwenEmbedLayer3DRope)``) and answers through its own hook; our tables are its
    child. A plain object (no hook reaches it) is replaced by our tables and set again by the undo."""

    kind = "module"

    def install(self, transformer: nn.Module, tables: RotaryTables) -> Undo:
        stock = getattr(transformer, self.name)
        if isinstance(stock, nn.Module):
            undo_child, undo_hook = _child(stock, tables), _register(stock, _Answer(tables))
            return lambda: (undo_hook(), undo_child())
        setattr(transformer, self.name, tables)

        def undo() -> None:
            delattr(transformer, self.name)  # our module goes; the plain object is set again
            setattr(transformer, self.name, stock)

        return undo


class MethodSite(Site):
    """A method of the model computes the tables: our tables, a child of the transformer, shadow it on the
    instance; the undo lets the class's method be found again."""

    kind = "method"

    def install(self, transformer: nn.Module, tables: RotaryTables) -> Undo:
        undo_child = _child(transformer, tables)
        object.__setattr__(transformer, self.name, tables)
        return lambda: (transformer.__dict__.pop(self.name, None), undo_child())


class ArgumentSite(Site):
    """The pipeline passes the tables as the forward argument ``name``: before each forward they are replaced by
    ours, computed from the forward's ``hidden_states``."""

    kind = "argument"

    def install(self, transformer: nn.Module, tables: RotaryTables) -> Undo:
        return _child(transformer, tables)

    def step(self, transformer: nn.Module, tables: RotaryTables) -> Step:
        return replace_argument(transformer, self.name, tables, "hidden_states")


class BlockArgumentSite(Site):
    """Each rotary block (the modules whose names the record's processor prefixes give: ``layers.0``, ...) takes the
    tables as its argument ``name``: a hook per block replaces it with ours, from the block's ``hidden_states``."""

    kind = "block argument"

    def install(self, transformer: nn.Module, tables: RotaryTables) -> Undo:
        undo = [_child(transformer, tables)]
        for block in rotary_blocks(transformer, self.blocks):
            undo.append(_register(block, _ReplaceArgument(block, self.name, tables)))
        return lambda: [u() for u in reversed(undo)]


class FixedSite(Site):
    """The model's own tables only: the adapter installs processors, no tables (the installer refuses a scaling)."""

    kind = "fixed"

    def install(self, transformer: nn.Module, tables: RotaryTables) -> Undo:
        raise ValueError(f"{type(transformer).__name__}'s tables stay its own ({self!r}): nothing to install")


SITES: dict[str, type[Site]] = {cls.kind: cls for cls in (ModuleSite, MethodSite, ArgumentSite, BlockArgumentSite,
                                                           FixedSite)}  # fmt: skip


def rotary_blocks(transformer: nn.Module, prefixes: tuple[str, ...]) -> list[nn.Module]:
    """The blocks the processor prefixes name (``"layers."``: ``layers.0``, ``layers.1``, ...)."""
    return [
        m for n, m in transformer.named_modules() if any(n.startswith(p) and n[len(p) :].isdigit() for p in prefixes)
    ]


class RopeAdapterHook(ModelHook):
    """One installation on a transformer, as a diffusers hook: registering it installs ``parts`` (each a callable
    ``transformer -> undo``), removing it undoes them in reverse order, and ``pre_forward`` runs ``steps`` (each
    ``(args, kwargs) -> (args, kwargs)``) in order before every forward.

    Args:
        parts: what to install (the sites, the processors, the handle's attribute), in order.
        steps: what runs before each forward: the sampling time, the forward's grid, then an argument's tables.
    """

    def __init__(self, parts: list[Callable[[nn.Module], Undo]], steps: list[Step]):
        super().__init__()
        self.parts, self.steps, self.undo = parts, steps, []

    def initialize_hook(self, module: nn.Module) -> nn.Module:
        try:
            for part in self.parts:
                self.undo.append(part(module))
        except BaseException:  # a part that fails leaves the model as it was
            self.deinitalize_hook(module)
            raise
        return module

    def pre_forward(self, module: nn.Module, *args, **kwargs):
        for step in self.steps:
            args, kwargs = step(args, kwargs)
        return args, kwargs

    def deinitalize_hook(self, module: nn.Module) -> nn.Module:  # diffusers' spelling: it calls this on removal
        while self.undo:
            self.undo.pop()()
        return module


def install(transformer: nn.Module, parts: list[Callable[[nn.Module], Undo]], steps: list[Step]) -> Undo:
    """Register the installation's hook on ``transformer``; returns what removes it (also removable with
    ``HookRegistry.check_if_exists_or_initialize(transformer).remove_hook(HOOK)``)."""
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    registry.register_hook(RopeAdapterHook(parts, steps), HOOK)
    return lambda: registry.remove_hook(HOOK, recurse=True)


def argument_value(transformer: nn.Module, name: str) -> Callable[[tuple, dict], object]:
    """``(args, kwargs) -> the forward argument name`` (or ``None``), its slot read once here."""
    return forward_argument(transformer, name)


def time_step(tables: list[RotaryTables], read: Callable[[tuple, dict], object], noise: float, clean: float,
              name: str) -> Step:  # fmt: skip
    """Before each forward: ``max((timestep - clean) / (noise - clean))`` (1 at pure noise, 0 clean) into every tables
    module's ``time`` buffer (torch ops: no host sync). The batch (both halves of guidance) shares the step's time;
    per-token timesteps (Wan 2.2) give their maximum, the noised tokens'. A forward without it is refused."""

    def step(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        timestep = read(args, kwargs)
        if timestep is None:
            raise ValueError(f"a time-dependent scaling reads each forward's `{name}`; this forward got none")
        level = ((torch.as_tensor(timestep).detach().to(torch.float32) - clean) / (noise - clean)).amax()
        for each in tables:
            each.time.copy_(level.to(each.time.device))
        return args, kwargs

    return step


def sharded_sizing_step(transformer: nn.Module) -> Step:
    """Before each forward with ``mode`` (positions sized by the forward's grid): refuse under diffusers' context
    parallelism (``enable_parallelism``, before or after installation). Its hooks shard the forward's inputs across
    ranks, id tables included (Flux's ``img_ids``), so a rank would size its shard's grid, not the image's: measured
    0.0044 off the unsharded model on tiny Flux (``mode="interpolate"`` at 2x), where a fixed ``scaling`` is exact."""

    def step(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        parallel = getattr(transformer, "_parallel_config", None)
        if getattr(parallel, "context_parallel_config", None) is not None:
            raise ValueError(
                f"{type(transformer).__name__} runs under diffusers' context parallelism, which shards the forward's "
                "inputs across ranks: mode= would size each rank's shard instead of the image. Give the scaling "
                "per axis instead (scaling=..., e.g. the one handle.plan shows), which context parallelism keeps exact"
            )
        return args, kwargs

    return step


def grid_step(tables: list[RotaryTables], reads: list[Callable[[tuple, dict], object]], grid_of: Callable) -> Step:
    """Before each forward: the forward's token grid (``grid_of(*arguments)``) into every tables module's ``grid``
    buffer, for models that compute their tables in several calls, so that every call is sized by one grid."""

    def step(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        grid = grid_of(*(read(args, kwargs) for read in reads))
        for each in tables:
            each.grid.copy_(torch.as_tensor(grid, dtype=torch.long).to(each.grid.device))
        return args, kwargs

    return step
