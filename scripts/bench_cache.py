"""Rolling KV cache costs, ratios side by side in one run: ``python -m scripts.bench --cache [--json PATH]``.

1. One roll of a full cache (drop ``--shift`` entries after the sinks, move the rest down, rotate the
   kept keys from their copies as written) against recomputing those keys from the hidden states they came from
   (the key projection, then the rotation at the new positions) and moving the values alike: what a
   cache without RoPE's shift property would do.
2. One decode step of the byte GPT (``models.gpt`` preset ``tiny``) with a static cache against
   rolling ones of the same length that are full: one rolling every step (by one token), one rolling
   every ``--evict`` steps (time per step over ``evict`` steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import axial_rope as ar
from axial_rope.cache import KVCache
from models.gpt import GPT, PRESETS

from .cli import positive_int


def _median(fn, repeat: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    fn()
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def roll_vs_recompute(tokens, heads, head_dim, shift, repeat, device="cpu", dtype=torch.float32) -> dict:
    torch.manual_seed(0)
    backend = "triton" if device == "cuda" else None
    rope = ar.AxialRoPE(head_dim, pairing="half", backend=backend).to(device)
    width, kw = heads * head_dim, {"device": device, "dtype": dtype}
    cache = KVCache(1, tokens, heads, head_dim, window=tokens, sinks=4, **kw)
    raw = torch.randn(2, 1, heads, tokens, head_dim, **kw)
    cache.update(cache.advance(tokens, rope), raw[0], raw[1])  # a rolling cache writes the slots advance reserves
    keep = tokens - 4 - shift
    hidden = torch.randn(1, keep, width, **kw)  # the kept tokens' hidden states (a recomputing cache must hold them)
    w_k = torch.nn.Linear(width, width, bias=False, **kw)
    new_pos = torch.arange(4, 4 + keep, dtype=torch.float64, device=device)[:, None]

    def roll():
        cache.roll(shift, rope)
        cache.length = tokens  # full again: the next call rolls the same amount

    @torch.no_grad()
    def recompute():
        k = w_k(hidden).view(1, keep, heads, head_dim)
        k, _ = rope(k, None, new_pos, "bshd")
        cache.k[:, :, 4 : 4 + keep] = k.transpose(1, 2)
        cache.v[:, :, 4 : 4 + keep] = cache.v[:, :, 4 + shift :].clone()

    t_roll, t_recompute = _median(roll, repeat), _median(recompute, repeat)
    # what a roll moves: the keys as written and v each copied out and back (overlapping ranges go through a
    # copy), the kept keys copied from those as written and rotated in place: 4 + 4 + 2 + 2 passes
    moved = 12 * keep * width * raw.element_size()
    return {"tokens": tokens, "heads": heads, "head_dim": head_dim, "shift": shift, "dtype": str(dtype),
            "device": device, "roll_s": t_roll, "recompute_s": t_recompute, "recompute_over_roll": t_recompute / t_roll,
            "roll_bytes": moved, "roll_GBps": moved / t_roll / 1e9}  # fmt: skip


@torch.no_grad()
def decode_step(tokens: int, repeat: int, evict_many: int) -> dict:
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"]).eval()
    c = model.config
    nxt = torch.zeros(1, 1, dtype=torch.long)
    times = {}
    for kind, evict in (("static", None), ("rolling", 1), (f"rolling, evict {evict_many}", evict_many)):
        window = None if evict is None else tokens
        caches = [KVCache(1, tokens, c.num_heads, c.head_dim, window=window, evict=evict) for _ in model.layers]
        prompt = torch.randint(0, 256, (1, tokens - 1))
        for cache in caches:
            cache.advance(tokens - 1, model.rope)
        model(prompt, torch.arange(tokens - 1), caches, seq_len=tokens)

        def step(caches=caches, kind=kind):
            slots = [cache.advance(1, model.rope) for cache in caches][0]
            model(nxt, slots, caches, seq_len=tokens)
            if kind == "static":  # stay at the last slot: every step writes it again
                for cache in caches:
                    cache.length -= 1

        # a roll every `evict` steps: time that many steps
        times[kind] = _median(lambda step=step, k=evict or 1: [step() for _ in range(k)], repeat) / (evict or 1)
    return {"tokens": tokens, "model": "tiny", "step_s": times,
            "over_static": {k: t / times["static"] for k, t in times.items()}}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench --cache", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=positive_int, default=4096, help="cache length (default 4096)")
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--head-dim", type=positive_int, default=128)
    parser.add_argument("--shift", type=positive_int, default=256, help="entries one roll drops (default 256)")
    parser.add_argument("--evict", type=positive_int, default=64, help="the decode's second rolling cache's evict")
    parser.add_argument("--repeat", type=positive_int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--roll-only", action="store_true", help="skip the decode step (the GPU check)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    roll_args = (args.tokens, args.heads, args.head_dim)
    kw = {"device": args.device, "dtype": getattr(torch, args.dtype)}
    if args.shift >= args.tokens - 4:
        parser.error(f"--shift must be below --tokens - 4 (the sinks), got {args.shift}")
    result = {
        "threads": torch.get_num_threads(),
        "roll": roll_vs_recompute(*roll_args, args.shift, args.repeat, **kw),
        "roll_by_one": roll_vs_recompute(*roll_args, 1, args.repeat, **kw),
    }
    if not args.roll_only:
        result["decode"] = decode_step(args.tokens, args.repeat, args.evict)
    for name in ("roll", "roll_by_one"):
        r = result[name]
        print(f"one roll by {r['shift']} of a {r['tokens']}-token cache ({r['heads']} x {r['head_dim']}): "
              f"{r['roll_s'] * 1e3:.2f} ms; recomputing the kept keys {r['recompute_s'] * 1e3:.2f} ms "
              f"(x{r['recompute_over_roll']:.2f}); the roll moves {r['roll_GBps']:.1f} GB/s")  # fmt: skip
    d = result.get("decode", {"step_s": {}})
    for kind, t in d["step_s"].items():
        print(
            f"decode step, tiny GPT, {d['tokens']}-token cache, {kind}: {t * 1e3:.2f} ms (x{d['over_static'][kind]:.2f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
