"""Vision transformers with 2D axial RoPE, registered with timm.

Importing this module registers ``vit_small_patch16_axial_rope``,
``vit_base_patch16_axial_rope`` and the test-sized ``test_vit_axial_rope`` with
timm's ``register_model``, so ``timm.create_model(name, num_classes=...)`` builds
them (no pretrained weights). The model is a plain pre-norm ViT made of timm's
``PatchEmbed``, ``Mlp``, ``LayerScale`` and ``DropPath``, without absolute position
embeddings: the attention rotates the patch tokens' q and k by their ``(y, x)``
patch coordinates with :class:`~axial_rope.AxialRoPE` (prefix tokens are not rotated).
``dynamic_img_size`` (on by default) lets one model run at any size the patch
divides; ``rope_positions`` chooses the positions and frequencies at a new size. It is
a mode of :func:`axial_rope.positions_for_size` (any of ``POSITION_MODES``), applied with
the model's trained patch grid ``img_size / patch_size``, so each name means what it means
for the reference DiTs and everywhere else in the library:

- ``"none"``: integer patch indices ``0 .. n - 1`` (larger images extrapolate);
- ``"interpolate"`` (default): the indices of an axis longer than trained scaled by
  ``trained / current``, into the trained coordinate range (position interpolation);
  axes at or below the trained size keep integer indices;
- ``"ntk"`` / ``"yarn"``: integer indices, NTK-aware or YaRN frequencies on longer axes;
- ``"normalize"``: centred cell centres, the longest axis spanning the trained extent
  (aspect kept): unit spacing at the trained size.

Before this, ``"interpolate"`` also stretched grids smaller than the trained one, and
``"normalize"`` was DINOv3's ``[-1, 1]`` per axis times ``2 pi``; for DINOv3's coordinates,
override :meth:`AxialRoPEViT.positions` with ``ar.grid(h, w, normalize=True, scale=2 * math.pi)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, LayerNorm, LayerScale, Mlp, PatchEmbed, trunc_normal_
from timm.models import build_model_with_cfg, checkpoint, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from ..positions import POSITION_MODES, positions_for_size
from ..rope import AxialRoPE
from ..scaling import Scaling

__all__ = ["AxialRoPEViT", "ROPE_POSITIONS"]

ROPE_POSITIONS = POSITION_MODES  # the modes of axial_rope.positions_for_size


class RopeAttention(nn.Module):
    """Multi-head self-attention whose patch tokens' q and k are rotated by :class:`~axial_rope.AxialRoPE`."""

    def __init__(self, dim: int, num_heads: int, rope: AxialRoPE, qkv_bias: bool = True, qk_norm: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim, self.rope = num_heads, dim // num_heads, rope
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, num_prefix_tokens: int, rope: AxialRoPE | None = None
    ) -> torch.Tensor:
        """x ``[B, S, C]``, pos ``[S - prefix, 2]``; ``rope`` replaces ``self.rope`` for this call (a scaled one)."""
        B, S, C = x.shape
        q, k, v = self.qkv(x).reshape(B, S, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [B, H, S, D]
        q, k = self.q_norm(q), self.k_norm(k)
        n = num_prefix_tokens  # class/register tokens carry no position
        rope = self.rope if rope is None else rope
        q_rot, k_rot = rope(q[:, :, n:], k[:, :, n:], pos, "bhsd")  # pos [S - n, 2]
        q, k = torch.cat([q[:, :, :n], q_rot], dim=2), torch.cat([k[:, :, :n], k_rot], dim=2)
        x = F.scaled_dot_product_attention(q, k, v)  # [B, H, S, D]
        return self.proj(x.transpose(1, 2).reshape(B, S, C))


class RopeBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x), pos)``, ``x + mlp(norm(x))``, with timm's LayerScale/DropPath."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        rope: AxialRoPE,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        init_values: float | None = None,
        drop_path: float = 0.0,
    ):
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = RopeAttention(dim, num_heads, rope, qkv_bias=qkv_bias, qk_norm=qk_norm)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, num_prefix_tokens: int, rope: AxialRoPE | None = None
    ) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), pos, num_prefix_tokens, rope)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def _check_arguments(rope_positions: str, rope_scaling, global_pool: str, class_token: bool, head_dim: int) -> None:
    if rope_positions not in ROPE_POSITIONS:
        raise ValueError(f"rope_positions must be one of {ROPE_POSITIONS}, got {rope_positions!r}")
    if rope_positions in ("ntk", "yarn") and rope_scaling is not None:
        raise ValueError(f"rope_positions={rope_positions!r} sets the frequency scaling: leave rope_scaling None")
    if global_pool not in ("", "avg", "token"):
        raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True")
    if head_dim % 4:
        raise ValueError(f"head_dim = embed_dim / num_heads = {head_dim} must be divisible by 4 (two axes of planes)")


