"""Run the RoPE of diffusers' video, image and audio transformers through axial_rope, scaled for other sizes.

``set_rope_processors(transformer)`` adapts any class in :data:`SUPPORTED`: every diffusers class that a family
record of :mod:`axial_rope.conventions` covers (one :class:`~axial_rope.conventions.DiffusersFamily`
each; ``docs/integrations.md`` has their table and count, written from the records), through diffusers' own
extension points:

- **the tables** (with ``scaling`` or ``mode``): where the record says the model computes its rotary tables, ours
  are computed instead by :class:`~axial_rope.integrations.diffusers_tables.RotaryTables`, from the same input,
  with scaled frequencies or sized positions. A tables module (Flux ``pos_embed``, HunyuanVideo and Wan
  ``rope``, ...) stays in place, of its own class, and answers through diffusers' hook registry; a model method
  is shadowed on the instance; tables passed as a forward argument (CogVideoX's) are replaced before each
  forward. Every attention processor downstream, stock or not, rotates by them. Each kind of place is a site
  class of :mod:`~axial_rope.integrations.diffusers_sites`.
- **the processors**: in the families whose record names one of ours (Flux, FLUX.2, Chroma, Qwen-Image,
  HunyuanVideo and 1.5, HiDream, Wan and its copies, CogVideoX, ConsisID, LTX-Video, ...: the docs table), the
  stock attention processors of the rotary blocks are swapped, through each attention's ``set_processor``, for
  processors that rotate by the tables passed in on axial_rope's backends (fused Triton kernels on GPU); other
  processors (IP-adapter, a user's) are left as they are, and rotate by the same tables.

The installation is one ``diffusers.hooks.ModelHook`` named ``"axial_rope"`` on the transformer's
``HookRegistry``: it composes with diffusers' other hooks (first-block cache, group offloading, layerwise casting,
context parallel), and ``handle.remove()`` or diffusers' own ``remove_hook("axial_rope")`` undoes every part.

**The automatic policy** (``policy="auto"``): state the target size and the adapter plans the rest from the
record's training size (:mod:`axial_rope.policy`'s decision table: ``content`` positions for image axes, RIFLEx on
a longer video's time axis); ``handle.plan`` prints what it chose per axis and why. The pipeline form,
:func:`~axial_rope.integrations.diffusers_pipeline.apply_rope_scaling`, plans each pipeline call.

Unscaled, the model keeps its own tables and the output equals the stock model's. Nothing is kept
between forwards: positions and tables are computed inside each forward from its inputs, so the
adapted model compiles (fullgraph, regional, dynamic sizes), exports and checkpoints activations
as the stock one does. A scaling that could not act is refused at installation, with the reason (an axis with
no channels, a mode the family's positions make void, any scaling of a family whose tables are the model's own).

A time-dependent scaling (:mod:`axial_rope.time_scaling`: ``DyPE``, ``TimeAwareNTK``) reads the
sampling time from the transformer's own ``timestep`` argument, before each forward, so the pipeline
needs no extra call per step: ``t = max(timestep) / noise_timestep``, where ``noise_timestep`` is the
timestep of pure noise. Flux: 1 (``FluxPipeline`` passes ``timestep = sigma``, the transformer
multiplies by 1000 itself); HunyuanVideo, Wan: 1000 (flow-match ``timesteps = 1000 sigma``; Wan 2.2's
per-token timesteps give their maximum, the noised tokens'); CogVideoX: 1000 (its DDIM/DPM step
index over ``num_train_timesteps``: a time fraction, not a flow sigma).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..conventions import DIFFUSERS, PipelineUnits, diffusers_family
from ..methods import Untwisting, frequency_bands
from ..ops import BACKENDS
from ..policy import Plan
from ..scaling import Scaling

# the processor modules beside diffusers_processors: imported so that their processors register (PROCESSORS)
from . import (  # noqa: F401
    diffusers_ace_step,
    diffusers_anyflow,
    diffusers_bria_fibo2,
    diffusers_cogview4,
    diffusers_cosmos,
    diffusers_easyanimate,
    diffusers_flux2,
    diffusers_flux3,
    diffusers_helios,
    diffusers_hidream,
    diffusers_hunyuan_dit,
    diffusers_hunyuan_video15,
    diffusers_ideogram4,
    diffusers_joyimage,
    diffusers_kandinsky5,
    diffusers_kandinsky6,
    diffusers_krea2,
    diffusers_longcat_audio,
    diffusers_ltx,
    diffusers_lumina2,
    diffusers_lumina_next,
    diffusers_motif_video,
    diffusers_nucleus,
    diffusers_prx,
    diffusers_qwen_image,
    diffusers_z_image,
)
from .diffusers_checks import checked_scaling, checked_sizing
from .diffusers_policy import FamilyPlan, plan_family
from .diffusers_processors import PROCESSORS
from .diffusers_sites import SITES, ModuleSite, argument_value, grid_step, install, sharded_sizing_step, time_step
from .diffusers_tables import RotaryTables

__all__ = ["set_rope_processors", "remove_rope_processors", "RopeProcessors", "SUPPORTED"]

_ATTR = "_axial_rope_processors"  # where the handle lives on the transformer instance

SUPPORTED = tuple(sorted(DIFFUSERS))  # every class a record in axial_rope.conventions covers


class RopeProcessors:
    """Handle of an installed adaptation; :meth:`remove` restores the stock model.

    Attributes:
        rope: the :class:`~axial_rope.AxialRoPE` of the model (scaled as installed).
        tables: the :class:`~axial_rope.integrations.diffusers_tables.RotaryTables` computing the record's tables
            (``None`` unscaled: the model's own tables); ``every_tables``: each one (LTX-2 has several).
        plan: what ``policy="auto"`` chose per axis and why (:class:`~axial_rope.integrations.diffusers_policy.
            FamilyPlan`; printable), or ``None`` without a policy.
        names: the processor names (keys of ``transformer.attn_processors``) that were replaced.
    """

    def __init__(self, transformer, rope, every_tables: list, plan: FamilyPlan | None):
        self.transformer, self.rope, self.every_tables, self.plan = transformer, rope, every_tables, plan
        self.tables = every_tables[0] if every_tables else None
        self.originals: dict = {}  # every processor before installation, by name ({}: none replaced)
        self.names: list[str] = []
        self._remove = None  # set when installed: removes the hook (which undoes every part)

    @property
    def installed(self) -> bool:
        return getattr(self.transformer, _ATTR, None) is self

    def remove(self) -> None:
        """Undo the installation (idempotent): the stock tables and processors, no hook of ours.

        A processor replaced since installation (``fuse_qkv_projections()``, ``set_attn_processor``) is
        left as it is now: only processors that are still ours go back to the originals.
        """
        if self._remove is not None:
            self._remove()

    def _processors(self, family, backend):
        """The installation's part that swaps the processors (``transformer -> undo``), module by module through each
        attention's ``set_processor`` (a model without ``attn_processors``, HiDream's, is reached too)."""

        def part(transformer):
            ours = PROCESSORS[family.processor]
            modules = {f"{n}.processor": m for n, m in transformer.named_modules() if hasattr(m, "set_processor")}
            self.originals = {name: m.processor for name, m in modules.items()}
            # exact types: a subclass (e.g. a user's processor) may do more than the stock one; it stays, and rotates
            # by the same tables
            self.names = [n for n, p in self.originals.items()
                          if n.startswith(family.blocks) and type(p).__name__ in family.stock]  # fmt: skip
            for name in self.names:
                modules[name].set_processor(ours(backend, self.originals[name]))

            def undo():
                for name in self.names:  # a processor replaced since (fuse_qkv_projections, ...) stays as it is
                    if _is_ours(modules[name].processor):
                        modules[name].set_processor(self.originals[name])

            return undo

        return part

    def _attach(self, transformer):
        """The installation's part that makes the handle findable on the transformer (``transformer -> undo``)."""
        setattr(transformer, _ATTR, self)
        return lambda: transformer.__dict__.pop(_ATTR, None)


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
    policy: str | None = None,
    size: Sequence[int] | None = None,
    units: PipelineUnits | None = None,
    untwisting: Untwisting | None = None,
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
        train_size: the training token grid, ``(t, y, x)`` (video) or ``(y, x)`` (Flux), with ``mode`` (or, with
            ``policy``, in place of the record's training size); a family with one grid axis (Mochi's time, the
            audio models' sequence) gives ``(n,)``, the tokens its rope counts (a prepended global, memory or
            timestep token included). A forward at that grid equals the stock model.
        backend: axial_rope backend (``None`` automatic, ``"torch"``, ``"triton"``, ``"reference"``).
        noise_timestep: with a time-dependent scaling, the transformer's ``timestep`` at pure noise:
            the sampling time is ``max((timestep - clean) / (noise_timestep - clean))``, ``clean`` from the family's
            :class:`~axial_rope.conventions.Timing` (0; 1 where time runs from noise at 0 to clean at 1:
            Lumina, MiniMax). Default: the family's (Flux 1, the others 1000; Lumina 0; the module docstring says
            why).
        policy: ``"auto"``: plan the scaling per axis from the record's training size (or ``train_size``) with
            :mod:`axial_rope.policy`'s decision table, for ``size``; an explicit ``scaling`` or ``mode`` overrides
            the plan (which ``handle.plan`` then shows as not applied).
        size: with ``policy``, the target in the pipeline's units: ``(height, width)`` pixels for images,
            ``(frames, height, width)`` for video, ``(tokens,)`` for a one-axis audio latent; ``None``: plan the
            rule (image axes sized per forward; time as trained).
        units: how ``size`` maps to tokens, in place of the record's (:class:`~axial_rope.conventions.PipelineUnits`:
            the released VAE and patch); for a pipeline built with another VAE.
        untwisting: Untwisting RoPE (:class:`axial_rope.methods.Untwisting`, arXiv 2602.05013) on the keys of the
            in-context reference image (FLUX.1 Kontext's reference rows), over the planes of the grid axes, its
            schedule following each forward's ``timestep`` as a time-dependent scaling does; with or without a
            scaling. Families whose record marks reference rows only (``references``: Flux).

    Returns:
        A :class:`RopeProcessors` handle; ``handle.remove()`` (or :func:`remove_rope_processors`, or diffusers'
        ``HookRegistry.remove_hook("axial_rope")``) restores the stock model.

    Raises:
        TypeError: for any other model (the message lists the supported classes).
        ValueError: for an unknown ``backend`` or ``policy``, ``size`` without ``policy``, a ``scaling`` that does not
            fit the model's axes (or any ``scaling`` of a family without per-axis spectra, an attention factor
            where the tables are angles), a bad ``mode`` (one the family cannot take, or one its positions make
            void: the record's ``refused_modes``) or ``train_size``, a scaling on an axis with no channels, any
            scaling, mode or ``train_size`` of a family served unscaled only (tables ``"fixed"``), and a size the policy
            cannot serve (past its decision table's evidence), and ``untwisting`` on a family whose tables do
            not mark reference rows.
    """
    family = diffusers_family(transformer)
    if untwisting is not None:
        if not isinstance(untwisting, Untwisting):
            raise TypeError(f"untwisting must be an axial_rope.methods.Untwisting, got {type(untwisting).__name__}")
        if family.references is None:
            served = sorted({f.name for f in DIFFUSERS.values() if f.references is not None})
            raise ValueError(
                f"untwisting needs the tables to mark the reference image's rows; {type(transformer).__name__} "
                f"({family.name}) does not (families that do: {', '.join(served)})"
            )
    if backend not in (None, *BACKENDS):
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    name, config = type(transformer).__name__, transformer.config
    widths = None if family.widths is None else tuple(family.widths(config))
    planned, extra = None, None
    if policy is not None or size is not None:
        if policy is None:
            raise ValueError(f"size goes with policy='auto' (what to plan it by), got size={size!r} and no policy")
        explicit = scaling is not None or mode is not None
        planned = plan_family(family, family.rope(config), policy=policy, size=size, train_size=train_size,
                              explicit=explicit, columns=None if widths is None else len(widths),
                              units=units)  # fmt: skip
        if not explicit and _keeps_trained(planned.plan):  # the trained positions: the model's own tables
            train_size = None
        elif not explicit:
            mode, train_size, extra = planned.modes, planned.train_size, planned.scaling
        elif mode is None:
            train_size = None  # the policy's train_size was for its plan, not for the explicit scaling
    if not family.scalable and (scaling is not None or mode is not None or train_size is not None):
        raise ValueError(
            f"{name} ({family.name}) is served unscaled only: its processors rotate by the model's own tables, which "
            "the adapter does not replace, so a scaling, mode or train_size could not act; leave them unset, got "
            f"scaling={scaling!r}, mode={mode!r}, train_size={train_size!r}"
        )
    sizing = checked_sizing(family, mode, train_size, scaling)
    if not family.spectrum and scaling is not None:
        modes = [m for m in ("interpolate", "none", "normalize") if m not in dict(family.refused_modes)]
        raise ValueError(
            f"{name} ({family.name}) turns by learned or per-head frequencies, no per-axis spectrum: the scaling "
            f"methods do not apply; size positions with mode={modes[0]!r} (or {', '.join(map(repr, modes[1:]))}) "
            "instead"
        )
    columns = None if widths is None or all(widths) else tuple(a for a, d in enumerate(widths) if d)
    rope = family.rope(config)
    if scaling is not None or extra is not None:
        rope = checked_scaling(family, rope, scaling if scaling is not None else extra, name, widths)
    if not family.amplitude and rope.scaled:
        raise ValueError(
            f"{name} ({family.name}) takes its tables as angles, which carry no amplitude: a scaling with an "
            f"attention factor ({rope.scaling}) cannot be served; use one without (Linear, NTK, ...)"
        )
    rope.backend = backend
    timing = family.timing
    clean = timing.clean
    timed = rope.time_dependent or (untwisting is not None and untwisting.scheduled)
    if noise_timestep is not None and (
        not timed or not (noise_timestep - clean) * (timing.noise - clean) > 0
    ):
        side = "> 0" if clean == 0 else f"on the side of {timing.noise} from the clean {clean}"
        raise ValueError(f"noise_timestep ({side}) goes with a time-dependent scaling, got {noise_timestep!r}")
    previous = getattr(transformer, _ATTR, None)
    if previous is not None:  # re-install from the stock model, not on top of ours
        previous.remove()

    # the tables follow the model (.to(), offloading): built on its device, or on the CPU while its parameters
    # are still on the meta device (a from_pretrained-style build), whence loading and .to() move them
    device = next(iter(transformer.parameters()), torch.empty(0)).device
    device = torch.device("cpu") if device.type == "meta" else device
    rope = rope.to(device)
    scaled = sizing is not None or any(s is not None for s in rope.scaling) or untwisting is not None
    made = _tables(transformer, family, config, rope, scaling if scaling is not None else extra, sizing, columns, backend, name,
                   device, untwisting) if scaled else []  # fmt: skip
    handle = RopeProcessors(transformer, rope, [tables for _, tables in made], planned)
    parts = [handle._attach]
    parts += [lambda t, site=site, tables=tables: site.install(t, tables) for site, tables in made]
    if family.processor is not None:  # else the stock processors stay (the model may not even list them)
        parts.append(handle._processors(family, backend))
    steps = _steps(transformer, family, made, timed, sizing, noise_timestep, config) if scaled else []
    handle._remove = install(transformer, parts, steps)
    return handle


def _keeps_trained(plan: Plan) -> bool:
    """Whether a plan changes nothing at its target (every axis inside its trained extent)."""
    return all(a.target is not None and a.target <= a.trained for a in plan.axes)


def _tables(transformer, family, config, rope, scaling, sizing, columns, backend, name, device,
            untwisting=None) -> list[tuple]:  # fmt: skip
    """``(site, tables module)`` for the record's tables and (LTX-2) each further producer's: each its own rope,
    positions and layout, sized and timed alike; ``untwisting`` on the record's tables (Flux: one module)."""
    by_grid = sizing is not None and family.grid is not None
    kind, attr = family.tables
    made = [(SITES[kind](attr, family.blocks), rope, family.positions(config), family.layout,
             None if family.frequencies is None else family.frequencies(config))]  # fmt: skip
    for producer in family.producers:
        more = producer.rope(config)
        more = more if scaling is None else checked_scaling(family, more, scaling, name)
        more.backend = backend
        kind_p, attr_p = producer.tables
        made.append((SITES[kind_p](attr_p, family.blocks), more.to(device), producer.positions(config),
                     producer.layout, None))  # fmt: skip
    # a plain object standing for a module (Z-Image's RopeEmbedder) is replaced: our tables answer its attributes
    stock = lambda site: getattr(transformer, site.name, None) if isinstance(site, ModuleSite) else None
    return [
        (site, RotaryTables(rope_of, positions, layout, sizing, stock=stock(site),
                            grid_axes=len(family.grid_axes) if by_grid else 0, frequencies=frequencies,
                            columns=columns, **_untwisting(rope_of, family, columns, untwisting if i == 0 else None)
                            ).to(device))
        for i, (site, rope_of, positions, layout, frequencies) in enumerate(made)
    ]  # fmt: skip


def _untwisting(rope, family, columns, untwisting) -> dict:
    """RotaryTables' keywords for its time buffer and Untwisting RoPE over the grid axes' planes (their bands)."""
    if untwisting is None:
        return {"time_dependent": rope.time_dependent}
    axes = [a if columns is None else columns.index(a) for a in family.grid_axes if columns is None or a in columns]
    bands = frequency_bands(rope.freqs, axes)  # a host read of F, once, at install
    return {"time_dependent": rope.time_dependent or untwisting.scheduled, "untwisting": untwisting,
            "references": family.references, "bands": bands}  # fmt: skip


def _steps(transformer, family, made, timed, sizing, noise_timestep, config) -> list:
    """What runs before each forward, in order: the sampling time (``timed``: a time-dependent scaling or a scheduled
    Untwisting), the forward's grid, then any argument's tables (which need both)."""
    every = [tables for _, tables in made]
    steps = [] if sizing is None else [sharded_sizing_step(transformer)]
    if timed:  # the tables modules holding a time buffer (an Untwisting's: the record's first only)
        timing = family.timing
        noise = timing.noise if noise_timestep is None else noise_timestep
        read = argument_value(transformer, timing.argument)
        timed_tables = [tables for tables in every if tables.time_dependent]
        steps.append(time_step(timed_tables, read, noise, timing.clean, timing.argument))
    if sizing is not None and family.grid is not None:
        names, grid_of = family.grid
        steps.append(grid_step(every, [argument_value(transformer, n) for n in names], grid_of(config)))
    for site, tables in made:
        step = site.step(transformer, tables)
        if step is not None:
            steps.append(step)
    return steps


def remove_rope_processors(transformer: torch.nn.Module) -> None:
    """Restore what :func:`set_rope_processors` replaced.

    Raises:
        ValueError: if no axial_rope processors are installed on ``transformer``.
    """
    handle = getattr(transformer, _ATTR, None)
    if handle is None:
        raise ValueError(f"no axial_rope processors are installed on this {type(transformer).__name__}")
    handle.remove()
