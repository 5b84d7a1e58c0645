"""Run the RoPE of diffusers' video and image transformers through axial_rope.

``set_rope_processors(transformer)`` swaps the stock attention processors of a
``FluxTransformer2DModel``, ``HunyuanVideoTransformer3DModel``, ``WanTransformer3DModel``,
``CogVideoXTransformer3DModel`` or ``LTXVideoTransformer3DModel`` for processors that rotate q and k with
:class:`~axial_rope.AxialRoPE` (fusing QK-RMSNorm where the model has a per-head
one), through diffusers' own ``set_attn_processor``. Unscaled, the output equals the
stock model's; with ``scaling`` (per axis), the frequencies are rescaled so the model
can run beyond its training resolution or length.

Positions are read, never patched in: a forward hook on the model's rotary module
(Flux: ``pos_embed``, whose input is the ids; HunyuanVideo, Wan: ``rope``, whose input is
the latent video) or a pre-hook on the transformer (CogVideoX, whose tables come from the
pipeline) records ``pos`` ``[S, 3]`` against the tables of that forward, which the
processors receive (so activation checkpointing recomputes with the right positions).
A pre-hook on the transformer refuses to run when something (``fuse_qkv_projections()``,
``set_attn_processor``) has replaced the installed processors since.

A time-dependent scaling (:mod:`axial_rope.time_scaling`: ``DyPE``, ``TimeAwareNTK``) reads the
sampling time from the transformer's own ``timestep`` argument, in a pre-hook, so the pipeline
needs no extra call per step: ``t = max(timestep) / noise_timestep``, where ``noise_timestep`` is the
timestep of pure noise. Flux: 1 (``FluxPipeline`` passes ``timestep = sigma``, the transformer
multiplies by 1000 itself); HunyuanVideo, Wan: 1000 (flow-match ``timesteps = 1000 sigma``; Wan 2.2's
per-token timesteps give their maximum, the noised tokens'); CogVideoX: 1000 (its DDIM/DPM step
index over ``num_train_timesteps``: a time fraction, not a flow sigma).
"""

from __future__ import annotations

import inspect
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
from .diffusers_ltx import LTXVideoRopeProcessor, ltx_hook, ltx_rope
from .diffusers_processors import (
    CogVideoXRopeProcessor,
    FluxRopeProcessor,
    HunyuanVideoRopeProcessor,
    RopeState,
    WanRopeProcessor,
)

__all__ = ["set_rope_processors", "remove_rope_processors", "RopeProcessors", "SUPPORTED"]

_ATTR = "_axial_rope_processors"  # where the handle lives on the transformer instance


@dataclass(frozen=True)
class _Family:
    """How one model family is adapted: its rotary layout, stock processors and where positions come from."""

    model: type
    stock: tuple[type, ...]  # the processors replaced
    processor: type
    layout: Callable[[torch.nn.Module], tuple[tuple[int, ...], float]]  # -> (axes_dim (t|-, y, x), theta)
    hook: Callable[[torch.nn.Module, RopeState], torch.utils.hooks.RemovableHandle]
    # processor names (keys of attn_processors) in the rotary blocks: all must be stock; the rest
    # (e.g. HunyuanVideo's text refiner) is left alone
    blocks: tuple[str, ...] = ("transformer_blocks.", "single_transformer_blocks.")
    tables_when_unscaled: bool = False  # rotate with the model's own tables when unscaled (exact)
    noise_timestep: float = 1000.0  # the transformer's `timestep` at pure noise (t = 1)
    # a fixed convention rope (no spectrum, so no scaling or mode), built from the model; else from `layout`
    convention: Callable[[torch.nn.Module], AxialRoPE] | None = None


