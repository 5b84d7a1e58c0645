"""Benchmark RoPE providers against a plain copy of q and k: ``python -m scripts.bench [--small] [--out docs]``.

Providers: axial_rope (triton, torch from tables, torch from positions, reference),
diffusers ``apply_rotary_emb``, transformers ``apply_rotary_pos_emb``, timm
``apply_rot_embed_cat``, flash-attn's and Liger's Triton rotary (loaded from the package
files carried in ``.peers``, see ``scripts/peers.py``), each in its own layout, and ``copy``
(``q.clone(), k.clone()``, backward too: the floor, one read and one write). Modes: forward,
backward, forward+backward, and QK-RMSNorm+RoPE fused against the fastest RMSNorm then the
fastest RoPE of the run.

Writes ``<out>/bench/<device>[-small].json`` and ``<out>/img/bench_<device>[-small].png``,
then regenerates ``<out>/benchmarks.md`` from every JSON found there (``--report``: only that).

``--packed``: packed vs padded vs bucketed DiT training steps on a mix of image sizes instead
(``scripts/bench_packed.py``, which takes the remaining arguments; docs/packing.md); ``--diffusers``:
stock vs scaled diffusers families (``scripts/bench_diffusers.py``); ``--cache``: a rolling KV
cache's roll against recomputing its keys, and its decode step (``scripts/bench_cache.py``); ``--norm-tables``:
QK-norm + RoPE from tables, ours fused and unfused against diffusers and comfy-kitchen (``scripts/bench_norm_tables.py``);
``--guard``: the speed guard, small eager shapes on CPU against diffusers, comfy-kitchen and rotary-embedding-torch
(``scripts/bench_guard.py``).
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

import axial_rope as ar

from . import cli, peers
from .bench_report import HEADER, format_row, machine, write_chart, write_markdown
from .cli import positive_int

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
# every provider a run may time (which of them run depends on the device, the pairing and the mode), and the
# RMSNorms of the unfused QK-norm baseline ("unfused: <norm> + <rope>"): a --providers substring must name one
PROVIDERS = (
    "copy",
    "axial_rope triton (in place)",
    "axial_rope torch (in place)",
    "axial_rope triton (bhsd)",
    "axial_rope triton (bshd)",
    "axial_rope torch (tables)",
    "axial_rope torch (positions)",
    "axial_rope reference",
    "diffusers apply_rotary_emb",
    "timm apply_rot_embed_cat",
    "transformers apply_rotary_pos_emb",
    "flash-attn rotary",
    "liger rope",
    "axial_rope norm_and_rotate (triton)",
    "axial_rope norm_and_rotate (torch)",
)
UNFUSED_NORMS = ("torch.compile rms_norm", "F.rms_norm", "liger rms_norm")  # scripts/peers.py


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


# -- providers: name -> (layout, rotate(q, k)), with tables built outside the timed call ------------


def providers(shape: Shape, rope: ar.AxialRoPE, pos: torch.Tensor, device: str, mode: str) -> dict:
    """name -> (layout, rotate(q, k)) for every provider that can run here; name -> reason string otherwise."""
    cos, sin = rope.cos_sin(pos)  # float32 [S, D], the pairing's channel layout
    out = {"copy": ("bhsd", lambda q, k: (Copy.apply(q), Copy.apply(k)))}
    backends = ["triton", "torch"] if device == "cuda" else ["torch"]
    if mode == "forward":  # in place: no output allocated (inference; with autograd it is a copy back)
        for b in backends:
            out[f"axial_rope {b} (in place)"] = (
                "bhsd",
                lambda q, k, b=b: rope(q, k, pos, "bhsd", backend=b, inplace=True),
            )
    if device == "cuda":
        for layout in ("bhsd", "bshd"):
            out[f"axial_rope triton ({layout})"] = (
                layout,
                lambda q, k, lay=layout: rope(q, k, pos, lay, backend="triton"),
            )
    out["axial_rope torch (tables)"] = (
        "bhsd",
        lambda q, k: (
            ar.apply_rope(q, cos, sin, rope.pairing, "bhsd", backend="torch"),
            ar.apply_rope(k, cos, sin, rope.pairing, "bhsd", backend="torch"),
        ),
    )
    out["axial_rope torch (positions)"] = ("bhsd", lambda q, k: rope(q, k, pos, "bhsd", backend="torch"))
    if pos.shape[0] * shape.heads * shape.head_dim * shape.batch <= 2**22:  # complex128: small shapes only
        out["axial_rope reference"] = ("bhsd", lambda q, k: rope(q, k, pos, "bhsd", backend="reference"))
    out.update(_eager_peers(cos, sin, shape.pairing))
    out.update(peers.rope_peers(cos, sin, shape.pairing, device))
    return out  # fmt: skip


def _optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        return f"not importable ({type(err).__name__})"


def _eager_peers(cos, sin, pairing: str) -> dict:
    """diffusers and timm (interleaved pairs), transformers (half pairs): eager PyTorch, ``[B, H, S, D]``."""
    out = {}
    if pairing == "interleaved":
        fn = _optional("diffusers.models.embeddings", "apply_rotary_emb")
        out["diffusers apply_rotary_emb"] = (
            fn if isinstance(fn, str) else ("bhsd", lambda q, k, fn=fn: (fn(q, (cos, sin)), fn(k, (cos, sin))))
        )
        fn = _optional("timm.layers.pos_embed_sincos", "apply_rot_embed_cat")
        emb = torch.cat([sin, cos], -1)  # timm's order: sin first
        out["timm apply_rot_embed_cat"] = (
            fn if isinstance(fn, str) else ("bhsd", lambda q, k, fn=fn: (fn(q, emb), fn(k, emb)))
        )
    else:
        fn = _optional("transformers.models.llama.modeling_llama", "apply_rotary_pos_emb")
        out["transformers apply_rotary_pos_emb"] = (
            fn if isinstance(fn, str) else ("bhsd", lambda q, k, fn=fn: fn(q, k, cos[None], sin[None]))
        )
    return out  # fmt: skip


def norm_providers(rope, pos, device: str, head_dim: int, rope_table: dict, tensors, repeat: int) -> dict:
    """Fused QK-RMSNorm+RoPE against the fastest RMSNorm followed by the fastest RoPE of this run (weights [D]).

    ``rope_table``: the RoPE providers of the shape; ``tensors(layout)``: (q, k) in a layout.
    """
    w = torch.ones(head_dim, device=device)
    fused = "triton" if device == "cuda" else "torch"
    out = {
        "copy": rope_table["copy"],
        f"axial_rope norm_and_rotate ({fused})": ("bhsd", lambda q, k: rope.norm_and_rotate(q, k, pos, w, w, "bhsd", backend=fused)),
    }  # fmt: skip
    quick = max(3, repeat // 5)
    q, k = tensors("bhsd")
    norms = {n: f for n, f in peers.rms_norm_candidates(w, 1e-6, device).items() if not isinstance(f, str)}
    both = lambda f: lambda q, k: (f(q), f(k))
    norm_name = min(norms, key=lambda n: _time_fwd_bwd(both(norms[n]), q, k, quick))
    ropes = {n: p for n, p in rope_table.items() if n in UNFUSED_ROPES and not isinstance(p, str)}
    rope_name = min(ropes, key=lambda n: _time_fwd_bwd(ropes[n][1], *tensors(ropes[n][0]), quick))
    norm, (layout, rotate) = norms[norm_name], ropes[rope_name]
    out[f"unfused: {norm_name} + {rope_name}"] = (layout, lambda q, k: rotate(norm(q), norm(k)))
    return out


# the RoPE candidates of the unfused baseline (the fastest of those present wins)
UNFUSED_ROPES = ("axial_rope triton (bhsd)", "axial_rope triton (bshd)", "liger rope", "flash-attn rotary")
UNFUSED_ROPES += ("axial_rope torch (tables)",)  # CPU


def _time_fwd_bwd(rotate, q, k, repeat: int) -> float:
    return median_time(timed_modes(rotate, q, k, "forward+backward"), repeat=repeat, flush=_FLUSH.get(q.device.type))


_FLUSH: dict[str, torch.Tensor] = {}  # device type -> the buffer overwritten before each timed CUDA run


# -- one run ------------------------------------------------------------------------------------


def run_shape(shape: Shape, modes: list[str], names: list[str] | None, dtype, device: str, repeat: int) -> list[dict]:
    """Time every provider in every mode on one shape (each in its layout); returns one row per case."""
    rope = ar.AxialRoPE(shape.axes_dim, pairing=shape.pairing).to(device)
    pos = ar.grid(*shape.grid).to(device)
    seq, made = pos.shape[0], {}

    def tensors(layout: str):  # q, k of the shape in a layout, made once (same values in both layouts)
        if layout not in made:
            gen = torch.Generator(device=device).manual_seed(0)
            q = torch.randn(shape.batch, shape.heads, seq, shape.head_dim, device=device, dtype=dtype, generator=gen)
            k = torch.randn(shape.batch, shape.kv_heads, seq, shape.head_dim, device=device, dtype=dtype, generator=gen)
            made[layout] = (q, k) if layout == "bhsd" else tuple(t.transpose(1, 2).contiguous() for t in (q, k))
        return made[layout]

    q, k = tensors("bhsd")
    io_bytes = 2 * (q.numel() + k.numel()) * q.element_size()  # one read + one write of q and k
    if device == "cuda":
        _FLUSH["cuda"] = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    peak = _peak_gbps() if device == "cuda" else None
    rows = []
    for mode in modes:
        table = providers(shape, rope, pos, device, mode)
        if mode.startswith("qknorm"):
            table = norm_providers(
                rope, pos, device, shape.head_dim, providers(shape, rope, pos, device, "x"), tensors, repeat
            )
        timed_mode = "forward+backward" if mode.startswith("qknorm") else mode
        copy_seconds = None
        for name, entry in table.items():
            if names and name != "copy" and not any(n in name for n in names):
                continue
            row = {"shape": shape.name, "mode": mode, "provider": name, "pairing": shape.pairing}
            if isinstance(entry, str):
                rows.append({**row, "skipped": entry})
                continue
            layout, rotate = entry
            row["layout"] = layout
            timed = timed_modes(rotate, *tensors(layout), timed_mode)
            seconds = median_time(timed, repeat=repeat, flush=_FLUSH.get(device))
            copy_seconds = copy_seconds or seconds  # copy is the first provider of every mode
            moved = io_bytes * (2 if timed_mode == "forward+backward" else 1)
            row.update(median_ms=seconds * 1e3, gbps=moved / seconds / 1e9, x_copy=seconds / copy_seconds)
            if peak:
                row["pct_peak_hbm"] = 100 * row["gbps"] / peak
            if device == "cuda":  # forward+backward peak against inputs + outputs (+ grads)
                used = peak_memory(timed_modes(rotate, *tensors(layout), "forward+backward"))
                row["peak_mib"], row["peak_x_io"] = used / 2**20, used / (2 * io_bytes)
            rows.append(row)
            print(format_row(row), flush=True)
    return rows  # fmt: skip


def _peak_gbps() -> float | None:
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_GBPS.items() if k in name), None)


# the flags that run another benchmark (a module of scripts/) with the remaining arguments
SUBBENCHMARKS = {
    "--diffusers": "bench_diffusers",
    "--packed": "bench_packed",
    "--cache": "bench_cache",
    "--transformers": "bench_transformers",
    "--norm-tables": "bench_norm_tables",
    "--guard": "bench_guard",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    for flag, module in SUBBENCHMARKS.items():  # each takes its own arguments
        if flag in argv:
            importlib.import_module(f"scripts.{module}").main([a for a in argv if a != flag])
            return
    parser = cli.Parser(prog="scripts.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--packed", action="store_true", help="packed vs padded DiT steps (scripts/bench_packed.py)")
    parser.add_argument("--diffusers", action="store_true", help="stock vs scaled diffusers families (bench_diffusers)")
    parser.add_argument("--cache", action="store_true", help="rolling KV cache: roll vs recompute (bench_cache)")
    parser.add_argument("--small", action="store_true", help="small shapes that finish on a 2-core CPU in a minute")
    parser.add_argument("--out", default="docs", help="docs folder to write into")
    parser.add_argument("--shapes", default="dit,video,llm", help=f"comma list of {list(SHAPES)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {list(MODES)}")
    parser.add_argument(
        "--providers", default="", help="comma list of substrings of provider names (default: all; copy always)"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeat", type=positive_int, default=None, help="timed runs per case (default 5 CPU, 50 GPU)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--tag", default=None, help="result file name (default: device[-small])")
    parser.add_argument("--report", action="store_true", help="only regenerate benchmarks.md and charts from JSON")
    args = parser.parse_args(argv)
    out = cli.out_folder(parser, "--out", args.out)
    keys, modes = (
        cli.choices(parser, "--shapes", args.shapes, SHAPES),
        cli.choices(parser, "--modes", args.modes, MODES),
    )
    if args.report:
        for path in sorted((out / "bench").glob("*.json")):
            result = json.loads(path.read_text())
            if "shape" in (result.get("rows") or [{}])[0]:  # this script's providers; the other benches have no chart
                write_chart(result, out / "img" / f"bench_{path.stem}.png")
        write_markdown(out)
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    repeat = args.repeat if args.repeat is not None else (50 if device == "cuda" else 5)
    shapes = SMALL if args.small else SHAPES
    names = [n for n in args.providers.split(",") if n]
    unknown = [n for n in names if not any(n in known for known in (*PROVIDERS, "unfused", *UNFUSED_NORMS))]
    if unknown:  # before anything is measured or written (else: only "copy" timed, benchmarks.md replaced)
        parser.error(
            f"--providers: {', '.join(map(repr, unknown))} names no provider; expected substrings of "
            f"{list(PROVIDERS)} or of the unfused baseline's norms {list(UNFUSED_NORMS)}"
        )
    peers.unpack()
    print(HEADER)
    tag = args.tag or (device + ("-small" if args.small else ""))
    (out / "bench").mkdir(parents=True, exist_ok=True)
    info = machine(device, dtype, torch.get_num_threads(), peers.versions())
    result = {"machine": info, "repeat": repeat, "rows": [], "shapes": {s.name: asdict(s) for s in shapes.values()}}
    for key in keys:
        result["rows"] += run_shape(shapes[key], modes, names, dtype, device, repeat)
        # written after every shape: a run stopped at its time limit keeps what it measured
        (out / "bench" / f"{tag}.json").write_text(json.dumps(result, indent=1))
        write_chart(result, out / "img" / f"bench_{tag}.png")
        write_markdown(out)
    print(f"wrote {out / 'bench' / f'{tag}.json'}, {out / 'img' / f'bench_{tag}.png'}, {out / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
