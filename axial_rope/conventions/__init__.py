"""Production RoPE conventions, each one constructor of the general frequency model, pinned to its upstream code.

``ar.conventions.<name>(<upstream config fields>)`` returns the :class:`~axial_rope.AxialRoPE`
(per-layer conventions: a list of :class:`LayerRoPE`) whose tables and rotations equal the upstream
implementation's; ``<name>_positions(...)`` (where the convention defines positions) builds the
token coordinates it rotates by. :data:`REGISTRY` lists every convention with the upstream file and
version its tests compare against (``tests/test_conventions_*.py``); :func:`table` renders it for
``docs/conventions.md``. :data:`MODEL_TYPES` holds the transformers model types whose rotation
(pairing, sign, M-RoPE layout) a test checked against their modeling code, for :func:`axial_rope.rope_from_config`.
"""

from . import (  # noqa: F401  (diffusers family records: they register on import)
    ace_step,
    allegro,
    anyflow,
    bria,
    cogview,
    consisid,
    cosmos3,
    ernie_image,
    flux2,
    hidream,
    ideogram,
    joyimage,
    kandinsky,
    krea2,
    longcat,
    longcat_audio,
    minimax,
    motif,
    nucleus,
    omnigen,
    ovis,
    prx,
    qwen_image,
    stable_audio,
    wan_variants,
    z_image,
)
from ._registry import (
    DIFFUSERS,
    FAMILIES,
    REGISTRY,
    Convention,
    DiffusersFamily,
    PipelineUnits,
    Timing,
    TrainedGrid,
    diffusers_family,
    table,
)
from .cogvideox import cogvideox, cogvideox_positions
from .cosmos import cosmos
from .dinov3 import dinov3
from .easyanimate import easyanimate_crop
from .flux import flux, flux_positions
from .helios import helios
from .hunyuan import hunyuan_dit, hunyuan_dit_crop, hunyuan_dit_positions, hunyuan_image, hunyuan_video
from .llm import gpt_neox, llama, p_rope, rope_for_parameters
from .ltx import ltx2, ltx2_audio_positions, ltx2_from_config, ltx2_positions, ltx_video, ltx_video_positions
from .lumina import lumina2, lumina2_positions
from .mochi import mochi, mochi_positions
from .model_types import INTERLEAVED_MODEL_TYPES, MODEL_TYPES, ModelConvention
from .per_layer import LayerRoPE, gemma, llama4
from .qwen_vl import mrope_positions, qwen2_5_vl, qwen2_vl, qwen3_vl
from .timm_vit import eva02, timm_cat, timm_mixed, timm_positions
from .videorope import videorope, videorope_positions
from .wan import video_grid_positions, wan, wan_axes_dim

__all__ = [
    "FAMILIES", "REGISTRY", "Convention", "LayerRoPE", "INTERLEAVED_MODEL_TYPES", "MODEL_TYPES", "ModelConvention", "table",
    "DIFFUSERS", "DiffusersFamily", "PipelineUnits", "Timing", "TrainedGrid", "diffusers_family",
    "rope_for_parameters",
    "flux", "flux_positions", "hunyuan_video", "hunyuan_image", "hunyuan_dit", "hunyuan_dit_positions",
    "hunyuan_dit_crop", "wan", "wan_axes_dim", "video_grid_positions", "cogvideox", "cogvideox_positions",
    "cosmos", "easyanimate_crop", "helios",
    "ltx_video", "ltx_video_positions", "ltx2", "ltx2_positions", "ltx2_audio_positions", "ltx2_from_config",
    "lumina2", "lumina2_positions", "mochi", "mochi_positions",
    "timm_cat", "timm_positions", "eva02", "timm_mixed", "dinov3",
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "mrope_positions", "videorope", "videorope_positions",
    "llama", "gpt_neox", "p_rope", "gemma", "llama4",
]  # fmt: skip
