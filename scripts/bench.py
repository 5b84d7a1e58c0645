"""Benchmark RoPE providers against a plain copy of q and k: ``python -m scripts.bench [--small] [--out docs]``.

Providers: axial_rope (triton, torch from tables, torch from positions, reference),
diffusers ``apply_rotary_emb``, transformers ``apply_rotary_pos_emb``, timm
``apply_rot_embed_cat``, flash-attn's and Liger's Triton rotary when importable, and
``copy`` (``q.clone(), k.clone()``, backward too: the floor, one read and one write). Modes: forward,
backward, forward+backward, and QK-RMSNorm+RoPE fused against RMSNorm then RoPE.

Writes ``<out>/bench/<device>[-small].json`` and ``<out>/img/bench_<device>[-small].png``,
then regenerates ``<out>/benchmarks.md`` from every JSON found there.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import axial_rope as ar
from axial_rope.ops.common import rms_norm

# peak HBM bandwidth in GB/s, matched against torch.cuda.get_device_name()
PEAK_GBPS = {
    "H200": 4800,
    "H100 NVL": 3900,
    "H100 PCIe": 2000,
    "H100": 3350,  # SXM, "NVIDIA H100 80GB HBM3"
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100": 1555,
}


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    grid: tuple[int, ...]  # position grid, S = prod(grid)
    heads: int
    kv_heads: int
    axes_dim: tuple[int, ...]  # sum = head_dim
    pairing: str

    @property
    def head_dim(self) -> int:
        return sum(self.axes_dim)


SHAPES = {
    "dit": Shape("DiT-XL/2 256px", 8, (16, 16), 16, 16, (36, 36), "interleaved"),
    "video": Shape("720p video latent", 1, (13, 30, 45), 24, 24, (16, 56, 56), "interleaved"),
    "llm": Shape("LLM 32k GQA", 1, (32768,), 32, 8, (128,), "half"),
}
SMALL = {
    "dit": Shape("DiT-XL/2 (small)", 2, (8, 8), 16, 16, (36, 36), "interleaved"),
    "video": Shape("video latent (small)", 1, (4, 15, 15), 8, 8, (16, 56, 56), "interleaved"),
    "llm": Shape("LLM GQA (small)", 1, (2048,), 8, 2, (128,), "half"),
}
MODES = ("forward", "backward", "forward+backward", "qknorm+rope fwd+bwd")
HEADER = "| shape | mode | provider | median ms | GB/s | x copy | % peak HBM | peak MiB (x io) |\n|" + "---|" * 8


# -- timing ------------------------------------------------------------------------------------


def median_time(fn, *, repeat: int, flush: torch.Tensor | None = None) -> float:
    """Median wall time of ``fn()`` in seconds, after one warm-up call.

    CUDA (``flush`` given): CUDA events, the L2 cache overwritten before each run. CPU:
    each sample loops enough calls to last about 5 ms, so timer noise does not dominate.
    """
    t0 = time.perf_counter()
    fn()
    inner = 1 if flush is not None else max(1, int(5e-3 / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(repeat):
        if flush is not None:
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def peak_memory(fn) -> float | None:
    """Peak CUDA memory allocated by ``fn()`` above what was allocated before, in bytes."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def timed_modes(rotate, q, k, mode: str):
    """The callable to time for ``mode``: forward, backward only (graph kept), or both."""
    if mode == "forward":
        return lambda: rotate(q, k)
    qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    outs = rotate(qg, kg)
    grads = [torch.randn_like(o) for o in outs]
    if mode == "backward":
        return lambda: torch.autograd.grad(outs, (qg, kg), grads, retain_graph=True)
    return lambda: torch.autograd.grad(rotate(qg, kg), (qg, kg), grads)


