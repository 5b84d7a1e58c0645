"""Per-head and asymmetric rotations against the shared-rotation kernel: ``python -m scripts.bench_qk_rotation``.

Issue 44's primitives (docs/architecture.md, "Queries and keys turned differently, per-head rotations"), timed at
the same shapes and dtype as the rotation every model runs today, forward and forward+backward. Providers, each
rotating q ``[B, S, H, D]`` and k ``[B, S, H_k, D]``:

- ``shared``: one ``Rotation`` for q and k (Triton: one launch each way), the baseline;
- ``key positions``: a ``QKRotation`` whose keys sit elsewhere (CRPA): one launch per tensor;
- ``key amplitude``: a ``QKRotation`` whose keys carry a per-token amplitude (Untwisting RoPE): tables per side;
- ``per-head F``: one ``F`` per key head, query heads grouped (LoL's jitter), one launch;
- ``shared tables`` / ``per-head tables``: ``apply_rope`` with ``[S, r]`` tables, and with grouped per-head
  ``[1, S, H_k, r]`` tables (FoPE's form), on q and on k;
- ``copy``: a copy of q and k, the memory floor.

Every round times each provider once, in turn (interleaved); medians, GB/s (q and k read and written once; twice
that with the backward) and each provider's ratio to its baseline (``shared``, or ``shared tables``) within the
round. On CUDA the Triton backend is asked for explicitly (a call it cannot serve fails loudly); on CPU (the dry
run) the automatic backend, or ``--backend triton`` under ``TRITON_INTERPRET=1`` (the kernels' paths, untimed).
"""

from __future__ import annotations

import json
import statistics

import torch

import axial_rope as ar
from axial_rope import ops
from axial_rope.ops import QKRotation, Rotation

from . import cli
from .bench_report import call_timer

SHAPES = {  # name -> batch, grid, q heads, k heads, axes_dim (rot_dim = head_dim)
    "Flux-like DiT": dict(batch=1, grid=(1, 64, 64), heads=24, kv_heads=24, axes_dim=(16, 56, 56)),
    "GQA LM": dict(batch=1, grid=(8192,), heads=32, kv_heads=8, axes_dim=(128,)),
}
SMALL = {"small": dict(batch=1, grid=(1, 4, 4), heads=4, kv_heads=2, axes_dim=(8, 12, 12))}
MODES = ("forward", "forward+backward")
BASELINE = {"key positions": "shared", "key amplitude": "shared", "per-head F": "shared",
            "per-head tables": "shared tables", "copy": "shared"}  # fmt: skip


