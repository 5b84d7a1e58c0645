"""The RoPE doctor on every served diffusers family's tiny model (no false alarm), and on Flux tables broken two
ways, where only the family record's layout shows what the tables are (no plane tables to read angles from)."""

from __future__ import annotations

import pytest
import torch

from axial_rope.conventions._registry import DIFFUSERS
from axial_rope.doctor import doctor

diffusers = pytest.importorskip("diffusers")
from models.tiny_diffusers import TINY, build  # noqa: E402  (after the skip: it imports diffusers)


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_served_family_raises_no_alarm(name):
    model, inputs = build(name)
    report = doctor(model, example_inputs=inputs)
    assert report.healthy, str(report)
    family = DIFFUSERS[type(model).__name__]
    if family.positions is not None:  # a record that derives the tables from inputs: every site was compared
        assert report.sites and all(s.error <= s.bound for s in report.sites), str(report)


def _flux():
    model, inputs = build("flux")
    return model, inputs


def test_flux_tables_of_another_theta_are_named_with_it():
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    model, inputs = _flux()
    model.pos_embed = FluxPosEmbed(theta=1000, axes_dim=list(model.pos_embed.axes_dim))  # the config says 10000
    (finding,) = doctor(model, example_inputs=inputs).alarms
    assert finding.kind == "wrong_theta", finding
    # found by a scan and golden-section search of log(theta) on the float32 tables: to their precision
    assert finding.evidence["theta_found"] == pytest.approx(1000.0, rel=1e-3)


def test_flux_tables_laid_out_for_the_other_pairing_are_named():
    model, inputs = _flux()
    stock = model.pos_embed.forward

    def rotate_half_tables(ids):  # the same angles, laid out (j, j + D/2) for a processor pairing (2j, 2j + 1)
        return tuple(torch.cat([t[..., 0::2], t[..., 0::2]], dim=-1) for t in stock(ids))

    model.pos_embed.forward = rotate_half_tables
    (finding,) = doctor(model, example_inputs=inputs).alarms
    assert (finding.kind, finding.evidence["pairing_found"]) == ("wrong_pairing", "half"), finding
