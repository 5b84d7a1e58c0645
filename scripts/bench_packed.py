"""Packed vs padded vs bucketed DiT training steps on a mix of sizes: ``python -m scripts.bench --packed``.

One batch of images drawn as the packed trainer draws them (sides 16-48 px, multiples of the
patch, aspect up to 3:1; ``models.training.packed_data.MixedSizes``), and one training step
(forward, rectified-flow loss on the real pixels, backward, AdamW) of the same DiT three ways:

- ``packed``: every image's tokens in one sequence, attention within each image
  (``DiT.forward_packed``; ``axial_rope.varlen`` picks the attention path);
- ``padded``: every image padded to the batch's largest height and width, padding keys masked;
- ``bucketed``: images grouped by their sides rounded up to ``--bucket`` pixels, each group padded
  to its bucket and run as its own batch (aspect-ratio buckets without resizing).

All three compute the same function on the real tokens (checked once before timing). Reported:
real tokens per second (median step), the padding each leaves (share of processed tokens that
are padding), and the varlen attention paths alone on the packed batch's items. On a CPU shared
with other work, one thread (``--threads 1``, the default there) keeps timings from measuring
the other processes (two threads on two busy cores: 10 ms per SDPA call instead of 0.05 ms).
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

import axial_rope as ar
from axial_rope import varlen
from models.dit import PRESETS, DiT
from models.flow import T_SCALE
from models.training.data import Shapes
from models.training.packed_data import MixedSizes, render_images

from . import cli
from .cli import positive_int

STRATEGIES = ("packed", "padded", "bucketed")


def draw_batch(n: int, seed: int, patch: int, low: int = 16, high: int = 48, aspect: float = 3.0):
    """``n`` images ``[3, H_i, W_i]`` of the packed trainer's size mix, noise, timesteps and labels."""
    sizes = MixedSizes(low, high, aspect, patch, seed).sizes(range(n))
    images, labels = render_images(Shapes(seed=seed), list(range(n)), sizes)
    gen = torch.Generator().manual_seed(seed)
    noise = [torch.randn(x.shape, generator=gen) for x in images]
    t = torch.rand(n, generator=gen)
    xt = [(1 - ti) * x + ti * e for x, e, ti in zip(images, noise, t.tolist())]
    target = [e - x for x, e in zip(images, noise)]
    return xt, target, t * T_SCALE, labels


def _pad(xs: list[torch.Tensor], H: int, W: int) -> torch.Tensor:
    return torch.stack([F.pad(x, (0, W - x.shape[2], 0, H - x.shape[1])) for x in xs])