class AxialRoPEViT(nn.Module):
    """ViT with 2D axial RoPE on the patch tokens (no absolute position embedding).

    Args:
        img_size, patch_size, in_chans, num_classes, global_pool (``"token"``, ``"avg"`` or ``""``),
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias, qk_norm, init_values, class_token,
        drop_rate, drop_path_rate: as in timm's ``VisionTransformer``.
        dynamic_img_size: accept any input size the patch divides (positions follow the grid).
        rope_theta: base of each axis' spectrum; a head's ``D`` channels are split ``(D/2, D/2)``
            between y and x.
        rope_positions: one of ``POSITION_MODES`` (see the module docstring).
        rope_scaling: an :mod:`axial_rope.scaling` method, or one per axis ``(y, x)``, or ``None``
            (not with ``rope_positions`` ``"ntk"`` or ``"yarn"``, which choose the scaling themselves).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        init_values: float | None = None,
        class_token: bool = True,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        dynamic_img_size: bool = True,
        rope_theta: float = 100.0,
        rope_positions: str = "interpolate",
        rope_scaling: Scaling | None | Sequence[Scaling | None] = None,
    ):
        super().__init__()
        _check_arguments(rope_positions, rope_scaling, global_pool, class_token, embed_dim // num_heads)
        head_dim = embed_dim // num_heads
        self.num_classes, self.global_pool, self.rope_positions = num_classes, global_pool, rope_positions
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.dynamic_img_size, self.grad_checkpointing = dynamic_img_size, False

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            flatten=not dynamic_img_size,
            output_fmt="NHWC" if dynamic_img_size else None,
            strict_img_size=not dynamic_img_size,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        # one rotary layout shared by every block: (y, x) planes, interleaved as in timm's EVA/diffusers
        self.rope = AxialRoPE((head_dim // 2, head_dim // 2), rope_theta, rope_scaling)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.ModuleList(
            RopeBlock(embed_dim, num_heads, self.rope, mlp_ratio, qkv_bias, qk_norm, init_values, dpr[i])
            for i in range(depth)
        )
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=reduction) for i in range(depth)]
        self.norm = LayerNorm(embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    # -- timm model interface ------------------------------------------------------

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^cls_token|patch_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    # -- positions and tokens ------------------------------------------------------

    def positions(self, height: int, width: int, device=None) -> torch.Tensor:
        """Patch coordinates ``[height * width, 2]`` (y, x), row-major, for a ``height x width`` patch grid."""
        sizes, trained = (height, width), tuple(self.patch_embed.grid_size)
        return positions_for_size(sizes, trained, self.rope_positions, device=device).pos

    def rope_for(self, height: int, width: int) -> AxialRoPE:
        """The rope of a ``height x width`` patch grid: ``self.rope``, or its NTK / YaRN scaling of longer axes.

        Built per call (cheap); ``self.rope`` is never changed.
        """
        if self.rope_positions not in ("ntk", "yarn"):
            return self.rope
        sized = positions_for_size((height, width), tuple(self.patch_embed.grid_size), self.rope_positions)
        return self.rope.with_scaling(sized.scaling)

    def _tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, AxialRoPE]:
        """Images ``[B, C, H, W]`` -> tokens ``[B, prefix + h * w, C]``, patch positions ``[h * w, 2]``, rope."""
        x = self.patch_embed(x)
        if self.dynamic_img_size:  # [B, h, w, C]
            h, w = x.shape[1], x.shape[2]
            x = x.flatten(1, 2)
        else:
            h, w = self.patch_embed.grid_size
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x, self.positions(h, w, x.device), self.rope_for(h, w)

    def _block(self, block: RopeBlock, x: torch.Tensor, pos: torch.Tensor, rope: AxialRoPE) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint(block, x, pos, self.num_prefix_tokens, rope)
        return block(x, pos, self.num_prefix_tokens, rope)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, C, H, W]`` -> normed tokens ``[B, prefix + h * w, embed_dim]``."""
        x, pos, rope = self._tokens(x)
        for block in self.blocks:
            x = self._block(block, x, pos, rope)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        elif self.global_pool == "token":
            x = x[:, 0]
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """timm's intermediate-features API (used by ``features_only=True``).

        Returns the outputs of the blocks in ``indices`` (``NCHW`` ``[B, C, h, w]`` or ``NLC``),
        and unless ``intermediates_only``, also the final normed tokens.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        B, _, height, width = x.shape
        x, pos, rope = self._tokens(x)
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, block in enumerate(blocks):
            x = self._block(block, x, pos, rope)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        n = self.num_prefix_tokens
        prefix = [y[:, :n] for y in intermediates]
        intermediates = [y[:, n:] for y in intermediates]
        if output_fmt == "NCHW":
            h, w = self.patch_embed.dynamic_feat_size((height, width))
            intermediates = [y.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if return_prefix_tokens:
            intermediates = list(zip(intermediates, prefix))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks (and optionally norm and head) that ``indices`` does not need."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


def _cfg(**kwargs) -> dict:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,  # any size the patch divides
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        **kwargs,
    }


# no weights are published: pretrained=True raises timm's "no pretrained weights" error
default_cfgs = generate_default_cfgs(
    {
        "vit_small_patch16_axial_rope": _cfg(),
        "vit_base_patch16_axial_rope": _cfg(),
        "test_vit_axial_rope": _cfg(input_size=(3, 160, 160)),
    }
)


def _create(variant: str, pretrained: bool = False, **kwargs) -> AxialRoPEViT:
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(
        AxialRoPEViT,
        variant,
        pretrained,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **kwargs,
    )


@register_model
def vit_small_patch16_axial_rope(pretrained: bool = False, **kwargs) -> AxialRoPEViT:
    """ViT-S/16 (384 wide, 12 blocks, 6 heads) with 2D axial RoPE."""
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _create("vit_small_patch16_axial_rope", pretrained, **dict(args, **kwargs))


@register_model
def vit_base_patch16_axial_rope(pretrained: bool = False, **kwargs) -> AxialRoPEViT:
    """ViT-B/16 (768 wide, 12 blocks, 12 heads) with 2D axial RoPE."""
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return _create("vit_base_patch16_axial_rope", pretrained, **dict(args, **kwargs))


@register_model
def test_vit_axial_rope(pretrained: bool = False, **kwargs) -> AxialRoPEViT:
    """A test-sized model (64 wide, 4 blocks, 2 heads, 160 px) for unit tests and examples."""
    args = dict(img_size=160, patch_size=16, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0)
    return _create("test_vit_axial_rope", pretrained, **dict(args, **kwargs))