def providers(shape: dict, device: str, backend: str | None) -> dict:
    """name -> rotate(q, k) -> (q, k) for one shape (rotations and tables built once, outside the timing)."""
    rope = ar.AxialRoPE(shape["axes_dim"])
    pos = ar.grid(*shape["grid"]).to(device)
    shared = rope.rotation(pos)
    n, hk = shared.n_pairs, shape["kv_heads"]
    damp = torch.ones(1, pos.shape[0], n, dtype=torch.float64, device=device)
    damp[:, pos.shape[0] // 2 :, : n // 4] = 0.5  # the second half of the tokens: high-frequency planes damped
    jitter = torch.linspace(1.0, 1.1, hk, dtype=torch.float64, device=device)[:, None, None]
    per_head = Rotation(shared.pos, shared.freqs.to(device) * jitter, None, shared.pairing)
    cos, sin = (t.to(device) for t in rope.cos_sin(pos))  # [S, r]
    cos_h, sin_h = (t[None, :, None].expand(1, -1, hk, -1) * (1 + 0.01 * torch.arange(hk, device=device))[:, None]
                    for t in (cos, sin))  # fmt: skip
    pairs = {
        "shared": shared,
        "key positions": QKRotation(shared, shared._replace(pos=shared.pos * 2 + 1)),
        "key amplitude": QKRotation(shared, shared._replace(attention_factor=damp)),
        "per-head F": per_head,
    }
    out = {name: (lambda q, k, r=r: ops.rotate(q, k, r, "bshd", backend)) for name, r in pairs.items()}
    out["shared tables"] = lambda q, k: (ar.apply_rope(q, cos, sin, backend=backend),
                                         ar.apply_rope(k, cos, sin, backend=backend))  # fmt: skip
    out["per-head tables"] = lambda q, k: (ar.apply_rope(q, cos_h, sin_h, backend=backend),
                                           ar.apply_rope(k, cos_h, sin_h, backend=backend))  # fmt: skip
    out["copy"] = lambda q, k: (q * 1, k * 1)
    return out


def _callable(rotate, q: torch.Tensor, k: torch.Tensor, mode: str):
    if mode == "forward":
        return lambda: rotate(q, k)
    qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    grads = [torch.randn_like(t) for t in (q, k)]
    return lambda: torch.autograd.grad(rotate(qg, kg), (qg, kg), grads)


def run(shapes: dict, dtype: torch.dtype, repeat: int, device: str, backend: str | None = None) -> list[dict]:
    """One row per (shape, mode, provider): median ms, GB/s and the median of the per-round ratios to its baseline.

    ``backend``: the backend asked for explicitly (default: triton on CUDA, the automatic choice elsewhere).
    """
    backend = backend or ("triton" if device == "cuda" else None)
    once, rows = call_timer(device), []
    for label, shape in shapes.items():
        S = 1
        for g in shape["grid"]:
            S *= g
        D = sum(shape["axes_dim"])
        gen = torch.Generator(device).manual_seed(0)
        q = torch.randn(shape["batch"], S, shape["heads"], D, device=device, generator=gen).to(dtype)
        k = torch.randn(shape["batch"], S, shape["kv_heads"], D, device=device, generator=gen).to(dtype)
        moved = 2 * (q.numel() + k.numel()) * q.element_size()
        for mode in MODES:
            cases = {}
            for name, rotate in providers(shape, device, backend).items():
                fn = _callable(rotate, q, k, mode)
                fn()  # warm-up (and the kernels' compile)
                cases[name] = (fn, [])
            for _ in range(repeat):  # interleaved: every provider once per round
                for fn, times in cases.values():
                    times.append(once(fn))
            factor = 1 if mode == "forward" else 2
            for name, (_, times) in cases.items():
                row = {"shape": f"{label} B{shape['batch']} S{S} H{shape['heads']} H_k{shape['kv_heads']} D{D}",
                       "dtype": str(dtype).removeprefix("torch."), "mode": mode, "provider": name,
                       "median_ms": statistics.median(times) * 1e3,
                       "gbps": factor * moved / statistics.median(times) / 1e9}  # fmt: skip
                if name in BASELINE:
                    base = cases[BASELINE[name]][1]
                    row[f"x_{BASELINE[name].replace(' ', '_')}"] = statistics.median(
                        t / b for t, b in zip(times, base))  # fmt: skip
                rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| shape | mode | provider | ms | GB/s | vs baseline |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = next((f"{v:.2f}x {k[2:]}" for k, v in r.items() if k.startswith("x_")), "")
        lines.append(f"| {r['shape']} | {r['mode']} | {r['provider']} | {r['median_ms']:.3f} | {r['gbps']:.0f} | "
                     f"{ratio} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = cli.Parser(prog="python -m scripts.bench_qk_rotation", description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a tiny shape (the CPU dry run)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--repeat", type=cli.positive_int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default=None, choices=ops.BACKENDS, help="default: triton on CUDA, else automatic")
    parser.add_argument("--json", default=None, help="write the rows here (a .json file)")
    args = parser.parse_args(argv)
    path = None if args.json is None else cli.out_file(parser, "--json", args.json, (".json",))
    rows = run(SMALL if args.small else SHAPES, getattr(torch, args.dtype), args.repeat, args.device, args.backend)
    print(markdown(rows))
    if path is not None:
        path.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
