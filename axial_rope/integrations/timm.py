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

DINOv3's coordinates (``[-1, 1]`` per axis times ``2 pi``) are a subclass overriding :meth:`GridRoPE.positions`
(set as ``grid_rope_cls``).

The weights carry their positional settings (``rope_config``): another ``rope_theta`` or
trained grid is a load error, another ``rope_positions`` or ``rope_scaling`` a warning; a
scaling method is recorded as its JSON dict, so ``save_for_hf`` and ``local-dir:`` loading
rebuild it. torch.fx traces the models (:class:`GridRoPE` is a registered leaf); scripting
one is a clear error (:data:`EXCLUDE_JIT_FILTERS`, as timm lists its non-scriptable models).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import LayerNorm, PatchEmbed, trunc_normal_
from timm.models import build_model_with_cfg, checkpoint, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from ..init import deferred_init
from ..ops.rotation import Rotation
from ..rope import AxialRoPE
from ..scaling import Scaling
from .timm_rope import ROPE_POSITIONS, GridRoPE, RopeBlock, check_rope_positions, scaling_json, script_error

__all__ = ["AxialRoPEViT", "EXCLUDE_JIT_FILTERS", "GridRoPE", "ROPE_POSITIONS"]

EXCLUDE_JIT_FILTERS = ["*axial_rope*"]  # for a timm-style model test suite: not scriptable (see __prepare_scriptable__)


def _check_arguments(args: dict, head_dim: int) -> None:
    """The constructor's arguments that would otherwise fail deep inside (or run as something else)."""
    check_rope_positions(args["rope_positions"], args["rope_scaling"])
    if args["global_pool"] not in ("", "avg", "token"):
        raise ValueError(f"global_pool must be '', 'avg' or 'token', got {args['global_pool']!r}")
    if args["global_pool"] == "token" and not args["class_token"]:
        raise ValueError("global_pool='token' needs class_token=True")
    if head_dim % 4:
        raise ValueError(f"head_dim = embed_dim / num_heads = {head_dim} must be divisible by 4 (two axes of planes)")
    sizes = args["img_size"] if isinstance(args["img_size"], (tuple, list)) else (args["img_size"],)
    for name, values in (("img_size", sizes), ("patch_size", (args["patch_size"],))):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values) or len(values) > 2:
            raise TypeError(f"{name} must be a positive int or two of them, got {args[name]!r}")
    theta = args["rope_theta"]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise TypeError(f"rope_theta must be a number, got {theta!r}")


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
        rope_scaling: an :mod:`axial_rope.scaling` method (or its dict), or one per axis ``(y, x)``, or
            ``None`` (not with ``rope_positions`` ``"ntk"`` or ``"yarn"``, which choose the scaling themselves).
    """

    grid_rope_cls = GridRoPE  # a subclass may set its own (other coordinates: override GridRoPE.positions)

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
        _check_arguments(locals(), embed_dim // num_heads)
        head_dim = embed_dim // num_heads
        self.num_classes, self.global_pool = num_classes, global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.dynamic_img_size, self.grad_checkpointing = dynamic_img_size, False

        with deferred_init(self):  # built on meta, then reset_parameters: a meta-device build reproduces it
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
            grid = tuple(self.patch_embed.grid_size)
            self.rope_grid = self.grid_rope_cls(self.rope, grid, rope_positions, rope_scaling)
            dpr = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # python floats, also under meta
            self.blocks = nn.ModuleList(
                RopeBlock(embed_dim, num_heads, self.rope_grid, mlp_ratio, qkv_bias, qk_norm, init_values, dpr[i])
                for i in range(depth)
            )
            reduction = self.patch_embed.patch_size[0]
            self.feature_info = [
                dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=reduction) for i in range(depth)
            ]
            self.norm = LayerNorm(embed_dim)
            self.head_drop = nn.Dropout(drop_rate)
            self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def reset_parameters(self) -> None:
        """timm's ViT init: each layer's own reset (patch conv, norms, layer scales, the rope's buffers), then
        truncated-normal linears (std 0.02, zero biases) and the class token from ``N(0, 1e-6)``; also the
        re-initialisation of a model built on the meta device after ``to_empty``."""
        for m in self.modules():
            if m is not self and not isinstance(m, nn.Linear) and hasattr(m, "reset_parameters"):
                m.reset_parameters()
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

    @property
    def rope_positions(self) -> str:
        return self.rope_grid.mode

    @rope_positions.setter
    def rope_positions(self, mode: str) -> None:
        check_rope_positions(mode, self.rope_grid.scaling)
        self.rope_grid.mode = mode

    # -- saving and loading ----------------------------------------------------------

    @property
    def _model_args(self) -> dict:
        return self.__dict__.get("_timm_model_args", {})

    @_model_args.setter
    def _model_args(self, args: dict) -> None:
        # timm records create_model's arguments here and save_for_hf writes them to config.json:
        # a scaling method is kept as its JSON dict, which the constructor takes back
        args = dict(args)
        if "rope_scaling" in args:
            args["rope_scaling"] = scaling_json(args["rope_scaling"])
        self.__dict__["_timm_model_args"] = args

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "rope_config"] = self.rope_grid.code()  # the settings now, not at construction

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        key = prefix + "rope_config"
        if key in state_dict:  # absent (older weights, or dropped on purpose): unchecked
            self.rope_grid.compare(state_dict[key].cpu(), errors)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)
        if key in unexpected:
            unexpected.remove(key)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: the library's rope is Python TorchScript cannot compile
        raise script_error(type(self).__name__)

    def positions(self, height: int, width: int, device=None) -> torch.Tensor:
        """Patch coordinates ``[height * width, 2]`` (y, x), row-major, for a ``height x width`` patch grid."""
        return self.rope_grid.positions(height, width, device)

    def rotation(self, height: int, width: int, device=None) -> Rotation:
        """The rotation of a ``height x width`` patch grid: its positions and, for NTK / YaRN, the scaling of
        longer axes (tensors computed per call; ``self.rope`` is never changed)."""
        return self.rope_grid.rotation(height, width, device)

    def _tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images ``[B, C, H, W]`` -> tokens ``[B, prefix + h * w, C]`` and the patch grid ``(h, w)``."""
        if self.dynamic_img_size:
            # timm's PatchEmbed.forward formats the sizes into its divisibility message, which specialises a
            # symbolic size (a recompile per resolution); the same conv and norm, checked here eagerly only
            ph, pw = self.patch_embed.patch_size
            traced = torch.compiler.is_compiling() or torch.fx._symbolic_trace.is_fx_tracing()
            if not traced and (x.shape[-2] % ph or x.shape[-1] % pw):
                raise ValueError(f"image size {tuple(x.shape[-2:])} must be divisible by the patch size {(ph, pw)}")
            x = self.patch_embed.norm(self.patch_embed.proj(x).permute(0, 2, 3, 1))  # [B, h, w, C]
            grid = (x.shape[1], x.shape[2])  # proxies under torch.fx, passed on to the GridRoPE leaf
            x = x.flatten(1, 2)
        else:
            x = self.patch_embed(x)
            grid = tuple(self.patch_embed.grid_size)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x, grid

    def _block(self, block: RopeBlock, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint(block, x, grid, self.num_prefix_tokens)
        return block(x, grid, self.num_prefix_tokens)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, C, H, W]`` -> normed tokens ``[B, prefix + h * w, embed_dim]``."""
        x, grid = self._tokens(x)
        for block in self.blocks:
            x = self._block(block, x, grid)
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
        x, grid = self._tokens(x)
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, block in enumerate(blocks):
            x = self._block(block, x, grid)
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
