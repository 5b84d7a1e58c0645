"""The RoPE doctor names each public incident, rebuilt as a seeded defect on a tiny transformers model, and the
confusion table of docs/doctor.md is the one the code gives. Also the pieces the names rest on: the pairing read
off q and k, the frequencies fitted from tables, the bfloat16 grid, each against an independent construction."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch

import axial_rope as ar
from axial_rope.doctor import CLASSES, doctor
from axial_rope.doctor.diagnose import fitted_theta
from axial_rope.doctor.observe import fit_frequencies, qk_rotation
from models.tiny_defects import DEFECTS, HEALTHY, confusion_table, seeded

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _report(defect, model=None):
    with seeded(defect, model) as (net, inputs):
        return doctor(net, example_inputs=inputs)


def _alarms(defect, model=None) -> frozenset[str]:
    return frozenset(f.kind for f in _report(defect, model).alarms)


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_each_seeded_incident_is_named_by_its_class_alone(defect):
    report = _report(defect)
    assert {f.kind for f in report.alarms} == {defect.expected}, str(report)
    assert all(f.evidence for f in report.alarms)  # every alarm carries the numbers that triggered it


@pytest.mark.parametrize("name", ["llama-llama3", "qwen2_vl-yarn", "gpt_neox", "llama-yarn"])
def test_the_models_the_defects_break_are_healthy_before(name):
    assert _alarms(None, name) == frozenset(), str(_report(None, name))


def test_the_evidence_holds_the_numbers_of_the_incident():
    (finding,) = _report(next(d for d in DEFECTS if d.expected == "wrong_theta")).alarms
    # the seeded rotary uses 1e6: the search over log(theta) lands on it to the float32 tables' precision
    assert finding.evidence["theta_config"] == 1e4
    assert finding.evidence["theta_found"] == pytest.approx(1e6, rel=1e-4)
    report = _report(next(d for d in DEFECTS if d.expected == "partial_rotary_width"))
    (finding,) = report.alarms
    assert (finding.evidence["width_found"], finding.evidence["width_config"]) == (32, 8)  # head 32, factor 0.25
    # tables of another width have no finite error: strict JSON still (null)
    sites = json.loads(report.to_json())["sites"]
    assert sites[0]["error"] is None and report.sites[0].error == float("inf")


def test_docs_hold_the_confusion_table_the_code_gives():
    page = (ROOT / "docs" / "doctor.md").read_text()
    table = confusion_table(_alarms)
    assert table in page, "docs/doctor.md: regenerate the table with python -m scripts.doctor_page"
    for row in table.splitlines()[2:]:  # each defect's row marks its own class, and no other
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[1] == "-":
            assert not any(cells[2:]) and f"none ({len(HEALTHY)} healthy" in row, row  # the healthy: no alarm
            continue
        marked = [k for k, c in zip(CLASSES, cells[2:]) if c == "x"]
        assert marked == [cells[1].strip("`")], row


def test_pairing_read_off_q_and_k_is_the_one_that_rotated_them():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 3, 8, generator=gen, dtype=torch.float64)
    pos = torch.arange(5.0)[:, None] + 10
    for pairing in ("half", "interleaved"):
        rope = ar.AxialRoPE(8, theta=100.0, pairing=pairing)
        fit = qk_rotation(q, rope.rotate(q, pos, layout="bshd"), 8)
        assert fit.pairing == pairing
        # the angles read off q equal the rope's own (float64 rotation: rounding only)
        expected = torch.remainder(pos * rope.freqs[0] + math.pi, 2 * math.pi) - math.pi
        torch.testing.assert_close(fit.angles, expected[None].expand(2, -1, -1), rtol=0, atol=1e-12)


def test_frequencies_fitted_from_wrapped_angles_give_back_theta():
    # angles of a theta 5e5 spectrum at two offset rows of positions, wrapped into (-pi, pi]: the fit unwraps them
    rope = ar.AxialRoPE(32, theta=5e5)
    pos = torch.cat([torch.arange(12.0) + 300, torch.arange(12.0) + 700]).view(2, 12, 1).double()
    angles = torch.remainder(pos * rope.freqs[0] + math.pi, 2 * math.pi) - math.pi
    freqs = fit_frequencies(angles, pos)
    # float64 angles up to 711 rad: the least squares recover F to about 1e-13 relative at the fast end; the slow
    # planes turn by 1e-7 rad per position, so their relative error is larger (1e-9 here)
    torch.testing.assert_close(freqs[0], rope.freqs[0], rtol=1e-8, atol=0)
    assert fitted_theta(freqs, (32,), [0] * 16) == pytest.approx(5e5, rel=1e-9)
