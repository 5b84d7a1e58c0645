"""The study's page: every table from :class:`~.summary.Results`, the statements from the intervals."""

from __future__ import annotations

import json
import platform
import sys
import sysconfig
import time
from dataclasses import asdict

import numpy as np
import torch

import axial_rope

from ...training.needles import ALPHABETS
from ...training.text_task import stdlib_text
from ..bootstrap import Interval
from ..seed_intervals import correct, correction_note
from .design import SCHEME_ARMS, Study
from .evaluate import BIN
from .summary import Results

__all__ = ["CORRECTION", "correction_lines", "environment", "fmt", "page"]

CORRECTION = "holm"  # the page's family of comparisons is corrected with Holm's method

# the survey table's rows: (row, the arm measured, what the scheme does)
PARADIGM = (
    ("NoPE", "NoPE", "nothing: the causal mask alone orders the tokens"),
    ("Sinusoidal (absolute)", "Sinusoidal", "x * sqrt(C) + (sin, cos) of p / 10000^(2i/C), at the input"),
    ("Learned (absolute)", "Learned", "x + W[p], a learned table, at the input"),
    ("T5 relative bias", "T5 bias", "logit + b[h, bucket(j - i)], learned, log-spaced buckets"),
    ("ALiBi", "ALiBi", "logit - m_h (i - j), fixed head slopes"),
    ("RoPE", "RoPE", "rotate q and k by p * theta_k: q_i . k_j depends on i - j"),
    ("Linear attention + RoPE", "Linear attention + RoPE", "rotate phi(q), phi(k); normaliser unrotated"),
    ("RoPE + Dual Chunk (no training)", "Dual Chunk", "RoPE at remapped indices: distances < context"),
    ("RoPE + window {c}", "Window {c}", "RoPE, each token sees the last {c} tokens"),
)


def paradigm_rows(arms: dict, context: int) -> list[tuple[str, str, str]]:
    """The survey table's rows whose arm the study has, with the context filled in."""
    rows = [tuple(t.format(c=context) for t in row) for row in PARADIGM]
    return [row for row in rows if row[1] in arms]


def fmt(value: Interval | None, digits: int = 3) -> str:
    """``mean [low, high]``, or an em dash where there is no value."""
    return "—" if value is None else value.format(digits)


def environment(study, wall: float, compute: dict[str, float]) -> dict:
    """What the page records: versions, machine, the held-out text, the sizes, the wall time."""
    val = stdlib_text("val")
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "axial_rope": axial_rope.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "heldout": {"stdlib": sysconfig.get_paths()["stdlib"], "files": val.files, "bytes": len(val)},
        "study": asdict(study),
        "wall_minutes": round(wall / 60, 1),  # this invocation (reused results take none)
        "worker_minutes": {k: round(v / 60, 1) for k, v in compute.items()},  # every result, all invocations
        "date": time.strftime("%Y-%m-%d"),
    }


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _header(*cells) -> list[str]:
    return [_row(*cells), "|" + "---|" * len(cells)]


def paradigm_table(results: Results, measured: dict) -> list[str]:
    s = results.study
    longest, c = s.longest, s.context
    lines = _header(
        "scheme",
        "operation",
        "score change at +1e6 (mean abs score)",
        f"loss {longest} / {c}",
        *([f"retrieval at {longest}"] if s.probe else []),
        "position parameters",
        "SDPA without mask",
        f"forward at {s.timing_length} (ms)",
    )
    for row, arm, operation in paradigm_rows(results.arms, c):
        m = measured[arm]
        change = "n/a (no row past the table)" if m["change"] is None else f"{m['change']:.2g} ({m['scale']:.2g})"
        fused = "yes" if m["fused"] else "no"
        ratio, rate = results.ratio(arm), results.pass_rate(arm, longest)
        retrieval = fmt(rate, 2) if rate is not None else f"— (at {c}: {fmt(results.pass_rate(arm, c), 2)})"
        ms = f"{1000 * m['seconds']:.0f}" if m["seconds"] is not None else "—"
        lines.append(
            _row(row, operation, change, fmt(ratio), *([retrieval] if s.probe else []), m["parameters"], fused, ms)
        )
    return lines


