"""axial_rope: rotary position embedding over 1, 2 or 3 coordinate axes.

The public API (fixed; see the README and docs/): ``inv_freq`` and ``scaling`` for
frequency schedules, ``grid`` and friends for positions, ``AxialRoPE`` for the rotary
layout of a head, ``apply_rope`` for table-based rotation; ``layers`` and ``KVCache``
for attention and DiT blocks built on them (``attend``: the attention's paths, ``Sdpa``, ``Cached``, ``Varlen``,
``Sharded``); ``frequencies`` (the general frequency model),
``conventions`` (every production convention, pinned to its upstream code) and
``rope_from_config`` (a transformers or diffusers config to its rope).
"""

from . import attend, cache, conventions, convert, frequencies, layers, positions, scaling
from .attend import Cached, Sdpa, Sharded, Varlen
from .cache import KVCache
from .configs import rope_from_config
from .frequencies import Frequencies, PositionTransform
from .layers import Attention, DiTBlock, FinalLayer, LabelEmbedder, PatchEmbed, TimestepEmbedder, unpatchify
from .ops import apply_rope
from .positions import POSITION_MODES, crop_grid, grid, positions_for_size, text_positions
from .rope import AxialRoPE
from .scaling import inv_freq

__all__ = [
    "Attention",
    "attend",
    "Cached",
    "Sdpa",
    "Sharded",
    "Varlen",
    "AxialRoPE",
    "DiTBlock",
    "FinalLayer",
    "KVCache",
    "LabelEmbedder",
    "PatchEmbed",
    "TimestepEmbedder",
    "apply_rope",
    "cache",
    "conventions",
    "frequencies",
    "Frequencies",
    "PositionTransform",
    "rope_from_config",
    "layers",
    "unpatchify",
    "convert",
    "crop_grid",
    "grid",
    "inv_freq",
    "positions",
    "positions_for_size",
    "POSITION_MODES",
    "scaling",
    "text_positions",
]
__version__ = "0.1.0"
