"""The speed guard: small eager shapes on CPU against the peers, ``python -m scripts.bench --guard``.

Two cases, bf16 q and k ``[B, S, H, D]``, forward (the rotation of q and k):

- *DiT-XL/2*: 8 x 256 tokens (a 16 x 16 grid), 16 heads, head dim 72 (axes 36, 36). Target: ours at most a third
  of diffusers' ``apply_rotary_emb``.
- *video slice*: 4096 tokens (4 x 32 x 32), 24 heads, head dim 128 (axes 16, 56, 56). Target: ours at most twice
  ``q.clone(), k.clone()`` (one read and one write of q and k, the floor).

Providers: ``copy``; ``ours (positions)``, ``rope(q, k, pos)``, the path a model takes (tables from positions in the
call); ``ours (tables)``, :func:`axial_rope.apply_rope` on cos/sin built outside; ``ours compiled``, the positions
call under ``torch.compile`` (inductor fuses it into one loop); diffusers' ``apply_rotary_emb``; comfy-kitchen's eager
``apply_rope`` (its ``freqs_cis`` rotation matrices built outside); rotary-embedding-torch's ``apply_rotary_emb``
(``[B, H, S, D]``, its layout; angles in, cos and sin computed in the call, as its API takes them). Each peer is
checked against a float32 rotation of the same q (``max err``: a wrong pairing would show O(1)).

One run: every round samples each provider once, in a new random order per round; a sample repeats the call for at
least ``--sample-ms``. Medians, the spread (min and max over rounds) and the medians of the per-round ratios to copy
and to diffusers. The machine may be shared: read the ratios, and the spread says how far to trust them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import random
import statistics
import time
from pathlib import Path

import torch

import axial_rope as ar

from . import cli
from .bench_report import machine

CASES = {
    "dit": dict(name="DiT-XL/2", batch=8, grid=(16, 16), heads=16, axes_dim=(36, 36)),
    "video": dict(name="video slice", batch=1, grid=(4, 32, 32), heads=24, axes_dim=(16, 56, 56)),
}
TARGETS = {"dit": ("x_diffusers", 1 / 3), "video": ("x_copy", 2.0)}  # ours (positions) at most this


def _peer(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        return f"not importable ({type(err).__name__}: {err}); pip install {module.split('.')[0].replace('_', '-')}"


def providers(q, k, rope, pos, compiled: bool) -> dict:
    """name -> rotate() -> (q, k) on this case's q and k, or name -> why it cannot run."""
    cos, sin = rope.cos_sin(pos)  # float32 [S, D], interleaved
    out = {
        "copy": lambda: (q.clone(), k.clone()),
        "ours (positions)": lambda: rope(q, k, pos, "bshd"),
        "ours (tables)": lambda: (ar.apply_rope(q, cos, sin), ar.apply_rope(k, cos, sin)),
    }
    if compiled:
        fn = torch.compile(lambda q, k: rope(q, k, pos, "bshd"), fullgraph=True, dynamic=False)
        out["ours compiled"] = lambda: fn(q, k)
    diffusers = _peer("diffusers.models.embeddings", "apply_rotary_emb")
    out["diffusers apply_rotary_emb"] = diffusers if isinstance(diffusers, str) else (
        lambda: (diffusers(q, (cos, sin), sequence_dim=1), diffusers(k, (cos, sin), sequence_dim=1)))  # fmt: skip
    comfy = _peer("comfy_kitchen", "apply_rope")
    if isinstance(comfy, str):
        out["comfy-kitchen apply_rope (eager)"] = comfy
    else:
        c, s = cos[:, 0::2], sin[:, 0::2]
        freqs_cis = torch.stack([c, -s, s, c], -1).unflatten(-1, (2, 2))[None, :, None]  # [1, S, 1, D/2, 2, 2]

        def comfy_eager():
            with importlib.import_module("comfy_kitchen").registry.use_backend("eager"):
                return comfy(q, k, freqs_cis)

        out["comfy-kitchen apply_rope (eager)"] = comfy_eager
    ret = _peer("rotary_embedding_torch", "apply_rotary_emb")
    if isinstance(ret, str):
        out["rotary-embedding-torch"] = ret
    else:
        angles = torch.atan2(sin[:, 0::2], cos[:, 0::2]).repeat_interleave(2, -1)  # [S, D], each plane's twice
        qh, kh = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # [B, H, S, D]
        out["rotary-embedding-torch"] = lambda: (ret(angles, qh), ret(angles, kh))
    return out


def _error(name: str, result, reference: torch.Tensor) -> float:
    """Max |q out - float32 rotation of q| (outputs in their own layout)."""
    got = result[0].transpose(1, 2) if name == "rotary-embedding-torch" else result[0]
    return float((got.float() - reference).abs().max())