def _token_grid(frames: int, height: int, width: int, patch: Sequence[int]) -> tuple[int, int, int]:
    # latent [.., F, .., H, W] -> the token grid (t, y, x), as the model's patch embedding cuts it
    p_t, p_h, p_w = patch
    return -(-frames // p_t), height // p_h, width // p_w


# Position hooks: each records the positions of one forward against the tables the stock model
# computes in it (the output of its rotary module) and passes to every processor.


def _flux_hook(model, state):
    def hook(module, args, output):
        state.record_ids(output, args[0].float())  # ids [S, 3], text rows first, as FluxPosEmbed reads them

    return model.pos_embed.register_forward_hook(hook)


def _latent_video_hook(rope_module, patch, state):
    def hook(module, args, output):
        _, _, frames, height, width = args[0].shape  # latent video [B, C, F, H, W]
        state.record_grid(output, _token_grid(frames, height, width, patch), args[0].device)

    return rope_module.register_forward_hook(hook)


def _hunyuan_hook(model, state):
    patch = (model.config.patch_size_t, model.config.patch_size, model.config.patch_size)
    return _latent_video_hook(model.rope, patch, state)


def _wan_hook(model, state):
    return _latent_video_hook(model.rope, tuple(model.rope.patch_size), state)


def _cogvideox_hook(model, state):
    patch = (model.config.patch_size_t or 1, model.config.patch_size, model.config.patch_size)
    signature = inspect.signature(model.forward)

    def hook(module, args, kwargs):
        call = signature.bind_partial(*args, **kwargs).arguments  # the tables come from the pipeline
        _, frames, _, height, width = call["hidden_states"].shape  # [B, F, C, H, W]
        # the integer latent grid: CogVideoX 1.5's pipeline positions (and 1.0's at its base size)
        sizes = _token_grid(frames, height, width, patch)
        state.record_grid(call.get("image_rotary_emb"), sizes, call["hidden_states"].device)

    return model.register_forward_pre_hook(hook, with_kwargs=True)


def _time_hook(model, state: RopeState, noise_timestep: float):
    """A pre-hook that sets ``state.time`` from the forward's ``timestep``: ``max(timestep) / noise_timestep``."""
    signature = inspect.signature(model.forward)

    def hook(module, args, kwargs):
        timestep = signature.bind_partial(*args, **kwargs).arguments.get("timestep")
        if timestep is None:
            state.time = None
            return
        # one time per forward ([] float64, on the timestep's device: no host sync); the batch (CFG
        # halves) shares the step's time, per-token timesteps (Wan 2.2) give the noised tokens' maximum
        state.time = torch.as_tensor(timestep).detach().to(torch.float64).amax() / noise_timestep

    return model.register_forward_pre_hook(hook, with_kwargs=True)


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
        hook=_flux_hook,
        noise_timestep=1.0,  # FluxPipeline passes timestep = sigma
    ),
    _Family(
        model=diffusers.HunyuanVideoTransformer3DModel,
        stock=(HunyuanVideoAttnProcessor2_0,),
        processor=HunyuanVideoRopeProcessor,
        layout=lambda m: (tuple(m.rope.rope_dim), float(m.rope.theta)),
        hook=_hunyuan_hook,
    ),
    _Family(
        model=diffusers.WanTransformer3DModel,
        stock=(WanAttnProcessor,),
        processor=WanRopeProcessor,
        layout=_wan_layout,
        hook=_wan_hook,
        blocks=("blocks.",),
    ),
    _Family(
        model=diffusers.CogVideoXTransformer3DModel,
        stock=(CogVideoXAttnProcessor2_0, FusedCogVideoXAttnProcessor2_0),
        processor=CogVideoXRopeProcessor,
        layout=_cogvideox_layout,
        hook=_cogvideox_hook,
        tables_when_unscaled=True,  # the pipeline's crop grids are not integer positions
    ),
    _Family(
        model=diffusers.LTXVideoTransformer3DModel,
        stock=(LTXVideoAttnProcessor,),
        processor=LTXVideoRopeProcessor,
        layout=lambda m: ((), 0.0),  # unused: the rope is the per-head LTX-Video convention
        hook=ltx_hook,
        tables_when_unscaled=True,  # upstream's float32 angles (1e-3 rad at theta * pi / 2): rotate by its table
        convention=ltx_rope,
    ),
)

SUPPORTED = tuple(f.model.__name__ for f in _FAMILIES)


