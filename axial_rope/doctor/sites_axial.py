"""The doctor's view of a model built from this library's layers: the rotation each attention is handed.

:class:`~axial_rope.layers.Attention` takes its rotation as data (``rotation=`` from the model, or ``pos`` and its
rope): a forward pre-hook reads it. The timm ViTs of :mod:`axial_rope.integrations.timm` rotate the patch tokens
in :class:`~axial_rope.integrations.timm_rope.GridRoPE`: a forward hook reads q and k before and after, so what
is checked there is the rotation the backend applied. The prescription is the model's own rope rebuilt from its
description (axes, theta, scaling, pairing, spectrum: fresh buffers), or the rope passed as ``config``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers import Attention
from ..ops import rotation_tables
from ..rope import AxialRoPE
from .observe import Observation, plane_render, qk_rotation

__all__ = ["AxialSite"]


def _rebuilt(rope: AxialRoPE) -> AxialRoPE:
    """``rope`` built again from its description, on the CPU (its buffers as the constructor computes them)."""
    if rope.spectrum is None or rope.learned_freqs is not None:
        return rope
    shared = rope.spectrum != "per_axis"
    theta = rope.theta[0] if shared else rope.theta
    scaling = rope.scaling[0] if shared else rope.scaling
    return AxialRoPE(rope.axes_dim, theta, scaling, rope.pairing, rope.spectrum, plane_order=rope.plane_order)


def _is_grid_rope(module: nn.Module) -> bool:
    return type(module).__name__ == "GridRoPE" and type(module).__module__.startswith("axial_rope.")


class AxialSite:
    """The rotary sites of a model of this library's layers (``Attention``, ``GridRoPE``)."""

    source = "axial_rope"

    def __init__(self, model: nn.Module, config=None, example_inputs=None):
        self.model = model
        if config is not None and not isinstance(config, AxialRoPE):
            raise ValueError(f"config of a model of axial_rope's layers is the rope it should rotate by (an "
                             f"AxialRoPE), got {type(config).__name__}")  # fmt: skip
        self.config = config
        self.sites = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention) or _is_grid_rope(m)]
        if not self.sites:
            raise TypeError(
                f"the doctor cannot hook {type(model).__name__}: it has no rotary site it knows. It examines "
                "transformers models (a text rotary module), diffusers transformers with a family record "
                "(axial_rope.conventions), and models of axial_rope's layers (Attention, the timm ViTs' GridRoPE)"
            )
        self.inputs = example_inputs if example_inputs is not None else self._build_inputs()

    def _build_inputs(self):
        embed = getattr(self.model, "patch_embed", None)
        size = getattr(embed, "img_size", None)
        if any(_is_grid_rope(m) for _, m in self.sites) and size is not None:  # a timm ViT: an image
            gen = torch.Generator().manual_seed(0)
            return (torch.randn(2, getattr(embed.proj, "in_channels", 3), *size, generator=gen),)
        raise ValueError(f"the doctor cannot build inputs for {type(self.model).__name__}: pass example_inputs= "
                         "(one forward's keyword arguments as a dict, or its positional ones as a tuple)")  # fmt: skip

    def _rope(self, rope: AxialRoPE) -> AxialRoPE:
        return self.config if self.config is not None else _rebuilt(rope)

    def prescribed(self) -> dict[str, str]:
        ropes = {}
        for name, m in self.sites:
            rope = m.rope
            if rope is not None:
                ropes.setdefault(f"AxialRoPE({self._rope(rope).extra_repr()})", name)
        return {name: what for what, name in ropes.items()}

    def axes(self):
        """The map's axes: a timm ViT's trained patch grid, a DiT's latent grid (``input_size / patch_size``), a
        language model's ``max_seq_len``; unknown elsewhere (``train_size=``)."""
        from .extrapolation import MapAxes

        grids = [m for _, m in self.sites if _is_grid_rope(m)]
        if grids:
            return MapAxes(("y", "x"), tuple(grids[0].trained), ("space", "space"))
        rope = next(m.rope for _, m in self.sites if m.rope is not None)
        config = getattr(self.model, "config", None)
        n = rope.n_axes
        names = {1: ("position",), 2: ("y", "x"), 3: ("t", "y", "x")}.get(n, tuple(f"axis {a}" for a in range(n)))
        kinds = {2: ("space", "space"), 3: ("time", "space", "space")}.get(n, (None,) * n)  # the policy's grids
        trained = (None,) * n
        if n == 1 and isinstance(getattr(config, "max_seq_len", None), int):
            trained = (config.max_seq_len,)
        elif n == 2 and isinstance(getattr(config, "input_size", None), int):
            trained = (config.input_size // config.patch_size,) * 2
        return MapAxes(names, trained, kinds)

    def describe_sites(self) -> list[str]:
        return [name for name, _ in self.sites]

    def run(self, forward) -> list[Observation]:
        observations, hooks = [], []
        for name, module in self.sites:
            if _is_grid_rope(module):
                hooks.append(module.register_forward_hook(self._grid_hook(name, observations)))
            else:
                hooks.append(
                    module.register_forward_pre_hook(self._attention_hook(name, observations), with_kwargs=True)
                )
        try:
            forward(self.model, self.inputs)
        finally:
            for h in hooks:
                h.remove()
        return observations

    def _attention_hook(self, name: str, observations: list):
        def hook(module, args, kwargs):
            rotation = kwargs.get("rotation")
            rope = kwargs.get("rope") or module.rope
            if rotation is None:
                pos = args[1] if len(args) > 1 else kwargs.get("pos")
                if pos is None or rope is None:
                    return
                rotation = rope.rotation(pos, seq_len=kwargs.get("seq_len"))
            if rope is None or not isinstance(rope, AxialRoPE) or rope.transform is not None:
                return  # a rotation without its rope (packed, learned per image): nothing to rebuild it from
            prescribed = self._rope(rope)
            factor = rotation.attention_factor
            rotation = rotation._replace(pos=rotation.pos.cpu(), freqs=rotation.freqs.detach().cpu(), turns=None,
                                         attention_factor=None if factor is None else factor.cpu())  # fmt: skip
            pos = rotation.pos.double()
            cos, sin = rotation_tables(rotation, torch.float64)
            observations.append(Observation(name, prescribed, pos, prescribed.rotation(pos), [cos, sin],
                                            torch.float64, plane_render(), planes=(cos, sin), width=2 * cos.shape[-1],
                                            layout="Rotation"))  # fmt: skip

        return hook

    def _grid_hook(self, name: str, observations: list):
        def hook(module, args, output):
            q, k, height, width = args[:4]
            q, k, output = q.detach().cpu(), k.detach().cpu(), [t.detach().cpu() for t in output]
            rope = self._rope(module.rope)
            rotation = module.rotation(height, width, torch.device("cpu"))
            before = torch.cat([q, k], dim=1).transpose(1, 2)  # [B, S, 2H, D]
            after = torch.cat(list(output), dim=1).transpose(1, 2)
            fit = qk_rotation(before, after, rope.rot_dim)
            if fit.angles is None:
                return
            pos = module.positions(height, width).double()[None]
            cos, sin = fit.factor * fit.angles.cos(), fit.factor * fit.angles.sin()  # the turns q, k received
            prescribed = rotation._replace(pos=rotation.pos.double(), freqs=rotation.freqs.double().cpu(), turns=None)
            observations.append(Observation(name, rope, pos, prescribed, [cos, sin], q.dtype, plane_render(),
                                            planes=(cos, sin), width=rope.rot_dim, qk=fit, layout="q, k turned",
                                            sample=(q.transpose(1, 2), k.transpose(1, 2))))  # fmt: skip

        return hook