def run_case(key: str, rounds: int, sample_ms: float, compiled: bool, seed: int = 0) -> list[dict]:
    """One row per provider: median / min / max ms over interleaved rounds, per-round ratios, error."""
    case = CASES[key]
    rope, pos = ar.AxialRoPE(case["axes_dim"]), ar.grid(*case["grid"])
    gen = torch.Generator().manual_seed(seed)
    shape = (case["batch"], pos.shape[0], case["heads"], rope.rot_dim)
    q, k = (torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2))
    cos, sin = rope.cos_sin(pos)
    reference = ar.apply_rope(q.float(), cos, sin)
    rows, timed = [], {}
    with torch.no_grad():
        for name, fn in providers(q, k, rope, pos, compiled).items():
            row = {"case": key, "shape": f"{case['name']} B{shape[0]} S{shape[1]} H{shape[2]} D{shape[3]}",
                   "provider": name}  # fmt: skip
            if isinstance(fn, str):
                rows.append({**row, "skipped": fn})
                continue
            row["max_err"] = _error(name, fn(), reference) if name != "copy" else 0.0  # also the warm-up (compile)
            rows.append(row)
            timed[name] = fn
        samples = {name: [] for name in timed}
        rng = random.Random(seed)
        for _ in range(rounds):
            order = list(timed)
            rng.shuffle(order)
            for name in order:
                fn, calls, start = timed[name], 0, time.perf_counter()
                while (elapsed := time.perf_counter() - start) < sample_ms / 1e3 or calls == 0:
                    fn()
                    calls += 1
                samples[name].append(elapsed / calls)
    for row in rows:
        ts = samples.get(row["provider"])
        if ts is None:
            continue
        row.update(median_ms=statistics.median(ts) * 1e3, min_ms=min(ts) * 1e3, max_ms=max(ts) * 1e3)
        for ref, col in (("copy", "x_copy"), ("diffusers apply_rotary_emb", "x_diffusers")):
            if ref in samples:
                row[col] = statistics.median(t / b for t, b in zip(ts, samples[ref]))
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """Whether ``ours (positions)`` meets each case's target, one sentence per case."""
    lines = []
    for key, (col, limit) in TARGETS.items():
        ours = next((r for r in rows if r["case"] == key and r["provider"] == "ours (positions)"), None)
        if ours is None or col not in ours:
            continue
        what = "diffusers' apply_rotary_emb" if col == "x_diffusers" else "the copy of q and k"
        met = "met" if ours[col] <= limit else "NOT met"
        lines.append(f"{CASES[key]['name']}: ours (positions) {ours[col]:.3g} x {what} (target <= {limit:.3g}): {met}")
    return lines


def markdown(rows: list[dict]) -> str:
    head = "| case | provider | median ms | min - max ms | x copy | x diffusers | max err |"
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['provider']} | skipped: {r['skipped']} | | | | |")
            continue
        ratio = lambda col, r=r: f"{r[col]:.3f}" if col in r else ""  # noqa: E731
        lines.append(f"| {r['shape']} | {r['provider']} | {r['median_ms']:.2f} | {r['min_ms']:.2f} - {r['max_ms']:.2f} "
                     f"| {ratio('x_copy')} | {ratio('x_diffusers')} | {r.get('max_err', 0):.2g} |")  # fmt: skip
    return "\n".join(lines)


def report(result: dict, source: str) -> str:
    """The benchmarks page's section for one result file (``docs/bench/guard/*.json``)."""
    info = result["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("date", "device", "torch_threads", "dtype"))
    return "\n".join([
        f"## Speed guard: small eager shapes, {info['device']}",
        "",
        "`python -m scripts.bench --guard` (`scripts/bench_guard.py`): the rotation of bf16 q and k `[B, S, H, D]`,",
        "forward, against the peers. *ours (positions)*: `rope(q, k, pos)`, tables from positions inside the call (what",
        "a model runs); *ours (tables)*: `apply_rope` on tables built outside; *ours compiled*: the positions call under",
        "`torch.compile`; *comfy-kitchen*: its eager `apply_rope`; *rotary-embedding-torch*: its `apply_rotary_emb` on",
        "`[B, H, S, D]`, angles in (its API computes cos and sin in the call). Rounds interleave the providers in a new",
        "random order each; *x copy*, *x diffusers*: medians of the per-round ratios to `q.clone(), k.clone()` and to",
        "diffusers' `apply_rotary_emb`; *max err*: against a float32 rotation of q (bf16 rounding is about 4e-3 here).",
        f"{info['torch_threads']} torch threads, {result['rounds']} rounds of at least {result['sample_ms']} ms per",
        f"sample, {info['date']}; {versions}. Rows: `{source}`.",
        "",
        markdown(result["rows"]),
        "",
        *[f"- {line}" for line in result.get("verdicts", [])],
    ])


def main(argv: list[str] | None = None) -> None:
    parser = cli.Parser(prog="scripts.bench --guard", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {list(CASES)}")
    parser.add_argument("--rounds", type=cli.positive_int, default=15, help="interleaved rounds")
    parser.add_argument("--sample-ms", type=cli.positive_int, default=60, help="least time of one sample")
    parser.add_argument("--threads", type=cli.positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled provider")
    parser.add_argument("--json", default=None, help="write the rows here (docs/bench/guard/cpu.json for the page)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    keys = cli.choices(parser, "--cases", args.cases, CASES)
    rows = [row for key in keys for row in run_case(key, args.rounds, args.sample_ms, not args.no_compile)]
    print(markdown(rows))
    found = verdicts(rows)
    print("\n".join(found))
    if args.json:
        versions = {}
        for dist in ("diffusers", "comfy-kitchen", "rotary-embedding-torch"):
            try:
                versions[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                pass
        info = machine("cpu", "bfloat16", torch.get_num_threads(), {}) | versions
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": info, "rounds": args.rounds, "sample_ms": args.sample_ms,
                                               "rows": rows, "verdicts": found}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
