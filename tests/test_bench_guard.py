"""The speed guard's benchmark (scripts/bench_guard.py) on one round: every peer rotates as ours (a wrong pairing or
layout shows as an O(1) error), the ratios and the page's section are written. No speed is asserted."""

from __future__ import annotations

import json

import pytest


def test_guard_bench_times_every_provider_and_checks_their_rotation(tmp_path):
    from scripts import bench_guard, bench_report

    path = tmp_path / "bench" / "guard" / "cpu.json"
    bench_guard.main(["--cases", "dit", "--rounds", "1", "--sample-ms", "1", "--no-compile", "--json", str(path)])
    result = json.loads(path.read_text())
    rows = {r["provider"]: r for r in result["rows"]}
    assert set(rows) == {"copy", "ours (positions)", "ours (tables)", "diffusers apply_rotary_emb",
                         "comfy-kitchen apply_rope (eager)", "rotary-embedding-torch"}  # fmt: skip
    assert rows["copy"]["x_copy"] == 1.0
    for name, row in rows.items():
        if "skipped" in row:
            assert "pip install" in row["skipped"] and name not in ("ours (positions)", "ours (tables)")
            continue
        assert row["median_ms"] > 0 and row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert row["max_err"] < 2e-2, (name, row["max_err"])  # bf16 rounding of values of a few units
    assert rows["diffusers apply_rotary_emb"]["x_diffusers"] == pytest.approx(1.0)
    assert len(result["verdicts"]) == 1 and result["verdicts"][0].startswith("DiT-XL/2: ours (positions)")
    bench_report.write_markdown(tmp_path)
    page = (tmp_path / "benchmarks.md").read_text()
    assert "## Speed guard: small eager shapes" in page and "| DiT-XL/2 B8 S256 H16 D72 | ours (tables) |" in page