class RopeProcessors:
    """Handle of installed axial_rope processors; :meth:`remove` restores the originals.

    Attributes:
        rope: the :class:`~axial_rope.AxialRoPE` shared by the processors.
        names: the processor names (keys of ``transformer.attn_processors``) that were replaced.
    """

    def __init__(self, transformer, state: RopeState, originals: dict, names: list[str], hooks: list):
        self.transformer, self.state, self._hooks = transformer, state, hooks
        self.originals = originals  # every processor before installation, by name
        self.names = names

    @property
    def rope(self) -> AxialRoPE:
        return self.state.rope

    def remove(self) -> None:
        """Put the original processors back and drop the hooks (idempotent)."""
        if getattr(self.transformer, _ATTR, None) is not self:
            return
        current = dict(self.transformer.attn_processors)
        current.update({name: self.originals[name] for name in self.names})
        self.transformer.set_attn_processor(current)
        for hook in self._hooks:
            hook.remove()
        delattr(self.transformer, _ATTR)


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
    """Install attention processors that run the transformer's RoPE through axial_rope.

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
        :func:`remove_rope_processors`) restores the original processors.

    Raises:
        TypeError: for any other model (the message lists the supported classes).
        ValueError: for an unknown ``backend``, or when the rotary blocks hold processors other
            than the stock ones (e.g. IP-adapter processors), as replacing them would drop their behaviour.
    """
    family = _family(transformer)
    if backend not in (None, *BACKENDS):
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    sizing = _sizing(family, mode, train_size, scaling)
    if family.convention is not None:
        if scaling is not None or mode is not None:
            raise ValueError(
                f"{type(transformer).__name__}'s RoPE is a fixed per-head frequency model (axial_rope.conventions); "
                "the scaling methods and modes need a spectrum per axis: leave scaling and mode unset"
            )
        rope = family.convention(transformer)
        rope.backend = backend
    else:
        axes_dim, theta = family.layout(transformer)
        rope = AxialRoPE(axes_dim, theta, scaling, pairing="interleaved", backend=backend)  # checks scaling
    previous = getattr(transformer, _ATTR, None)
    if previous is not None:  # re-install from the stock processors, not on top of ours
        previous.remove()
    if noise_timestep is not None and (not rope.time_dependent or not noise_timestep > 0):
        raise ValueError(f"noise_timestep (> 0) goes with a time-dependent scaling, got {noise_timestep!r}")
    unscaled = sizing is None and not any(s is not None for s in rope.scaling)
    state = RopeState(rope, use_tables=family.tables_when_unscaled and unscaled, sizing=sizing)

    originals = dict(transformer.attn_processors)
    names = [name for name in originals if name.startswith(family.blocks)]
    # exact types: a subclass (e.g. a user's processor) may do more than the stock one
    foreign = sorted({type(originals[n]).__name__ for n in names if type(originals[n]) not in family.stock})
    if foreign or not names:
        raise ValueError(
            f"set_rope_processors replaces {type(transformer).__name__}'s stock processors "
            f"({', '.join(c.__name__ for c in family.stock)}), but its rotary blocks use {foreign or 'none'}; "
            "remove those (e.g. IP-adapter or custom processors) first, as replacing them would drop their behaviour"
        )
    new = {
        name: family.processor(state, originals[name]) if name in names else proc for name, proc in originals.items()
    }
    transformer.set_attn_processor(new)
    # the time hook first (hooks run in the order registered): the time is set before positions are recorded
    hooks = [_time_hook(transformer, state, noise_timestep or family.noise_timestep)] if rope.time_dependent else []
    hooks += [family.hook(transformer, state), _guard(transformer, names[0], family.processor)]
    handle = RopeProcessors(transformer, state, originals, names, hooks)
    setattr(transformer, _ATTR, handle)
    return handle


def _sizing(family: _Family, mode, train_size, scaling) -> tuple | None:
    """``(train_size, mode)`` for :class:`RopeState`, checked; ``None`` without ``mode``."""
    if mode is None:
        if train_size is not None:
            raise ValueError("train_size goes with mode (how to size positions against it)")
        return None
    if scaling is not None:
        raise ValueError("pass either scaling (fixed per-axis methods) or mode (sized per forward), not both")
    n_axes = 2 if family.model is diffusers.FluxTransformer2DModel else 3
    modes = (mode,) * n_axes if isinstance(mode, str) else tuple(mode)
    if len(modes) != n_axes or any(m not in POSITION_MODES for m in modes):
        raise ValueError(f"mode must be one of {POSITION_MODES} or one per grid axis ({n_axes}), got {mode!r}")
    if n_axes == 2 and "normalize" in modes:
        raise ValueError("mode 'normalize' moves Flux's text ids off 0; use 'interpolate', 'ntk' or 'yarn'")
    if train_size is None or len(tuple(train_size)) != n_axes:
        raise ValueError(f"mode needs train_size, the training token grid ({n_axes} sizes), got {train_size!r}")
    return tuple(train_size), modes


def _guard(transformer, name: str, processor: type):
    """A pre-hook that raises when the processor ``name`` is no longer one of ours (replaced since)."""
    attention = transformer.get_submodule(name.removesuffix(".processor"))

    def hook(module, args, kwargs):
        if not isinstance(attention.processor, processor):
            raise RuntimeError(
                f"the axial_rope processors of this {type(transformer).__name__} were replaced (now "
                f"{type(attention.processor).__name__}), e.g. by fuse_qkv_projections() or set_attn_processor(), "
                "which drops their positions and scaling; call set_rope_processors again after it (our processors "
                "run fused projections too), or remove_rope_processors() first to go back to the stock ones"
            )

    return transformer.register_forward_pre_hook(hook, with_kwargs=True)


def remove_rope_processors(transformer: torch.nn.Module) -> None:
    """Restore the processors that :func:`set_rope_processors` replaced.

    Raises:
        ValueError: if no axial_rope processors are installed on ``transformer``.
    """
    handle = getattr(transformer, _ATTR, None)
    if handle is None:
        raise ValueError(f"no axial_rope processors are installed on this {type(transformer).__name__}")
    handle.remove()
