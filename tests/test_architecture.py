"""The walkthroughs of docs/architecture.md are true: a new scaling method is one class."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

import axial_rope as ar
from axial_rope import scaling


def test_a_new_scaling_method_is_one_class(monkeypatch):
    monkeypatch.setattr(scaling, "REGISTRY", dict(scaling.REGISTRY))  # keep the registry as it was

    @dataclass(frozen=True)
    class Halved(scaling.Scaling):
        """Every frequency halved past pair ``start`` (a toy method)."""

        rope_type = "halved"
        start: int

        def __call__(self, dim, theta, seq_len):
            inv = scaling.base_inv_freq(dim, theta)
            inv[self.start :] /= 2
            return inv, 1.0

    method = Halved(2)
    assert scaling.REGISTRY["halved"] is Halved
    assert scaling.from_dict(json.loads(json.dumps(method.to_dict()))) == method
    assert scaling.from_rope_parameters({"rope_type": "halved", "start": 2, "rope_theta": 100.0}) == method
    rope = ar.AxialRoPE(8, scaling={"rope_type": "halved", "start": 2})
    expected = ar.inv_freq(8)[0]
    expected[2:] /= 2
    torch.testing.assert_close(rope.freqs[0], expected, rtol=0, atol=0)