class Copy(torch.autograd.Function):
    """The floor: one read and one write of x, forward and backward (clone's own backward copies nothing)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


# -- providers: (q, k) -> (q_out, k_out), with tables built outside the timed call -----------------


def providers(shape: Shape, rope: ar.AxialRoPE, pos: torch.Tensor, device: str, mode: str) -> dict:
    """name -> rotate(q, k) for every provider that can run here; name -> reason string otherwise."""
    cos, sin = rope.cos_sin(pos)  # float32 [S, D], the pairing's channel layout
    out = {"copy": lambda q, k: (Copy.apply(q), Copy.apply(k))}
    backends = ["triton", "torch"] if device == "cuda" else ["torch"]
    if mode == "forward":  # in place: no output allocated (inference; with autograd it is a copy back)
        for backend in backends:
            out[f"axial_rope {backend} (in place)"] = lambda q, k, b=backend: rope(
                q, k, pos, "bhsd", backend=b, inplace=True
            )
    if device == "cuda":
        out["axial_rope triton"] = lambda q, k: rope(q, k, pos, "bhsd", backend="triton")
    out["axial_rope torch (tables)"] = lambda q, k: (
        ar.apply_rope(q, cos, sin, rope.pairing, "bhsd", backend="torch"),
        ar.apply_rope(k, cos, sin, rope.pairing, "bhsd", backend="torch"),
    )
    out["axial_rope torch (positions)"] = lambda q, k: rope(q, k, pos, "bhsd", backend="torch")
    if pos.shape[0] * shape.heads * shape.head_dim * shape.batch <= 2**22:  # complex128: small shapes only
        out["axial_rope reference"] = lambda q, k: rope(q, k, pos, "bhsd", backend="reference")
    if shape.pairing == "interleaved":
        out.update(_interleaved_peers(cos, sin))
    else:
        out.update(_half_peers(cos, sin, shape, device))
    return out


def _optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        return f"not importable ({type(err).__name__})"


def _interleaved_peers(cos, sin) -> dict:
    out = {}
    fn = _optional("diffusers.models.embeddings", "apply_rotary_emb")
    out["diffusers apply_rotary_emb"] = (
        fn if isinstance(fn, str) else lambda q, k, fn=fn: (fn(q, (cos, sin)), fn(k, (cos, sin)))
    )
    fn = _optional("timm.layers.pos_embed_sincos", "apply_rot_embed_cat")
    emb = torch.cat([sin, cos], -1)  # timm's order: sin first
    out["timm apply_rot_embed_cat"] = fn if isinstance(fn, str) else lambda q, k, fn=fn: (fn(q, emb), fn(k, emb))
    return out


def _half_peers(cos, sin, shape: Shape, device: str) -> dict:
    out = {}
    fn = _optional("transformers.models.llama.modeling_llama", "apply_rotary_pos_emb")
    out["transformers apply_rotary_pos_emb"] = (
        fn if isinstance(fn, str) else lambda q, k, fn=fn: fn(q, k, cos[None], sin[None])
    )
    n = shape.head_dim // 2
    half_cos, half_sin = cos[:, :n].contiguous(), sin[:, :n].contiguous()
    fn = _optional("flash_attn.layers.rotary", "apply_rotary_emb")  # [B, S, H, D], half tables
    if isinstance(fn, str) or device != "cuda":
        out["flash-attn rotary"] = fn if isinstance(fn, str) else "needs CUDA"
    else:
        out["flash-attn rotary"] = lambda q, k, fn=fn: (
            fn(q.transpose(1, 2), half_cos, half_sin),
            fn(k.transpose(1, 2), half_cos, half_sin),
        )
    fn = _optional("liger_kernel.ops.rope", "LigerRopeFunction")  # [B, H, S, D], full tables [1, S, D]
    if isinstance(fn, str) or device != "cuda":
        out["liger rope"] = fn if isinstance(fn, str) else "needs CUDA"
    else:
        out["liger rope"] = lambda q, k, fn=fn: fn.apply(q, k, cos[None], sin[None])
    return out


def norm_providers(rope: ar.AxialRoPE, pos: torch.Tensor, device: str, head_dim: int) -> dict:
    """Fused QK-RMSNorm+RoPE against RMSNorm then RoPE (weights [D])."""
    w = torch.ones(head_dim, device=device)
    backend = "triton" if device == "cuda" else "torch"
    unfused = lambda q, k: rope(rms_norm(q, w, 1e-6).to(q.dtype), rms_norm(k, w, 1e-6).to(k.dtype), pos, "bhsd")
    return {
        f"axial_rope norm_and_rotate ({backend})": lambda q, k: rope.norm_and_rotate(
            q, k, pos, w, w, "bhsd", backend=backend
        ),
        "RMSNorm then RoPE": unfused,
    }


# -- one run ------------------------------------------------------------------------------------


def run_shape(shape: Shape, modes: list[str], names: list[str] | None, dtype, device: str, repeat: int) -> list[dict]:
    """Time every provider in every mode on one shape (tensors in ``bhsd``); returns one row per case."""
    rope = ar.AxialRoPE(shape.axes_dim, pairing=shape.pairing).to(device)
    pos = ar.grid(*shape.grid).to(device)
    q = torch.randn(shape.batch, shape.heads, pos.shape[0], shape.head_dim, device=device, dtype=dtype)
    k = torch.randn(shape.batch, shape.kv_heads, pos.shape[0], shape.head_dim, device=device, dtype=dtype)
    io_bytes = 2 * (q.numel() + k.numel()) * q.element_size()  # one read + one write of q and k
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if device == "cuda" else None
    peak = _peak_gbps() if device == "cuda" else None
    rows = []
    for mode in modes:
        table = providers(shape, rope, pos, device, mode)
        if mode.startswith("qknorm"):
            table = {"copy": table["copy"], **norm_providers(rope, pos, device, shape.head_dim)}
        timed_mode = "forward+backward" if mode.startswith("qknorm") else mode
        copy_seconds = None
        for name, rotate in table.items():
            if names and name != "copy" and not any(n in name for n in names):
                continue
            row = {"shape": shape.name, "mode": mode, "provider": name, "pairing": shape.pairing}
            if isinstance(rotate, str):
                rows.append({**row, "skipped": rotate})
                continue
            seconds = median_time(timed_modes(rotate, q, k, timed_mode), repeat=repeat, flush=flush)
            copy_seconds = copy_seconds or seconds  # copy is the first provider of every mode
            moved = io_bytes * (2 if timed_mode == "forward+backward" else 1)
            row.update(median_ms=seconds * 1e3, gbps=moved / seconds / 1e9, x_copy=seconds / copy_seconds)
            if peak:
                row["pct_peak_hbm"] = 100 * row["gbps"] / peak
            if device == "cuda":  # forward+backward peak against inputs + outputs (+ grads)
                used = peak_memory(timed_modes(rotate, q, k, "forward+backward"))
                row["peak_mib"], row["peak_x_io"] = used / 2**20, used / (2 * io_bytes)
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def _peak_gbps() -> float | None:
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_GBPS.items() if k in name), None)


def format_row(row: dict) -> str:
    if "skipped" in row:
        return f"| {row['shape']} | {row['mode']} | {row['provider']} | skipped: {row['skipped']} | | | |"
    pct = f"{row['pct_peak_hbm']:.0f}%" if "pct_peak_hbm" in row else ""
    mem = f"{row['peak_mib']:.0f} ({row['peak_x_io']:.2f}x)" if "peak_mib" in row else ""
    return (
        f"| {row['shape']} | {row['mode']} | {row['provider']} | {row['median_ms']:.3f} | {row['gbps']:.2f} "
        f"| {row['x_copy']:.2f} | {pct} | {mem} |"
    )


def machine(device: str, dtype, threads: int) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name() if device == "cuda" else _cpu_name(),
        "torch_threads": threads,
        "dtype": str(dtype).removeprefix("torch."),
        "python": platform.python_version(),
    }
    for module in ("torch", "triton", "diffusers", "transformers", "timm", "flash_attn", "liger_kernel"):
        try:
            info[module] = importlib.import_module(module).__version__
        except (ImportError, AttributeError):
            pass
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} CPU"
    except OSError:
        pass
    return platform.processor() or "CPU"


# -- report ---------------------------------------------------------------------------------------


def write_chart(result: dict, path: Path) -> None:
    """Bar chart of forward GB/s per shape and provider (copy = the floor)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["mode"] == "forward" and "gbps" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    names = list(dict.fromkeys(r["provider"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        values = [next((r["gbps"] for r in rows if r["shape"] == s and r["provider"] == name), 0) for s in shapes]
        ax.bar([j + i * width for j in range(len(shapes))], values, width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes)
    ax.set_yscale("log")  # copy and the slowest provider are orders of magnitude apart on CPU
    ax.set_ylabel("GB/s (read + write of q and k), log scale")
    info = result["machine"]
    ax.set_title(f"RoPE forward, {info['dtype']}, {info['device']}", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(out: Path) -> None:
    """docs/benchmarks.md from every result file in ``out/bench``."""
    lines = [
        "# Benchmarks",
        "",
        "Written by `python -m scripts.bench` (see [Kernels](kernels.md)). Every provider rotates the same",
        "q and k (`bhsd`); tables are built outside the timed call, except for *torch (positions)* and",
        "*triton*, which start from positions. GB/s counts one read and one write of q and k (twice",
        "that for forward+backward); *x copy* is the time over `q.clone(), k.clone()` (a copy in backward",
        "too) in the same run, in the same mode.",
        "",
    ]
    for path in sorted((out / "bench").glob("*.json")):
        result = json.loads(path.read_text())
        info = result["machine"]
        versions = ", ".join(
            f"{k} {v}" for k, v in info.items() if k not in ("date", "device", "torch_threads", "dtype")
        )
        lines += [
            f"## {path.stem}",
            "",
            f"{info['device']}, {info['torch_threads']} torch threads, {info['dtype']}, median of "
            f"{result['repeat']} runs, {info['date']}. Versions: {versions}.",
            "",
            HEADER,
            *(format_row(r) for r in result["rows"]),
            "",
            f"![forward GB/s, {path.stem}](img/bench_{path.stem}.png)",
            "",
        ]
    (out / "benchmarks.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small shapes that finish on a 2-core CPU in a minute")
    parser.add_argument("--out", default="docs", help="docs folder to write into")
    parser.add_argument("--shapes", default="dit,video,llm", help=f"comma list of {list(SHAPES)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {list(MODES)}")
    parser.add_argument("--providers", default="", help="comma list of substrings (default: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per case (default 5 CPU, 50 GPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--tag", default=None, help="result file name (default: device[-small])")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    repeat = args.repeat or (50 if device == "cuda" else 5)
    shapes = SMALL if args.small else SHAPES
    names = [n for n in args.providers.split(",") if n]
    print(HEADER)
    rows = []
    for key in args.shapes.split(","):
        rows += run_shape(shapes[key], args.modes.split(","), names, dtype, device, repeat)
    tag = args.tag or (device + ("-small" if args.small else ""))
    out = Path(args.out)
    (out / "bench").mkdir(parents=True, exist_ok=True)
    result = {"machine": machine(device, dtype, torch.get_num_threads()), "repeat": repeat, "rows": rows}
    result["shapes"] = {s.name: asdict(s) for s in shapes.values()}
    (out / "bench" / f"{tag}.json").write_text(json.dumps(result, indent=1))
    write_chart(result, out / "img" / f"bench_{tag}.png")
    write_markdown(out)
    print(f"wrote {out / 'bench' / f'{tag}.json'}, {out / 'img' / f'bench_{tag}.png'}, {out / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
