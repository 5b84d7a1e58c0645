"""The retrieval probe: a key planted in held-out source text at some depth, asked for at the end.

The byte-level analogue of the passkey / needle-in-a-haystack test of the RoPE scaling
papers (format: :mod:`models.training.needles`): a key between marker bytes is inserted
into a window of held-out standard-library code, at a line start near the requested depth
(0: the start of the context, 1: just before the question); the window ends with the
question marker. The probe passes when the model's greedy next-byte prediction at every key
position is the key's byte (teacher forcing: a later prediction sees the earlier key bytes).
Guessing passes with probability ``1 / prod(len(a) for a in ALPHABETS)`` (1/28).
"""

from __future__ import annotations

import numpy as np
import torch

from ...training.needles import KEY_LENGTH, draw_key, plant, room

__all__ = ["probe_inputs", "passes"]


def probe_inputs(
    text: torch.Tensor, length: int, depth: float, trials: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``trials`` probes of ``length`` bytes with the needle at ``depth``.

    Args:
        text: the held-out bytes ``[N]`` (uint8).
        seed: draws the haystack starts and the keys (the same for every arm: paired).

    Returns:
        ``inputs [trials, length]`` (int64) and ``keys [trials, KEY_LENGTH]`` (int64): the last
        ``KEY_LENGTH`` inputs predict the key, so the predictions at input positions
        ``length - KEY_LENGTH .. length - 1`` and the key's bytes are compared.
    """
    rng = np.random.default_rng([seed, length, int(round(depth * 1000))])
    data, free = text.numpy(), room(length)
    rows, keys = [], []
    for _ in range(trials):
        start = int(rng.integers(0, len(data) - free))
        key = draw_key(rng.random(KEY_LENGTH).tolist())
        seq = plant(data[start : start + free].tobytes(), key, depth)  # length + 1 bytes
        rows.append(list(seq[:-1]))
        keys.append(list(key))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(keys, dtype=torch.long)


@torch.no_grad()
def passes(model, inputs: torch.Tensor, keys: torch.Tensor, batch: int = 4, **kw) -> np.ndarray:
    """``[trials]`` bool: whether every key byte is the greedy prediction (one forward per ``batch`` probes)."""
    out = []
    for i in range(0, len(inputs), batch):
        logits = model(inputs[i : i + batch], **kw)[:, -KEY_LENGTH:]  # [b, K, V]: the predictions of the key bytes
        out.append((logits.argmax(-1) == keys[i : i + batch]).all(-1))
    return torch.cat(out).numpy()
