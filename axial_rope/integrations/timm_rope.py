"""The rotary pieces of the timm ViTs: the grid rope (a torch.fx leaf), attention and block.

Kept apart from the model and its registration (:mod:`axial_rope.integrations.timm`);
imports timm, so only that module imports it.
"""

from __future__ import annotations

import hashlib
import json
import struct
import warnings

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerNorm, LayerScale, Mlp
from timm.models._features_fx import register_notrace_module
from torch import nn

from ..ops import rotate
from ..ops.rotation import Rotation
from ..positions import POSITION_MODES, positions_for_size
from ..rope import AxialRoPE
from ..scaling import Scaling
from ..scaling import from_dict as scaling_from_dict

__all__ = ["GridRoPE", "RopeAttention", "RopeBlock", "ROPE_POSITIONS", "scaling_json", "script_error"]

ROPE_POSITIONS = POSITION_MODES  # the modes of axial_rope.positions_for_size


def scaling_json(value) -> dict | list | None:
    """``rope_scaling`` as JSON (the form timm writes to config.json): a method's dict, or a list per axis."""
    if value is None:
        return None
    if isinstance(value, Scaling):
        return value.to_dict()
    if isinstance(value, dict):
        return scaling_from_dict(value).to_dict()  # checked, and normalised
    if isinstance(value, (list, tuple)):
        return [scaling_json(v) for v in value]
    raise TypeError(f"rope_scaling must be None, a scaling method, its dict, or one per axis, got {value!r}")


def script_error(owner: str) -> RuntimeError:
    """The error of ``torch.jit.script`` on a model (or a torch.fx trace of one) that holds the library's rotation."""
    return RuntimeError(
        f"{owner} cannot be scripted with TorchScript (axial_rope's rotation is not scriptable); "
        "use torch.compile, torch.export or torch.fx (supported), and exclude it from scripting tests "
        "like timm's own non-scriptable models (EXCLUDE_JIT_FILTERS)"
    )


def _code(value) -> int:
    """A setting as an int64 (int buffers survive .half() and dtype casts): floats by their bits, the rest by digest."""
    if isinstance(value, float):
        return struct.unpack("<q", struct.pack("<d", value))[0]
    if isinstance(value, int):
        return value
    return int.from_bytes(hashlib.blake2b(json.dumps(value).encode(), digest_size=8).digest(), "little") >> 2