def scaling_table(results: Results) -> list[str]:
    s = results.study
    probe = [f"retrieval at {s.longest}"] if s.probe else []
    lines = _header("method", "effective context", *probe, f"loss at {s.longest}")
    for name, arm in results.arms.items():
        if arm.family in ("scaling", "finetuned", "bound"):
            rate = [fmt(results.pass_rate(name, s.longest), 2)] if s.probe else []
            loss = fmt(results.loss(name, s.longest))
            lines.append(_row(name, results.effective_context(name), *rate, loss))
    return lines


def length_table(results: Results, families: tuple[str, ...], retrieval: bool = False) -> list[str]:
    s = results.study
    lines = _header("arm", *(f"{L}" for L in s.lengths))
    for name, arm in results.arms.items():
        if arm.family not in families or (retrieval and not arm.retrieval):
            continue
        get = (
            (lambda L, n=name: fmt(results.pass_rate(n, L), 2))
            if retrieval
            else (lambda L, n=name: fmt(results.loss(n, L)))
        )
        lines.append(_row(name, *(get(L) for L in s.lengths)))
    return lines


CHANCE = 1 / float(np.prod([len(a) for a in ALPHABETS]))  # a guessed key passes with this probability


def retrieval_text(results: Results) -> list[str]:
    """The probe, its chance level, and which arms retrieve above chance (interval above it) where."""
    s = results.study
    above = []
    for name, arm in results.arms.items():
        lengths = [L for L in s.lengths if (r := results.pass_rate(name, L)) is not None and r.low > CHANCE]
        if arm.retrieval and lengths:
            above.append(f"{name} ({', '.join(map(str, lengths))})")
    found = "; ".join(above) if above else "no arm, at any length"
    key = "a one-byte key" if len(ALPHABETS) == 1 else f"a {len(ALPHABETS)}-byte key"
    base = results.pass_rate("RoPE", s.context)
    competence = (
        f" The base model (RoPE) at its training length, {s.context} bytes: {fmt(base, 2)} (the competence"
        " criterion of the design: 0.9)."
        if base is not None
        else ""
    )
    return [
        f"The probe: {key} between marker bytes planted at depths {list(s.depths)} of held-out text, asked for"
        f" at the end ({s.trials} probes per length, depth and seed, the same for every arm); it passes when"
        f" every key byte is the greedy prediction. A guess passes with probability {CHANCE:.3f}.{competence}"
        f" Pass rate significantly above chance (interval above {CHANCE:.3f}): {found}.",
    ]


NO_PROBE = (
    "The retrieval probe is not run here: no base model of this size passes it inside its own training"
    " context, so its pass rates would say nothing about length. Spot checks"
    " ([After the pilot](../experiments.md#after-the-pilot)): the RoPE model of 2400 steps spreads its"
    " prediction of a key's first byte nearly evenly (0.09 to 0.16) over the 8 bytes it can be, the same for"
    " every key, and passes 2 of 100 probes at 256 bytes; planting a key in every window, or in a quarter or"
    " half of them with the key's loss weighted 32 or 16 times, leaves 600-step models at 0 to 2 of 100; and"
    " these models copy no repeated text (a random 40-byte string costs as much the second time as the"
    " first). The page states what the losses show."
)


def retrieval_section(results: Results, pictures: dict) -> list[str]:
    if not results.study.probe:
        return ["## Retrieval", "", NO_PROBE, ""]
    return [
        "## Retrieval: pass rate per length (95% interval)",
        "",
        *retrieval_text(results),
        "",
        *length_table(results, ("scaling", "scheme", "finetuned", "bound"), retrieval=True),
        "",
        f"![retrieval]({pictures['retrieval']})",
        "",
    ]


def break_table(results: Results) -> list[str]:
    s = results.study
    lines = _header("arm", f"breaks at (first {BIN}-byte bin above the last trained one)", f"loss at {s.longest}")
    for name in results.break_arms():
        where = results.break_position(name)
        lines.append(_row(name, "no bin, to the end" if where is None else where, fmt(results.loss(name, s.longest))))
    return lines


def statements(comparisons: list[dict]) -> list[str]:
    """One bullet per comparison, its wording decided by the intervals (``summary.verdict``)."""
    lines = []
    for c in comparisons:
        d = c["difference"]
        lines.append(
            f"- {c['a']} vs {c['b']} at {c['length']}: {fmt(c['a_loss'])} vs {fmt(c['b_loss'])}, "
            f"difference {d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}]: {c['a']} is {c['verdict']}."
        )
    return lines


