"""What the compiled kernels look like on an H100/H200, without a GPU: ``python -m scripts.kernel_static``.

:func:`compile_launch` compiles a launch plan (``axial_rope/ops/_triton_launch.py``) for
sm_90 with Triton's own argument binder, so the specialisation is the one a real launch
of the same tensors gets (16-divisible integers and 16-byte aligned pointers marked,
integers equal to 1 made constants; nothing forced). :func:`sass_facts` reads the cubin
with the ``cuobjdump`` Triton bundles: registers, spills, shared memory, barriers and the
width of every global load and store. The plans are made on ``meta`` tensors (shapes and
strides, no memory), so the benchmark shapes cost nothing. ``tests/test_kernels_static.py``
asserts on these facts; ``scripts/roofline.py`` turns them into predicted bandwidth.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

SM90 = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


@dataclass
class Facts:
    """The compiled kernel of one launch, as read from its SASS."""

    registers: int
    spill_bytes: int  # local memory per thread (register spills, stack arrays)
    shared_bytes: int
    barriers: int  # BAR.SYNC / BAR.RED instructions
    loads: dict[int, int] = field(default_factory=dict)  # global load width in bytes -> instructions
    stores: dict[int, int] = field(default_factory=dict)
    sass: str = ""

    @property
    def min_load_bytes(self) -> int:
        return min(self.loads, default=0)

    @property
    def min_store_bytes(self) -> int:
        return min(self.stores, default=0)


def compile_launch(launch, target: GPUTarget = SM90):
    """Compile ``launch.kernel`` for ``target`` with exactly the specialisation of ``launch()`` (no GPU needed)."""
    kernel = launch.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.meta)
    options, signature, constexprs, attrs = kernel._pack_args(backend, launch.meta, bound, specialization, options)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=target, options=options.__dict__)


# SASS memory instructions: LDG.E.128 (16 bytes), LDG.E.64, LDG.E (4), LDG.E.U16 (2), STG.E.128 ...
_WIDTH = {"128": 16, "64": 8, "": 4, "U16": 2, "S16": 2, "U8": 1, "S8": 1}
_MEMORY = re.compile(r"\b(LDG|STG)\.E((?:\.[A-Z0-9]+)*)")


def _width(suffixes: str) -> int:
    parts = [p for p in suffixes.split(".") if p and p not in ("CONSTANT", "EF", "EL", "LU", "STRONG", "GPU", "SYS")]
    widths = [_WIDTH[p] for p in parts if p in _WIDTH]
    return widths[0] if widths else 4


def sass_facts(compiled) -> Facts:
    """Registers, spills, shared memory, barriers and global access widths of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        usage = _tool("cuobjdump", "--dump-resource-usage", f.name)
        sass = _tool("cuobjdump", "-sass", f.name)
    finally:
        os.remove(f.name)
    facts = Facts(
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        spill_bytes=int(re.search(r"LOCAL:(\d+)", usage).group(1)),
        shared_bytes=int(re.search(r"SHARED:(\d+)", usage).group(1)) + compiled.metadata.shared,
        barriers=len(re.findall(r"\bBAR\.(?:SYNC|RED)", sass)),
        sass=sass,
    )
    for op, suffixes in _MEMORY.findall(sass):
        table = facts.loads if op == "LDG" else facts.stores
        width = _width(suffixes)
        table[width] = table.get(width, 0) + 1
    return facts


_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", re.MULTILINE)


def path_instructions(sass: str) -> int:
    """Instructions on the longest path from the entry to an EXIT: what one thread executes at most.

    The kernels have no loops, so the code is a DAG of forward branches (the q and k
    branches of a program are alternatives, counted once). A backward branch ends a path.
    """
    code = [(int(a, 16), bool(pred), op, rest) for a, pred, op, rest in _INSTRUCTION.findall(sass)]
    index = {address: i for i, (address, *_) in enumerate(code)}
    longest = [0] * (len(code) + 1)
    for i in range(len(code) - 1, -1, -1):
        address, predicated, op, rest = code[i]
        successors = [] if op == "EXIT" and not predicated else [i + 1]
        if op.startswith("BRA"):
            target = re.search(r"0x([0-9a-f]+)", rest)
            target = index.get(int(target.group(1), 16)) if target else None
            successors = [i + 1] if predicated else []
            if target is not None and target > i:
                successors.append(target)
        longest[i] = 1 + max((longest[j] for j in successors), default=0)
    return longest[0] if code else 0


def _tool(name: str, *args: str) -> str:
    return subprocess.run([os.path.join(BIN, name), *args], capture_output=True, text=True, check=True).stdout


def facts_of(launch, target: GPUTarget = SM90) -> Facts:
    return sass_facts(compile_launch(launch, target))


