"""Class-conditional image DiT (Peebles & Xie 2023) with 2D axial RoPE instead of a sin-cos table.

Patches of the latent ``[B, C, H, W]`` become tokens at coordinates ``ar.grid(h, w)``;
every block rotates q and k by those coordinates, so the model runs at any height,
width and aspect ratio whose sides divide by the patch. How positions are scaled
for a resolution not seen in training is ``pos_mode`` (a config field, or a
``forward`` argument):

- ``"none"``: integer coordinates, whatever the size (extrapolation);
- ``"interpolate"``: coordinates of an axis longer than in training squeezed into the trained range;
- ``"ntk"`` / ``"yarn"``: per-axis NTK-aware or YaRN frequency scaling by ``n / n_train``;
- ``"normalize"``: cell centres in ``[-1, 1]`` (aspect kept), times ``n_train / 2`` so the
  training size gets unit spacing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import axial_rope as ar
from axial_rope.layers import DiTBlock, FinalLayer, LabelEmbedder, PatchEmbed, TimestepEmbedder, unpatchify

__all__ = ["DiT", "DiTConfig", "PRESETS", "POS_MODES"]

POS_MODES = ("none", "interpolate", "ntk", "yarn", "normalize")


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
    class_init_std: float = 0.02
    learn_sigma: bool = True  # output channels: 2 * in_channels (eps and variance), as DiT
    theta: float = 10000.0
    qk_norm: str | None = None  # None (as DiT), "rms" or "layer"
    pos_mode: str = "none"


# The DiT paper's configurations (Table 1: S 33M, B 130M, L 458M, XL 675M parameters) and a CPU model
# (32 px RGB, patch 4 -> 64 tokens, 4 shape classes; sized from CALIBRATION.md).
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
}


class DiT(nn.Module):
    """Diffusion transformer: patch embedding, adaLN-Zero blocks with 2D RoPE, final layer, unpatchify."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        if config.pos_mode not in POS_MODES:
            raise ValueError(f"pos_mode must be one of {POS_MODES}, got {config.pos_mode!r}")
        if config.input_size % config.patch_size:
            raise ValueError(f"input_size {config.input_size} must be divisible by patch_size {config.patch_size}")
        self.config = c = config
        self.out_channels = c.in_channels * 2 if c.learn_sigma else c.in_channels
        head_dim = c.hidden_size // c.num_heads
        # half of each head's planes per axis (y, x); 2 * (head_dim // 4) keeps both even
        axis_dim = 2 * (head_dim // 4)
        self.rope = ar.AxialRoPE((axis_dim, axis_dim), theta=c.theta)
        self.train_grid = c.input_size // c.patch_size  # tokens per side in training
        # inference ropes by (mode, factors, device): not state, so .to() leaves them; keyed by device instead
        self._scaled_ropes: dict[tuple, ar.AxialRoPE] = {}

        self.x_embedder = PatchEmbed(c.patch_size, c.in_channels, c.hidden_size)
        self.t_embedder = TimestepEmbedder(c.hidden_size)
        self.y_embedder = LabelEmbedder(c.num_classes, c.hidden_size, c.class_dropout_prob, init_std=c.class_init_std)
        self.blocks = nn.ModuleList(
            [
                DiTBlock(c.hidden_size, c.num_heads, self.rope, mlp_ratio=c.mlp_ratio, qk_norm=c.qk_norm)
                for _ in range(c.depth)
            ]
        )
        self.final_layer = FinalLayer(c.hidden_size, c.patch_size, self.out_channels)
        # each layer initialises itself as DiT's initialize_weights does (xavier linears, N(0, 0.02)
        # embedders, zero adaLN modulation and final layer)

    def positions(
        self, h: int, w: int, pos_mode: str | None = None, *, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, ar.AxialRoPE]:
        """Coordinates ``[h * w, 2]`` of an ``h x w`` token grid and the rope to use, under ``pos_mode``."""
        mode = self.config.pos_mode if pos_mode is None else pos_mode
        if mode not in POS_MODES:
            raise ValueError(f"pos_mode must be one of {POS_MODES}, got {mode!r}")
        n0 = self.train_grid
        factors = (max(h / n0, 1.0), max(w / n0, 1.0))  # only axes longer than in training are scaled
        if mode == "interpolate":
            return ar.grid(h, w, scale=tuple(1 / f for f in factors), device=device), self.rope
        if mode == "normalize":
            return ar.grid(h, w, normalize="max", scale=n0 / 2, device=device), self.rope
        pos = ar.grid(h, w, device=device)
        if mode == "none" or factors == (1.0, 1.0):
            return pos, self.rope
        key = (mode, factors, self.rope.freqs.device)
        if key not in self._scaled_ropes:
            if mode == "ntk":
                methods = tuple(ar.scaling.NTK(f) if f > 1 else None for f in factors)
            else:
                methods = tuple(ar.scaling.YaRN(f, n0) if f > 1 else None for f in factors)
            rope = ar.AxialRoPE(self.rope.axes_dim, theta=self.config.theta, scaling=methods)
            self._scaled_ropes[key] = rope.to(self.rope.freqs.device)
        return pos, self._scaled_ropes[key]

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor,
        *,
        pos_mode: str | None = None,
        force_drop_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict from a noisy latent.

        Args:
            x: latent ``[B, C, H, W]``, ``H`` and ``W`` divisible by the patch.
            t: timesteps ``[B]``.
            y: class labels ``[B]`` (``y_embedder.null_label`` = unconditional).
            pos_mode: overrides ``config.pos_mode`` for this call.

        Returns:
            ``[B, out_channels, H, W]``.
        """
        x, (h, w) = self.x_embedder(x)  # [B, S, C], S = h * w
        pos, rope = self.positions(h, w, pos_mode, device=x.device)
        c = self.t_embedder(t) + self.y_embedder(y, force_drop_ids)  # [B, C]
        for block in self.blocks:
            x = block(x, c, pos, rope=rope)
        x = self.final_layer(x, c)  # [B, S, p * p * out_channels]
        return unpatchify(x, (h, w), self.config.patch_size, self.out_channels)

    def forward_with_cfg(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float, **kwargs
    ) -> torch.Tensor:
        """Classifier-free guidance: one batch of conditional and null-label passes, mixed by ``cfg_scale``.

        Guidance applies to the first ``in_channels`` output channels (the prediction); a
        learned variance, if any, is taken from the conditional pass.
        """
        null = torch.full_like(y, self.y_embedder.null_label)
        out = self(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), **kwargs)
        cond, uncond = out.chunk(2)
        k = self.config.in_channels
        guided = uncond[:, :k] + cfg_scale * (cond[:, :k] - uncond[:, :k])
        return torch.cat([guided, cond[:, k:]], dim=1)
