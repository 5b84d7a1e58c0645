"""The language model's task: byte windows of the Python standard library, optionally with planted keys.

:class:`TextTask` is one of the trainer's tasks (:data:`models.training.tasks.TASKS`); the length
study reads the same bytes through :func:`stdlib_text`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from .. import gpt
from . import needles
from .data import StdlibText, shard, step_generator, uniform

_STDLIB: dict[str, StdlibText] = {}


def stdlib_text(split: str) -> StdlibText:
    """The standard library's bytes of ``split``, read once per process (11 MB; a study builds many tasks)."""
    if split not in _STDLIB:
        _STDLIB[split] = StdlibText(split)
    return _STDLIB[split]


NEEDLE_RATE = 1.0  # the share of a study model's training windows that hold a planted key: all (a quarter left
# the answer unlearnt in some 600-step runs; docs/experiments.md, "After the pilot")
NEEDLE_STREAM = 0x6E656564  # offsets the seed of the needle draws ("need")


class _TextPresets(Mapping):
    """``{name: GPTConfig}``: the reference GPT's presets and the length study's (``lm-*``), which the study's
    factory builds with their position schemes (imported when first asked: the study imports this loop)."""

    def _all(self) -> dict:
        from ..studies.length.positions import STUDY_PRESETS

        return {**gpt.PRESETS, **{name: m.config for name, m in STUDY_PRESETS.items()}}

    def __getitem__(self, name: str):
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class TextTask:
    """Byte-level language model on the standard library's source, next-byte cross-entropy.

    The length study's presets (``models.studies.length.positions.STUDY_PRESETS``) are built by the
    study's factory, with their position schemes; they also see planted keys: in a share
    :data:`NEEDLE_RATE` of their training windows a key between marker bytes is inserted and asked
    for at the window's end, the answer weighted in the loss (:mod:`models.training.needles`), so that
    the retrieval probe measures how far a model that can retrieve keeps doing so, not whether
    copying emerged.
    """

    name = "gpt"
    presets = _TextPresets()

    def __init__(self, preset: str, context: int, seed: int):
        if preset in gpt.PRESETS:
            self.config, self.positions = replace(gpt.PRESETS[preset], max_seq_len=context), None
        else:  # a length-study model: its config and position scheme from the study's factory
            from ..studies.length.positions import study_model

            self.config, self.positions = study_model(preset, context)
        self.context, self.seed = context, seed
        self.needle_rate = 0.0 if self.positions is None else NEEDLE_RATE

    def _planted(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``step``'s windows ``x, y [batch_size, context]`` and where each key's answer is (``None``: no keys).
        The needles' draws are a stream of their own, independent of the window starts drawn from ``seed``."""
        x, y = self.train_data.batch(step, batch_size, self.context, seed=self.seed)
        if not self.needle_rate:
            return x, y, None
        rows = torch.arange(step * batch_size, (step + 1) * batch_size)
        u = uniform(self.seed + NEEDLE_STREAM, rows, needles.DRAWS)  # [B, DRAWS]
        return needles.plant_batch(x, y, u, self.needle_rate)

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training windows ``x, y [batch_size, context]`` of ``step`` (planted keys included)."""
        return self._planted(step, batch_size)[:2]

    def target_weights(self, step: int, batch_size: int) -> torch.Tensor | None:
        """``[batch_size, context]`` loss weights of ``step``'s targets (:func:`needles.key_weights`: a planted
        key's answer weighs :data:`needles.KEY_WEIGHT`), or ``None`` where no key is planted (all weigh 1)."""
        answer = self._planted(step, batch_size)[2]
        return None if answer is None else needles.key_weights(answer, self.context)

    @classmethod
    def from_run(cls, run: Mapping) -> TextTask:
        return cls(run["preset"], run["context"], run["seed"])

    @property
    def train_data(self) -> StdlibText:
        return stdlib_text("train")

    @property
    def val_data(self) -> StdlibText:
        return stdlib_text("val")

    def build(self) -> torch.nn.Module:
        return gpt.GPT(self.config, positions=self.positions)

    def loss(self, model, step: int, batch_size: int, rank: int = 0, world: int = 1, **kw) -> torch.Tensor:
        x, y, answer = self._planted(step, batch_size)
        part = shard(batch_size, rank, world)
        device = next(model.parameters()).device
        logits = model(x[part].to(device), **kw).flatten(0, 1).float()
        if answer is None:
            return torch.nn.functional.cross_entropy(logits, y[part].flatten().to(device))
        # the weighted sum over this rank's targets divided by their number (not by the weights' sum): every
        # rank's loss is a mean over its own targets, so the ranks' average is the single-process loss
        weights = needles.key_weights(answer, self.context)[part].flatten().to(device)
        per_target = torch.nn.functional.cross_entropy(logits, y[part].flatten().to(device), reduction="none")
        return (per_target * weights).mean()

    @torch.no_grad()
    def val_loss(self, model, n: int = 16, context: int | None = None, **kw) -> dict:
        """Mean held-out loss (nats/byte) over ``n`` fixed windows of ``context`` bytes."""
        context = context or self.context
        gen = step_generator(self.seed, 0, "val")
        starts = torch.randint(len(self.val_data) - context - 1, (n,), generator=gen)
        x, y = self.val_data.windows(starts, context)
        device = next(model.parameters()).device
        losses = []
        for i in range(0, n, 4):  # small chunks: long contexts stay within memory
            logits = model(x[i : i + 4].to(device), **kw)
            losses.append(
                torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y[i : i + 4].flatten().to(device))
            )
        return {context: float(torch.stack(losses).mean())}

    def save_samples(self, model, path: Path, steps: int = 200) -> Path:
        """A 200-byte continuation of ``def `` (``steps`` is the DiTs' knob; text length is fixed)."""
        prompt = torch.tensor([list(b"def ")])
        out = model.generate(
            prompt.to(next(model.parameters()).device),
            200,
            temperature=0.8,
            top_k=40,
            generator=torch.Generator().manual_seed(0),
        )
        path = path.with_suffix(".txt")
        path.write_bytes(bytes(out[0].tolist()))
        return path