@register_notrace_module  # a torch.fx leaf: the grid size is known only at call time
class GridRoPE(nn.Module):
    """The positional part of :class:`AxialRoPEViT`: patch coordinates of a grid and the rope that rotates them.

    ``positions``/``rope_for`` apply ``positions_for_size`` with the trained grid; ``forward``
    rotates patch tokens. :meth:`code` is the settings the weights are trained with, which the
    model writes into its state dict (``rope_config``) and compares on load (:meth:`compare`).
    """

    def __init__(self, rope: AxialRoPE, trained: tuple[int, int], mode: str, scaling=None):
        super().__init__()
        self.rope, self.trained, self.mode = rope, tuple(trained), mode
        self.scaling = scaling_json(scaling)

    def __prepare_scriptable__(self):
        # torch.jit.script of a torch.fx trace (timm's test_model_forward_fx_torchscript) reaches this leaf,
        # not the model's own __prepare_scriptable__: the same error
        raise script_error(f"{type(self).__name__} (the rotary leaf of a traced AxialRoPEViT)")

    def code(self) -> torch.Tensor:
        """The settings as int64 (dtype casts leave it exact): version, theta, grid h and w, mode, scaling."""
        values = [1, float(self.rope.theta[0]), *self.trained, ROPE_POSITIONS.index(self.mode), self.scaling]
        return torch.tensor([_code(v) for v in values], dtype=torch.int64)

    def compare(self, saved: torch.Tensor, errors: list[str]) -> None:
        """An error (theta, trained grid) or a warning (positions, scaling) for each setting ``saved`` differs in."""
        own = self.code()
        if saved.shape != own.shape or int(saved[0]) != 1:
            errors.append(f"rope_config {saved.tolist()} is not one this version wrote")
            return
        names = ("version", "rope_theta", "grid", "grid", "rope_positions", "rope_scaling")
        differ = {n for n, a, b in zip(names, saved.tolist(), own.tolist()) if a != b}
        if "rope_theta" in differ or "grid" in differ:
            theta = struct.unpack("<d", struct.pack("<q", int(saved[1])))[0]
            errors.append(
                f"the weights were trained with rope_theta={theta} on a {int(saved[2])} x {int(saved[3])} patch grid "
                f"(img_size / patch_size); this model has rope_theta={self.rope.theta[0]} and a {self.trained[0]} x "
                f"{self.trained[1]} grid: both change the outputs without changing a shape. Build the model with the "
                "saved values, or drop 'rope_config' from the state dict to load anyway"
            )
        if "rope_positions" in differ:  # inference choices: a change may be meant, but it is never silent
            saved_mode = ROPE_POSITIONS[int(saved[4])] if 0 <= int(saved[4]) < len(ROPE_POSITIONS) else "?"
            warnings.warn(
                f"weights saved with rope_positions={saved_mode!r} loaded into a model with {self.mode!r}", stacklevel=4
            )
        if "rope_scaling" in differ:
            warnings.warn(
                f"weights saved with another rope_scaling loaded into a model with {self.scaling!r}", stacklevel=4
            )

    def positions(self, height: int, width: int, device=None) -> torch.Tensor:
        """Patch coordinates ``[height * width, 2]`` (y, x), row-major, for a ``height x width`` patch grid."""
        return positions_for_size((height, width), self.trained, self.mode, device=device).pos

    def rotation(self, height: int, width: int, device=None) -> Rotation:
        """The rotation of a ``height x width`` grid's patches: its positions and, for NTK / YaRN, the scaling of
        longer axes (computed per call as tensors: no rope is built)."""
        pos = self.positions(height, width, device)
        if self.mode not in ("ntk", "yarn"):
            return self.rope.rotation(pos)
        return self.rope.rotation(pos, scaling=positions_for_size((height, width), self.trained, self.mode).scaling)

    def forward(self, q: torch.Tensor, k: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate patch tokens' ``q``, ``k`` ``[B, H, height * width, D]`` by their grid coordinates."""
        return rotate(q, k, self.rotation(height, width, q.device), "bhsd", self.rope.backend)


class RopeAttention(nn.Module):
    """Multi-head self-attention whose patch tokens' q and k are rotated by the model's :class:`GridRoPE`."""

    def __init__(self, dim: int, num_heads: int, rope: GridRoPE, qkv_bias: bool = True, qk_norm: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim, self.rope = num_heads, dim // num_heads, rope
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> torch.Tensor:
        """x ``[B, S, C]``: ``num_prefix_tokens``, then the patch tokens of a ``grid = (h, w)`` grid, row-major."""
        B, S, C = x.shape
        q, k, v = self.qkv(x).reshape(B, S, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [B, H, S, D]
        q, k = self.q_norm(q), self.k_norm(k)
        n = num_prefix_tokens  # class/register tokens carry no position
        q_rot, k_rot = self.rope(q[:, :, n:], k[:, :, n:], *grid)
        q, k = torch.cat([q[:, :, :n], q_rot], dim=2), torch.cat([k[:, :, :n], k_rot], dim=2)
        x = F.scaled_dot_product_attention(q, k, v)  # [B, H, S, D]
        return self.proj(x.transpose(1, 2).reshape(B, S, C))


class RopeBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x), pos)``, ``x + mlp(norm(x))``, with timm's LayerScale/DropPath."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        rope: GridRoPE,
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

    def forward(self, x: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), grid, num_prefix_tokens)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def check_rope_positions(rope_positions: str, rope_scaling) -> None:
    if rope_positions not in ROPE_POSITIONS:
        raise ValueError(f"rope_positions must be one of {ROPE_POSITIONS}, got {rope_positions!r}")
    if rope_positions in ("ntk", "yarn") and rope_scaling is not None:
        raise ValueError(f"rope_positions={rope_positions!r} sets the frequency scaling: leave rope_scaling None")
