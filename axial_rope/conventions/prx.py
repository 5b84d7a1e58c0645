"""PRX (diffusers ``PRXEmbedND``): per-axis spectra over the image grid ``(y, x)``, as 2x2 matrices.

Only image tokens are rotated (text tokens are keys without rotation); the ids are the latent grid after the
patches, ``[B, S, 2]``, and the tables ``[B, 1, S, D/2, 2, 2]`` (``bhsd``).
"""

from __future__ import annotations

from ._registry import DiffusersFamily, PipelineUnits, Timing, TrainedGrid, register_diffusers
from .fields import field, kind, size
from .flux import flux
from .hidream import rotation_matrices
from .tables import ids_positions

__all__: list[str] = []

SOURCE = "diffusers 0.42.1 `models/transformers/transformer_prx.py` `PRXEmbedND`"


def _rope(config):
    axes = tuple(field(config, "axes_dim", None) or (32, 32))  # None in a config: the model's default
    head = size(config, "hidden_size") // size(config, "num_heads")
    if len(axes) != 2 or sum(axes) != head:
        raise ValueError(f"{kind(config)} config: axes_dim {list(axes)} must be (y, x) channels summing to {head}")
    return flux(axes, field(config, "theta", 10000))


PRX_TRAINED_SOURCE = (
    "diffusers docs `prx.md` model table: huggingface.co/Photoroom/prx-512-t2i 'pre-trained at 512 with Flux VAE'"
)
register_diffusers(
    DiffusersFamily(
        name="prx",
        classes=("PRXTransformer2DModel",),
        rope=_rope,
        tables=("module", "pe_embedder"),  # pe_embedder(img_ids): the image grid [B, S, 2]
        positions=lambda c: lambda rope, sizing, ids: ids_positions(ids, rope, sizing, cols=(0, 1)),
        layout=lambda cos, sin: rotation_matrices(cos, sin).unsqueeze(-5),  # [B, 1, S, D/2, 2, 2]
        grid_axes=(0, 1),
        time_axis=None,
        stock=("PRXAttnProcessor2_0",),
        processor="PRXRopeProcessor",
        blocks=("blocks.",),
        qk_norm="rms",  # PRXAttnProcessor2_0: norm_q, norm_k (RMSNorm over D) of the image tokens, then apply_rope
        timing=Timing(noise=1.0),  # the pipeline passes timestep / num_train_timesteps
        max_diff=0.0,
        source=SOURCE,
        axes="(y, x): `axes_dim`, `theta`",
        trained=(TrainedGrid("prx-512-t2i", (512, 512), PRX_TRAINED_SOURCE),),
        units=PipelineUnits(16),  # the Flux-VAE checkpoints (DC-AE ones: 32 px)
    )
)
