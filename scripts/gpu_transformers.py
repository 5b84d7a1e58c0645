"""transformers on the GPU, stock vs ``apply_axial_rope``: ``python -m scripts.gpu_transformers --out OUT.json``.

Two timings (bf16, CUDA events, medians of ``--repeat`` after warm-up), forward and forward + backward:

- **Qwen3 attention layer** (Qwen3-8B's: hidden 4096, 32 heads, 8 KV heads, head 128; ``--seq`` tokens, SDPA):
  stock (q_norm, k_norm, then ``apply_rotary_pos_emb``) vs patched, where the per-head RMSNorm and the
  rotation are one ``ops.norm_rotate`` call (one Triton kernel);
- **Qwen2.5-VL M-RoPE rotation** (head 128, sections 16/24/24; q 28 heads, k 4; positions of a text prompt,
  then an image grid, then text, from three distinct axes): stock ``apply_rotary_pos_emb`` on the tables
  ``Qwen2_5_VLRotaryEmbedding`` computes, the function ``apply_axial_rope`` binds, and Liger-Kernel's M-RoPE
  (``liger_kernel.ops.qwen2vl_mrope`` from ``.peers``, see scripts/peers.py) on per-axis tables.

Each candidate's outputs are compared with stock's (max |difference|, bf16). ``--small`` runs tiny shapes on
any device (the CPU check of this script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from . import peers


def _time(fn, repeat: int, device: str) -> float:
    """Median ms of ``fn()`` over ``repeat`` calls after three warm-up calls (Triton compiles, autotuning)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
    return round(statistics.median(times), 4)


def _modes(call, leaves, repeat: int, device: str) -> dict:
    """Forward ms and forward + backward ms of ``call() -> tuple of tensors``."""

    def forward():
        with torch.no_grad():
            call()

    def backward():
        for x in leaves:
            x.grad = None
        sum(out.float().sum() for out in call()).backward()

    return {"forward ms": _time(forward, repeat, device), "forward+backward ms": _time(backward, repeat, device)}


