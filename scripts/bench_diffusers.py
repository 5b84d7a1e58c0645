"""Stock vs scaled forward of every served diffusers family: ``python -m scripts.bench --diffusers``.

Each family's tiny model (``models/tiny_diffusers.py``) at twice its training token grid (twice the frames
for video): stock; unscaled ``set_rope_processors(model)`` ("hooked": the installation's diffusers hook and, where
the family has one, our processors, on the model's own tables); and ``set_rope_processors(mode="interpolate",
train_size=...)``, whose tables axial_rope computes: the cost of the hook and of the table-producer path. Interleaved rounds in one
process (``--repeat`` forwards each, medians); ``--compiled`` times both compiled with inductor too.
Ratios are the figure to read: absolute times on a shared CPU move by a factor of 2 between runs.
"""

from __future__ import annotations

import statistics
import time

import torch

import axial_rope as ar
from axial_rope.conventions._registry import DIFFUSERS

from . import cli
from .bench_report import save_rows
from .cli import positive_int


def _ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def time_family(name: str, repeat: int, rounds: int, compiled: bool, *, depth: int = 1, factor: int = 2) -> dict:
    from axial_rope.integrations.diffusers import set_rope_processors
    from models import tiny_diffusers as tiny

    spec = tiny.TINY[name]
    frames, h, w = spec.grid
    inputs = tiny.inputs(name, factor * h, factor * w, frames=factor * frames if spec.video else frames)
    stock, _ = tiny.build(name, depth=depth)
    scaled, _ = tiny.build(name, depth=depth)
    hooked, _ = tiny.build(name, depth=depth)
    if DIFFUSERS[name].grid_axes:
        set_rope_processors(scaled, mode="interpolate", train_size=tiny.train_size(name))
    else:  # positions the pipeline computes: no grid to size, scale every axis
        set_rope_processors(scaled, scaling=ar.scaling.Linear(float(factor)))
    set_rope_processors(hooked)  # the installation's hook and processors alone, on the model's own tables
    runs = {"stock": stock, "hooked": hooked, "scaled": scaled}
    if compiled:
        torch._dynamo.reset()
        runs |= {"stock compiled": torch.compile(stock), "scaled compiled": torch.compile(scaled)}
    with torch.no_grad():
        for fn in runs.values():  # warm-up (and compiles)
            fn(**inputs)
        ms = {key: [] for key in runs}
        for _ in range(rounds):
            for key, fn in runs.items():
                ms[key].append(_ms(lambda fn=fn: fn(**inputs), repeat))
    row = {
        "class": name,
        "depth": depth,
        "grid x": factor,
        **{f"{k} ms": round(statistics.median(v), 3) for k, v in ms.items()},
    }
    row["scaled / stock"] = round(row["scaled ms"] / row["stock ms"], 3)
    row["hooked / stock"] = round(row["hooked ms"] / row["stock ms"], 3)
    if compiled:
        row["compiled scaled / stock"] = round(row["scaled compiled ms"] / row["stock compiled ms"], 3)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = cli.Parser(prog="scripts.bench --diffusers", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=10, help="forwards per timed round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument("--compiled", action="store_true", help="also time both compiled (inductor)")
    parser.add_argument("--depth", type=positive_int, default=1, help="blocks of each kind in the tiny models")
    parser.add_argument("--factor", type=positive_int, default=2, help="token grid (and frames) x the training one")
    parser.add_argument("--classes", default=None, help="comma list of diffusers classes (default: every served one)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    from models import tiny_diffusers as tiny

    served = sorted(n for n in DIFFUSERS if n in tiny.TINY and DIFFUSERS[n].scalable)
    classes = served if args.classes is None else cli.choices(parser, "--classes", args.classes, served)
    if args.json is not None:
        cli.out_file(parser, "--json", args.json)
    torch.set_num_threads(args.threads)
    rows = []
    for name in classes:
        try:
            rows.append(
                time_family(name, args.repeat, args.rounds, args.compiled, depth=args.depth, factor=args.factor)
            )
        except Exception as error:  # a tiny model whose inputs do not follow --depth: recorded, the others go on
            rows.append({"class": name, "depth": args.depth, "error": f"{type(error).__name__}: {error}"[:120]})
    save_rows(args.json, rows, args.threads)
    return rows