def correction_lines(comparisons: list[dict], method: str = CORRECTION, alpha: float = 0.05) -> list[str]:
    """The closing section: every stated comparison corrected together (``method``, named); none with one seed."""
    tests = {_name(c): c["test"] for c in comparisons if not np.isnan(c["test"].p_value)}
    if not tests:
        return []
    adjusted = correct(tests, method)
    significant = [name for name, p in adjusted.items() if p < alpha]
    return [
        "## Multiple comparisons",
        "",
        correction_note(method, len(tests), alpha)
        + " Effective context and break positions are per-arm readings, not in this family.",
        "",
        "| comparison | p | adjusted p |",
        "|---|---|---|",
        *(_row(name, f"{tests[name].p_value:.2g}", f"{adjusted[name]:.2g}") for name in tests),
        "",
        "Significant after the correction: " + ("; ".join(significant) if significant else "none") + ".",
        "",
    ]


def _name(c: dict) -> str:
    return f"{c['a']} - {c['b']} at {c['length']}"


# why a scheme of the survey is not trained where a study leaves it out (else: SPARED)
LEFT_OUT = {
    "t5": "at the shared learning rate its learned bias moved about 0.33 logits in the first design's 300 steps,"
    " so the arm measured no positions by construction, and a learning rate of its own needs a parameter"
    " group the trainer does not build",
}
SPARED = (
    "left out so that five seeds of the rest fit the machine"
    " (the first design measured them with 3 seeds: this page's git history)"
)


def left_out(study) -> str:
    """The sentence naming the survey's schemes this study does not train, and why."""
    by_reason: dict[str, list[str]] = {}
    for scheme in SCHEME_ARMS:
        if scheme not in study.schemes:
            by_reason.setdefault(LEFT_OUT.get(scheme, SPARED), []).append(SCHEME_ARMS[scheme])
    parts = [f"{', '.join(names)}: {why}" for why, names in by_reason.items()]
    return " Not trained here: " + "; ".join(parts) + "." if parts else ""


def _weighted(study: Study) -> str:
    return "" if study.key_weight == 1 else f" whose answer weighs {study.key_weight:g} targets in the loss"


def setup_text(results: Results, env: dict) -> list[str]:
    s, h = results.study, env["heldout"]
    return [
        f"Every scheme is the byte-level model of `models/gpt.py` (width 128, depth 3, 4 heads, the `lm-*` presets),"
        f" trained {s.steps} steps of {s.batch_size} windows of {s.context} bytes (AdamW, lr {s.lr:g}, cosine,"
        f" the same data order for every scheme at a given seed; {100 * s.needle_rate:g}% of the windows hold a"
        f" planted key{_weighted(s)}, asked for {s.asked}, see Retrieval), seeds {list(s.seeds)}.{left_out(s)} Fine-tuned arms: the RoPE model of each seed,"
        f" {s.finetune_steps} more steps at {s.finetune_factor * s.context} bytes with the scaling of factor"
        f" {s.finetune_factor} (lr {s.finetune_lr:g}, the same tokens per step, a fresh data stream), and with plain"
        " positions for the same steps (`RoPE fine-tuned`: the control, so a fine-tuned scaling is compared with"
        " what the steps alone give)."
        + (
            f" Upper bound: RoPE trained from scratch at {s.longest} bytes, same steps and tokens per step."
            if s.bound
            else " No upper bound is trained (RoPE from scratch at the longest length): left out to afford the seeds."
        ),
        "",
        f"Evaluation: {s.windows} windows of {s.longest} bytes, evenly spaced over the held-out files of the"
        f" standard library of Python {env['python']} ({h['files']} files, {h['bytes']:,} bytes; the split is"
        f" fixed by file-name hashes); the windows of a shorter length are their prefixes, so every length and"
        f" arm sees the same text. Intervals of one arm: 95% bootstrap over windows and seeds ({s.draws} draws,"
        f" fixed seed). Paired differences (comparisons, effective context, break positions): "
        + (
            f"seed-level 95% intervals, a bootstrap over the {len(s.seeds)} seeds and, shared by every seed and"
            f" arm, the windows clustered by the held-out file they start in"
            f" ({len(set(results.sources or range(s.windows)))} files), with a t quantile on the scarcer of the"
            " two (`models/studies/seed_intervals.py`)."
            if len(s.seeds) > 1
            else "one seed, so no seed-level interval exists: a bootstrap over windows alone (plumbing only)."
        ),
    ]


