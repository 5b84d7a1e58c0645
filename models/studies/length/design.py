"""What the length study trains and evaluates: its sizes (:class:`Study`), its runs and its arms.

Trained models (one run folder per model and seed, ``ROOT/train/<model>_s<seed>``):

- one per position scheme (``positions.STUDY_PRESETS``), all with the same width, steps, batch,
  learning rate and data order (seed ``s`` of every scheme reads the same windows);
- ``ft-pi``, ``ft-ntk``, ``ft-yarn``: the RoPE model of seed ``s`` fine-tuned at 4x the
  context with that scaling (factor 4), the same tokens per step; ``ft-rope``: the same steps with
  plain positions, the control that tells the scaling's part from the steps' part;
- ``long``: RoPE trained from scratch at the longest evaluated length, the same steps and
  tokens per step: the upper bound.

An arm is a trained model plus what is changed at evaluation (a scaling, Dual Chunk
Attention, a window). ``per_length`` arms take the factor ``L / context`` at each length
``L`` (one forward per length); the others are one fixed model, evaluated once on the
longest windows, whose prefixes give every shorter length (causal models: the loss of the
first ``L`` positions of a window is the loss of its length-``L`` prefix).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import axial_rope as ar

from ...training.config import TrainConfig
from ...training.needles import ASKED, KEY_WEIGHT
from ...training.text_task import NEEDLE_RATE
from .positions import DualChunk

__all__ = ["DYNAMIC_NTK", "Arm", "FULL", "QUICK", "Study", "arms", "train_configs"]

DYNAMIC_NTK = "Dynamic NTK (static per length)"  # the arm's name says how it is evaluated

SCHEMES = ("rope", "nope", "sinusoidal", "learned", "t5", "alibi", "linear")
# the arm of each scheme but RoPE (whose arm is the scalings' reference), in table order
SCHEME_ARMS = {"nope": "NoPE", "sinusoidal": "Sinusoidal", "learned": "Learned", "t5": "T5 bias", "alibi": "ALiBi",
               "linear": "Linear attention + RoPE"}  # fmt: skip
FINETUNED = ("rope", "pi", "ntk", "yarn")  # "rope": plain positions, the control with the same steps


@dataclass(frozen=True)
class Study:
    """The sizes of one run of the study (``FULL``: the published one; ``QUICK``: seconds, plumbing only)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    schemes: tuple[str, ...] = SCHEMES  # the position schemes trained ("rope" first: every scaling arm's model)
    bound: bool = True  # train RoPE at the longest length too (the upper bound)
    context: int = 256  # training context of every scheme
    steps: int = 300
    batch_size: int = 16
    lr: float = 2e-3
    finetune_factor: int = 4  # PI / NTK / YaRN fine-tuned at factor x context
    finetune_steps: int = 100
    finetune_lr: float = 5e-4
    lengths: tuple[int, ...] = (256, 512, 1024, 2048)  # evaluated; the last is also the upper bound's context
    windows: int = 192  # held-out windows of the longest length (prefixes give the shorter ones)
    sweep: tuple[float, ...] = (2.0, 4.0, 8.0)  # fixed factors, each evaluated at every length
    depths: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)  # retrieval: where the key is planted
    trials: int = 8  # retrieval probes per (length, depth) and seed
    probe: bool = True  # run the retrieval probe (off where the base model does not pass it inside its context)
    # how the training windows teach the probe's format (models/training/needles.py): a record of what the
    # trainer does (train_configs refuses a study that asks otherwise), kept in a page's json. The runs before
    # the pilot of 2026-12-02 planted a quarter of the windows, unweighted: their jsons say 0.25 and 1
    needle_rate: float = NEEDLE_RATE  # the share of training windows that hold a planted key
    key_weight: float = KEY_WEIGHT  # the answer's weight in the training loss
    asked: str = ASKED  # where the window asks for its key (the runs before the published 2026-12-02 re-run:
    # "at the window's end"; their jsons predate the field)
    dca_local: int = 64  # Dual Chunk Attention's local window w (chunks of context - w)
    draws: int = 2000  # bootstrap replicates
    workers: int = 2  # processes (one thread each); 0: in this process
    timing_length: int = 2048  # sequence length of the kernel timings
    quick: bool = field(default=False, compare=False)

    def __post_init__(self):
        if self.schemes[:1] != ("rope",) or not set(self.schemes) <= set(SCHEMES):
            raise ValueError(f"schemes must start with 'rope' and be among {SCHEMES}, got {self.schemes}")

    @property
    def longest(self) -> int:
        return self.lengths[-1]


# the design of the re-run (docs/experiments.md, "After the pilot"): five seeds of RoPE, NoPE and ALiBi at 600
# steps, the fine-tunes and their control, evaluated to 4x the context; no sweeps or upper bound. The published
# page (2026-12-01) ran it before the pilot found a key format its models learn: without the probe, keys in a
# quarter of the windows, unweighted (its json holds those settings)
FULL = Study(
    seeds=(0, 1, 2, 3, 4),
    schemes=("rope", "nope", "alibi"),
    bound=False,
    steps=600,
    lengths=(256, 512, 1024),
    windows=96,
    sweep=(),
)
QUICK = Study(
    seeds=(0,),
    context=64,  # the needle and its question take 40 bytes
    steps=3,
    batch_size=4,
    finetune_steps=2,
    lengths=(64, 128, 256),
    windows=6,
    sweep=(2.0, 4.0),
    depths=(0.2, 0.8),
    trials=2,
    dca_local=16,
    draws=200,
    workers=0,
    timing_length=256,
    quick=True,
)