def padded_forward(model: DiT, xs: list[torch.Tensor], t: torch.Tensor, y: torch.Tensor, H: int, W: int):
    """The DiT on images padded to ``H x W`` (top-left aligned, so each real token keeps its grid position),
    padding tokens masked out as keys. Returns each image's prediction cropped to its size."""
    p = model.config.patch_size
    x, (h, w) = model.x_embedder(_pad(xs, H, W))  # [B, h * w, C]
    valid = torch.zeros(len(xs), h, w, dtype=torch.bool, device=x.device)
    for i, img in enumerate(xs):
        valid[i, : img.shape[1] // p, : img.shape[2] // p] = True
    mask = valid.flatten(1)[:, None, None, :]  # [B, 1, 1, S]: keys that are real tokens
    pos = ar.grid(h, w, device=x.device)
    c = model.t_embedder(t) + model.y_embedder(y)
    for block in model.blocks:
        x = block(x, c, pos, mask=mask)
    out = ar.unpatchify(model.final_layer(x, c), (h, w), p, model.out_channels)
    return [o[:, : img.shape[1], : img.shape[2]] for o, img in zip(out, xs)]


def buckets(xs: list[torch.Tensor], bucket: int) -> dict[tuple[int, int], list[int]]:
    """Image indices per bucket: sides rounded up to multiples of ``bucket`` pixels."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, x in enumerate(xs):
        key = tuple(math.ceil(s / bucket) * bucket for s in x.shape[1:])
        groups.setdefault(key, []).append(i)
    return groups


def predict(model: DiT, strategy: str, xs, t, y, bucket: int) -> list[torch.Tensor]:
    """Predictions per image under ``strategy`` (one list, image order)."""
    if strategy == "packed":
        return model.forward_packed(xs, t, y)
    if strategy == "padded":
        H, W = (max(x.shape[d] for x in xs) for d in (1, 2))
        return padded_forward(model, xs, t, y, H, W)
    out: list = [None] * len(xs)
    for (H, W), idx in buckets(xs, bucket).items():
        for i, o in zip(idx, padded_forward(model, [xs[i] for i in idx], t[idx], y[idx], H, W)):
            out[i] = o
    return out


def processed_tokens(strategy: str, xs, patch: int, bucket: int) -> int:
    """Tokens the strategy runs through the model (real plus padding)."""
    if strategy == "packed":
        return sum(x.shape[1] * x.shape[2] for x in xs) // patch**2
    if strategy == "padded":
        return len(xs) * max(x.shape[1] for x in xs) * max(x.shape[2] for x in xs) // patch**2
    return sum(len(idx) * H * W for (H, W), idx in buckets(xs, bucket).items()) // patch**2


def loss_of(preds, targets) -> torch.Tensor:
    err = sum((p[: g.shape[0]] - g).square().sum() for p, g in zip(preds, targets))
    return err / sum(g.numel() for g in targets)


def step_times(model, batch, bucket: int, repeat: int) -> dict[str, float]:
    """Median seconds of a training step (forward, loss, backward, AdamW) per strategy.

    The strategies take turns, one step each per round after a warm-up round, so a change in the
    machine's load (other processes) falls on all of them alike.
    """
    xs, targets, t, y = batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for i in range(repeat + 1):
        for strategy in STRATEGIES:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_of(predict(model, strategy, xs, t, y, bucket), targets).backward()
            opt.step()
            if xs[0].is_cuda:
                torch.cuda.synchronize()
            if i:
                times[strategy].append(time.perf_counter() - start)
    return {s: statistics.median(v) for s, v in times.items()}


def check_equal(model, batch, bucket: int) -> float:
    """Largest difference between the strategies' predictions (they compute one function)."""
    xs, _, t, y = batch
    model.eval()  # no label dropout: the same labels for every strategy
    with torch.no_grad():
        ref = predict(model, "packed", xs, t, y, bucket)
        diff = max(
            float((a - b).abs().max()) for s in STRATEGIES[1:] for a, b in zip(ref, predict(model, s, xs, t, y, bucket))
        )
    model.train()
    return diff


def _time_path(name: str, grad: bool, qkv, segments, repeat: int) -> float:
    """Median milliseconds of one varlen path (with its backward if ``grad``), after a warm-up call."""
    q, k, v = (x.clone().requires_grad_(grad) for x in qkv)
    times = []
    for i in range(repeat + 1):  # the first call warms up (FlexAttention compiles there)
        start = time.perf_counter()
        with torch.set_grad_enabled(grad):
            out = varlen.varlen_attention(q, k, v, segments, backend=name)
            if grad:
                out.sum().backward()
        if q.is_cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def attention_paths(segments, heads: int, head_dim: int, device, repeat: int) -> dict[str, dict[str, float]]:
    """Milliseconds of the varlen paths on these items: forward (no grad) and forward + backward where they run."""
    qkv = [torch.randn(segments.total, heads, head_dim, device=device) for _ in range(3)]
    out: dict[str, dict[str, float]] = {}
    for name in varlen.VARLEN_BACKENDS:
        for mode, grad in (("forward", False), ("forward+backward", True)):
            if varlen._why_not(name, qkv[0].device, qkv[0].dtype, grad) is None:
                out.setdefault(name, {})[mode] = _time_path(name, grad, qkv, segments, repeat)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = cli.Parser(prog="scripts.bench --packed", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="DiT preset (patch size kept)")
    parser.add_argument("--images", type=positive_int, default=32, help="images in the batch")
    parser.add_argument("--bucket", type=positive_int, default=16, help="bucket side granularity in pixels")
    parser.add_argument(
        "--repeat", type=positive_int, default=7, help="timed rounds (one step of each strategy per round)"
    )
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default on CPU: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--no-attention", action="store_true", help="skip the attention-path timings")
    args = parser.parse_args(argv)
    if args.json is not None:
        cli.out_file(parser, "--json", args.json)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    torch.manual_seed(args.seed)
    model = DiT(replace(PRESETS[args.preset], in_channels=3, learn_sigma=False)).to(device)
    with torch.no_grad():  # away from DiT's zero init, so every branch computes something
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    patch = model.config.patch_size
    xs, targets, t, y = draw_batch(args.images, args.seed, patch)
    batch = ([x.to(device) for x in xs], [g.to(device) for g in targets], t.to(device), y.to(device))
    real = processed_tokens("packed", xs, patch, args.bucket)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)" + (f", {torch.cuda.get_device_name()}" if device.type == "cuda" else ""),
        "device": device.type,
        "preset": args.preset,
        "images": args.images,
        "real_tokens": real,
        "max_difference": check_equal(model, batch, args.bucket),
        "rows": [],
    }
    for strategy, seconds in step_times(model, batch, args.bucket, args.repeat).items():
        tokens = processed_tokens(strategy, xs, patch, args.bucket)
        result["rows"].append(
            {
                "strategy": strategy,
                "step_ms": 1e3 * seconds,
                "tokens_per_s": real / seconds,
                "padding": 1 - real / tokens,
            }
        )
    packed_segments = model.pack(batch[0]).segments
    if not args.no_attention:
        heads = model.config.num_heads
        result["attention_ms"] = attention_paths(
            packed_segments, heads, model.config.hidden_size // heads, device, args.repeat
        )
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def report(result: dict) -> str:
    """The result as markdown tables."""
    base = next(r for r in result["rows"] if r["strategy"] == "padded")["tokens_per_s"]
    lines = [
        f"{result['preset']} DiT, {result['images']} images ({result['real_tokens']} real tokens), {result['machine']}",
        f"(strategies agree to {result['max_difference']:.1e})",
        "",
        "| strategy | step (ms) | real tokens / s | vs padded | padding |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        speedup = r["tokens_per_s"] / base
        lines.append(
            f"| {r['strategy']} | {r['step_ms']:.0f} | {r['tokens_per_s']:.0f} | {speedup:.2f}x | {100 * r['padding']:.0f}% |"
        )
    if "attention_ms" in result:
        lines += ["", "| attention path | forward (ms) | forward + backward (ms) |", "|---|---|---|"]
        for name, t in result["attention_ms"].items():
            fwd, both = (f"{t[m]:.1f}" if m in t else "-" for m in ("forward", "forward+backward"))
            lines.append(f"| {name} | {fwd} | {both} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
