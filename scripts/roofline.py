"""A roofline and wave model of the Triton kernels, from their compiled code: ``python -m scripts.roofline``.

For every benchmark shape and kernel it plans the launch (``scripts/kernel_static.py``),
reads the sm_90 SASS (registers, instructions, shared memory) and predicts the time on an
H100 SXM and an H200:

- bytes: what the kernel must move (reads and writes of q and k, their outputs, gradients);
- occupancy: programs per SM, from registers (allocated per warp in units of 256), warps
  (64 per SM), shared memory and the 32-block limit; waves = programs / (SMs x occupancy);
- loads in flight: a tile is loaded by one ``tl.load``, so each thread has all its 16-byte
  loads issued at once; bytes in flight per SM = occupancy x threads x loads x 16;
- instruction issue: the SASS instructions on a thread's longest path, 4 warp-instructions
  per SM and cycle;
- time = max(bytes / (peak x DRAM efficiency), instruction issue, Little's law: bytes read /
  (bytes in flight x SMs / latency)) + half a program's lifetime (the tail) + the launch.

The constants below are assumptions to be replaced by the first GPU run's measurements
(its copy ceiling gives the DRAM efficiency).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from .kernel_static import bench_launches, facts_of, path_instructions, tile_of


@dataclass(frozen=True)
class Gpu:
    name: str
    sms: int
    peak_gbps: float  # HBM, GB/s
    clock_ghz: float  # sustained SM clock under a memory-bound load


GPUS = {"H100": Gpu("H100 SXM", 132, 3350, 1.755), "H200": Gpu("H200", 132, 4800, 1.755)}
DRAM_EFFICIENCY = 0.92  # a device copy reaches about this fraction of the HBM peak (checked by gpu_check.sh)
LATENCY_US = 0.8  # DRAM latency under load
LAUNCH_US = 2.0  # kernel launch and first-wave ramp
# bytes moved per element of q and k, in units of their size: reads + writes
PASSES = {"rope": 2, "rope_inplace": 2, "rope_table": 2, "norm_rope": 2, "norm_rope_bwd": 3, "freqs_grad": 2}


def occupancy(registers: int, warps: int, shared: int) -> int:
    """Resident programs per SM on sm_90: registers, warps, shared memory and the block limit."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    limits = [64 // warps, 65536 // (per_warp * warps), 32]
    if shared:
        limits.append(228 * 1024 // shared)
    return max(0, min(limits))


def predict(launch, facts, gpu: Gpu, kernel: str) -> dict:
    """Predicted time and fraction of the HBM peak of one launch (see the module docstring)."""
    tile = tile_of(launch)
    q, k = launch.args[0], launch.args[1]
    data = sum(t.numel() * t.element_size() for t in (q, k) if t is not None)
    moved = PASSES[kernel] * data
    occ = occupancy(facts.registers, tile["warps"], facts.shared_bytes)
    slots = gpu.sms * occ
    waves = tile["programs"] / slots
    threads = 32 * tile["warps"]
    in_flight = occ * threads * tile["loads_in_flight"] * 16 * (2 if kernel in ("norm_rope_bwd", "freqs_grad") else 1)
    instr = path_instructions(facts.sass)
    t_mem = moved / (gpu.peak_gbps * 1e3 * DRAM_EFFICIENCY)  # µs
    t_issue = tile["programs"] * tile["warps"] * instr / (gpu.sms * 4 * gpu.clock_ghz * 1e3)
    reads = moved - data if kernel != "freqs_grad" else moved
    t_latency = reads / (gpu.sms * in_flight / LATENCY_US)
    lifetime = LATENCY_US + instr * tile["warps"] * occ / (4 * gpu.clock_ghz * 1e3)
    body = max(t_mem, t_issue, t_latency)
    bound = ("memory", "issue", "latency")[[t_mem, t_issue, t_latency].index(body)]
    total = body + (lifetime if waves < 1 else lifetime / 2) + LAUNCH_US
    return dict(
        mb=moved / 1e6, programs=tile["programs"], tile=f"{tile['heads']}x{tile['block_s']}x{tile['warps']}",
        registers=facts.registers, per_sm=occ, waves=waves, loads=tile["loads_in_flight"],
        kb_in_flight=in_flight / 1024, instructions=instr, bound=bound, us=total,
        pct_peak=100 * moved / (total * gpu.peak_gbps * 1e3),
    )  # fmt: skip


ROWS = {"video": "720p video latent", "llm": "LLM 32k GQA", "dit": "DiT-XL/2 256px"}
HEADER = (
    "| shape | kernel | MB moved | programs | tile (heads x tokens x warps) | regs | programs/SM | waves "
    "| 16-B loads in flight per thread | KiB in flight per SM | bound | H100 µs | H100 % peak | H200 µs | H200 % peak |\n"
    + "|---" * 15
    + "|"
)


def table(kernels=("rope", "norm_rope", "norm_rope_bwd")) -> tuple[str, dict]:
    """The markdown table of predictions, and {(shape, kernel, gpu): prediction}."""
    lines, out = [HEADER], {}
    for key, name in ROWS.items():
        launches = bench_launches(key)
        for kernel in kernels:
            facts = facts_of(launches[kernel])
            h100, h200 = (predict(launches[kernel], facts, GPUS[g], kernel) for g in ("H100", "H200"))
            out[key, kernel, "H100"], out[key, kernel, "H200"] = h100, h200
            lines.append(
                f"| {name} | {kernel} | {h100['mb']:.0f} | {h100['programs']} | {h100['tile']} | {h100['registers']} "
                f"| {h100['per_sm']} | {h100['waves']:.1f} | {h100['loads']:.2f} | {h100['kb_in_flight']:.0f} "
                f"| {h200['bound']} | {h100['us']:.1f} | {h100['pct_peak']:.0f}% | {h200['us']:.1f} | {h200['pct_peak']:.0f}% |"
            )
    return "\n".join(lines), out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="rope,norm_rope,norm_rope_bwd")
    args = parser.parse_args(argv)
    print(table(tuple(args.kernels.split(",")))[0])


if __name__ == "__main__":
    main()
