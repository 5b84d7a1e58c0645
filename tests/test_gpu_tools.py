"""The tools of the GPU run, on CPU: the benchmark script, the kernel sweep's dry run, the peers loader.

``scripts/gpu_check.sh`` runs them on an H100/H200; here they run on CPU stand-ins so a broken
report or sweep is found before a GPU is spent on it.
"""

from __future__ import annotations

import json
import sys

import pytest

SHAPES = ("video", "llm", "dit")


def _compiler():
    """Skip unless this process can compile for sm_90 (triton importable, not loaded for the interpreter)."""
    pytest.importorskip("triton")
    from axial_rope.ops import _triton_launch as plans

    if plans.INTERPRETED:
        pytest.skip("this process imported the kernels for the interpreter")
    return plans


def test_bench_writes_json_markdown_and_chart(tmp_path):
    from scripts import bench

    bench.main(["--small", "--shapes", "dit", "--modes", "forward,backward", "--providers", "tables,in place"]
               + ["--repeat", "1", "--out", str(tmp_path)])  # fmt: skip
    result = json.loads((tmp_path / "bench" / "cpu-small.json").read_text())
    rows = {(r["mode"], r["provider"]): r for r in result["rows"]}
    assert rows["forward", "copy"]["x_copy"] == 1.0
    assert rows["backward", "axial_rope torch (tables)"]["median_ms"] > 0
    assert rows["forward", "axial_rope torch (in place)"]["median_ms"] > 0  # in place: forward (inference) only
    assert ("backward", "axial_rope torch (in place)") not in rows
    assert (tmp_path / "img" / "bench_cpu-small.png").stat().st_size > 1000
    page = (tmp_path / "benchmarks.md").read_text()
    assert "| DiT-XL/2 (small) | forward | axial_rope torch (tables) |" in page
    assert "img/bench_cpu-small.png" in page and result["machine"]["torch"] in page


def test_kernel_sweep_dry_run_writes_json_and_markdown(tmp_path):
    _compiler()
    from scripts import kernel_sweep

    kernel_sweep.main(["--dry-run", "--shapes", "dit", "--kernels", "rope", "--limit", "2", "--workers", "1",
                       "--out", str(tmp_path)])  # fmt: skip
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["spills"] == 0 and r["registers"] > 0 for r in rows)
    assert "| dit | rope |" in (tmp_path / "sweep.md").read_text()


def test_kernel_sweep_tiles_cover_the_policy_and_fit_the_shapes():
    plans = _compiler()
    from scripts.kernel_static import bench_launches
    from scripts.kernel_sweep import KERNELS, tiles

    for shape in SHAPES:
        launches = bench_launches(shape)
        for kernel in KERNELS:
            grid = tiles(shape, kernel)
            policy = plans.Tile(launches[kernel].meta["BLOCK_S"], launches[kernel].meta["HEADS"], 4)
            assert policy in grid, (shape, kernel)
            assert all(t.block_s >= 1 and t.heads in (1, 2, 4, 8) for t in grid)


def test_peers_load_from_carried_archives():
    from scripts import peers

    if not any(peers.PEERS.glob("*.whl")) or not any(peers.PEERS.glob("flash_attn-*.tar.gz")):
        pytest.skip(f"no peer archives in {peers.PEERS} (see scripts/peers.py)")
    site = peers.unpack()
    flash = peers.load("flash_attn.ops.triton.rotary", site)
    assert callable(flash.apply_rotary)
    assert callable(peers.load("liger_kernel.ops.rope", site).LigerRopeFunction.apply)
    assert "flash_attn" not in sys.modules  # loaded privately: no library believes flash-attn is installed
    assert peers.load("no_such.module", site).startswith("not carried")


def test_cache_bench_records_the_roll_the_recomputation_and_the_bytes_moved(tmp_path):
    from scripts import bench_cache

    path = tmp_path / "cache.json"
    bench_cache.main(["--tokens", "64", "--heads", "2", "--head-dim", "16", "--shift", "8", "--evict", "4",
                      "--repeat", "1", "--device", "cpu", "--json", str(path)])  # fmt: skip
    data = json.loads(path.read_text())
    roll = data["roll"]
    assert roll["roll_bytes"] == 12 * (64 - 4 - 8) * 2 * 16 * 4  # 12 passes over the kept float32 entries
    assert roll["roll_s"] > 0 and roll["recompute_over_roll"] > 0 and set(data["decode"]["step_s"]) == {
        "static", "rolling", "rolling, evict 4"}  # fmt: skip


def test_qk_rotation_bench_times_every_provider_against_its_baseline(tmp_path):
    # gpu_check.sh step 10: issue 44's rotations against the shared kernel; here the CPU dry run of every provider
    from scripts import bench_qk_rotation

    path = tmp_path / "qk.json"
    bench_qk_rotation.main(["--small", "--device", "cpu", "--dtype", "float32", "--repeat", "1", "--json", str(path)])
    rows = json.loads(path.read_text())
    providers = {"shared", "key positions", "key amplitude", "per-head F", "shared tables", "per-head tables", "copy"}
    for mode in ("forward", "forward+backward"):
        got = {r["provider"]: r for r in rows if r["mode"] == mode}
        assert set(got) == providers
        assert all(r["median_ms"] > 0 and r["gbps"] > 0 for r in got.values())
        assert got["key positions"]["x_shared"] > 0 and got["per-head tables"]["x_shared_tables"] > 0
