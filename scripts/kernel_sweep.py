"""Kernel-only sweep of the Triton tiles on a GPU, against a copy ceiling: ``python -m scripts.kernel_sweep --out DIR``.

For each benchmark shape (bf16, ``bhsd``) and kernel (``rope``, ``norm_rope``,
``norm_rope_bwd``), every tile of a small grid (heads per program x elements per thread x
warps, which fix the tokens per program and so the number of programs) is launched alone:
the launch plan of ``axial_rope/ops/_triton_launch.py`` with the tile forced, timed with
CUDA events, the L2 overwritten before each run. The kernels have no loop (a tile's loads
are all issued at once), so there are no pipeline stages to tune. Per tile: programs, µs,
GB/s, % of the HBM peak and of the copy ceiling measured in the same run (a device copy of
1 GiB, and of the shape's q and k), registers and spills of the compiled kernel; ``policy``
marks the tile the launcher picks on its own. Each shape's tiles are compiled first in
parallel worker processes (Triton's cache then serves the timed launches), and the files
are written after every shape, so a run stopped at its time limit keeps what it measured.

Writes ``DIR/sweep.json`` and ``DIR/sweep.md``. ``--dry-run`` (no GPU needed): compiles the
same tiles for sm_90 and records registers, spills and barriers only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import torch

from axial_rope.ops._triton_launch import Tile

KERNELS = ("rope", "norm_rope", "norm_rope_bwd")
SHAPES = ("video", "llm", "dit")
# per kernel: (elements per thread, heads per program, warps) to try; the tokens follow
GRID = {
    "rope": [(e, h, w) for e in (16, 32, 64) for h in (1, 2, 4, 8) for w in (4, 8)],
    "norm_rope": [(e, h, 4) for e in (16, 32) for h in (1, 2, 4)],
    "norm_rope_bwd": [(e, h, 4) for e in (8, 16, 32) for h in (1, 2, 4)],
}
PASSES = {"rope": 2, "norm_rope": 2, "norm_rope_bwd": 3}  # bytes moved in units of q and k


def tiles(key: str, kernel: str) -> list[Tile]:
    """The tiles of :data:`GRID` that fit the shape: heads dividing both head counts, tokens >= 1."""
    from .bench import SHAPES as BENCH
    from .kernel_static import bench_launches

    shape, meta = BENCH[key], bench_launches(key)[kernel].meta
    row = 2 * meta["BLOCK_N"] + (meta["BLOCK_R"] if meta.get("BLOCK_R", 1) > 1 else 0)
    out = []
    for per_thread, heads, warps in GRID[kernel]:
        if shape.heads % heads or shape.kv_heads % heads:
            continue
        block_s = per_thread * 32 * warps // (heads * row)
        if block_s >= 1 and Tile(block_s, heads, warps) not in out:
            out.append(Tile(block_s, heads, warps))
    return out


def _compile(jobs: list[tuple[str, str, Tile]], dry_run: bool) -> list[dict]:
    """Compile each (shape, kernel, tile): for the GPU (warmup: fills Triton's cache) or for sm_90 (its facts)."""
    from .kernel_static import bench_launches, facts_of

    out = []
    for key, kernel, tile in jobs:
        launch = bench_launches(key, tiles={kernel: tile})[kernel]
        if dry_run:
            f = facts_of(launch)
            out.append(dict(registers=f.registers, spills=f.spill_bytes, barriers=f.barriers, shared=f.shared_bytes))
        else:
            launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.meta)
            out.append({})
    return out


def compile_all(jobs: list, dry_run: bool, pool: concurrent.futures.Executor | None, workers: int) -> list[dict]:
    """:func:`_compile` over ``jobs``, split over ``workers`` processes of ``pool`` (None: here), in order."""
    if pool is None or workers <= 1:
        return _compile(jobs, dry_run)
    chunks = [jobs[i::workers] for i in range(workers)]
    merged = [None] * len(jobs)
    for i, result in enumerate(pool.map(_compile, chunks, [dry_run] * workers)):
        merged[i::workers] = result
    return merged


