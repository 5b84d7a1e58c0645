"""Class-conditional image DiT (Peebles & Xie 2023) with 2D axial RoPE instead of a sin-cos table.

Native resolution in one batch (:meth:`DiT.forward_packed`, docs/packing.md): images of
different sizes are packed into one token sequence, each at its own grid and scaling, and
attention stays within each image (``axial_rope.varlen``).

Patches of the latent ``[B, C, H, W]`` become tokens at coordinates ``ar.grid(h, w)``;
every block rotates q and k by those coordinates, so the model runs at any height,
width and aspect ratio whose sides divide by the patch. How positions are scaled
for a resolution not seen in training is ``pos_mode`` (a config field, or a
``forward`` argument), one of ``ar.POSITION_MODES`` with the meaning
:func:`axial_rope.positions_for_size` gives it (the factor of an axis is ``n / n_train``,
and only axes longer than in training are scaled):

- ``"none"``: integer coordinates, whatever the size (extrapolation);
- ``"interpolate"``: coordinates of an axis longer than in training squeezed into the trained range;
- ``"ntk"`` / ``"yarn"``: per-axis NTK-aware or YaRN frequency scaling by the factor;
- ``"normalize"``: centred cell centres, the longest axis spanning the trained extent
  (aspect kept), so the training size gets unit spacing;
- ``"dype"`` / ``"time_aware_ntk"``: integer coordinates and, per axis longer than in training, a
  scaling that follows the sampling time (:mod:`axial_rope.time_scaling`): ``DyPE(s, n_train)``
  (Dy-YaRN) or Lumina-Next's ``TimeAwareNTK(s, head_dim)``.

Each forward computes its rotation once, ``self.rope.rotation(pos, scaling=..., t=...)`` (positions,
``F`` and attention factor as tensors, :class:`axial_rope.ops.Rotation`), and hands it to every block:
no rope is built, cached or changed inside ``forward``, so the model compiles with symbolic sizes.
A time-dependent scaling (those modes, or an explicit ``scaling=`` per call) follows each forward's
timestep, ``t / 1000`` (the models take ``1000 sigma``, :data:`models.flow.T_SCALE`), so every sampler
that calls the model (``sample_euler``, the diffusers pipelines) drives it with no extra argument; the
batch must share one timestep (a sampler's step, both halves of guidance).

:func:`initialize_weights` is DiT's initialisation, written once for the image and the
video DiT (``models/video_dit.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

import axial_rope as ar
from axial_rope.init import deferred_init
from axial_rope.layers import DiTBlock, FinalLayer, LabelEmbedder, PatchEmbed, TimestepEmbedder, unpatchify
from axial_rope.packing import Item, Packed, pack, unpack

from .checks import batch_timesteps, check_fields, check_labels, check_time_range
from .flow import T_SCALE, classifier_free_guidance
from .packed import patch_tokens

__all__ = ["DiT", "DiTConfig", "PRESETS", "POS_MODES", "TIME_MODES", "initialize_weights", "noise_level"]

TIME_MODES = ("dype", "time_aware_ntk")  # pos_mode values whose scaling follows the sampling time
# the pos_mode values: axial_rope.positions_for_size's names, then the time-dependent ones
POS_MODES = (*ar.POSITION_MODES, *TIME_MODES)


def noise_level(t: torch.Tensor) -> torch.Tensor:
    """The noise level in ``[0, 1]`` of model timesteps ``t [B]`` (``t / T_SCALE``): what a time-dependent
    scaling reads (one shared value; :func:`axial_rope.time_scaling.sampling_time` checks it). Torch ops only.
    The forwards check ``t`` first (:func:`models.checks.check_time_range`): only float rounding is clamped."""
    return (t.detach() / T_SCALE).clamp(0, 1)  # clamp: float rounding of 1000 * 1.0 / 1000


@dataclass(frozen=True)
class DiTConfig:
    """Sizes of a DiT. ``input_size`` is the training latent side; any size divisible by the patch runs."""

    input_size: int = 32
    patch_size: int = 2
    in_channels: int = 4
    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    class_dropout_prob: float = 0.1
    class_init_std: float = 0.02  # std of the label table's N(0, std) init (DiT: 0.02)
    learn_sigma: bool = True  # output channels: 2 * in_channels (eps and variance), as DiT
    theta: float = 10000.0
    qk_norm: str | None = None  # None (as DiT), "rms" or "layer"
    pos_mode: str = "none"

    def __post_init__(self):
        check_fields(
            self,
            positive_ints=(
                "input_size",
                "patch_size",
                "in_channels",
                "hidden_size",
                "depth",
                "num_heads",
                "num_classes",
            ),
            positive_reals=("mlp_ratio", "theta"),
            probabilities=("class_dropout_prob",),
            bools=("learn_sigma",),
        )
        if not isinstance(self.class_init_std, (int, float)) or not self.class_init_std >= 0:
            raise ValueError(f"DiTConfig.class_init_std must be a number >= 0, got {self.class_init_std!r}")
        if self.pos_mode not in POS_MODES:
            raise ValueError(f"pos_mode must be one of {POS_MODES}, got {self.pos_mode!r}")
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size {self.input_size} must be divisible by patch_size {self.patch_size}")
        if self.hidden_size // self.num_heads < 4:
            raise ValueError(
                f"head_dim = hidden_size / num_heads must be >= 4 (two axes of planes), got "
                f"{self.hidden_size} / {self.num_heads}"
            )


# The DiT paper's configurations (Table 1: S 33M, B 130M, L 458M, XL 675M parameters) and a CPU model
# (32 px RGB, patch 4 -> 64 tokens, 4 shape classes, 1.28 M parameters: the default run of
# scripts.train takes minutes on 2 CPU cores; docs/training.md). Its label table starts at std 1.0:
# a model trained for a few minutes learns the classes faster from distinct class vectors.
PRESETS: dict[str, DiTConfig] = {
    "DiT-S/2": DiTConfig(hidden_size=384, depth=12, num_heads=6),
    "DiT-B/2": DiTConfig(hidden_size=768, depth=12, num_heads=12),
    "DiT-L/2": DiTConfig(hidden_size=1024, depth=24, num_heads=16),
    "DiT-XL/2": DiTConfig(hidden_size=1152, depth=28, num_heads=16),
    "tiny": DiTConfig(
        input_size=32,
        patch_size=4,
        in_channels=3,
        hidden_size=128,
        depth=4,
        num_heads=4,
        num_classes=4,
        class_init_std=1.0,
        learn_sigma=False,
    ),
    # the grid study's base (models/studies/vision/grid.py, docs/experiments/design.md): 16 x 16 tokens at 32 px,
    # 2 heads of 64 channels (16 rotary planes per axis) and theta 100, so that YaRN's ramp, NTK and Dy-YaRN
    # change planes whose wavelengths lie near the 16-token training extent
    "tiny-16": DiTConfig(
        input_size=32,
        patch_size=2,
        in_channels=3,
        hidden_size=128,
        depth=4,
        num_heads=2,
        theta=100.0,
        num_classes=4,
        class_init_std=1.0,
        learn_sigma=False,
    ),
}


class DiT(nn.Module):
    """Diffusion transformer: patch embedding, adaLN-Zero blocks with 2D RoPE, final layer, unpatchify."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = c = config  # checked when it was made (DiTConfig.__post_init__)
        self.out_channels = c.in_channels * 2 if c.learn_sigma else c.in_channels
        head_dim = c.hidden_size // c.num_heads
        self.train_grid = c.input_size // c.patch_size  # tokens per side in training
        with deferred_init(self):  # built on meta, then reset_parameters: a meta-device build reproduces it
            # half of each head's planes per axis (y, x); 2 * (head_dim // 4) keeps both even
            axis_dim = 2 * (head_dim // 4)
            self.rope = ar.AxialRoPE((axis_dim, axis_dim), theta=c.theta)
            self.x_embedder = PatchEmbed(c.patch_size, c.in_channels, c.hidden_size)
            self.t_embedder = TimestepEmbedder(c.hidden_size)
            self.y_embedder = LabelEmbedder(c.num_classes, c.hidden_size, c.class_dropout_prob,
                                            init_std=c.class_init_std)  # fmt: skip
            self.blocks = nn.ModuleList(
                [
                    DiTBlock(c.hidden_size, c.num_heads, self.rope, mlp_ratio=c.mlp_ratio, qk_norm=c.qk_norm)
                    for _ in range(c.depth)
                ]
            )
            self.final_layer = FinalLayer(c.hidden_size, c.patch_size, self.out_channels)

    def reset_parameters(self) -> None:
        """DiT's initialisation (:func:`initialize_weights`); also what re-initialises a model built on the meta
        device after ``to_empty`` (the same weights as the constructor's for the same seed)."""
        initialize_weights(self)

    def positions(
        self,
        h: int,
        w: int,
        pos_mode: str | None = None,
        *,
        scaling: ar.scaling.Scaling | tuple | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, tuple]:
        """Coordinates ``[h * w, 2]`` of an ``h x w`` token grid and the scaling per axis (y, x) to rotate them
        with, under ``pos_mode`` (or, given ``scaling``, integer coordinates and that scaling: one method or one
        per axis). ``h`` and ``w`` may be symbolic sizes (``torch.compile(dynamic=True)``, ``torch.export``)."""
        mode = self.config.pos_mode if pos_mode is None else pos_mode
        if mode not in POS_MODES:
            raise ValueError(f"pos_mode must be one of {POS_MODES}, got {mode!r}")
        if scaling is not None or mode in TIME_MODES:
            sized = ar.positions_for_size((h, w), self.train_grid, "none", device=device)
            if scaling is None:  # per axis longer than in training: its factor
                scaling = tuple(self._time_scaling(mode, float(f)) if f > 1 else None for f in sized.factors)
            return sized.pos, scaling if isinstance(scaling, tuple) else (scaling, scaling)
        sized = ar.positions_for_size((h, w), self.train_grid, mode, device=device)
        return sized.pos, sized.scaling

    def _time_scaling(self, mode: str, factor: float) -> ar.scaling.Scaling:
        """The time-dependent method of ``mode`` for an axis ``factor`` times its training length."""
        from axial_rope.time_scaling import DyPE, TimeAwareNTK

        if mode == "dype":
            return DyPE(factor, self.train_grid)  # Dy-YaRN, the paper's default schedule
        return TimeAwareNTK(factor, head_dim=self.config.hidden_size // self.config.num_heads)  # Lumina-Next's D

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor,
        *,
        pos_mode: str | None = None,
        scaling: ar.scaling.Scaling | tuple | None = None,
        force_drop_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict from a noisy latent.

        Args:
            x: latent ``[B, C, H, W]``, ``H`` and ``W`` divisible by the patch; or a list of latents
                ``[C, H_i, W_i]`` of different sizes: :meth:`forward_packed` (one packed sequence).
            t: timesteps ``[B]``, or one value for every sample.
            y: class labels ``[B]`` (``y_embedder.null_label`` = unconditional).
            pos_mode: overrides ``config.pos_mode`` for this call.
            scaling: instead of ``pos_mode``, integer coordinates and this scaling (one method of
                :mod:`axial_rope.scaling` / :mod:`axial_rope.time_scaling` or one per axis (y, x)), e.g.
                ``(None, DyPE(2.0, 16))``. A time-dependent one (or mode) follows ``t``: ``t`` must then
                hold one value for the batch.

        Returns:
            ``[B, out_channels, H, W]`` (for a list: a list of ``[out_channels, H_i, W_i]``).
        """
        if isinstance(x, (list, tuple)):  # through forward, so DDP and hooks see packed batches too
            if scaling is not None:
                raise ValueError("scaling= is per call for a batch of one size; packed batches take pos_mode")
            return self.forward_packed(x, t, y, pos_mode=pos_mode, force_drop_ids=force_drop_ids)
        t = batch_timesteps(t, x.shape[0], x.device)
        x, (h, w) = self.x_embedder(x)  # [B, S, C], S = h * w
        pos, scaling = self.positions(h, w, pos_mode, scaling=scaling, device=x.device)
        check_time_range(t, T_SCALE, scaling)  # a time-dependent scaling reads t / 1000: refused outside [0, 1]
        rotation = self.rope.rotation(pos, scaling=scaling, t=noise_level(t))  # once for every block
        check_labels(y, self.y_embedder, t.shape[0])
        c = self.t_embedder(t) + self.y_embedder(y, force_drop_ids)  # [B, C]
        for block in self.blocks:
            x = block(x, c, rotation=rotation)
        x = self.final_layer(x, c)  # [B, S, p * p * out_channels]
        return unpatchify(x, (h, w), self.config.patch_size, self.out_channels)

    def pack(self, xs: Sequence[torch.Tensor], pos_mode: str | None = None) -> Packed:
        """Latents ``[C, H_i, W_i]`` -> their patches packed (``tokens [T, C p p]``), each image at its own grid
        and with its own scaling under ``pos_mode`` (:func:`axial_rope.positions_for_size`, as :meth:`positions`)."""
        mode = self.config.pos_mode if pos_mode is None else pos_mode
        if mode not in POS_MODES:
            raise ValueError(f"pos_mode must be one of {POS_MODES}, got {mode!r}")
        if mode in TIME_MODES:  # per-image scaling is fixed per packed batch (axial_rope.packed_rope)
            raise ValueError(
                f"pos_mode {mode!r} follows the sampling time: not for packed batches; call forward per size"
            )
        items, sized = [], {}
        for i, x in enumerate(xs):
            patches = patch_tokens(x, self.config.patch_size, i)  # [h, w, C p p]
            h, w = patches.shape[:2]
            if (h, w) not in sized:  # one rule per size, computed once per batch
                sized[h, w] = ar.positions_for_size((h, w), self.train_grid, mode, device=x.device)
            pos, scaling = sized[h, w].pos, sized[h, w].scaling
            items.append(Item(patches.reshape(h * w, -1), pos, (h, w), scaling=scaling))
        return pack(items)

    def forward_packed(
        self,
        xs: Sequence[torch.Tensor],
        t: torch.Tensor,
        y: torch.Tensor,
        *,
        pos_mode: str | None = None,
        force_drop_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Predict for images of different sizes in one packed sequence (equal to :meth:`forward` on each alone).

        Args:
            xs: ``N`` latents ``[C, H_i, W_i]``, sides divisible by the patch.
            t: timesteps ``[N]`` (or one value); y: labels ``[N]``.
            pos_mode: as in :meth:`forward`, applied per image (each its own factor: block axes,
                ``axial_rope.packed_rope``).

        Returns:
            ``N`` predictions ``[out_channels, H_i, W_i]``.
        """
        if not len(xs):
            raise ValueError("forward_packed needs at least one image")
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != (len(xs),):
            raise ValueError(f"y must be one label per image, [{len(xs)}], got {getattr(y, 'shape', y)}")
        packed = self.pack(xs, pos_mode)
        p, out = self.config.patch_size, self.out_channels
        w = self.x_embedder.proj  # the patch conv as one matmul over every image's patches
        x = (packed.tokens @ w.weight.flatten(1).T + w.bias)[None]  # [1, T, hidden]
        rotation, segments = packed.rope(self.rope).rotation(packed.pos), packed.segments  # each image its own F
        t = batch_timesteps(t, packed.n_items, x.device)
        check_labels(y, self.y_embedder, packed.n_items)
        c = self.t_embedder(t) + self.y_embedder(y, force_drop_ids)  # [N, C]: modulation per image, then per token
        attend = ar.Varlen(segments)  # attention within each image
        for block in self.blocks:
            x = block(x, c, rotation=rotation, attend=attend)
        x = self.final_layer(x, c, segments=segments)  # [1, T, p * p * out]
        return [unpatchify(o.reshape(1, -1, o.shape[-1]), o.shape[:2], p, out)[0] for o in unpack(packed, x)]

    def forward_packed_with_cfg(
        self, xs: Sequence[torch.Tensor], t: torch.Tensor, y: torch.Tensor, cfg_scale: float, **kwargs
    ) -> list[torch.Tensor]:
        """:meth:`forward_with_cfg` for a packed batch: one sequence of ``2N`` images (conditional, then null label)."""
        if cfg_scale == 1.0:
            return self.forward_packed(xs, t, y, **kwargs)
        n, null = len(xs), torch.full_like(y, self.y_embedder.null_label)
        t = batch_timesteps(t, n, y.device)
        both = self.forward_packed([*xs, *xs], torch.cat([t, t]), torch.cat([y, null]), **kwargs)
        c = xs[0].shape[0]
        guided = []
        for cond, uncond in zip(both[:n], both[n:]):
            mixed = uncond[:c] + cfg_scale * (cond[:c] - uncond[:c])
            guided.append(torch.cat([mixed, cond[c:]]))
        return guided

    def forward_with_cfg(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float, **kwargs
    ) -> torch.Tensor:
        """Classifier-free guidance (:func:`models.flow.classifier_free_guidance`) against the null label.

        Guidance applies to the first ``in_channels`` output channels (the prediction); a
        learned variance, if any, is taken from the conditional pass.
        """
        return classifier_free_guidance(self, x, t, y, self.y_embedder.null_label, cfg_scale, **kwargs)


def initialize_weights(model: nn.Module) -> None:
    """DiT's initialisation, for :class:`DiT` and :class:`~models.video_dit.VideoDiT`.

    As ``initialize_weights`` of facebookresearch/DiT (``models.py``), in order:

    1. patch embedding: xavier-uniform of the kernel viewed as a linear map
       ``[hidden, C * prod(patch)]``, zero bias;
    2. timestep embedder: MLP weights from ``N(0, 0.02)``, zero biases;
    3. label table (if any): ``N(0, class_init_std)``, 0.02 as DiT (the tiny preset: 1.0);
       the video DiT's vector conditioning MLP (if any): PyTorch's default ``Linear`` init;
    4. each block: xavier-uniform attention and MLP linears with zero biases, unit QK-norm
       weights, and adaLN-Zero: zero modulation, so every block starts as the identity;
    5. final layer: zero modulation and zero projection, so the untrained model predicts 0.

    Each step is the layer's own ``reset_parameters`` (``axial_rope/layers.py``), which its
    constructor also calls: a layer built alone starts the same way. The rope's buffers are recomputed
    (a model built on the meta device has none until then).
    """
    model.rope.reset_parameters()
    model.x_embedder.reset_parameters()
    model.t_embedder.reset_parameters()
    if model.y_embedder is not None:
        model.y_embedder.reset_parameters()
    cond_embedder = getattr(model, "cond_embedder", None)  # video DiT: Linear, SiLU, Linear
    if cond_embedder is not None:
        cond_embedder[0].reset_parameters()
        cond_embedder[2].reset_parameters()
    for block in model.blocks:
        block.reset_parameters()  # attention, MLP, then adaLN-Zero
    model.final_layer.reset_parameters()
