"""Checkpoint conventions: move q/k projection weights between pairings.

A plane is channels ``(2j, 2j+1)`` under ``"interleaved"`` pairing (Meta's LLaMA, Flux,
diffusers) and ``(j, j + r/2)`` under ``"half"`` (Hugging Face LLaMA, GPT-NeoX).
Permuting the output rows of the q and k projections within each head moves every
plane to its place in the other pairing; ``q . k`` is a sum over channels, so with
both weights and the pairing converted, attention is unchanged.
"""

from __future__ import annotations

import torch

from .ops import PAIRINGS, check_choice

__all__ = ["pairing_permutation", "permute_pairing"]


def pairing_permutation(
    head_dim: int, rot_dim: int | None = None, *, src: str = "interleaved", dst: str = "half"
) -> torch.Tensor:
    """Channel order ``perm`` with ``new[..., c] = old[..., perm[c]]`` for one head.

    Channels past ``rot_dim`` (default: ``head_dim``) keep their place.
    """
    check_choice("src", src, PAIRINGS)
    check_choice("dst", dst, PAIRINGS)
    rot_dim = head_dim if rot_dim is None else rot_dim
    if rot_dim % 2 or not 0 < rot_dim <= head_dim:
        raise ValueError(f"rot_dim must be even and in (0, head_dim={head_dim}], got {rot_dim}")
    index = torch.arange(rot_dim)
    if src == dst:
        perm = index
    elif src == "interleaved":  # half channel j <- plane j's first, j + r/2 <- its second
        perm = torch.cat([index[0::2], index[1::2]])
    else:  # interleaved channel 2j <- j, 2j+1 <- j + r/2
        perm = torch.stack([index[: rot_dim // 2], index[rot_dim // 2 :]], dim=-1).flatten()
    return torch.cat([perm, torch.arange(rot_dim, head_dim)])


def permute_pairing(
    weight: torch.Tensor,
    num_heads: int,
    *,
    rot_dim: int | None = None,
    src: str = "interleaved",
    dst: str = "half",
) -> torch.Tensor:
    """Reorder the output rows of a q or k projection weight (or bias) from ``src`` to ``dst`` pairing.

    Args:
        weight: ``[num_heads * head_dim, in_features]`` (or a bias ``[num_heads * head_dim]``),
            rows grouped by head as in ``nn.Linear``.
        num_heads: heads in this projection (kv heads for k under GQA).
        rot_dim: rotary channels per head (partial rotary), default the whole head.

    Returns:
        A new tensor of the same shape.
    """
    if weight.shape[0] % num_heads:
        raise ValueError(f"weight has {weight.shape[0]} output rows, not divisible by num_heads={num_heads}")
    head_dim = weight.shape[0] // num_heads
    perm = pairing_permutation(head_dim, rot_dim, src=src, dst=dst).to(weight.device)
    return weight.unflatten(0, (num_heads, head_dim))[:, perm].flatten(0, 1).clone()
