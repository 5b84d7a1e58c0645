"""Frame-at-a-time generation with a frame-causal video DiT and a rolling frame cache (streaming video).

A :class:`~models.video_dit.VideoDiT` built with ``causal=True`` and trained with one noise level per
frame (diffusion forcing, Chen et al. 2024, arXiv:2407.01392; the training CausVid and Self-Forcing use)
generates a video a chunk of frames at a time, past the length it was trained on:

1. each block keeps the keys and values of the finished frames in a rolling
   :class:`~axial_rope.KVCache` (``frame`` = tokens per frame, ``time_axis`` 0): when it is full it drops the
   oldest frame and re-indexes the kept ones by rotating their keys on the time axis, so time positions stay
   within ``0 .. window - 1`` frames, the trained range when ``window`` is the training length;
2. the new chunk is denoised from noise by Euler steps (:func:`models.flow.sample_euler`), attending to the
   cached frames and to itself *without writing* (``cache_write=False``: its keys change at every step); the
   caches make room for it first (:meth:`~axial_rope.KVCache.make_room`: the roll, if one is due), so the
   steps read the same kept frames its clean pass then writes beside;
3. one clean pass at timestep 0 writes the finished chunk into the caches: context frames are clean, as
   diffusion forcing samples (timestep 0 for the past, noise for the frame being made).

With a window holding every frame, :func:`forward_frames` equals the model's own causal forward over all the
frames (tests/test_video_causal.py, float64); with a rolling window, each block's attention equals attention
over the kept frames at re-indexed positions.
"""

from __future__ import annotations

import torch

import axial_rope as ar
from axial_rope.layers import unpatchify

from .flow import classifier_free_guidance, sample_euler
from .video_dit import VideoDiT, frame_causal_mask, frame_timesteps, token_frames

__all__ = ["forward_frames", "frame_caches", "sample_streaming"]


