"""Time, peak memory and bytes sent per rank for one sharded attention layer, at growing lengths.

Run under torchrun (gloo on CPU), one process per rank, each with one thread::

    MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone \\
        --nproc_per_node 2 -m scripts.bench_parallel --method ring --frames 1 2 4 8

``--nproc_per_node 1 --method none`` is the unsharded baseline (one SDPA call). The layer is
``Attention(dim=H * D, H, AxialRoPE((8, 12, 12)), qk_norm="rms")`` over a video of ``frames``
frames of 32 x 32 tokens (``S = 1024 * frames``), batch 1, forward and backward.

Peak memory is the rise of the process' resident set (``VmHWM`` after resetting it through
``/proc/self/clear_refs``) over one forward and backward, with glibc's mmap threshold fixed
so that freed tensors leave the resident set: Linux only, and approximate (it counts every
allocation, the layer's weights' gradients included). CPU timings are a sanity check.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import torch
import torch.distributed as dist

import axial_rope as ar
from axial_rope.attention import Attention
from axial_rope.parallel import ContextParallel, communication_bytes, reset_sent_bytes, sent_bytes


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _peak_rise_mb(step) -> float:
    """MB the resident set rises to while ``step()`` runs (Linux ``clear_refs`` resets the peak)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kb("VmRSS")
    step()
    return (_status_kb("VmHWM") - base) / 1024


def _measure(args, frames: int, cp: ContextParallel | None) -> dict:
    """One length: median seconds, peak MB and bytes sent for one forward and backward on this rank."""
    torch.manual_seed(0)  # the same layer on every rank
    heads, dim = args.heads, args.heads * args.head_dim
    attn = Attention(dim, heads, ar.AxialRoPE((8, 12, 12), theta=256.0), qk_norm="rms", causal=args.causal)
    pos = ar.grid(frames, 32, 32)  # [S, 3] global coordinates: 12 bytes a token, the rotation is per shard
    S = pos.shape[0]
    cp = cp.for_length(S) if cp is not None else None
    local_pos = cp.positions(pos) if cp is not None else pos
    torch.manual_seed(1 + (cp.rank if cp is not None else 0))
    x = torch.randn(1, local_pos.shape[0], dim, requires_grad=True)  # this rank's tokens only

    def step():
        attn(x, local_pos, context_parallel=cp).square().mean().backward()

    step()  # warm-up
    times = []
    for _ in range(args.repeats):
        if cp is not None:
            dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    reset_sent_bytes()
    peak = _peak_rise_mb(step)
    sent = sent_bytes()
    world = cp.world if cp is not None else 1
    method = cp.method if cp is not None else "ring"
    layout = cp.layout if cp is not None else "contiguous"
    expected = communication_bytes(
        method, batch=1, seq_len=S, heads=heads, kv_heads=heads, head_dim=args.head_dim, world=world,
        layout=layout, backward=True,
    )  # fmt: skip
    return {"S": S, "seconds": statistics.median(times), "peak_mb": peak, "sent": sent, "formula": expected}


def _report(args, rows: list[list[dict]], world: int) -> None:
    """Rank 0 prints one markdown row per length: fastest and slowest rank's time, largest peak, bytes per rank."""
    print(
        "| method | P | S | s / step (fastest, slowest rank) | peak MB (largest rank) | MB sent per rank | formula MB |"
    )
    print("|---|---|---|---|---|---|---|")
    for per_rank in rows:
        S = per_rank[0]["S"]
        seconds = [r["seconds"] for r in per_rank]
        peak = max(r["peak_mb"] for r in per_rank)
        sent = max(r["sent"] for r in per_rank) / 2**20
        formula = per_rank[0]["formula"] / 2**20
        method = f"{args.method} {args.layout}{' causal' if args.causal else ''}" if world > 1 else "none"
        times = f"{min(seconds):.3f}, {max(seconds):.3f}" if world > 1 else f"{seconds[0]:.3f}"
        print(f"| {method} | {world} | {S} | {times} | {peak:.0f} | {sent:.2f} | {formula:.2f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=("ring", "ulysses", "none"), default="ring")
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sharded = args.method != "none"
    if sharded:
        dist.init_process_group("gloo")
    cp = ContextParallel(None, args.method, args.layout) if sharded else None
    rows = []
    for frames in args.frames:
        mine = _measure(args, frames, cp)
        everyone = [None] * (cp.world if sharded else 1)
        if sharded:
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        rows.append(everyone)
    if not sharded or dist.get_rank() == 0:
        _report(args, rows, cp.world if sharded else 1)
    if sharded:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
