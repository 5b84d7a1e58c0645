"""Planted keys in byte text: the retrieval probe of the length study and the training windows that teach its format.

A needle is ``\x01 k \x02`` (a one-byte key between two marker bytes) inserted at a line start
near a given depth of a window of source text (0: its start, 1: its end); somewhere after it (in
the probe: at the window's end) come the question ``\n\x01`` and the key. The probe (the passkey /
needle-in-a-haystack test of the RoPE scaling papers, in bytes) asks whether the model predicts the
key. Markers and keys are control bytes that source text never holds, so a model can find the key
by its byte alone, without an induction circuit, and a guess passes with probability 1/28. The
study's models see the format in a share of their training windows (:func:`plant_batch`), all
within the training context, with the answer weighted :data:`KEY_WEIGHT` in the loss
(:func:`key_weights`).
"""

from __future__ import annotations

import torch

__all__ = [
    "ALPHABETS", "ASKED", "DRAWS", "KEY_LENGTH", "KEY_WEIGHT", "NEEDLE", "QUESTION",
    "draw_key", "key_weights", "plant", "plant_batch", "room",
]  # fmt: skip

# the key's byte and the markers: control bytes that source text never holds (of 0x01 .. 0x1f only the newline
# occurs in the standard library's .py files), so a key can only be read where it was planted
NEEDLE, QUESTION = b"\x01%s\x02\n", b"\n\x01"
# one key byte of the 28 control bytes that are neither a marker nor the newline: a guess passes with
# probability 1/28. (A key of two bytes, each of 8, did not work: the pilot's models learnt to retrieve the
# first and not the second, so the probe measured one byte's retrieval at chance 1/8; docs/experiments.md.)
ALPHABETS = (bytes(b for b in range(0x03, 0x20) if b != 0x0A),)
KEY_LENGTH = len(ALPHABETS)
# uniforms per training window: whether it is planted, the needle's depth, where it is asked, the key
DRAWS = 3 + KEY_LENGTH
# the answer's weight in the training loss (the other targets weigh 1): under the language-model loss alone
# retrieval is learnt late and by chance within a run of this size (docs/experiments.md, "After the pilot")
KEY_WEIGHT = 32.0
# where a training window asks for its key (:func:`plant_batch`), in the words of a study's page
ASKED = "anywhere after it"


def room(length: int) -> int:
    """Haystack bytes in a sequence of ``length + 1`` bytes (inputs and the last target) that holds a needle."""
    free = length + 1 - len(NEEDLE % (b"x" * KEY_LENGTH)) - len(QUESTION) - KEY_LENGTH
    if free < 1:
        raise ValueError(f"length {length} is too short for a needle and its question")
    return free


def draw_key(u: list[float]) -> bytes:
    """The key of ``KEY_LENGTH`` uniform draws in [0, 1): byte ``i`` from ``ALPHABETS[i]``."""
    return bytes(alphabet[int(v * len(alphabet))] for alphabet, v in zip(ALPHABETS, u))


def plant(hay: bytes, key: bytes, depth: float, ask: float = 1.0) -> bytes:
    """``hay`` with the needle of ``key`` at the first line start at or after ``depth * len(hay)``
    (within 80 bytes; else exactly there), and the question and the key at ``ask * len(hay)`` (not before
    the needle; 1: after all of ``hay``, as the probe asks)."""
    cut = int(round(depth * len(hay)))
    newline = hay.find(b"\n", cut, cut + 80)  # keep the code's lines whole where one ends nearby
    cut = cut if newline < 0 else newline + 1
    at = max(cut, int(round(ask * len(hay))))
    return hay[:cut] + NEEDLE % key + hay[cut:at] + QUESTION + key + hay[at:]


def plant_batch(
    x: torch.Tensor, y: torch.Tensor, u: torch.Tensor, rate: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training windows ``x, y [B, L]`` with a needle planted in the rows where ``u[:, 0] < rate``.

    ``u [B, DRAWS]`` in [0, 1): the draw (a pure function of seed and step), the needle's depth, where
    between the needle and the window's end the question is asked, then the key's letters. A planted row
    keeps its window's first bytes as the haystack. The question sits anywhere after the needle, not at
    the window's end: asked always at the end, the models learnt to predict the question's bytes from the
    distance to the window's first byte, and did so at every position past the training length
    (docs/experiments.md, "After the pilot").

    Returns ``x, y`` and ``answer [B]`` (int64): the index in ``y`` of the key's first byte, -1 where unplanted.
    """
    x, y = x.clone(), y.clone()
    length = x.shape[1]
    answer = torch.full((x.shape[0],), -1, dtype=torch.long)
    for r in torch.nonzero(u[:, 0] < rate).flatten().tolist():
        seq = torch.cat([x[r], y[r, -1:]]).to(torch.uint8).numpy().tobytes()  # the window's L + 1 bytes
        key = draw_key(u[r, 3:].tolist())
        depth = float(u[r, 1])
        planted = plant(seq[: room(length)], key, depth, ask=depth + (1 - depth) * float(u[r, 2]))
        answer[r] = planted.rindex(QUESTION + key) + len(QUESTION) - 1  # y[i] is byte i + 1 of the sequence
        planted = torch.tensor(list(planted), dtype=torch.long)
        x[r], y[r] = planted[:-1], planted[1:]
    return x, y, answer


def key_weights(answer: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, length]`` float32 loss weights: :data:`KEY_WEIGHT` for the ``KEY_LENGTH`` targets from ``answer``
    (:func:`plant_batch`'s) on, 1 elsewhere (and in the rows without a key, ``answer = -1``)."""
    w = torch.ones(answer.shape[0], length)
    for r in torch.nonzero(answer >= 0).flatten().tolist():
        w[r, answer[r] : answer[r] + KEY_LENGTH] = KEY_WEIGHT
    return w
