"""What compiles, and what it costs: ``python -m scripts.compile_report [--out docs/bench/compile-cpu.json]``.

For each diffusers family ``set_rope_processors`` serves (unscaled, a fixed scaling, DyPE) and each of the
library's models: the graphs ``torch.compile`` makes over a sequence of sizes (a counting backend:
tracing only), whether ``torch.export`` takes it, and the tracing time. Then the CPU time of a 6-block
tiny Flux at a 32 x 32 latent grid (1024 image tokens), stock and adapted, eager and compiled with
inductor, measured interleaved in one process (medians of ``--repeat`` rounds). Prints markdown tables
(docs/compile.md carries them) and writes the figures as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch._dynamo.testing import CompileCounter

import axial_rope as ar
from axial_rope.time_scaling import DyPE

from . import cli
from .bench_report import markdown_table

VARIANTS = {
    "unscaled": None,
    "scaled": (None, ar.scaling.NTK(2.0), ar.scaling.YaRN(2.0, 2)),
    "timed": (None, DyPE(2.0, 2), DyPE(2.0, 2, method="ntk")),
}
SIZES = ((4, 4), (4, 8), (8, 8), (6, 10), (8, 4), (10, 10))  # token grids h x w of the diffusers models
IMAGE_SIZES = ((32, 32), (48, 64), (64, 48), (64, 64), (16, 64), (40, 24))  # DiT latents (patch 4)
VIDEO_SIZES = ((8, 16, 16), (4, 24, 8), (12, 8, 8), (8, 24, 16), (2, 16, 16), (6, 8, 24))  # video latents


def _graphs(model, calls, **compile_kwargs) -> tuple[int, float, str]:
    """(graphs compiled, seconds to trace them all, the first error or '') over ``calls``: (args, kwargs)."""
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, **compile_kwargs)
    start = time.perf_counter()
    try:
        with torch.no_grad():
            for args, kwargs in calls:
                compiled(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 (reported in the table)
        return counter.frame_count, time.perf_counter() - start, f"{type(err).__name__}: {str(err)[:80]}"
    return counter.frame_count, time.perf_counter() - start, ""


def _exports(model, args, kwargs) -> str:
    try:
        torch.export.export(model, args=args, kwargs=kwargs)
        return "yes"
    except Exception as err:  # noqa: BLE001
        return f"no ({type(err).__name__})"


def diffusers_rows() -> list[dict]:
    from axial_rope.integrations.diffusers import set_rope_processors
    from models import tiny_diffusers as tiny

    rows = []
    for family in ("flux", "hunyuan_video", "wan", "cogvideox"):
        for variant, scaling in {"stock": None, **VARIANTS}.items():
            model, inputs = tiny.build(family)
            if variant != "stock":
                set_rope_processors(model, scaling=scaling)
            calls = [((), tiny.inputs(family, h, w)) for h, w in SIZES]
            graphs, seconds, error = _graphs(model, calls)
            with torch.fx.experimental._config.patch(use_duck_shape=False):  # as diffusers' dynamic-shape check
                dynamic, _, dyn_error = _graphs(model, calls, dynamic=True)
            rows.append(dict(model=family, variant=variant, graphs=graphs, dynamic_graphs=dynamic,
                             trace_s=round(seconds, 2), export=_exports(model, (), inputs),
                             error=error or dyn_error))  # fmt: skip
    return rows


def model_rows() -> list[dict]:
    from models.dit import PRESETS as DIT
    from models.dit import DiT
    from models.video_dit import PRESETS as VIDEO
    from models.video_dit import VideoDiT

    rows = []
    t, y = torch.full((2,), 500.0), torch.tensor([0, 1])
    # the training size, then larger and other aspect ratios (the second size changes both sides)
    images = [((torch.randn(2, 3, h, w), t, y), {}) for h, w in IMAGE_SIZES]
    for mode in ("none", "interpolate", "yarn", "dype"):
        model = DiT(DIT["tiny"]).eval()
        calls = [(args, {"pos_mode": mode}) for args, _ in images]
        rows.append(_model_row("DiT tiny", f"pos_mode={mode}", model, calls))
    video = VideoDiT(VIDEO["tiny"]).eval()
    clips = [((torch.randn(1, 3, *s), t[:1], y[:1]), {}) for s in VIDEO_SIZES]
    rows.append(_model_row("VideoDiT tiny", "frames and sizes", video, clips))
    return rows


def _model_row(name: str, variant: str, model, calls) -> dict:
    graphs, seconds, error = _graphs(model, calls)
    with torch.fx.experimental._config.patch(use_duck_shape=False):
        dynamic, _, dyn_error = _graphs(model, calls, dynamic=True)
    return dict(model=name, variant=variant, graphs=graphs, dynamic_graphs=dynamic, trace_s=round(seconds, 2),
                export=_exports(model, *calls[0]), error=error or dyn_error)  # fmt: skip


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def flux_timing(repeat: int, *, device: str = "cpu", dtype=torch.float32, side: int = 32, gpu_sizes: bool = False):
    """ms per forward of a Flux at ``side x side`` tokens, stock and ours, eager and inductor, interleaved.

    CPU: the tiny Flux with 3 double- and 3 single-stream blocks. ``gpu_sizes``: FLUX.1's block sizes
    (24 heads of 128 channels), one block of each kind."""
    from axial_rope.integrations.diffusers import set_rope_processors
    from models import tiny_diffusers as tiny

    def build():
        torch.manual_seed(0)
        model = (tiny.flux(1, 24, (16, 56, 56)) if gpu_sizes else tiny.flux(3)).eval()
        return model if (device, dtype) == ("cpu", torch.float32) else model.to(device, dtype)

    stock, ours = build(), build()
    set_rope_processors(ours)
    inputs = {k: v.to(device, dtype) if isinstance(v, torch.Tensor) and k not in ("img_ids", "txt_ids") else v
              for k, v in tiny.inputs("flux", side, side).items()}  # fmt: skip
    inputs["img_ids"], inputs["txt_ids"] = inputs["img_ids"].to(device), inputs["txt_ids"].to(device)
    torch._dynamo.reset()
    runs = {
        "stock eager": stock,
        "ours eager": ours,
        "stock compiled": torch.compile(stock, fullgraph=True),
        "ours compiled": torch.compile(ours, fullgraph=True),
    }
    with torch.no_grad():
        start = time.perf_counter()
        for fn in runs.values():  # warm-up, compiles included
            fn(**inputs)
        compile_s = time.perf_counter() - start
        ms = {name: [] for name in runs}
        for _ in range(3):  # rounds, interleaved: each provider sees the same machine state
            for name, fn in runs.items():
                ms[name].append(_median_ms(lambda fn=fn: fn(**inputs), repeat))
    result = {name: round(statistics.median(v), 2) for name, v in ms.items()}
    result["ours/stock compiled"] = round(result["ours compiled"] / result["stock compiled"], 3)
    result["ours/stock eager"] = round(result["ours eager"] / result["stock eager"], 3)
    result["warm-up s (both compiles)"] = round(compile_s, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog="scripts.compile_report", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/bench/compile-cpu.json")
    parser.add_argument("--repeat", type=cli.positive_int, default=5, help="forwards per timing round")
    parser.add_argument("--threads", type=cli.positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--flux-only", action="store_true", help="only the timing (CUDA: FLUX.1 block sizes, bf16)")
    args = parser.parse_args(argv)
    out = cli.out_file(parser, "--out", args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.flux_only:
        gpu = torch.cuda.is_available()
        kind = dict(device="cuda", dtype=torch.bfloat16, side=64, gpu_sizes=True) if gpu else {}
        report["flux_ms"] = flux_timing(args.repeat, **kind)
        report["flux_ms"]["device"] = torch.cuda.get_device_name() if gpu else "cpu"
        print(json.dumps(report["flux_ms"], indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        return 0
    report["diffusers"] = diffusers_rows()
    print(markdown_table(report["diffusers"], last="error"), "\n", flush=True)
    report["models"] = model_rows()
    print(markdown_table(report["models"], last="error"), "\n", flush=True)
    report["flux_cpu_ms"] = flux_timing(args.repeat)
    print(json.dumps(report["flux_cpu_ms"], indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
