"""Run the RoPE of diffusers' video and image transformers through axial_rope, scaled for other sizes.

``set_rope_processors(transformer)`` adapts a ``FluxTransformer2DModel``,
``HunyuanVideoTransformer3DModel``, ``WanTransformer3DModel``, ``CogVideoXTransformer3DModel`` or
``LTXVideoTransformer3DModel`` through diffusers' own extension points:

- **the tables** (with ``scaling`` or ``mode``): the module that computes the model's rotary tables
  (Flux ``pos_embed``, HunyuanVideo and Wan ``rope``) is replaced by
  :class:`~axial_rope.integrations.diffusers_tables.RotaryTables`, which computes them from the same
  input with scaled frequencies or sized positions; CogVideoX's tables, a forward argument, are
  replaced by a forward pre-hook. Every attention processor downstream, stock or not, rotates by them.
- **the processors**: the stock attention processors of the rotary blocks are swapped, through
  ``set_attn_processor``, for processors that rotate by the tables passed in on axial_rope's
  backends (fused Triton kernels on GPU); other processors (IP-adapter, a user's) are left as they
  are, and rotate by the same tables.

Unscaled, the model keeps its own tables and the output equals the stock model's. Nothing is kept
between forwards: positions and tables are computed inside each forward from its inputs, so the
adapted model compiles (fullgraph, regional, dynamic sizes), exports and checkpoints activations
as the stock one does.

A time-dependent scaling (:mod:`axial_rope.time_scaling`: ``DyPE``, ``TimeAwareNTK``) reads the
sampling time from the transformer's own ``timestep`` argument, in a pre-hook, so the pipeline
needs no extra call per step: ``t = max(timestep) / noise_timestep``, where ``noise_timestep`` is the
timestep of pure noise. Flux: 1 (``FluxPipeline`` passes ``timestep = sigma``, the transformer
multiplies by 1000 itself); HunyuanVideo, Wan: 1000 (flow-match ``timesteps = 1000 sigma``; Wan 2.2's
per-token timesteps give their maximum, the noised tokens'); CogVideoX: 1000 (its DDIM/DPM step
index over ``num_train_timesteps``: a time fraction, not a flow sigma).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import diffusers
import torch
from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0, FusedCogVideoXAttnProcessor2_0
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor
from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0
from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from ..ops import BACKENDS
from ..positions import POSITION_MODES
from ..rope import AxialRoPE
from ..scaling import Scaling
from .diffusers_ltx import LTXVideoRopeProcessor, ltx_rope
from .diffusers_processors import (
    CogVideoXRopeProcessor,
    FluxRopeProcessor,
    HunyuanVideoRopeProcessor,
    WanRopeProcessor,
)
from .diffusers_tables import (
    RotaryTables,
    Sizing,
    argument_hook,
    flux_positions,
    grid_positions,
    latent_grid,
    time_hook,
)

__all__ = ["set_rope_processors", "remove_rope_processors", "RopeProcessors", "SUPPORTED"]

_ATTR = "_axial_rope_processors"  # where the handle lives on the transformer instance


@dataclass(frozen=True)
class _Family:
    """How one model family is adapted: its rotary layout, where its tables come from, its stock processors."""

    model: type
    stock: tuple[type, ...]  # the processors replaced
    processor: type
    layout: Callable[[torch.nn.Module], tuple[tuple[int, ...], float]]  # -> (axes_dim (t|-, y, x), theta)
    # where the tables come from: the transformer's submodule that computes them (replaced when scaled), or
    # the forward argument the pipeline passes them in (replaced by a pre-hook)
    tables_module: str | None
    tables_argument: str | None
    # (transformer) -> (rope, sizing, *inputs) -> (pos [S, 3], scaling per axis), from the producer's inputs
    positions: Callable
    table_layout: Callable = lambda cos, sin: (cos, sin)  # [S, D] tables -> the stock producer's layout
    # processor names (keys of attn_processors) in the rotary blocks; the rest (e.g. HunyuanVideo's
    # text refiner) is left alone
    blocks: tuple[str, ...] = ("transformer_blocks.", "single_transformer_blocks.")
    grid_axes: int = 3  # axes that `mode` sizes: (t, y, x); Flux: (y, x)
    noise_timestep: float = 1000.0  # the transformer's `timestep` at pure noise (t = 1)
    # a fixed convention rope (no spectrum, so no scaling or mode), built from the model; else from `layout`
    convention: Callable[[torch.nn.Module], AxialRoPE] | None = None


def _latent_positions(patch: Callable, channels_first: bool = True):
    """Positions of a latent video's token grid ``[B, C, F, H, W]`` (CogVideoX: ``[B, F, C, H, W]``)."""

    def positions(transformer):
        cut = patch(transformer)

        def of(rope, sizing, latent):
            sizes = latent_grid(latent.shape, cut, channels_first=channels_first)
            return grid_positions(sizes, rope, sizing, latent.device)

        return of

    return positions