def workers_pool(workers: int) -> concurrent.futures.Executor | None:
    """Spawned compile workers (spawn: safe after CUDA is initialised here), or None for one worker."""
    if workers <= 1:
        return None
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def cuda_time(fn, flush: torch.Tensor, repeat: int) -> float:
    """Median seconds of ``fn()`` by CUDA events, the L2 overwritten before each run."""
    fn()
    times = []
    for _ in range(repeat):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_ceiling(flush: torch.Tensor, repeat: int) -> float:
    """GB/s of a device copy of 1 GiB (bytes read + written)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / cuda_time(lambda: dst.copy_(src), flush, repeat) / 1e9


def sweep(shapes, kernels, repeat: int, workers: int, limit: int | None, save) -> dict:
    """Time every tile of every shape and kernel; ``save(result)`` after each shape (a stopped run keeps it)."""
    from .bench import _peak_gbps
    from .kernel_static import bench_launches

    pool = workers_pool(workers)  # started before CUDA work here, its processes import while the copy runs
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    peak = _peak_gbps()
    result = {"device": torch.cuda.get_device_name(), "peak_gbps": peak, "compile_s": 0.0, "rows": []}
    result["copy_1gib_gbps"] = copy_ceiling(flush, repeat)
    for key in shapes:
        jobs = [(key, kernel, tile) for kernel in kernels for tile in tiles(key, kernel)[:limit]]
        started = time.perf_counter()
        compile_all(jobs, False, pool, workers)  # in parallel; the timed launches below then hit Triton's cache
        result["compile_s"] += time.perf_counter() - started
        default = bench_launches(key, device="cuda", n_sm=None)
        q, k = default["rope"].args[:2]
        pairs = [(q, torch.empty_like(q)), (k, torch.empty_like(k))]
        data = (q.numel() + k.numel()) * q.element_size()
        copy_s = cuda_time(lambda pairs=pairs: [dst.copy_(src) for src, dst in pairs], flush, repeat)
        result[f"copy_qk_gbps {key}"] = 2 * data / copy_s / 1e9
        for kernel in kernels:
            policy = default[kernel]
            for tile in [t for s, k_, t in jobs if (s, k_) == (key, kernel)]:
                launch = bench_launches(key, device="cuda", n_sm=None, tiles={kernel: tile})[kernel]
                compiled = launch.kernel[launch.grid](*launch.args, **launch.meta)
                seconds = cuda_time(launch, flush, repeat)
                gbps = PASSES[kernel] * data / seconds / 1e9
                result["rows"].append(dict(
                    shape=key, kernel=kernel, heads=tile.heads, block_s=tile.block_s, warps=tile.warps,
                    programs=launch.grid[0] * launch.grid[1] * launch.grid[2], us=seconds * 1e6, gbps=gbps,
                    pct_peak=100 * gbps / peak if peak else None, pct_copy=100 * gbps / result["copy_1gib_gbps"],
                    registers=compiled.n_regs, spills=compiled.n_spills,
                    policy=(tile.block_s, tile.heads, tile.warps) == (
                        policy.meta["BLOCK_S"], policy.meta["HEADS"], policy.meta["num_warps"]),
                ))  # fmt: skip
            del launch
        del default
        torch.cuda.empty_cache()
        save(result)
    if pool is not None:
        pool.shutdown()
    return result


def dry_run(shapes, kernels, workers: int, limit: int | None) -> dict:
    """The sweep's tiles compiled for sm_90 without a GPU: registers, spills, barriers."""
    jobs = [(key, kernel, tile) for key in shapes for kernel in kernels for tile in tiles(key, kernel)[:limit]]
    pool = workers_pool(workers)
    facts = compile_all(jobs, True, pool, workers)
    if pool is not None:
        pool.shutdown()
    rows = [
        dict(shape=s, kernel=k, heads=t.heads, block_s=t.block_s, warps=t.warps, **f)
        for (s, k, t), f in zip(jobs, facts)
    ]
    return {"device": "sm_90 (compiled only)", "rows": rows}  # fmt: skip


def markdown(result: dict) -> str:
    lines = [f"# Kernel sweep, {result['device']}", ""]
    for name, value in result.items():
        if name.startswith("copy"):
            lines.append(f"- {name}: {value:.0f} GB/s")
    lines += [
        "",
        "| shape | kernel | heads x tokens x warps | programs | regs | spills | µs | GB/s | % peak | % copy | |",
    ]
    lines.append("|" + "---|" * 11)
    rows = sorted(result["rows"], key=lambda r: (r["shape"], r["kernel"], r.get("us", 0)))
    for r in rows:
        if "us" in r:
            timing = f"{r['us']:.1f} | {r['gbps']:.0f} | {r['pct_peak'] or 0:.0f}% | {r['pct_copy']:.0f}%"
            note = "policy" if r["policy"] else ""
        else:  # dry run: compiled facts only
            timing, note = "| | |", f"{r['barriers']} barriers, {r['shared']} B shared"
        lines.append(
            f"| {r['shape']} | {r['kernel']} | {r['heads']}x{r['block_s']}x{r['warps']} | {r.get('programs', '')} "
            f"| {r['registers']} | {r['spills']} | {timing} | {note} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for sweep.json and sweep.md")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    parser.add_argument("--limit", type=int, default=None, help="tiles per shape and kernel (smoke tests)")
    parser.add_argument("--dry-run", action="store_true", help="compile for sm_90 only (no GPU)")
    args = parser.parse_args(argv)
    shapes, kernels = args.shapes.split(","), args.kernels.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(result: dict) -> None:
        (out / "sweep.json").write_text(json.dumps(result, indent=1))
        (out / "sweep.md").write_text(markdown(result))

    if args.dry_run:
        result = dry_run(shapes, kernels, args.workers, args.limit)
    else:
        result = sweep(shapes, kernels, args.repeat, args.workers, args.limit, save)
    save(result)
    print(markdown(result))


if __name__ == "__main__":
    main()