def run_dir(root, model: str, seed: int):
    return root / "train" / f"{model}_s{seed}"


def train_configs(study: Study, root) -> dict[tuple[str, int], tuple[TrainConfig, tuple[str, int] | None]]:
    """``{(model, seed): (config, the run it starts from or None)}`` of every training run, in a safe order."""
    if (study.needle_rate, study.key_weight, study.asked) != (NEEDLE_RATE, KEY_WEIGHT, ASKED):
        raise ValueError(
            f"this code plants a key in {NEEDLE_RATE:g} of the training windows with its answer weighted"
            f" {KEY_WEIGHT:g}, asked for {ASKED}; the study asks for {study.needle_rate:g}, {study.key_weight:g}"
            f" and {study.asked} (a page's json keeps the settings its runs were trained with: retrain them at"
            " the commit it names)"
        )
    common = dict(model="gpt", lr=study.lr, schedule="cosine", warmup=20, ema=0.0, progress=False, report=False)
    common |= dict(log_every=10, ckpt_every=100, val_every=10**6)
    out = {}
    for seed in study.seeds:
        for scheme in study.schemes:
            cfg = TrainConfig(
                preset=f"lm-{scheme}",
                steps=study.steps,
                batch_size=study.batch_size,
                context=study.context,
                seed=seed,
                out=str(run_dir(root, scheme, seed)),
                **common,
            )
            out[scheme, seed] = (cfg, None)
    f = study.finetune_factor
    for seed in study.seeds:
        for method in FINETUNED:  # a fresh data stream (seed + 1000), the same tokens per step
            cfg = TrainConfig(
                preset="lm-rope" if method == "rope" else f"lm-rope-{method}{f}",
                steps=study.finetune_steps,
                batch_size=max(1, study.batch_size // f),
                context=study.context * f,
                seed=1000 + seed,
                out=str(run_dir(root, f"ft-{method}", seed)),
                **(common | {"lr": study.finetune_lr, "warmup": 10}),
            )
            out[f"ft-{method}", seed] = (cfg, ("rope", seed))
        if not study.bound:
            continue
        ratio = study.longest // study.context
        cfg = TrainConfig(
            preset="lm-rope",
            steps=study.steps,
            batch_size=max(1, study.batch_size // ratio),
            context=study.longest,
            seed=seed,
            out=str(run_dir(root, "long", seed)),
            **common,
        )
        out["long", seed] = (cfg, None)
    return out


@dataclass(frozen=True)
class Arm:
    """A trained model and what evaluation changes in its config (``change(factor) -> {field: value}``)."""

    name: str
    model: str  # a key of train_configs: a scheme, "ft-pi", ..., "long"
    family: str  # "scheme", "scaling", "sweep", "finetuned", "bound": which tables it is in
    change: Callable[[float], dict] | None = None
    per_length: bool = False  # factor = L / context at each length L; else one fixed model
    factor: float | None = None  # the fixed factor of a sweep arm
    retrieval: bool = True
    max_length: int | None = None  # the longest length it can run (learned positions: its table)

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


def _scalings(context: int) -> dict[str, Callable[[float], object]]:
    return {
        "PI": lambda f: ar.scaling.Linear(f),
        "NTK": lambda f: ar.scaling.NTK(f),
        "YaRN": lambda f: ar.scaling.YaRN(f, context),
        "YaRN, no attention factor": lambda f: ar.scaling.YaRN(f, context, attention_factor=1.0),
        "Llama 3": lambda f: ar.scaling.Llama3(f, context),
    }


def arms(study: Study) -> dict[str, Arm]:
    """Every arm of the study by name, in table order."""
    c, out = study.context, {}

    def add(arm: Arm) -> None:
        out[arm.name] = arm

    add(Arm("RoPE", "rope", "scaling"))
    for name, make in _scalings(c).items():  # factor = L / context; factor 1 is plain RoPE
        add(Arm(name, "rope", "scaling", lambda f, m=make: {"scaling": m(f) if f > 1 else None}, per_length=True))
    # one whole-window forward per length: DynamicNTK at seq_len = L is static NTK at that length's factor, not
    # NTK growing with the decoded length as in generation (docs/scaling.md, "DynamicNTK and transformers' cache")
    dynamic = lambda f: {"scaling": ar.scaling.DynamicNTK(2.0, c)}  # noqa: E731
    add(Arm(DYNAMIC_NTK, "rope", "scaling", dynamic, per_length=True))
    dual = DualChunk(c, study.dca_local)
    add(Arm("Dual Chunk", "rope", "scaling", lambda f: {"dual_chunk": dual}))
    add(Arm(f"Window {c}", "rope", "scaling", lambda f: {"window": c}))
    for name, make in _scalings(c).items():
        for factor in study.sweep:
            change = lambda f, m=make, k=factor: {"scaling": m(k)}  # noqa: E731 - the fixed factor k, not f
            add(Arm(f"{name} x{factor:g}", "rope", "sweep", change, factor=factor, retrieval=False))
    for scheme, label in SCHEME_ARMS.items():
        if scheme in study.schemes:
            add(Arm(label, scheme, "scheme", max_length=c if scheme == "learned" else None))
    f = study.finetune_factor
    for method, label in zip(FINETUNED, ("RoPE", "PI", "NTK", "YaRN")):
        add(Arm(f"{label} fine-tuned x{f}", f"ft-{method}", "finetuned"))
    if study.bound:
        add(Arm(f"RoPE trained at {study.longest}", "long", "bound"))
    return out if study.probe else {name: replace(arm, retrieval=False) for name, arm in out.items()}
