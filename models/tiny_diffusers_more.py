"""Tiny random diffusers transformers of the later families (Z-Image) and their inputs at any size:
:data:`ENTRIES` holds a :class:`~models.tiny_diffusers_common.Tiny` per class name.
"""

from __future__ import annotations

import diffusers
import torch

from models.tiny_diffusers_common import B, Tiny

__all__ = ["ENTRIES"]


class ZImageTransformer2DModel(diffusers.ZImageTransformer2DModel):
    """Z-Image returning its per-item latents stacked (``[B, C, F, H, W]``; the items share a size here), so
    the generic checks compare one tensor; named as the stock class, whose record the adapter finds."""

    def forward(self, x, t, cap_feats, return_dict=True, patch_size=2, **kwargs):
        out = super().forward(x, t, cap_feats, return_dict=False, patch_size=patch_size, **kwargs)[0]
        return (torch.stack(out),)


def _z_image(depth):
    return ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=16, n_layers=depth, n_refiner_layers=depth,
        n_heads=2, n_kv_heads=2, cap_feat_dim=8, axes_dims=[2, 2, 4], axes_lens=[64, 32, 32],
    )  # fmt: skip


def _z_image_inputs(h, w, frames, g):  # captions of 5 and 3 tokens: padded to 32, the second item masked more
    return dict(
        x=[torch.randn(4, 1, 2 * h, 2 * w, generator=g) for _ in range(B)], t=torch.rand(B, generator=g),
        cap_feats=[torch.randn(5, 8, generator=g), torch.randn(3, 8, generator=g)], return_dict=False,
    )  # fmt: skip


ENTRIES: dict[str, Tiny] = {
    "ZImageTransformer2DModel": Tiny(
        model=_z_image,
        inputs=_z_image_inputs,
        grid=(1, 3, 4),
        video=False,
        no_fullgraph="RopeEmbedder builds its lookup tables under a `with torch.device` and the forward pads the "
        "items' sequences in Python loops",
        no_dynamic="the forward pads each item's sequence to a multiple of 32 tokens from host lengths",
        no_repeated="its ZImageTransformerBlock serves the image refiner, the caption refiner (without modulation) "
        "and the main layers, each a different call",
    ),
}
