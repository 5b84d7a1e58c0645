"""Video DiT with 3D (t, y, x) axial RoPE: patches (1, 2, 2), any frame count and frame size.

Each head's channels are split per axis (``axes_dim``, default Wan's rule: ``y`` and
``x`` get ``2 * (D // 6)`` each, ``t`` the rest), and tokens sit at ``ar.grid(t, h, w)``.
Conditioning is a class label, a vector (e.g. a pooled text embedding), or both,
added to the timestep embedding that drives adaLN-Zero. The temporal axis can be
rescaled at inference (``temporal_scaling``, per call: any method of
:mod:`axial_rope.scaling`, RIFLEx included, or a time-dependent one of :mod:`axial_rope.time_scaling`,
following each forward's timestep, ``t / 1000``) to generate more frames than in
training; space keeps integer coordinates. Weights start as DiT's (:func:`models.dit.initialize_weights`).

Context parallel (``forward(..., context_parallel=cp)``, docs/distributed.md): the tokens are
sharded over the ranks of ``cp.group`` right after the patch embedding, each rank keeps its
tokens' global ``(t, y, x)`` coordinates, the conditioning is computed whole on every rank,
and only attention communicates; the output is gathered before the unpatchify (or kept
sharded for :func:`flow_loss_shard`, the training loss on this rank's tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

import axial_rope as ar
from axial_rope.init import deferred_init
from axial_rope.layers import DiTBlock, FinalLayer, LabelEmbedder, PatchEmbed, TimestepEmbedder, unpatchify
from axial_rope.packing import Item, pack, unpack
from axial_rope.parallel import ContextParallel
from axial_rope.time_scaling import is_time_dependent

from .checks import batch_timesteps, check_fields, check_labels, check_time_range
from .dit import initialize_weights, noise_level
from .flow import T_SCALE, noisy
from .packed import patch_tokens

__all__ = [
    "VideoDiT",
    "VideoDiTConfig",
    "PRESETS",
    "default_axes_dim",
    "flow_loss_shard",
    "frame_causal_mask",
    "frame_timesteps",
    "patchify",
    "token_frames",
]


def default_axes_dim(head_dim: int) -> tuple[int, int, int]:
    """Wan's split of a head over (t, y, x) (:func:`axial_rope.conventions.wan_axes_dim`): ``y`` and ``x`` get
    ``2 * (D // 6)``, ``t`` the rest; an odd ``D`` leaves its last channel unrotated."""
    return ar.conventions.wan_axes_dim(head_dim - head_dim % 2)


@dataclass(frozen=True)
class VideoDiTConfig:
    """Sizes of a video DiT; ``num_classes`` and ``cond_dim`` (0 = off) choose the conditioning."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 4
    hidden_size: int = 384
    depth: int = 12
    num_heads: int = 6
    mlp_ratio: float = 4.0
    axes_dim: tuple[int, int, int] | None = None  # (d_t, d_y, d_x); None: default_axes_dim(head_dim)
    theta: float = 10000.0
    num_classes: int = 0  # class conditioning (with label dropout for guidance) when > 0
    class_dropout_prob: float = 0.1
    cond_dim: int = 0  # vector conditioning [B, cond_dim] when > 0
    qk_norm: str | None = "rms"
    learn_sigma: bool = False
    causal: bool = False  # frame-causal attention: a frame's tokens see their frame and the earlier ones

    def __post_init__(self):
        check_fields(
            self,
            positive_ints=("in_channels", "hidden_size", "depth", "num_heads"),
            counts=("num_classes", "cond_dim"),
            positive_reals=("mlp_ratio", "theta"),
            probabilities=("class_dropout_prob",),
            bools=("learn_sigma", "causal"),
        )
        # JSON gives lists: the sizes are kept as tuples (a frozen dataclass: set through object)
        for name in ("patch_size", "axes_dim"):
            value = getattr(self, name)
            if value is None and name == "axes_dim":
                continue
            if not isinstance(value, (tuple, list)) or len(value) != 3 or not all(_positive_int(v) for v in value):
                raise ValueError(f"VideoDiTConfig.{name} must be three positive ints (t, y, x), got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.num_classes <= 0 and self.cond_dim <= 0:
            raise ValueError("VideoDiTConfig needs num_classes > 0 or cond_dim > 0 (a conditioning)")
        head_dim = self.hidden_size // self.num_heads
        axes_dim = self.axes_dim or default_axes_dim(head_dim)
        if any(d % 2 for d in axes_dim) or sum(axes_dim) > head_dim or min(axes_dim) == 0:
            raise ValueError(
                f"axes_dim {axes_dim} must be even and positive, summing to at most head_dim = {head_dim} "
                f"(hidden_size {self.hidden_size} / num_heads {self.num_heads})"
            )


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


PRESETS: dict[str, VideoDiTConfig] = {
    "tiny": VideoDiTConfig(in_channels=3, hidden_size=128, depth=2, num_heads=4, num_classes=4),
    # the frame-count study's model (docs/experiments/frames.md): HunyuanVideo's temporal rope (16 channels,
    # theta 256: periods 6.3, 12.6, 25, 50 ... frames), so a model trained on 8 frames has a pair whose
    # period (12.6) first falls inside a 16-24-frame test window; 32 px frames in 4 px patches (8 x 8 tokens)
    "tiny-hunyuan": VideoDiTConfig(
        patch_size=(1, 4, 4),
        in_channels=3,
        hidden_size=128,
        depth=3,
        num_heads=4,
        axes_dim=(16, 8, 8),
        theta=256.0,
        num_classes=4,
    ),  # fmt: skip
    "S": VideoDiTConfig(hidden_size=384, depth=12, num_heads=6, num_classes=1000),
    "B": VideoDiTConfig(hidden_size=768, depth=12, num_heads=12, num_classes=1000),
    # Wan 2.1 1.3B's trunk sizes (head dim 128 -> axes (44, 42, 42)) with vector conditioning
    "wan-1.3b-like": VideoDiTConfig(in_channels=16, hidden_size=1536, depth=30, num_heads=12, cond_dim=4096),
}


class VideoDiT(nn.Module):
    """Video diffusion transformer over latents ``[B, C, T, H, W]`` with 3D axial RoPE."""

    def __init__(self, config: VideoDiTConfig):
        super().__init__()
        self.config = c = config  # checked when it was made (VideoDiTConfig.__post_init__)
        axes_dim = c.axes_dim or default_axes_dim(c.hidden_size // c.num_heads)
        self.out_channels = c.in_channels * 2 if c.learn_sigma else c.in_channels
        with deferred_init(self):  # built on meta, then reset_parameters: a meta-device build reproduces it
            self.rope = ar.AxialRoPE(axes_dim, theta=c.theta)
            self.x_embedder = PatchEmbed(c.patch_size, c.in_channels, c.hidden_size)
            self.t_embedder = TimestepEmbedder(c.hidden_size)
            self.y_embedder = (
                LabelEmbedder(c.num_classes, c.hidden_size, c.class_dropout_prob) if c.num_classes > 0 else None
            )
            self.cond_embedder = (
                nn.Sequential(nn.Linear(c.cond_dim, c.hidden_size), nn.SiLU(), nn.Linear(c.hidden_size, c.hidden_size))
                if c.cond_dim > 0
                else None
            )
            self.blocks = nn.ModuleList(
                [
                    DiTBlock(c.hidden_size, c.num_heads, self.rope, mlp_ratio=c.mlp_ratio, qk_norm=c.qk_norm)
                    for _ in range(c.depth)
                ]
            )
            self.final_layer = FinalLayer(c.hidden_size, c.patch_size, self.out_channels)

    def reset_parameters(self) -> None:
        """DiT's initialisation (:func:`models.dit.initialize_weights`); also the re-initialisation of a model built
        on the meta device after ``to_empty``."""
        initialize_weights(self)

    def condition(self, t: torch.Tensor, y: torch.Tensor | None, cond: torch.Tensor | None, force_drop_ids=None):
        """The adaLN conditioning vector ``[B, C]``: timestep + class + vector embeddings; with one timestep per
        frame, ``t [B, T]``: ``[B, T, C]`` (the class and vector embeddings the same for every frame)."""
        c = self.t_embedder(t.flatten()).unflatten(0, t.shape)  # [B, C] | [B, T, C]
        per_frame = (slice(None), None) if t.ndim == 2 else (slice(None),)  # a sample's embedding on each frame
        for name, value, embedder in (("y", y, self.y_embedder), ("cond", cond, self.cond_embedder)):
            if (value is None) != (embedder is None):
                need = "is required" if value is None else "is not used by this config"
                raise ValueError(
                    f"{name} {need} (num_classes={self.config.num_classes}, cond_dim={self.config.cond_dim})"
                )
        if y is not None:
            check_labels(y, self.y_embedder, t.shape[0])
            c = c + self.y_embedder(y, force_drop_ids)[per_frame]
        if cond is not None:
            c = c + self.cond_embedder(cond.to(c.dtype))[per_frame]
        return c

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
        *,
        temporal_scaling: ar.scaling.Scaling | None = None,
        force_drop_ids: torch.Tensor | None = None,
        context_parallel: ContextParallel | None = None,
        gather: bool = True,
    ) -> torch.Tensor:
        """Predict from a noisy video latent.

        Args:
            x: ``[B, C, T, H, W]``, each size divisible by the patch.
            t: timesteps ``[B]``, or one value for every sample, or one per latent frame ``[B, T / p_t]``
                (diffusion forcing: each frame its own noise level; the adaLN modulation then varies per frame).
            y: class labels ``[B]`` (configs with ``num_classes``).
            cond: conditioning vectors ``[B, cond_dim]`` (configs with ``cond_dim``).
            temporal_scaling: a scaling method for the t axis at inference, e.g.
                ``ar.scaling.RIFLEx(k, test_length=T_latent)``; a time-dependent one (``DyPE(2.0, 8)``)
                follows ``t``, which must then hold one value for the batch.
            context_parallel: a :class:`~axial_rope.parallel.ContextParallel`: every rank of its group
                passes the same whole ``x``, ``t``, ``y``, ``cond`` (collective) and computes ``1/P`` of
                the tokens; attention spans all of them.
            gather: ``False``: return the output tokens ``[B, L, p_t * p_y * p_x * out_channels]``
                before the unpatchify (with ``context_parallel``: this rank's ``L`` slots, padding
                included, in ``cp.indices`` order; without: all ``S`` tokens).

        Returns:
            ``[B, out_channels, T, H, W]`` (the whole video on every rank, also under context parallel).
        """
        if isinstance(x, (list, tuple)):  # through forward, so DDP and hooks see packed batches too
            if context_parallel is not None or not gather:
                raise ValueError("packed batches (a list of videos) take neither context_parallel nor gather=False")
            return self.forward_packed(x, t, y, cond, temporal_scaling=temporal_scaling, force_drop_ids=force_drop_ids)
        batch = x.shape[0]
        x, grid = self.x_embedder(x)  # [B, S, C], grid (t, h, w), S = t * h * w
        t = frame_timesteps(t, batch, grid[0], x.device)  # [B] | [B, t]
        frame = grid[1] * grid[2] if t.ndim == 2 else None  # tokens per frame of a per-frame conditioning
        if t.ndim == 2 and is_time_dependent(temporal_scaling):
            raise ValueError("a time-dependent temporal_scaling follows one timestep: t must be [B], not per frame")
        mask = None
        if self.config.causal:  # [S, S] bool: frame i's tokens see frames 0 .. i
            frames = token_frames(grid[0], grid[1] * grid[2], device=x.device)
            mask = frame_causal_mask(frames, frames)
        pos = ar.grid(*grid, device=x.device)  # [S, 3], t slowest as the tokens
        cp, seq_len = None, None
        if context_parallel is not None:
            if mask is not None or frame is not None:
                raise ValueError(
                    "context_parallel takes neither a causal config (its frame mask) nor per-frame timesteps "
                    "t [B, T]: each rank holds only a shard of the tokens"
                )
            cp = context_parallel.for_length(x.shape[1])
            # [B, L, C] and [L, 3]: this rank's tokens at their global coordinates; a length-dependent
            # scaling is told the whole grid (what it infers from unsharded positions: max + 1 per axis)
            x, pos, seq_len = cp.shard(x), cp.positions(pos), tuple(grid)
        # the temporal scaling on the t axis (y, x unscaled); a time-dependent one at t / 1000. Once for every block.
        check_time_range(t, T_SCALE, temporal_scaling)  # refused outside [0, 1000], not clamped
        rotation = self.rope.rotation(pos, seq_len=seq_len, scaling=(temporal_scaling, None, None), t=noise_level(t))
        c = self.condition(t, y, cond, force_drop_ids)  # [B, C]: the same on every rank of the group
        attend = ar.Sdpa(mask) if cp is None else ar.Sharded(cp)  # cp takes no mask (refused above)
        for block in self.blocks:
            x = block(x, c, rotation=rotation, attend=attend, frame=frame)
        x = self.final_layer(x, c, frame=frame)  # [B, S | L, p_t * p_y * p_x * out_channels]
        if not gather:
            # a tensor of its own: nn.Linear on [B, L, C] returns a view of its 2-D product, and FSDP2, which
            # hooks the model's outputs for its backward, warns that an in-place op on a view skips that hook
            return x.clone()
        if cp is not None:
            x = cp.gather(x)  # [B, S, ...] on every rank, padding dropped
        return unpatchify(x, grid, self.config.patch_size, self.out_channels)

    def forward_packed(
        self,
        xs,
        t: torch.Tensor,
        y: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
        *,
        temporal_scaling: ar.scaling.Scaling | None = None,
        force_drop_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Predict for videos of different lengths and sizes in one packed sequence (equal to :meth:`forward`
        on each alone; ``forward`` takes the list too).

        Args:
            xs: ``N`` latents ``[C, T_i, H_i, W_i]``, sizes divisible by the patch.
            t: timesteps ``[N]`` (or one value); y: labels ``[N]``; cond: vectors ``[N, cond_dim]``.
            temporal_scaling: as in :meth:`forward`, applied to each video on its own (a length-dependent
                method sees that video's frames; block axes, ``axial_rope.packed_rope``); not time-dependent.

        Returns:
            ``N`` predictions ``[out_channels, T_i, H_i, W_i]``.
        """
        if not len(xs):
            raise ValueError("forward_packed needs at least one video")
        if self.config.causal:
            raise ValueError("forward_packed is bidirectional: a causal config (frame mask) takes one size per call")
        if is_time_dependent(temporal_scaling):
            raise ValueError("a time-dependent temporal_scaling follows one sampling time: call forward per size")
        for name, v in (("y", y), ("cond", cond)):
            if v is not None and (not isinstance(v, torch.Tensor) or v.shape[0] != len(xs)):
                raise ValueError(f"{name} must hold one row per video ({len(xs)}), got {getattr(v, 'shape', v)}")
        patch = self.config.patch_size
        scaling = None if temporal_scaling is None else (temporal_scaling, None, None)
        items = []
        for i, x in enumerate(xs):
            patches = patch_tokens(x, patch, i)  # [t, h, w, C pt py px]
            grid = tuple(patches.shape[:3])
            pos = ar.grid(*grid, device=x.device)  # [t h w, 3]
            items.append(Item(patches.reshape(-1, patches.shape[-1]), pos, grid, scaling=scaling))
        packed = pack(items)
        proj = self.x_embedder.proj  # the patch conv as one matmul over every video's patches
        x = (packed.tokens @ proj.weight.flatten(1).T + proj.bias)[None]  # [1, T, hidden]
        rotation, segments = packed.rope(self.rope).rotation(packed.pos), packed.segments  # each video its own F
        t = batch_timesteps(t, packed.n_items, x.device)
        c = self.condition(t, y, cond, force_drop_ids)  # [N, C]: modulation per video, then per token
        attend = ar.Varlen(segments)  # attention within each video
        for block in self.blocks:
            x = block(x, c, rotation=rotation, attend=attend)
        x = self.final_layer(x, c, segments=segments)  # [1, T, prod(patch) * out]
        out = self.out_channels
        return [unpatchify(o.reshape(1, -1, o.shape[-1]), o.shape[:3], patch, out)[0] for o in unpack(packed, x)]


def frame_timesteps(t: torch.Tensor | float, batch: int, frames: int, device=None) -> torch.Tensor:
    """Timesteps as ``[batch]`` (:func:`~models.checks.batch_timesteps`) or one per latent frame ``[batch, frames]``."""
    if not (isinstance(t, torch.Tensor) and t.ndim == 2):
        return batch_timesteps(t, batch, device)
    if tuple(t.shape) != (batch, frames):
        raise ValueError(
            f"timesteps must be one value or [B] = [{batch}], got shape {tuple(t.shape)}; one per latent frame: "
            f"[B, T] = [{batch}, {frames}]"
        )
    return (t if t.is_floating_point() else t.float()).to(device)


def token_frames(frames: int, tokens_per_frame: int, start: int = 0, device=None) -> torch.Tensor:
    """The frame index of each token of ``frames`` frames of ``tokens_per_frame`` tokens (t-major, as
    :func:`axial_rope.grid`), frames counted from ``start``: int ``[frames * tokens_per_frame]``."""
    return torch.arange(start, start + frames, device=device).repeat_interleave(tokens_per_frame)


def frame_causal_mask(query_frames: torch.Tensor, key_frames: torch.Tensor) -> torch.Tensor:
    """Block-causal attention over frames (autoregressive video models: CausVid, Self-Forcing): a query sees the
    keys of its own frame and the earlier ones. ``query_frames [S_q]``, ``key_frames [S_k]`` (int, from
    :func:`token_frames`) -> bool ``[S_q, S_k]``, True = attend (SDPA's convention)."""
    return key_frames[None, :] <= query_frames[:, None]


def patchify(x: torch.Tensor, patch_size: tuple[int, int, int]) -> torch.Tensor:
    """``[B, C, T, H, W]`` -> ``[B, S, p_t * p_y * p_x * C]``: :func:`unpatchify`'s inverse (tokens t-major,
    each token's channels ordered ``(p_t, p_y, p_x, C)``), e.g. a loss target in the model's token layout."""
    B, C, T, H, W = x.shape
    pt, py, px = patch_size
    x = x.reshape(B, C, T // pt, pt, H // py, py, W // px, px)
    return x.permute(0, 2, 4, 6, 3, 5, 7, 1).reshape(B, -1, pt * py * px * C)  # [B, t, h, w, pt, py, px, C]


def flow_loss_shard(
    model, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, cp: ContextParallel, patch_size, **model_kwargs
) -> torch.Tensor:
    """This rank's share of :func:`models.flow.flow_loss` under context parallel (collective).

    Every rank of ``cp.group`` passes the same ``x0 [B, C, T, H, W]``, ``t [B]`` and ``noise``; the
    model (a :class:`VideoDiT`, possibly wrapped by DDP or FSDP) returns this rank's output tokens,
    compared with the same tokens of the target. The share is the squared error summed over this
    rank's valid tokens, divided by ``x0.numel()`` (the whole batch's ``B * S * prod(patch) * C``),
    so the shares of the group add up to the unsharded mean, and so do their gradients (the ring's
    or all-to-all's backward carries each rank's share of the other ranks' keys and values home).
    """
    pred = model(noisy(x0, t, noise), t * T_SCALE, context_parallel=cp, gather=False, **model_kwargs)
    target = patchify(noise - x0, patch_size)  # [B, S, n * C], n = prod(patch)
    cp = cp.for_length(target.shape[1])
    target = cp.shard(target)  # [B, L, n * C]: this rank's tokens, zero at padding slots
    B, L = pred.shape[:2]
    n = math.prod(patch_size)
    pred = pred.reshape(B, L, n, -1)[..., : x0.shape[1]].reshape(B, L, -1)  # a learned variance's channels dropped
    err = (pred.float() - target.float()).square()[:, cp.valid(device=pred.device)]  # [B, valid L, n * C]
    return err.sum() / x0.numel()
