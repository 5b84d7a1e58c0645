"""QK-norm + RoPE from tables against peers, at Flux-dev's attention shape: ``python -m scripts.bench --norm-tables``.

The step the diffusers processors run (``docs/integrations.md``): RMSNorm of q and k per head (weights
``[D]``), then the rotation by the model's cos/sin tables. Providers, each on ``[B, S, H, D]`` q and k:

- ``ours fused``: :func:`axial_rope.ops.norm_apply_rope` (Triton on a GPU: one launch each way; torch on CPU);
- ``ours fused, compiled`` (CPU): the same under ``torch.compile`` (inductor fuses the torch backend's ops);
- ``ours unfused``: ``F.rms_norm`` then :func:`axial_rope.apply_rope` (two passes, as before issue 45);
- ``diffusers``: the stock processors' step, ``nn.RMSNorm`` modules then ``apply_rotary_emb``;
- ``comfy-kitchen <backend>``: ``comfy_kitchen.rms_rope`` (eager on CPU; cuda and triton on a GPU), with its
  ``freqs_cis`` ``[1, S, 1, D/2, 2, 2]`` built from the same tables. It rounds the normalised q and k to their
  dtype before rotating them (ours rounds once); forward only in its kernels.

One run: every round times each provider once, in turn (interleaved), ``--repeat`` rounds; medians, GB/s
(one read and one write of q and k, twice that for forward+backward), ratios to the copy floor and to
diffusers in the same round. ``--check-peer``: comfy-kitchen's Triton ``rms_rope`` and ours under the Triton
interpreter on a tiny shape, against the float64 reference (a correctness peer; run in a subprocess, since
``TRITON_INTERPRET=1`` must precede triton's import).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

import axial_rope as ar
from axial_rope import ops

from . import cli, peers
from .bench import PEAK_GBPS, Copy
from .bench_report import call_timer, machine

FLUX_DEV = dict(batch=1, grid=(1, 72, 64), heads=24, axes_dim=(16, 56, 56))  # 512 text + 4096 image tokens
SMALL = dict(batch=1, grid=(1, 16, 16), heads=8, axes_dim=(16, 56, 56))
MODES = ("forward", "forward+backward")


def comfy_kitchen():
    """The comfy_kitchen module, installed or unpacked from ``.peers`` (``scripts/peers.py``), or why it is absent.

    Not a dependency: ``pip install comfy-kitchen`` (a wheel with its compiled backends, no requirements).
    """
    try:
        import comfy_kitchen

        return comfy_kitchen
    except ImportError:
        site = str(peers.PEERS / "site")
        if (peers.PEERS / "site" / "comfy_kitchen").is_dir() and site not in sys.path:
            sys.path.append(site)
    try:
        import comfy_kitchen

        return comfy_kitchen
    except ImportError as err:
        return f"comfy-kitchen is not installed ({err}); pip install comfy-kitchen, or its wheel in .peers"


def freqs_cis(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved channel tables ``[S, D]`` -> comfy-kitchen's (ComfyUI's) ``[1, S, 1, D/2, 2, 2]`` rotation matrices."""
    c, s = cos[:, 0::2], sin[:, 0::2]
    return torch.stack([c, -s, s, c], -1).unflatten(-1, (2, 2))[None, :, None]


def _version(module) -> str:
    try:
        return importlib.metadata.version("comfy-kitchen")
    except importlib.metadata.PackageNotFoundError:  # unpacked from .peers, not installed
        return next((p.name for p in peers.PEERS.glob("comfy_kitchen-*.whl")), "unpacked")


def providers(q, cos, sin, device: str, compiled: bool) -> dict:
    """name -> rotate(q, k) -> (q, k), or name -> the reason it cannot run here."""
    D = q.shape[-1]
    w = torch.nn.Parameter(1 + 0.1 * torch.randn(D, device=device, generator=torch.Generator(device).manual_seed(2)))
    norm = ops.QKNorm("rms", w.detach(), w.detach(), eps=1e-6)
    fused_backend = "triton" if device == "cuda" else "torch"
    fused = lambda q, k: ops.norm_apply_rope(q, k, cos, sin, norm, backend=fused_backend)
    out = {"copy": lambda q, k: (Copy.apply(q), Copy.apply(k)), f"ours fused ({fused_backend})": fused}
    if compiled and device == "cpu":
        out["ours fused, compiled (torch)"] = torch.compile(fused, fullgraph=True, dynamic=False)
    rms = lambda x: F.rms_norm(x, (D,), w.detach(), 1e-6)
    out[f"ours unfused (F.rms_norm + apply_rope {fused_backend})"] = lambda q, k: (
        ar.apply_rope(rms(q), cos, sin, backend=fused_backend), ar.apply_rope(rms(k), cos, sin, backend=fused_backend)
    )  # fmt: skip
    try:
        from diffusers.models.embeddings import apply_rotary_emb

        module = torch.nn.RMSNorm(D, eps=1e-6, device=device)
        with torch.no_grad():
            module.weight.copy_(w)
        module.requires_grad_(False)
        stock = lambda x: apply_rotary_emb(module(x), (cos, sin), sequence_dim=1)
        out["diffusers (nn.RMSNorm + apply_rotary_emb)"] = lambda q, k: (stock(q), stock(k))
    except ImportError as err:
        out["diffusers (nn.RMSNorm + apply_rotary_emb)"] = f"diffusers is not installed ({err})"
    ck = comfy_kitchen()
    names = ["eager"] if device == "cpu" else ["cuda", "triton"]
    for name in names:
        if isinstance(ck, str):
            out[f"comfy-kitchen {name}"] = ck
            continue
        if not ck.registry.is_available(name):
            out[f"comfy-kitchen {name}"] = f"its {name} backend is unavailable here"
            continue
        fc = freqs_cis(cos, sin)

        def peer(q, k, name=name, fc=fc):
            with ck.registry.use_backend(name):
                return ck.rms_rope(q, k, fc, w.detach(), w.detach(), 1e-6)

        out[f"comfy-kitchen {name}"] = peer
    return out


