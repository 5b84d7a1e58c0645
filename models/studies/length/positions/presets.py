"""The length study's models: one width, one preset per position scheme, and the factory the trainer calls.

A run folder of the study names its preset (``lm-rope``, ``lm-t5``, ...) and nothing else about the
model, so a folder written when these were ``GPTConfig`` fields loads unchanged: the preset gives
both the config and the scheme (docs/experiments/length.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import axial_rope as ar

from ....gpt import GPT, GPTConfig
from .scheme import StudyPositions

__all__ = ["STUDY_PRESETS", "StudyModel", "study_model"]


class StudyModel(NamedTuple):
    """A study preset: the model's config and its position scheme."""

    config: GPTConfig
    positions: StudyPositions

    def build(self) -> GPT:
        return GPT(self.config, positions=self.positions)


_WIDTH = GPTConfig(depth=3, num_heads=4, hidden_size=128)
_ROPE = StudyPositions()
STUDY_PRESETS: dict[str, StudyModel] = {
    "lm-rope": StudyModel(_WIDTH, _ROPE),
    "lm-nope": StudyModel(_WIDTH, StudyPositions(position="nope")),
    "lm-sinusoidal": StudyModel(_WIDTH, StudyPositions(position="sinusoidal")),
    "lm-learned": StudyModel(_WIDTH, StudyPositions(position="learned")),
    "lm-t5": StudyModel(_WIDTH, StudyPositions(position="t5")),
    "lm-alibi": StudyModel(_WIDTH, StudyPositions(position="alibi")),
    "lm-linear": StudyModel(_WIDTH, StudyPositions(attention="linear")),
    # the fine-tuned arms: RoPE scaled by 4 (trained at 256, fine-tuned at 1024)
    "lm-rope-pi4": StudyModel(replace(_WIDTH, scaling=ar.scaling.Linear(4.0)), _ROPE),
    "lm-rope-ntk4": StudyModel(replace(_WIDTH, scaling=ar.scaling.NTK(4.0)), _ROPE),
    "lm-rope-yarn4": StudyModel(replace(_WIDTH, scaling=ar.scaling.YaRN(4.0, 256)), _ROPE),
}


def study_model(preset: str, context: int) -> StudyModel:
    """The config (trained at ``context``) and scheme of study preset ``preset``."""
    if preset not in STUDY_PRESETS:
        raise ValueError(f"preset must be one of the length study's {sorted(STUDY_PRESETS)}, got {preset!r}")
    config, positions = STUDY_PRESETS[preset]
    return StudyModel(replace(config, max_seq_len=context), positions)
