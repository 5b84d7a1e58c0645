"""The length study's position schemes for the reference language model (:mod:`models.gpt`), one option each.

:class:`StudyPositions` is a position scheme ``GPT(config, positions=...)`` takes; its ``position``
picks how positions enter the model:

- ``"rope"``: rotary embedding of q and k (Su et al. 2021), with any scaling of :mod:`axial_rope.scaling`;
- ``"nope"``: no positions at all; causal masking alone tells the tokens apart (Kazemnejad et al. 2023);
- ``"sinusoidal"``: fixed sinusoids added to the embeddings (Vaswani et al. 2017);
- ``"learned"``: a learned table added to the embeddings (GPT-2); positions past it raise;
- ``"t5"``: a learned bias per head and log-spaced distance bucket (Raffel et al. 2020);
- ``"alibi"``: a fixed linear distance penalty per head (Press et al. 2022).

Orthogonal to it: ``attention="linear"`` (Su et al.'s linear attention, rope or nope),
``window`` (sliding-window attention: each token sees the last ``window`` tokens) and
``dual_chunk`` (:class:`DualChunk`, training-free Dual Chunk Attention on a RoPE model).
:func:`fused_path` says which combinations keep PyTorch's fused causal kernel.
"""

from __future__ import annotations

from .absolute import LearnedPositions, PositionTableError, SinusoidalPositions, sinusoids
from .bias import ALiBi, T5Bias, alibi_slopes, t5_bucket
from .dual_chunk import DualChunk, DualChunkAttention
from .linear import LinearAttention, LinearState, feature_map
from .presets import STUDY_PRESETS, study_model
from .scheme import ATTENTIONS, POSITIONS, StudyPositions, attention_mask, fused_path, window_mask

__all__ = [
    "ALiBi",
    "ATTENTIONS",
    "DualChunk",
    "DualChunkAttention",
    "LearnedPositions",
    "LinearAttention",
    "LinearState",
    "POSITIONS",
    "PositionTableError",
    "STUDY_PRESETS",
    "SinusoidalPositions",
    "StudyPositions",
    "T5Bias",
    "alibi_slopes",
    "attention_mask",
    "feature_map",
    "fused_path",
    "sinusoids",
    "study_model",
    "t5_bucket",
    "window_mask",
]