def paper_lines(results: Results, comparisons: list[dict]) -> list[str]:
    """The page's paper table (:mod:`models.studies.papers`) from its stated comparisons and pass rates."""
    from .. import paper_findings
    from ..papers import section_lines

    differences = {f"{c['a']} vs {c['b']} at {c['length']}": c["difference"] for c in comparisons}
    retrieval = {
        arm: {str(L): results.pass_rate(arm, L) for L in results.study.lengths if results.pass_rate(arm, L)}
        for arm, a in results.arms.items()
        if a.retrieval
    }
    return section_lines("length", paper_findings.length(differences, retrieval))


def page(results: Results, measured: dict, timings: dict, comparisons: list[dict], env: dict, pictures: dict) -> str:
    """The whole page: the header and the survey tables, then the per-length results."""
    lines = head(results, measured, timings, env) + body(results, comparisons, env, pictures)
    return "\n".join(lines) + "\n"


def head(results: Results, measured: dict, timings: dict, env: dict) -> list[str]:
    s = results.study
    sdpa = ", ".join(f"{k}: {1000 * v:.1f} ms" for k, v in timings.items())
    work = env["worker_minutes"]
    return [
        "# Length extrapolation: position schemes and RoPE scaling, trained and measured",
        "",
        f"`python -m scripts.experiments length{' --quick' if s.quick else ''}` on {env['machine']},"
        f" {env['date']}, {max(s.workers, 1)} worker process(es) of one thread each: training took"
        f" {work['train']} and evaluation {work['eval']} worker-minutes ({env['wall_minutes']} min wall time in"
        f" the last invocation; finished runs and arms are reused). Python {env['python']}, torch"
        f" {env['torch']}, numpy {env['numpy']}, axial_rope {env['axial_rope']}.",
        "",
        *setup_text(results, env),
        "",
        "## The paradigm comparison, measured",
        "",
        *paradigm_table(results, measured),
        "",
        f"SDPA alone at {s.timing_length} tokens (4 heads of 32, one thread): {sdpa}. The biases (T5, ALiBi),"
        " the window and Dual Chunk Attention need an explicit mask or score matrix, so they cannot use the"
        " fused causal kernel; linear attention has no softmax kernel at all (its decoding state is"
        " constant-size). Score change: layer 0's query-key logit of 256 held-out token pairs within the"
        " training context, moved 1e6 positions further (float32; in brackets the mean |logit|).",
        "",
        "## The RoPE scaling benchmark",
        "",
        f"Effective context: the longest length up to which the loss is never significantly above the loss at {s.context}.",
        "",
        *scaling_table(results),
        "",
    ]


def sweep_section(results: Results) -> list[str]:
    if not results.study.sweep:
        return []
    return [
        "## Fixed-factor sweeps (a factor chosen once, evaluated at every length)",
        "",
        *length_table(results, ("sweep",)),
        "",
    ]


def body(results: Results, comparisons: list[dict], env: dict, pictures: dict) -> list[str]:
    return [
        "## Held-out loss per length (nats/byte, 95% interval)",
        "",
        *length_table(results, ("scaling", "scheme", "finetuned", "bound")),
        "",
        f"![loss per length]({pictures['lengths']})",
        "",
        "## Where inside a long window each method breaks",
        "",
        f"![loss per position]({pictures['curves']})",
        "",
        "A bin counts as broken when its loss is above the last trained bin's with 95% confidence for all"
        " bins past the context together (the paired difference of the setup above, Bonferroni over those bins).",
        "",
        *break_table(results),
        "",
        *sweep_section(results),
        *retrieval_section(results, pictures),
        "## What the intervals say",
        "",
        *statements(comparisons),
        "",
        *correction_lines(comparisons),
        *paper_lines(results, comparisons),
        "## Configuration",
        "",
        f"`{json.dumps(env['study'])}`",
    ]
