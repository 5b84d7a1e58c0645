"""The reference image and video DiTs as diffusers models: ``ModelMixin`` + ``ConfigMixin``.

Each class wraps the reference model (``self.dit``: a :class:`~models.dit.DiT` or
:class:`~models.video_dit.VideoDiT`), so the math has one implementation; the wrapper
adds what diffusers expects: ``@register_to_config`` with the reference config's fields
as plain JSON values, ``save_pretrained`` / ``from_pretrained`` through safetensors, and
``forward(hidden_states, timestep, ...)`` returning ``Transformer2DModelOutput``.

Timesteps follow the project's rectified flow (:mod:`models.flow`): ``t`` in [0, 1000],
``x_t = (1 - t/1000) x_0 + (t/1000) eps``, and the output's first ``in_channels`` channels
are the velocity ``eps - x_0``. A trainer run converts to these classes with
``models/training/export.py``; nothing here reads the trainer's formats.
"""

from __future__ import annotations

import dataclasses

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_outputs import Transformer2DModelOutput

import axial_rope as ar

from . import dit, video_dit
from .checks import batch_timesteps
from .saved_config import CheckedConfigMixin

__all__ = ["AxialDiT2DModel", "AxialDiT3DModel"]


def _temporal_scaling(value: ar.scaling.Scaling | dict | None) -> ar.scaling.Scaling | None:
    """A scaling method from itself, its ``to_dict()`` dict (``{"rope_type": "riflex", ...}``) or ``None``."""
    if value is None or isinstance(value, ar.scaling.Scaling):
        return value
    if isinstance(value, dict):
        return ar.scaling.from_dict(value)
    raise TypeError(f"temporal_scaling must be None, a scaling dict or an axial_rope.scaling method, got {value!r}")


def _timesteps(timestep: torch.Tensor | float, batch: int, device: torch.device) -> torch.Tensor:
    """A scalar or ``[B]`` timestep as a float32 ``[B]`` tensor (any other shape: a ``ValueError``)."""
    return batch_timesteps(torch.as_tensor(timestep, dtype=torch.float32, device=device), batch)


class AxialDiT2DModel(CheckedConfigMixin, ModelMixin, ConfigMixin):
    """Class-conditional image DiT with 2D axial RoPE (:class:`models.dit.DiT`) as a diffusers model.

    The arguments are :class:`models.dit.DiTConfig`'s fields (defaults: DiT-XL/2's trunk), checked
    as the config is made; :meth:`from_preset` builds one of :data:`models.dit.PRESETS`.
    ``from_pretrained`` checks config.json against the weights (:mod:`models.saved_config`).
    """

    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_classes: int = 1000,
        class_dropout_prob: float = 0.1,
        class_init_std: float = 0.02,
        learn_sigma: bool = True,
        theta: float = 10000.0,
        qk_norm: str | None = None,
        pos_mode: str = "none",
    ):
        args = dict(locals())
        super().__init__()
        self.dit = dit.DiT(dit.DiTConfig(**{f.name: args[f.name] for f in dataclasses.fields(dit.DiTConfig)}))
        self._init_fingerprint()

    def weight_free(self) -> dict:
        """The config fields that carry no weights (``num_heads`` does only with QK-norm), as the model uses them."""
        c = self.dit.config
        return {"input_size": c.input_size, "num_heads": c.num_heads, "theta": float(c.theta), "pos_mode": c.pos_mode}

    def reset_parameters(self) -> None:
        """The reference model's initialisation; also the re-initialisation after ``to_empty`` (meta-device build)."""
        self.dit.reset_parameters()
        self.reset_fingerprint()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> AxialDiT2DModel:
        """A randomly initialised model of ``models.dit.PRESETS[name]``, fields replaced by ``overrides``."""
        if name not in dit.PRESETS:
            raise ValueError(f"preset must be one of {sorted(dit.PRESETS)}, got {name!r}")
        return cls(**dataclasses.asdict(dataclasses.replace(dit.PRESETS[name], **overrides)))

    @classmethod
    def from_reference(cls, model: dit.DiT) -> AxialDiT2DModel:
        """The diffusers model holding a copy of a reference :class:`~models.dit.DiT`'s weights."""
        out = cls(**dataclasses.asdict(model.config))
        out.dit.load_state_dict(model.state_dict())
        return out.to(next(model.parameters()).device).train(model.training)

    @property
    def null_label(self) -> int | None:
        """The unconditional label for classifier-free guidance (``None``: trained without label dropout)."""
        return self.dit.y_embedder.null_label if self.config.class_dropout_prob > 0 else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor | float,
        class_labels: torch.Tensor,
        *,
        pos_mode: str | None = None,
        force_drop_ids: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> Transformer2DModelOutput | tuple[torch.Tensor]:
        """Predict from noisy images.

        Args:
            hidden_states: ``[B, C, H, W]``, ``H`` and ``W`` divisible by ``patch_size``.
            timestep: ``t`` in [0, 1000], a scalar or ``[B]``.
            class_labels: ``[B]`` int64 (``null_label``: unconditional).
            pos_mode: position scaling for this call (see :mod:`models.dit`); ``None``: the config's.

        Returns:
            ``sample [B, out_channels, H, W]``: the velocity ``eps - x_0`` in the first ``C`` channels.
        """
        t = _timesteps(timestep, hidden_states.shape[0], hidden_states.device)
        out = self.dit(hidden_states, t, class_labels, pos_mode=pos_mode, force_drop_ids=force_drop_ids)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)


