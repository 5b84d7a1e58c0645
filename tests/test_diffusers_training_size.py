"""``train_size`` counts tokens as the family's rope counts them, and a forward at that grid equals the stock model.

The 1-D audio models prepend tokens to their latent frames (Stable Audio a global token, Stable Audio 3
``num_memory_tokens``, MiniMax Music 3 a timestep token), which their rope counts: the tiny models' ``train_size``
counts them too (``models/tiny_diffusers_videoaudio.py``), and sized at it the output is the stock model's. One token
short, the positions are squeezed by ``12 / 13`` and the output moves by far more than the tables' float32 rounding:
what a wrong ``train_size`` looks like, the check ``docs/integrations.md`` gives users. Every family's training-size
forward is held to stock in ``tests/test_diffusers_families.py`` (tables replaced at the training size).
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from helpers import one_torch_thread  # noqa: E402
from test_diffusers_families import TOL, _model, _run  # noqa: E402

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

_one_thread = one_torch_thread()
PREPENDED = {"StableAudioDiTModel": 1, "StableAudio3DiTModel": 2, "MiniMaxMusic3Transformer1DModel": 1}


@pytest.mark.parametrize("name", sorted(PREPENDED))
def test_audio_train_size_counts_the_prepended_tokens(name):
    model, inputs = _model(name)
    latent = inputs["hidden_states"].shape[-1]  # [B, C, L]: the latent frames of the default grid
    assert tiny.train_size(name) == (latent + PREPENDED[name],)
    stock = _run(model, inputs)
    handle = set_rope_processors(model, mode="interpolate", train_size=tiny.train_size(name))
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)  # the tables' float32 rounding
    handle.remove()
    set_rope_processors(model, mode="interpolate", train_size=(latent,))  # the latent frames alone: one short
    assert (_run(model, inputs) - stock).abs().max() > 1e-3