def frame_caches(
    model: VideoDiT,
    batch: int,
    tokens_per_frame: int,
    window: int,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> list[ar.KVCache]:
    """One rolling frame cache per block, each holding ``window`` frames of ``tokens_per_frame`` tokens.

    The window counts the frame being generated too: a chunk of ``n`` frames attends to ``window - n``
    cached ones, at time positions ``0 .. window - 1``.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (frames kept), got {window!r}")
    if isinstance(tokens_per_frame, bool) or not isinstance(tokens_per_frame, int) or tokens_per_frame < 1:
        raise ValueError(
            f"tokens_per_frame must be a positive int (tokens of one latent frame), got {tokens_per_frame!r}"
        )
    attn = model.blocks[0].attn
    param = next(model.parameters())
    tokens = window * tokens_per_frame
    return [
        ar.KVCache(
            batch,
            tokens,
            attn.num_kv_heads,
            attn.head_dim,
            window=tokens,
            frame=tokens_per_frame,
            time_axis=0,
            dtype=dtype or param.dtype,
            device=device or param.device,
        )  # fmt: skip
        for _ in model.blocks
    ]


def forward_frames(
    model: VideoDiT,
    x: torch.Tensor,
    t: torch.Tensor | float,
    y: torch.Tensor | None = None,
    cond: torch.Tensor | None = None,
    *,
    caches: list[ar.KVCache],
    cache_write: bool,
    force_drop_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Predict for the next chunk of frames, attending to the frames in ``caches`` and frame-causally within it.

    Args:
        model: a :class:`~models.video_dit.VideoDiT` with ``config.causal``.
        x: the chunk ``[B, C, T_c, H, W]`` (``T_c`` frames, divisible by the patch).
        t: timesteps ``[B]`` (or one value, or ``[B, T_c / p_t]`` per frame), as :meth:`VideoDiT.forward`.
        y, cond: the conditioning, as :meth:`VideoDiT.forward`.
        caches: one per block (:func:`frame_caches`). Writing, they roll first if the chunk does not fit
            (:meth:`~axial_rope.KVCache.advance`).
        cache_write: ``True`` writes the chunk's keys and values (its final, clean pass); ``False`` reads the
            caches without changing them (a denoising step): no roll, no slot reserved, so the chunk must fit
            beside the cached frames (``ValueError`` otherwise: call ``cache.make_room(tokens, model.rope)`` on
            each cache first, as :func:`sample_streaming` does before a chunk's steps).

    Returns:
        ``[B, out_channels, T_c, H, W]``.
    """
    if not model.config.causal:
        raise ValueError("forward_frames needs a frame-causal model (VideoDiTConfig(causal=True))")
    if len(caches) != len(model.blocks):
        raise ValueError(f"caches must hold one KVCache per block ({len(model.blocks)}), got {len(caches)}")
    batch = x.shape[0]
    h, grid = model.x_embedder(x)  # [B, S_c, C], grid (t_c, h, w)
    t = frame_timesteps(t, batch, grid[0], h.device)  # [B] | [B, t_c]
    frame = grid[1] * grid[2]
    if any(cache.frame != frame for cache in caches):
        raise ValueError(f"the caches hold frames of {caches[0].frame} tokens, x has {frame} per frame")
    n = h.shape[1]
    if cache_write:  # reserves the chunk's slots on the host (rolling first if it does not fit)
        slots = [cache.advance(n, model.rope) for cache in caches][0]  # [S_c]
        held = caches[0].length - n
    else:  # a read: where a write would put the chunk, nothing reserved
        held = caches[0].length
        if any(cache.length + n > (cache.window or cache.max_seq_len) for cache in caches):
            raise ValueError(
                f"forward_frames(cache_write=False) reads the caches without changing them, and the chunk's "
                f"{n // frame} frame(s) do not fit beside the {held // frame} cached in a window of "
                f"{(caches[0].window or caches[0].max_seq_len) // frame}: call cache.make_room({n}, model.rope) on each cache first "
                "(sample_streaming does)"
            )
        slots = torch.arange(held, held + n, device=h.device)  # [S_c]
    start = held // frame  # the chunk's first frame, after the kept ones (re-indexed from 0)
    pos = ar.grid(*grid, offset=(start, 0, 0), device=h.device)  # [S_c, 3]
    rotation = model.rope.rotation(pos)
    # keys: the cache's slots (every written one an earlier frame), then (reading) the chunk's own tokens
    queries = token_frames(grid[0], frame, start, device=h.device)  # [S_c]
    keys = token_frames(caches[0].max_seq_len // frame, frame, device=h.device)  # [S_max]
    mask = frame_causal_mask(queries, keys if cache_write else torch.cat([keys, queries]))
    c = model.condition(t, y, cond, force_drop_ids)  # [B, C] | [B, t_c, C]
    per_frame = frame if t.ndim == 2 else None
    for block, cache in zip(model.blocks, caches):
        h = block(h, c, rotation=rotation, attend=ar.Cached(cache, slots, cache_write, mask), frame=per_frame)
    out = model.final_layer(h, c, frame=per_frame)  # [B, S_c, prod(patch) * out_channels]
    return unpatchify(out, grid, model.config.patch_size, model.out_channels)


@torch.no_grad()
def sample_streaming(
    model: VideoDiT,
    noise: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    window: int,
    steps: int = 20,
    cfg_scale: float = 1.0,
    chunk: int = 1,
    cond: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generate a video a chunk at a time with rolling frame caches (any length: positions are re-indexed).

    Args:
        model: a frame-causal :class:`~models.video_dit.VideoDiT` (trained with per-frame noise: ``--causal``).
        noise: ``[B, C, T, H, W]``, the initial noise of every frame (``T``: any multiple of the chunk).
        labels: class labels ``[B]`` (class-conditional configs).
        window: latent frames each cache keeps, the chunk being generated included (the training length
            keeps positions within the trained range).
        steps: Euler steps per chunk; cfg_scale: classifier-free guidance (needs label dropout when != 1).
        chunk: latent frames generated together (frame-causal among themselves).
        cond: conditioning vectors ``[B, cond_dim]`` (configs with ``cond_dim``).

    Returns:
        ``[B, C, T, H, W]`` in [-1, 1] (each chunk clamped before it becomes context).
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (latent frames kept), got {window!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 < chunk <= window:
        raise ValueError(f"chunk must be an int in [1, window = {window}] (latent frames), got {chunk!r}")
    pt, py, px = model.config.patch_size
    if not isinstance(noise, torch.Tensor) or noise.ndim != 5 or noise.shape[2] == 0:
        got = tuple(noise.shape) if isinstance(noise, torch.Tensor) else repr(noise)
        raise ValueError(f"noise must be [B, C, T, H, W] with T >= 1 frames, got {got}")
    B, _, T, H, W = noise.shape
    if T % (chunk * pt):
        raise ValueError(f"noise's {T} frames must be whole chunks of {chunk} latent frames of {pt}")
    guided = cfg_scale != 1.0
    null = model.y_embedder.null_label if guided and model.y_embedder is not None else None
    caches = frame_caches(model, 2 * B if guided else B, (H // py) * (W // px), window, device=noise.device)
    conditioned = {} if cond is None else {"cond": cond}

    def step(x, t, y, **kw):  # the model as classifier_free_guidance calls it, reading the caches only
        return forward_frames(model, x, t, y, caches=caches, cache_write=False, **kw)

    frames = []
    for first in range(0, T, chunk * pt):
        part = noise[:, :, first : first + chunk * pt]  # [B, C, chunk * pt, H, W]
        for cache in caches:  # the roll, if one is due, before the steps: they read what the clean pass writes beside
            cache.make_room(chunk * cache.frame, model.rope)

        def velocity(x, t):
            return classifier_free_guidance(step, x, t, labels, null, cfg_scale, **conditioned)

        clean = sample_euler(velocity, part, steps).clamp(-1, 1)
        # the clean pass at timestep 0 writes the finished chunk (both halves of a guided batch)
        both = (lambda v: None if v is None else torch.cat([v, v])) if guided else (lambda v: v)
        y = None if labels is None else (torch.cat([labels, torch.full_like(labels, null)]) if guided else labels)
        forward_frames(
            model, both(clean), torch.zeros((), device=noise.device), y, both(cond), caches=caches, cache_write=True
        )
        frames.append(clean)
    return torch.cat(frames, dim=2)