class AxialDiT3DModel(CheckedConfigMixin, ModelMixin, ConfigMixin):
    """Video DiT with 3D (t, y, x) axial RoPE (:class:`models.video_dit.VideoDiT`) as a diffusers model.

    The arguments are :class:`models.video_dit.VideoDiTConfig`'s fields, plus
    ``temporal_scaling``: the t axis' default scaling at inference, stored as the library's
    dict (``ar.scaling.Scaling.to_dict()``, e.g. ``{"rope_type": "riflex", "k": 4, "test_length": 12}``);
    a scaling object is accepted and converted. ``from_pretrained`` checks config.json against the
    weights (:mod:`models.saved_config`).
    """

    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        patch_size: tuple[int, int, int] = (1, 2, 2),
        in_channels: int = 4,
        hidden_size: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        axes_dim: tuple[int, int, int] | None = None,
        theta: float = 10000.0,
        num_classes: int = 0,
        class_dropout_prob: float = 0.1,
        cond_dim: int = 0,
        qk_norm: str | None = "rms",
        learn_sigma: bool = False,
        causal: bool = False,  # frame-causal attention (models/video_streaming.py samples it a frame at a time)
        temporal_scaling: dict | None = None,
    ):
        args = dict(locals())
        super().__init__()
        # the config holds plain values: a scaling object becomes its dict (a dict is checked and normalised)
        scaling = _temporal_scaling(temporal_scaling)
        self.register_to_config(temporal_scaling=None if scaling is None else scaling.to_dict())
        values = {f.name: args[f.name] for f in dataclasses.fields(video_dit.VideoDiTConfig)}
        self.dit = video_dit.VideoDiT(video_dit.VideoDiTConfig(**values))  # JSON lists become tuples there
        self._init_fingerprint()

    def weight_free(self) -> dict:
        """The config fields that carry no weights, as the model uses them (``axes_dim`` resolved)."""
        c = self.dit.config
        return {
            "num_heads": c.num_heads,
            "theta": float(c.theta),
            "axes_dim": list(self.dit.rope.axes_dim),
            "temporal_scaling": self.config.temporal_scaling,
        }

    def reset_parameters(self) -> None:
        """The reference model's initialisation; also the re-initialisation after ``to_empty`` (meta-device build)."""
        self.dit.reset_parameters()
        self.reset_fingerprint()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> AxialDiT3DModel:
        """A randomly initialised model of ``models.video_dit.PRESETS[name]``; ``overrides`` replace fields."""
        if name not in video_dit.PRESETS:
            raise ValueError(f"preset must be one of {sorted(video_dit.PRESETS)}, got {name!r}")
        scaling = overrides.pop("temporal_scaling", None)
        config = dataclasses.replace(video_dit.PRESETS[name], **overrides)
        return cls(**dataclasses.asdict(config), temporal_scaling=scaling)

    @classmethod
    def from_reference(cls, model: video_dit.VideoDiT) -> AxialDiT3DModel:
        """The diffusers model holding a copy of a reference :class:`~models.video_dit.VideoDiT`'s weights."""
        out = cls(**dataclasses.asdict(model.config))
        out.dit.load_state_dict(model.state_dict())
        return out.to(next(model.parameters()).device).train(model.training)

    @property
    def null_label(self) -> int | None:
        """The unconditional label (``None``: no class conditioning or no label dropout)."""
        embedder = self.dit.y_embedder
        return embedder.null_label if embedder is not None and self.config.class_dropout_prob > 0 else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor | float,
        class_labels: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
        *,
        temporal_scaling: ar.scaling.Scaling | dict | None = None,
        force_drop_ids: torch.Tensor | None = None,
        context_parallel=None,
        return_dict: bool = True,
    ) -> Transformer2DModelOutput | tuple[torch.Tensor]:
        """Predict from noisy videos.

        Args:
            hidden_states: ``[B, C, T, H, W]``, each size divisible by ``patch_size``.
            timestep: ``t`` in [0, 1000], a scalar or ``[B]``.
            class_labels: ``[B]`` int64 (configs with ``num_classes``).
            cond: ``[B, cond_dim]`` (configs with ``cond_dim``).
            temporal_scaling: the t axis' scaling for this call (e.g. ``ar.scaling.RIFLEx(k, T)``);
                ``None``: the config's.
            context_parallel: an :class:`~axial_rope.parallel.ContextParallel`: the tokens sharded over
                its group (collective; see :meth:`models.video_dit.VideoDiT.forward`).

        Returns:
            ``sample [B, out_channels, T, H, W]``: the velocity in the first ``C`` channels (the whole
            video on every rank, also under context parallel).
        """
        scaling = _temporal_scaling(self.config.temporal_scaling if temporal_scaling is None else temporal_scaling)
        t = _timesteps(timestep, hidden_states.shape[0], hidden_states.device)
        kwargs = {"temporal_scaling": scaling, "force_drop_ids": force_drop_ids, "context_parallel": context_parallel}
        out = self.dit(hidden_states, t, class_labels, cond, **kwargs)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)
