"""The compiled code of the Triton kernels for an H100 (sm_90), read without a GPU.

Each kernel is compiled exactly as a real launch of the benchmark shapes would compile it:
the launch plans of ``axial_rope/ops/_triton_launch.py`` are made on ``meta`` tensors with
the benchmarks' shapes and strides (``bhsd``, bf16), and Triton's own argument binder
specialises them (nothing forced divisible). ``scripts/kernel_static.py`` reads the cubin
with the ``cuobjdump`` Triton bundles. Compiles are cached by Triton, so reruns are quick.

Shapes (``scripts/bench.py``): 720p video latent (1 x 17550 tokens, 24 + 24 heads of 128,
interleaved), LLM 32k GQA (1 x 32768, 32 + 8 heads of 128, half pairs), DiT-XL/2 (8 x 256,
16 + 16 heads of 72, interleaved: a head stride of 72 elements is not divisible by 16).
"""

from __future__ import annotations

import functools

import pytest

triton = pytest.importorskip("triton")

from axial_rope.ops import _triton_launch as plans  # noqa: E402

if plans.INTERPRETED:
    pytest.skip("this process imported the kernels for the interpreter", allow_module_level=True)

from scripts.kernel_static import bench_launches, facts_of, path_instructions, tile_of  # noqa: E402
from scripts.roofline import GPUS, occupancy, predict  # noqa: E402

SHAPES = ("video", "llm", "dit")


@functools.cache
def _launches(shape: str, layout: str = "bhsd") -> dict:
    return bench_launches(shape, layout)


@functools.cache
def _facts(shape: str, kernel: str, layout: str = "bhsd"):
    return facts_of(_launches(shape, layout)[kernel])


def _data_vectors(shape: str, kernel: str) -> int:
    """16-byte vectors of one input tile per thread (masked lanes of a head dim of 72 included)."""
    tile = tile_of(_launches(shape)[kernel])
    return int(tile["elements_per_thread"] * 2 // 16)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kernel", ["rope", "rope_inplace"])
def test_rotation_moves_16_byte_vectors_without_barriers_or_spills(kernel, shape, layout):
    facts = _facts(shape, kernel, layout)
    launch = _launches(shape, layout)[kernel]
    assert launch.meta["VEC"] == 8  # 8 bf16 = 16 bytes, also for a head stride of 72
    assert set(facts.stores) == {16}  # every store is a 16-byte vector
    assert 2 not in facts.loads and facts.loads.get(16, 0) >= _data_vectors(shape, kernel)  # no 2-byte scalar
    assert facts.spill_bytes == 0
    # each thread stores exactly the elements it loaded: no exchange, so in place needs no barrier either
    assert facts.barriers == 0 and facts.shared_bytes == 0
    assert facts.registers <= 64  # >= 8 programs of 4 warps per SM (32 warps resident)


@pytest.mark.parametrize("shape", SHAPES)
def test_rotation_issues_a_whole_tile_of_loads_before_the_trigonometry(shape):
    # all 16-byte loads of the program's q/k tile are in flight before the first sin/cos: the
    # latency of one load round trip covers the tile (and the angle math overlaps it)
    sass = _facts(shape, "rope").sass
    before_trig = sass[: sass.index("MUFU")]
    assert before_trig.count("LDG.E.128") >= _data_vectors(shape, "rope")


@pytest.mark.parametrize("shape", SHAPES)
def test_tiles_keep_every_gpu_busy_with_heads_in_registers(shape):
    for kernel in ("rope", "norm_rope", "norm_rope_bwd"):
        launch = _launches(shape)[kernel]
        tile, facts = tile_of(launch), _facts(shape, kernel)
        per_sm = occupancy(facts.registers, tile["warps"], facts.shared_bytes)
        assert per_sm >= 7, (kernel, facts.registers)
        assert tile["programs"] >= 8 * 132  # at least 8 programs per SM of a 132-SM GPU
        if shape != "dit":  # large shapes: many waves, so the last one is a small fraction
            assert tile["programs"] / (132 * per_sm) >= 15
        # all warps along the tokens, so a thread holds every head of its (token, plane) pairs
        meta = launch.meta
        lanes = (meta["BLOCK_N"] * (2 if meta["INTERLEAVED"] else 1)) // meta["VEC"]  # threads across one row load
        assert meta["BLOCK_S"] >= tile["warps"] * max(1, 32 // lanes)


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_norm_forward_needs_no_barrier(shape):
    facts = _facts(shape, "norm_rope")
    assert set(facts.stores) == {16} and facts.loads.get(16, 0) >= _data_vectors(shape, "norm_rope")
    assert facts.spill_bytes == 0 and facts.barriers == 0 and facts.shared_bytes == 0
    assert facts.registers <= 80


@pytest.mark.parametrize("shape", SHAPES)
def test_norm_backward_reduces_the_weight_gradient_once_per_program(shape):
    # dw accumulates over the program's heads in registers, then one reduction over its tokens;
    # the SASS holds a q and a k branch, each with at most one reduction and its exchange
    facts = _facts(shape, "norm_rope_bwd")
    assert facts.spill_bytes == 0 and facts.registers <= 80
    assert facts.barriers <= 10
    assert facts.stores.get(16, 0) >= 2 and facts.stores.get(4, 0) <= 2  # dq/dk vectors, one dw row store


@pytest.mark.parametrize("shape", SHAPES)
def test_table_variant_and_freqs_gradient_compile_lean(shape):
    table = _facts(shape, "rope_table")
    assert set(table.stores) == {16} and table.spill_bytes == 0
    assert table.barriers <= 4  # the table tile is loaded in its own layout and exchanged once
    grad = _facts(shape, "freqs_grad")
    assert grad.spill_bytes == 0 and grad.barriers <= 6 and grad.registers <= 64  # one reduction per program


def test_unaligned_rows_fall_back_to_scalar_accesses():
    # a view starting one element into its buffer: no 16-byte alignment, so VEC = 1 (and correct)
    import torch

    import axial_rope as ar

    buf = torch.empty(1, 64, 4, 73, device="meta", dtype=torch.bfloat16)
    q = buf[..., 1:]  # head dim 72, every row 1 element past a 16-byte boundary
    rope = ar.AxialRoPE((36, 36))
    freqs, scale = rope.frequencies()
    launch = plans.plan_rope(q, None, torch.empty_like(q), None, ar.grid(8, 8)[None], freqs, scale, True, "bshd", False)
    assert launch.meta["VEC"] == 1
    facts = facts_of(launch)
    assert 2 in facts.loads and facts.spill_bytes == 0


def test_roofline_predicts_85_percent_of_peak_for_video_and_llm():
    for shape in ("video", "llm"):
        launch = _launches(shape)["rope"]
        for gpu in GPUS.values():
            prediction = predict(launch, _facts(shape, "rope"), gpu, "rope")
            assert prediction["pct_peak"] >= 85, (shape, gpu.name, prediction)
            assert prediction["bound"] == "memory"


def test_longest_path_counts_one_of_two_branches():
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/               @P0 BRA 0x0040 ;
        /*0020*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0030*/                   EXIT ;
        /*0040*/                   IADD3 R1, R1, 0x2, RZ ;
        /*0050*/                   IADD3 R1, R1, 0x3, RZ ;
        /*0060*/                   EXIT ;
        /*0070*/                   BRA 0x0070;
    """
    assert path_instructions(sass) == 5  # MOV, BRA, 2 x IADD3, EXIT