# -- the benchmark shapes, planned on meta tensors -----------------------------------------------------

KERNELS = ("rope", "rope_inplace", "rope_table", "norm_rope", "norm_rope_bwd", "freqs_grad")


def bench_launches(
    key: str, layout: str = "bhsd", dtype=None, *, n_sm: int | None = 132, tiles: dict | None = None, device="meta"
) -> dict:
    """Launch plans of every kernel for benchmark shape ``key`` of ``scripts/bench.py`` (tensors on ``meta``).

    ``tiles``: kernel name -> :class:`~axial_rope.ops._triton_launch.Tile` to plan with
    instead of the policy's choice. ``device="cuda"``: random tensors there, real launches
    (``n_sm=None``: the GPU's own SM count).
    """
    import torch

    import axial_rope as ar
    from axial_rope.ops import _triton_launch as plans

    from .bench import SHAPES

    shape, dtype, tiles = SHAPES[key], dtype or torch.bfloat16, tiles or {}
    seq = len(ar.grid(*shape.grid))
    size = lambda h: (
        (shape.batch, h, seq, shape.head_dim) if layout == "bhsd" else (shape.batch, seq, h, shape.head_dim)
    )
    make = torch.empty if device == "meta" else torch.randn
    q, k = (make(size(h), device=device, dtype=dtype) for h in (shape.heads, shape.kv_heads))
    qo, ko, w = torch.empty_like(q), torch.empty_like(k), torch.ones(shape.head_dim, device=device, dtype=dtype)
    rope = ar.AxialRoPE(shape.axes_dim, pairing=shape.pairing)
    freqs, scale = rope.frequencies()
    freqs, scale = freqs.to(device), (None if bool((scale == 1).all()) else scale.to(device))  # as AxialRoPE passes
    pos = ar.grid(*shape.grid)[None].to(device)
    angles = (pos, freqs, scale, shape.pairing == "interleaved", layout)
    opts = lambda name: dict(tile=tiles.get(name.removesuffix("_inplace")), n_sm=n_sm)
    cos, sin = (t[None].to(device, torch.float32) for t in rope.cos_sin(ar.grid(*shape.grid)))  # [1, S, rot_dim]
    half = shape.pairing == "half"
    planes = lambda t: (t[..., : t.shape[-1] // 2] if half else t[..., 0::2]).unsqueeze(1 if layout == "bhsd" else 2)
    return {
        "rope": plans.plan_rope(q, k, qo, ko, *angles, False, **opts("rope")),
        "rope_inplace": plans.plan_rope(q, k, q, k, *angles, False, **opts("rope_inplace")),
        "rope_table": plans.plan_rope_table(
            q, qo, planes(cos), planes(sin), not half, layout, False, **opts("rope_table")
        ),
        "norm_rope": plans.plan_norm_rope(q, k, w, w, qo, ko, 1e-6, *angles, **opts("norm_rope")),
        "norm_rope_bwd": plans.plan_norm_rope_bwd(qo, ko, q, k, w, w, qo, ko, 1e-6, *angles, **opts("norm_rope_bwd")),
        "freqs_grad": plans.plan_freqs_grad(q, k, qo, ko, *angles, **opts("freqs_grad")),
    }


def tile_of(launch) -> dict:
    """The tile a launch runs: programs, heads x tokens, warps, and per thread: padded elements, 16-byte loads."""
    meta = launch.meta
    row = 2 * meta["BLOCK_N"] + (meta["BLOCK_R"] if meta.get("BLOCK_R", 1) > 1 else 0)
    threads = 32 * meta["num_warps"]
    elements = meta["HEADS"] * meta["BLOCK_S"] * row / threads
    x = launch.args[0]
    vec_bytes = meta["VEC"] * x.element_size()
    return dict(
        programs=launch.grid[0] * launch.grid[1] * launch.grid[2],
        heads=meta["HEADS"],
        block_s=meta["BLOCK_S"],
        warps=meta["num_warps"],
        vec_bytes=vec_bytes,
        elements_per_thread=elements,
        # a tile's loads are all issued before any use: vectors in flight per thread, per input tile
        loads_in_flight=elements * x.element_size() / vec_bytes * meta["D"] / row,
    )


def main() -> None:
    for key in ("video", "llm", "dit"):
        for name, launch in bench_launches(key).items():
            f = facts_of(launch)
            print(f"{key:6} {name:14} {tile_of(launch)} regs={f.registers} spills={f.spill_bytes} "
                  f"smem={f.shared_bytes} barriers={f.barriers} loads={f.loads} stores={f.stores}")  # fmt: skip


if __name__ == "__main__":
    main()