def _wan_layout(model):
    rope = model.rope
    return (rope.t_dim, rope.h_dim, rope.w_dim), 10000.0  # WanRotaryPosEmbed's fixed theta


def _cogvideox_layout(model):
    d = model.config.attention_head_dim  # get_3d_rotary_pos_embed's split of a head: t d/4, y and x 3d/8
    if d % 16:
        raise ValueError(
            f"CogVideoX's rotary split (t: d/4, y and x: 3d/8 channels, each even) needs attention_head_dim "
            f"divisible by 16, got {d}"
        )
    return (d // 4, d // 8 * 3, d // 8 * 3), 10000.0


_FAMILIES = (
    _Family(
        model=diffusers.FluxTransformer2DModel,
        stock=(FluxAttnProcessor,),
        processor=FluxRopeProcessor,
        layout=lambda m: (tuple(m.pos_embed.axes_dim), float(m.pos_embed.theta)),
        tables_module="pos_embed",  # FluxPosEmbed(ids): ids [S, 3], text rows first
        tables_argument=None,
        positions=lambda m: lambda rope, sizing, ids: flux_positions(ids, rope, sizing),
        grid_axes=2,
        noise_timestep=1.0,  # FluxPipeline passes timestep = sigma
    ),
    _Family(
        model=diffusers.HunyuanVideoTransformer3DModel,
        stock=(HunyuanVideoAttnProcessor2_0,),
        processor=HunyuanVideoRopeProcessor,
        layout=lambda m: (tuple(m.rope.rope_dim), float(m.rope.theta)),
        tables_module="rope",  # HunyuanVideoRotaryPosEmbed(hidden_states): the latent video
        tables_argument=None,
        positions=_latent_positions(lambda m: (m.config.patch_size_t, m.config.patch_size, m.config.patch_size)),
    ),
    _Family(
        model=diffusers.WanTransformer3DModel,
        stock=(WanAttnProcessor,),
        processor=WanRopeProcessor,
        layout=_wan_layout,
        tables_module="rope",  # WanRotaryPosEmbed(hidden_states): the latent video
        tables_argument=None,
        positions=_latent_positions(lambda m: tuple(m.rope.patch_size)),
        table_layout=lambda cos, sin: (cos[None, :, None], sin[None, :, None]),  # [1, S, 1, D]
        blocks=("blocks.",),
    ),
    _Family(
        model=diffusers.CogVideoXTransformer3DModel,
        stock=(CogVideoXAttnProcessor2_0, FusedCogVideoXAttnProcessor2_0),
        processor=CogVideoXRopeProcessor,
        layout=_cogvideox_layout,
        tables_module=None,
        tables_argument="image_rotary_emb",  # from the pipeline; scaled: the integer latent grid's
        positions=_latent_positions(
            lambda m: (m.config.patch_size_t or 1, m.config.patch_size, m.config.patch_size), channels_first=False
        ),
    ),
    _Family(
        model=diffusers.LTXVideoTransformer3DModel,
        stock=(LTXVideoAttnProcessor,),
        processor=LTXVideoRopeProcessor,
        layout=lambda m: ((), 0.0),  # unused: the rope is the per-head LTX-Video convention
        tables_module=None,  # unscaled only: the model's own tables (upstream's float32 angles, rotated as given)
        tables_argument=None,
        positions=lambda m: None,
        convention=ltx_rope,
    ),
)

SUPPORTED = tuple(f.model.__name__ for f in _FAMILIES)


class RopeProcessors:
    """Handle of an installed adaptation; :meth:`remove` restores the stock model.

    Attributes:
        rope: the :class:`~axial_rope.AxialRoPE` of the model (scaled as installed).
        tables: the :class:`~axial_rope.integrations.diffusers_tables.RotaryTables` computing the tables
            (``None`` unscaled: the model's own tables).
        names: the processor names (keys of ``transformer.attn_processors``) that were replaced.
        hooks: the forward pre-hooks installed on the transformer (the sampling time; CogVideoX's tables).
    """

    def __init__(self, transformer, rope, tables, originals: dict, names: list[str], hooks: list, replaced=None):
        self.transformer, self.rope, self.tables, self.hooks = transformer, rope, tables, hooks
        self.originals = originals  # every processor before installation, by name
        self.names = names
        self._replaced = replaced  # (attribute, the stock tables module) when the tables module was replaced

    def remove(self) -> None:
        """Put the stock tables module and processors back and drop the hooks (idempotent).

        A processor replaced since installation (``fuse_qkv_projections()``, ``set_attn_processor``) is
        left as it is now: only processors that are still ours go back to the originals.
        """
        if getattr(self.transformer, _ATTR, None) is not self:
            return
        current = dict(self.transformer.attn_processors)
        ours = {name: self.originals[name] for name in self.names if _is_ours(current[name])}
        current.update(ours)
        self.transformer.set_attn_processor(current)
        for hook in self.hooks:
            hook.remove()
        if self._replaced is not None:
            name, stock = self._replaced
            setattr(self.transformer, name, stock.to(next(self.tables.rope.buffers()).device))
        delattr(self.transformer, _ATTR)


def _is_ours(processor) -> bool:
    return type(processor).__module__.startswith("axial_rope.")


def _family(transformer) -> _Family:
    for family in _FAMILIES:
        if isinstance(transformer, family.model):
            return family
    raise TypeError(
        f"set_rope_processors supports {', '.join(SUPPORTED)}; got {type(transformer).__name__}. "
        "Other models can call axial_rope.AxialRoPE / apply_rope from their own attention processor."
    )


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
        transformer: a ``FluxTransformer2DModel``, ``HunyuanVideoTransformer3DModel``,
            ``WanTransformer3DModel``, ``CogVideoXTransformer3DModel`` or ``LTXVideoTransformer3DModel``
            (LTX-Video: unscaled only, its rope is :func:`axial_rope.conventions.ltx_video`).
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
        train_size: the training token grid, ``(t, y, x)`` (video) or ``(y, x)`` (Flux), with ``mode``.
        backend: axial_rope backend (``None`` automatic, ``"torch"``, ``"triton"``, ``"reference"``).
        noise_timestep: with a time-dependent scaling, the transformer's ``timestep`` at pure noise:
            the sampling time is ``max(timestep) / noise_timestep``. Default: Flux 1, the others 1000
            (the module docstring lists why).

    Returns:
        A :class:`RopeProcessors` handle; ``handle.remove()`` (or
        :func:`remove_rope_processors`) restores the stock model.

    Raises:
        TypeError: for any other model (the message lists the supported classes).
        ValueError: for an unknown ``backend``, a ``scaling`` that does not fit the model's axes, a bad
            ``mode`` or ``train_size``.
    """
    family = _family(transformer)
    if backend not in (None, *BACKENDS):
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    sizing = _sizing(family, mode, train_size, scaling)
    name = type(transformer).__name__
    if family.convention is not None:
        if scaling is not None or mode is not None:
            raise ValueError(
                f"{name}'s RoPE is a fixed per-head frequency model (axial_rope.conventions); "
                "the scaling methods and modes need a spectrum per axis: leave scaling and mode unset"
            )
        rope = family.convention(transformer)
        rope.backend = backend
    else:
        axes_dim, theta = family.layout(transformer)
        try:
            rope = AxialRoPE(axes_dim, theta, scaling, pairing="interleaved", backend=backend)  # checks scaling
        except ValueError as err:
            raise ValueError(f"{name} (axes {_axes(family)} of {list(axes_dim)} channels): {err}") from err
    if noise_timestep is not None and (not rope.time_dependent or not noise_timestep > 0):
        raise ValueError(f"noise_timestep (> 0) goes with a time-dependent scaling, got {noise_timestep!r}")
    previous = getattr(transformer, _ATTR, None)
    if previous is not None:  # re-install from the stock model, not on top of ours
        previous.remove()

    device = next(iter(transformer.parameters())).device
    rope = rope.to(device)
    scaled = sizing is not None or any(s is not None for s in rope.scaling)
    tables, hooks, replaced = None, [], None
    if scaled:
        positions = family.positions(transformer)
        stock = None if family.tables_module is None else getattr(transformer, family.tables_module)
        tables = RotaryTables(
            rope, positions, family.table_layout, sizing, time_dependent=rope.time_dependent, stock=stock
        ).to(device)
        if rope.time_dependent:  # registered first (hooks run in order): the time is set before the tables
            hooks.append(time_hook(transformer, tables, noise_timestep or family.noise_timestep))
        if family.tables_module is not None:
            replaced = (family.tables_module, stock)
            setattr(transformer, family.tables_module, tables)
        else:
            hooks.append(argument_hook(transformer, family.tables_argument, tables, "hidden_states"))

    originals = dict(transformer.attn_processors)
    # exact types: a subclass (e.g. a user's processor) may do more than the stock one; it stays, and rotates
    # by the same tables
    names = [n for n in originals if n.startswith(family.blocks) and type(originals[n]) in family.stock]
    new = {n: family.processor(backend, originals[n]) if n in names else p for n, p in originals.items()}
    transformer.set_attn_processor(new)
    handle = RopeProcessors(transformer, rope, tables, originals, names, hooks, replaced)
    setattr(transformer, _ATTR, handle)
    return handle


def _axes(family: _Family) -> str:
    return "(index, y, x)" if family.grid_axes == 2 else "(t, y, x)"


def _sizing(family: _Family, mode, train_size, scaling) -> Sizing | None:
    """The per-forward sizing of ``mode`` and ``train_size``, checked; ``None`` without ``mode``."""
    if mode is None:
        if train_size is not None:
            raise ValueError("train_size goes with mode (how to size positions against it)")
        return None
    if scaling is not None:
        raise ValueError("pass either scaling (fixed per-axis methods) or mode (sized per forward), not both")
    n_axes = family.grid_axes
    modes = (mode,) * n_axes if isinstance(mode, str) else tuple(mode)
    if len(modes) != n_axes or any(m not in POSITION_MODES for m in modes):
        raise ValueError(f"mode must be one of {POSITION_MODES} or one per grid axis ({n_axes}), got {mode!r}")
    if n_axes == 2 and "normalize" in modes:
        raise ValueError("mode 'normalize' moves Flux's text ids off 0; use 'interpolate', 'ntk' or 'yarn'")
    axes = "(y, x)" if n_axes == 2 else "(t, y, x)"
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
