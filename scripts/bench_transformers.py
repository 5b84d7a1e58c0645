"""Stock vs axial_rope rotation of every checked transformers family: ``python -m scripts.bench --transformers``.

Per family (``models/tiny_transformers.py``), two ratios in one run:

- **rotation**: the modeling module's rotation function, stock and the one ``apply_axial_rope`` binds, on q and
  k ``[1, H, S, D]`` (Llama 4: ``[1, S, H, D]``) and the tables the model's own rotary module computes for
  ``S`` positions (M-RoPE: the text positions on all three axes): the cost of the rotation alone;
- **forward**: the tiny model's whole forward (the prompt of the tests), stock and patched (fused QK-norm
  where the family has it): what the rotation's cost is worth in a model, here a small share.

Interleaved rounds in one process (``--repeat`` calls each, medians of the rounds). Ratios are the figure to
read: absolute times on a shared CPU move by a factor of 2 between runs.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import time

import torch

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


def _interleaved(runs: dict, repeat: int, rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of each run's median of ``repeat`` calls, the runs taking turns."""
    for fn in runs.values():  # warm-up
        fn()
    ms = {key: [] for key in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            ms[key].append(_ms(fn, repeat))
    return {key: statistics.median(v) for key, v in ms.items()}


def _text_rotary(model):
    """The rotary module of the text model (not a vision tower's) and the extra arguments it takes."""
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls.endswith("RotaryEmbedding") and "Vision" not in cls and "visual" not in name:
            extra = ("full_attention",) if "layer_type" in inspect.signature(module.forward).parameters else ()
            return module, extra
    raise ValueError(f"{type(model).__name__} has no text rotary module")


def rotation_inputs(case, name: str, kind: str, seq: int, heads: int) -> tuple:
    """The rotation function's arguments at ``seq`` tokens: q, k and the model's own tables for them."""
    from models import tiny_transformers as tiny

    rotary, extra = _text_rotary(case.model)
    head_dim = case.model.config.get_text_config().head_dim
    pos = torch.arange(seq)[None]  # [1, S]
    if name in tiny.VISION:
        pos = pos.expand(3, 1, seq)  # [3, 1, S]: text positions, equal on t, h, w
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(1, seq, heads * head_dim)
    with torch.no_grad():
        tables = rotary(x, pos, *extra)
    if kind.startswith("complex"):  # freqs_cis [1, S, D / 2]; Llama 4: q, k [B, S, H, D]
        q, k = (torch.randn(1, seq, heads, head_dim, generator=gen) for _ in range(2))
        return q, k, tables
    q, k = (torch.randn(1, heads, seq, head_dim, generator=gen) for _ in range(2))  # [B, H, S, D]
    return (q, k, *tables)


def time_family(name: str, seq: int, heads: int, repeat: int, rounds: int) -> dict:
    from axial_rope.integrations.transformers import apply_axial_rope
    from models import tiny_transformers as tiny

    case = tiny.case(name)
    with apply_axial_rope(case.model) as handle:
        (function, kind), *_ = handle.functions.items()
        module = sys.modules[handle.module]
        ours = getattr(module, function)
        fused = len(handle.fused)
    stock = getattr(module, function)
    args = rotation_inputs(case, name, kind, seq, heads)
    with torch.no_grad():
        rot = _interleaved({"stock": lambda: stock(*args), "ours": lambda: ours(*args)}, repeat, rounds)
        forward = {"stock": lambda: case.model(**case.inputs)}
        stock_fwd = _interleaved(forward, repeat, rounds)["stock"]
        with apply_axial_rope(case.model):
            ours_fwd = _interleaved(forward, repeat, rounds)["stock"]
    return {
        "family": name,
        "kind": kind,
        "fused layers": fused,
        "rotation stock ms": round(rot["stock"], 3),
        "rotation ours ms": round(rot["ours"], 3),
        "rotation ours / stock": round(rot["ours"] / rot["stock"], 3),
        "forward stock ms": round(stock_fwd, 3),
        "forward ours ms": round(ours_fwd, 3),
        "forward ours / stock": round(ours_fwd / stock_fwd, 3),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = cli.Parser(prog="scripts.bench --transformers", description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=positive_int, default=1024, help="tokens of the rotation-only timing")
    parser.add_argument("--heads", type=positive_int, default=8, help="q and k heads of the rotation-only timing")
    parser.add_argument("--repeat", type=positive_int, default=10, help="calls per timed round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument("--families", default=None, help="comma list of tiny model names (default: all)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    from models import tiny_transformers as tiny

    names = list(tiny.NAMES) if args.families is None else cli.choices(parser, "--families", args.families, tiny.NAMES)
    if args.json is not None:
        cli.out_file(parser, "--json", args.json)
    torch.set_num_threads(args.threads)
    rows = [time_family(name, args.seq, args.heads, args.repeat, args.rounds) for name in names]
    save_rows(args.json, rows, args.threads)
    return rows


if __name__ == "__main__":
    main()