def qwen3_attention(seq: int, small: bool, repeat: int, device: str) -> dict:
    import transformers

    from axial_rope.integrations.transformers import apply_axial_rope

    sizes = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    if small:
        sizes = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    config = transformers.Qwen3Config(**sizes, intermediate_size=64, num_hidden_layers=1, vocab_size=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.bfloat16
    model = transformers.Qwen3Model(config).to(device, dtype)
    attn = model.layers[0].self_attn
    h = torch.randn(1, seq, config.hidden_size, device=device, dtype=dtype, requires_grad=True)
    pos = torch.arange(seq, device=device)[None]  # [1, S]
    tables = model.rotary_emb(h, pos)

    def call():
        return (attn(h, position_embeddings=tables, attention_mask=None, position_ids=pos)[0],)

    row = {
        "case": "qwen3 attention",
        "seq": seq,
        **{f"stock {k}": v for k, v in _modes(call, [h], repeat, device).items()},
    }
    with torch.no_grad():
        stock = call()[0]
    with apply_axial_rope(model) as handle:
        row["fused layers"] = len(handle.fused)
        row |= {f"patched {k}": v for k, v in _modes(call, [h], repeat, device).items()}
        with torch.no_grad():
            row["patched max diff"] = float((call()[0] - stock).abs().max())
    for mode in ("forward ms", "forward+backward ms"):
        row[f"patched / stock {mode[:-3]}"] = round(row[f"patched {mode}"] / row[f"stock {mode}"], 3)
    return row


def _mrope_positions(seq: int, device: str) -> torch.Tensor:
    """position_ids ``[3, 1, S]``: a quarter text, an image grid (t fixed; h, w over a square), the rest text."""
    text = seq // 4
    side = int((seq // 2) ** 0.5)
    n = side * side
    t = torch.full((n,), text)
    hh, ww = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    image = torch.stack([t, text + hh.flatten(), text + ww.flatten()])  # [3, n]
    rest = seq - text - n
    after = text + side + torch.arange(rest)
    before = torch.arange(text)
    pos = torch.cat([before.expand(3, -1), image, after.expand(3, -1)], 1)  # [3, S]
    return pos[:, None].to(device)


def qwen2_5_vl_mrope(seq: int, small: bool, repeat: int, device: str) -> dict:
    import transformers
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as module

    from axial_rope.integrations.transformers import apply_axial_rope

    heads, kv, head_dim, sections = (28, 4, 128, [16, 24, 24]) if not small else (2, 1, 32, [4, 6, 6])
    text = dict(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                intermediate_size=64, num_hidden_layers=1, vocab_size=64,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections})  # fmt: skip
    config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config={"depth": 1, "hidden_size": 32,
                                           "out_hidden_size": heads * head_dim, "num_heads": 2})  # fmt: skip
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).to(device)
    rotary = model.model.language_model.rotary_emb
    dtype = torch.bfloat16
    gen = torch.Generator(device).manual_seed(0)
    q = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, generator=gen, requires_grad=True)
    k = torch.randn(1, kv, seq, head_dim, device=device, dtype=dtype, generator=gen, requires_grad=True)
    pos = _mrope_positions(seq, device)
    cos, sin = rotary(q, pos)  # [1, S, D] bf16, sections recomposed
    stock_fn = module.apply_rotary_pos_emb
    candidates = {"stock": lambda: stock_fn(q, k, cos, sin)}
    with apply_axial_rope(model):
        ours_fn = module.apply_rotary_pos_emb
    candidates["axial_rope"] = lambda: ours_fn(q, k, cos, sin)
    liger = peers.load("liger_kernel.ops.qwen2vl_mrope")
    reasons = {}
    if isinstance(liger, str) or device != "cuda":
        reasons["liger"] = liger if isinstance(liger, str) else "needs CUDA"
    else:  # per-axis tables [3, B, S, D], as Liger's M-RoPE reads them (the sections selected in the kernel)
        freqs = pos[..., None].float() * rotary.inv_freq.float()  # [3, 1, S, D / 2]
        cos3 = torch.cat((freqs.cos(), freqs.cos()), -1).to(dtype)
        sin3 = torch.cat((freqs.sin(), freqs.sin()), -1).to(dtype)
        fn = liger.LigerQwen2VLMRopeFunction.apply
        candidates["liger"] = lambda: fn(q, k, cos3, sin3, sections, 1)
    row = {"case": "qwen2.5-vl mrope rotation", "seq": seq, "not run": reasons}
    with torch.no_grad():
        stock = stock_fn(q, k, cos, sin)
    for name, call in candidates.items():
        try:
            with torch.no_grad():
                out = call()
            row[f"{name} max diff"] = max(float((o - s).abs().max()) for o, s in zip(out, stock))
            row |= {f"{name} {mode}": v for mode, v in _modes(call, [q, k], repeat, device).items()}
        except Exception as error:  # noqa: BLE001 - a peer's failure is recorded, the others still run
            reasons[name] = f"{type(error).__name__}: {str(error)[:200]}"
    for name in candidates:
        for mode in ("forward", "forward+backward"):
            if f"{name} {mode} ms" in row and name != "stock":
                row[f"{name} / stock {mode}"] = round(row[f"{name} {mode} ms"] / row[f"stock {mode} ms"], 3)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="scripts.gpu_transformers", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    parser.add_argument("--seq", type=int, default=4096, help="tokens")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per candidate and mode")
    parser.add_argument("--small", action="store_true", help="tiny shapes on any device (checks the script)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq = 64 if args.small else args.seq
    print("peers:", peers.unpack(), peers.versions(), file=sys.stderr)
    rows = []
    for bench in (qwen3_attention, qwen2_5_vl_mrope):
        try:
            rows.append(bench(seq, args.small, args.repeat, device))
        except Exception as error:  # noqa: BLE001 - one failure does not hide the other timing
            rows.append({"case": bench.__name__, "error": f"{type(error).__name__}: {error}"})
        print(json.dumps(rows[-1], indent=1))
    if args.out is not None:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                       "torch": torch.__version__, "rows": rows}, f, indent=1)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