def _callable(rotate, q, k, mode: str):
    if mode == "forward":
        return lambda: rotate(q, k)
    qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    grads = [torch.randn_like(t) for t in (q, k)]
    return lambda: torch.autograd.grad(rotate(qg, kg), (qg, kg), grads)


def run(shape: dict, dtypes: list, modes: list, repeat: int, device: str, compiled: bool) -> list[dict]:
    """Median time of every (dtype, mode, provider), rounds interleaved; one row each (or its skip reason)."""
    rope = ar.AxialRoPE(shape["axes_dim"])
    pos = ar.grid(*shape["grid"])
    cos, sin = (t.to(device) for t in rope.cos_sin(pos))  # float32 [S, D], interleaved: Flux's tables
    S, D = pos.shape[0], rope.rot_dim
    gen = torch.Generator(device).manual_seed(0)
    cases, rows, sequence, once = [], [], [], call_timer(device)
    for dtype in dtypes:
        q = torch.randn(shape["batch"], S, shape["heads"], D, device=device, generator=gen).to(dtype)
        k = torch.randn(shape["batch"], S, shape["heads"], D, device=device, generator=gen).to(dtype)
        for mode in modes:
            for name, rotate in providers(q, cos, sin, device, compiled).items():
                row = {"shape": f"Flux-dev attention B{shape['batch']} S{S} H{shape['heads']} D{D}",
                       "dtype": str(dtype).removeprefix("torch."), "mode": mode, "provider": name}  # fmt: skip
                sequence.append((row["dtype"], mode, name))
                if isinstance(rotate, str):
                    rows.append({**row, "skipped": rotate})
                    continue
                try:
                    fn = _callable(rotate, q, k, mode)
                    fn()  # warm-up (and the compile)
                except Exception as err:  # a peer that cannot take this case: say why, keep the run
                    why = "no backward (no autograd formula registered)" if "no autograd formula" in str(err) else (
                        f"{type(err).__name__}: {str(err)[:120]}")  # fmt: skip
                    rows.append({**row, "skipped": why})
                    continue
                cases.append((row, fn, 2 * (q.numel() + k.numel()) * q.element_size() * (1 if mode == "forward" else 2)))
    times = [[] for _ in cases]
    for _ in range(repeat):  # interleaved: every case once per round
        for i, (_, fn, _) in enumerate(cases):
            times[i].append(once(fn))
    peak = next((v for n, v in PEAK_GBPS.items() if n in torch.cuda.get_device_name()), None) if device == "cuda" else None
    medians = {}
    for (row, _, moved), ts in zip(cases, times):
        seconds = statistics.median(ts)
        medians[(row["dtype"], row["mode"], row["provider"])] = ts
        row.update(median_ms=seconds * 1e3, gbps=moved / seconds / 1e9)
        if peak:
            row["pct_peak_hbm"] = 100 * row["gbps"] / peak
        rows.append(row)
    rows.sort(key=lambda r: sequence.index((r["dtype"], r["mode"], r["provider"])))  # as generated
    for row in rows:  # ratios within each round, then their median
        if "median_ms" not in row:
            continue
        for ref, key in (("copy", "x_copy"), ("diffusers (nn.RMSNorm + apply_rotary_emb)", "x_diffusers")):
            base = medians.get((row["dtype"], row["mode"], ref))
            if base:
                ts = medians[(row["dtype"], row["mode"], row["provider"])]
                row[key] = statistics.median(t / b for t, b in zip(ts, base))
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a table; a GPU's adds the HBM roofline column (% of peak)."""
    gpu = any("pct_peak_hbm" in r for r in rows)
    head = "| dtype | mode | provider | median ms | GB/s | x copy | x diffusers |" + (" % peak HBM |" if gpu else "")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r["dtype"], r["mode"], r["provider"]]
        if "skipped" in r:
            cells += [f"skipped: {r['skipped']}", "", "", ""]
        else:
            ratio = lambda key, r=r: f"{r[key]:.2f}" if key in r else ""
            cells += [f"{r['median_ms']:.2f}", f"{r['gbps']:.2f}", ratio("x_copy"), ratio("x_diffusers")]
        if gpu:
            cells.append(f"{r['pct_peak_hbm']:.0f}%" if "pct_peak_hbm" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(result: dict, source: str) -> str:
    """The benchmarks page's section for one result file of this benchmark (``docs/bench/norm_tables/*.json``)."""
    info = result["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("date", "device", "torch_threads", "dtype"))
    shape = next(r["shape"] for r in result["rows"])
    return "\n".join([
        f"## QK-norm + RoPE from tables: {info['device']}",
        "",
        "`python -m scripts.bench --norm-tables` (`scripts/bench_norm_tables.py`): the diffusers processors' step,",
        "per-head RMSNorm of q and k then the rotation by Flux's interleaved tables, at Flux-dev's attention shape",
        f"({shape}, `[B, S, H, D]`). *ours fused*: `ops.norm_apply_rope` (one Triton launch each way on a GPU;",
        "the torch backend on CPU, which normalises with torch's fused norm in float32 and rotates that tensor in",
        "place); *compiled*: the same under `torch.compile` (inductor fuses it); *ours unfused*: `F.rms_norm` then",
        "`apply_rope`; *diffusers*: `nn.RMSNorm` then `apply_rotary_emb`, the stock processors' step;",
        "*comfy-kitchen*: its `rms_rope` (forward only: no backward registered), which rounds the normalised q and",
        "k to their dtype before the rotation. Rounds interleaved (every case once per round), medians; *x copy*",
        "and *x diffusers*: the medians of the per-round ratios to `q.clone(), k.clone()` and to diffusers in the",
        "same dtype and mode. GB/s: one read and one write of q and k (twice for forward+backward).",
        f"{info['torch_threads']} torch threads, {result['repeat']} rounds, {info['date']}; {versions}. Rows:",
        f"`{source}`. On a shared CPU absolute times move by a factor of 2 or more between runs: read the ratios.",
        "",
        markdown(result["rows"]),
    ])


def check_peer() -> dict:
    """Under the Triton interpreter (set before this process imported triton): comfy-kitchen's Triton rms_rope
    and ours on a tiny float32 shape, max error against the float64 reference of the same step."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through --check-peer (a subprocess sets TRITON_INTERPRET=1)"
    ops.preload(triton=True)
    rope = ar.AxialRoPE((4, 6, 6))
    cos, sin = rope.cos_sin(ar.grid(1, 2, 3))
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 6, 2, 16, generator=gen), torch.randn(1, 6, 2, 16, generator=gen)
    w = 1 + 0.1 * torch.randn(16, generator=gen)
    norm = ops.QKNorm("rms", w, w)
    ref = ops.norm_apply_rope(q.double(), k.double(), cos, sin, norm._replace(q_weight=w.double(), k_weight=w.double()),
                              backend="reference")  # fmt: skip
    result = {"ours triton": ops.norm_apply_rope(q, k, cos, sin, norm, backend="triton")}
    ck = comfy_kitchen()
    if isinstance(ck, str):
        result = {**result, "comfy-kitchen triton": ck}
    else:
        kernel = importlib.import_module("comfy_kitchen.backends.triton.rms_rope")  # its module, called directly
        result["comfy-kitchen triton"] = kernel.rms_rope(q, k, freqs_cis(cos, sin), w, w, 1e-6)
    return {name: out if isinstance(out, str) else max(float((o.double() - r).abs().max()) for o, r in zip(out, ref))
            for name, out in result.items()}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = cli.Parser(prog="scripts.bench --norm-tables", description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small shape (a CPU smoke run)")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma list of torch dtypes")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {list(MODES)}")
    parser.add_argument("--repeat", type=cli.positive_int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=cli.positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled provider (CPU)")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--check-peer", action="store_true", help="the interpreter correctness check (subprocess)")
    parser.add_argument("--check-peer-here", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check_peer_here:
        print(json.dumps(check_peer()))
        return
    if args.check_peer:
        env = dict(os.environ, TRITON_INTERPRET="1")
        cmd = [sys.executable, "-m", "scripts.bench_norm_tables", "--check-peer-here"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        print(done.stdout.strip() or done.stderr[-3000:])
        sys.exit(done.returncode)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    modes = cli.choices(parser, "--modes", args.modes, MODES)
    rows = run(SMALL if args.small else FLUX_DEV, dtypes, modes, args.repeat, device, not args.no_compile)
    print(markdown(rows))
    if args.json:
        ck = comfy_kitchen()
        found = {} if isinstance(ck, str) else {"comfy_kitchen": _version(ck)}
        info = machine(device, args.dtypes, torch.get_num_threads(), found)
        with open(args.json, "w") as f:
            json.dump({"machine": info, "repeat": args.repeat, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
