"""The report of ``scripts/bench.py``: machine description, table rows, chart and ``benchmarks.md``."""

from __future__ import annotations

import datetime
import importlib
import json
import platform
import time
from pathlib import Path

import torch

HEADER = (
    "| shape | mode | provider | layout | median ms | GB/s | x copy | % peak HBM | peak MiB (x io) |\n|" + "---|" * 9
)


def format_row(row: dict) -> str:
    if "skipped" in row:
        return f"| {row['shape']} | {row['mode']} | {row['provider']} | | skipped: {row['skipped']} | | | | |"
    pct = f"{row['pct_peak_hbm']:.0f}%" if "pct_peak_hbm" in row else ""
    mem = f"{row['peak_mib']:.0f} ({row['peak_x_io']:.2f}x)" if "peak_mib" in row else ""
    return (
        f"| {row['shape']} | {row['mode']} | {row['provider']} | {row.get('layout', '')} | {row['median_ms']:.3f} "
        f"| {row['gbps']:.2f} | {row['x_copy']:.2f} | {pct} | {mem} |"
    )


def markdown_table(rows: list[dict], last: str | None = None) -> str:
    """Rows of one benchmark as a markdown table: one column per key of any row, in order of first appearance
    (``last`` moved last); a row without a key leaves its cell empty."""
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k != last] + (
        [last] if last is not None else []
    )
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def save_rows(path: str | Path | None, rows: list[dict], threads: int) -> None:
    """Print the rows' table and, with a ``path``, write them with the thread count and torch version."""
    print(markdown_table(rows))
    if path is not None:
        Path(path).write_text(json.dumps({"threads": threads, "torch": torch.__version__, "rows": rows}, indent=1))


def machine(device: str, dtype, threads: int, peers: dict[str, str]) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name() if device == "cuda" else _cpu_name(),
        "torch_threads": threads,
        "dtype": str(dtype).removeprefix("torch."),
        "python": platform.python_version(),
    }
    for module in ("torch", "triton", "diffusers", "transformers", "timm"):
        try:
            info[module] = importlib.import_module(module).__version__
        except (ImportError, AttributeError):
            pass
    info.update({f"{name} (carried)": version for name, version in peers.items()})
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} CPU"
    except OSError:
        pass
    return platform.processor() or "CPU"


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


INTRO = """\
# Benchmarks

Written by `python -m scripts.bench` (see [Kernels](kernels.md); on a GPU, `scripts/gpu_check.sh`
runs it with the tests and the kernel sweep). Every provider rotates the same q and k, each in its
own intended layout (*layout*: `bhsd` = `[B, H, S, D]`, `bshd` = `[B, S, H, D]`); tables are built
outside the timed call, except for *torch (positions)* and *triton*, which start from positions.
GB/s counts one read and one write of q and k (twice that for forward+backward); *x copy* is the
time over `q.clone(), k.clone()` (a copy in backward too) in the same run, in the same mode. The
unfused QK-norm baseline is the fastest RMSNorm found in the run (compiled, `F.rms_norm` or
Liger's) followed by the fastest RoPE (ours, Liger's or flash-attn's). Liger and flash-attn are
loaded from package files carried with the run (`scripts/peers.py`), never from this repository.
"""


NO_GPU = """\
## GPU

No GPU run is recorded yet: the GPU figures are blocked until `scripts/gpu_check.sh` runs on an
H100 or H200 (everything else is ready: kernels, static tests, sweep, this report). Until then,
the predicted bandwidth of each kernel is the roofline table of [Kernels](kernels.md).
"""


def write_markdown(out: Path) -> None:
    """``out/benchmarks.md`` from every result file in ``out/bench`` (a GPU-pending note when none is from a GPU)."""
    lines = [INTRO]
    results = {path.stem: json.loads(path.read_text()) for path in sorted((out / "bench").glob("*.json"))}
    results = {stem: r for stem, r in results.items() if "machine" in r}  # the others: rows other pages cite
    if not any("CPU" not in r["machine"]["device"] for r in results.values()):
        lines.append(NO_GPU)
    for stem, result in results.items():
        info = result["machine"]
        skip = ("date", "device", "torch_threads", "dtype")
        versions = ", ".join(f"{k} {v}" for k, v in info.items() if k not in skip)
        lines += [f"## {stem}", ""]
        lines += [
            f"{info['device']}, {info['torch_threads']} torch threads, {info['dtype']}, median of "
            f"{result['repeat']} runs, {info['date']}. Versions: {versions}.",
            "",
            HEADER,
            *(format_row(r) for r in result["rows"]),
            "",
            f"![forward GB/s, {stem}](img/bench_{stem}.png)",
            "",
        ]
    for path in sorted((out / "bench" / "norm_tables").glob("*.json")):  # scripts/bench_norm_tables.py
        from .bench_norm_tables import report

        lines += [report(json.loads(path.read_text()), path.relative_to(out).as_posix()), ""]
    for path in sorted((out / "bench" / "guard").glob("*.json")):  # scripts/bench_guard.py
        from .bench_guard import report as guard_report

        lines += [guard_report(json.loads(path.read_text()), path.relative_to(out).as_posix()), ""]
    (out / "benchmarks.md").write_text("\n".join(lines))


def call_timer(device: str):
    """``fn -> seconds`` of one call of ``fn`` (CUDA: events, the L2 cache flushed first by a 256 MiB write)."""
    if device != "cuda":
        return lambda fn: -time.perf_counter() + (fn(), time.perf_counter())[1]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)

    def once(fn):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    return once
