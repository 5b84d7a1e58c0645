"""Bad input gets a ValueError/TypeError that names the argument; backend choice is explicit and loud."""

from __future__ import annotations

import pytest
import torch

import axial_rope as ar
from axial_rope import ops
from axial_rope.scaling import NTK, Linear, YaRN

q4 = torch.zeros(1, 6, 4, 16)
CALL = ops.backend.Call("rotate_qk", q4.device, q4.dtype)
k2 = torch.zeros(1, 6, 2, 16)
pos2 = ar.grid(2, 3)
rope2 = ar.AxialRoPE((8, 8))
cos, sin = rope2.cos_sin(pos2)

CASES = [
    # (id, call, exception, message fragment)
    ("odd axis dim", lambda: ar.AxialRoPE((8, 7)), ValueError, "axes_dim"),
    ("zero axis dim", lambda: ar.AxialRoPE((0, 8)), ValueError, "axes_dim"),
    ("rot_dim over head_dim", lambda: ar.AxialRoPE((16, 8))(q4, k2, pos2), ValueError, "rot_dim"),
    ("pos wrong axes", lambda: rope2(q4, k2, ar.grid(6)), ValueError, "pos must be"),
    ("pos 1-D for 2 axes", lambda: rope2(q4, k2, torch.arange(6.0)), ValueError, "pos must be"),
    ("pos bool dtype", lambda: rope2(q4, k2, pos2.bool()), TypeError, "pos"),
    ("pos complex dtype", lambda: rope2(q4, k2, pos2.to(torch.complex64)), TypeError, "pos"),
    ("pos not a tensor", lambda: rope2(q4, k2, [[0, 0]] * 6), TypeError, "pos"),
    ("pos NaN", lambda: rope2(q4, k2, pos2.clone().fill_(float("nan"))), ValueError, "NaN or inf"),
    ("pos inf", lambda: rope2(q4, k2, pos2 + float("inf")), ValueError, "NaN or inf"),
    ("pos length", lambda: rope2(q4, k2, ar.grid(2, 2)), ValueError, "positions"),
    ("pos batch", lambda: rope2(q4, k2, pos2.expand(3, 6, 2)), ValueError, "batch"),
    ("theta zero", lambda: ar.inv_freq(8, 0.0), ValueError, "theta"),
    ("theta negative per axis", lambda: ar.AxialRoPE((8, 8), theta=(100.0, -1.0)), ValueError, "theta"),
    ("theta tuple length", lambda: ar.AxialRoPE((8, 8), theta=(1.0, 2.0, 3.0)), ValueError, "theta"),
    ("theta tuple with split", lambda: ar.AxialRoPE((8, 8), theta=(1.0, 2.0), spectrum="split"), ValueError, "theta"),
    ("factor zero", lambda: Linear(0.0), ValueError, "factor"),
    ("factor negative", lambda: NTK(-2.0), ValueError, "factor"),
    ("factor nan", lambda: YaRN(float("nan"), 64), ValueError, "factor"),
    ("odd dim", lambda: ar.inv_freq(7), ValueError, "dim"),
    ("scaling wrong type", lambda: ar.inv_freq(8, scaling="yarn"), TypeError, "scaling"),
    ("scaling wrong type module", lambda: ar.AxialRoPE(8, scaling=2.0), TypeError, "scaling"),
    ("unknown pairing", lambda: ar.AxialRoPE(8, pairing="rotate_half"), ValueError, "pairing"),
    ("unknown spectrum", lambda: ar.AxialRoPE(8, spectrum="mixed"), ValueError, "spectrum"),
    ("unknown layout", lambda: rope2(q4, k2, pos2, layout="bsd"), ValueError, "layout"),
    ("unknown layout table", lambda: ar.apply_rope(q4, cos, sin, layout="sbhd"), ValueError, "layout"),
    ("unknown pairing table", lambda: ar.apply_rope(q4, cos, sin, pairing="neox"), ValueError, "pairing"),
    ("unknown backend", lambda: rope2(q4, k2, pos2, backend="cuda"), ValueError, "backend"),
    ("unknown backend table", lambda: ar.apply_rope(q4, cos, sin, backend="fast"), ValueError, "backend"),
    ("head_dim mismatch", lambda: rope2(q4, torch.zeros(1, 6, 2, 18), pos2), ValueError, "head_dim"),
    ("heads not dividing", lambda: rope2(q4, torch.zeros(1, 6, 3, 16), pos2), ValueError, "divide"),
    ("q 3-D", lambda: rope2(q4[0], None, pos2), ValueError, "4-D"),
    ("q int dtype", lambda: rope2(q4.long(), None, pos2), TypeError, "q"),
    ("table wider than head", lambda: ar.apply_rope(q4, *ar.AxialRoPE((8, 16)).cos_sin(pos2)), ValueError, "r=24"),
    ("table odd width", lambda: ar.apply_rope(q4, cos[:, :7], sin[:, :7]), ValueError, "even"),
    ("table empty", lambda: ar.apply_rope(q4, cos[:, :0], sin[:, :0]), ValueError, "r=0"),
    ("table positions", lambda: ar.apply_rope(q4, cos[:4], sin[:4]), ValueError, "positions"),
    ("table shapes differ", lambda: ar.apply_rope(q4, cos, sin[:, :8]), ValueError, "same shape"),
    ("table 1-D", lambda: ar.apply_rope(q4, cos[0], sin[0]), ValueError, r"\[S, r\]"),
    ("table int", lambda: ar.apply_rope(q4, cos.long(), sin.long()), TypeError, "cos"),
    ("num_heads without learnable", lambda: ar.AxialRoPE(8, num_heads=2), ValueError, "num_heads"),
    ("riflex k too large", lambda: ar.inv_freq(8, scaling=ar.scaling.RIFLEx(5, 20)), ValueError, "k=5"),
    ("longrope length", lambda: ar.inv_freq(8, scaling=ar.scaling.LongRoPE([1.0], [2.0], 64)), ValueError, "entries"),
    ("llama3 factors order", lambda: ar.scaling.Llama3(8.0, 8192, 4.0, 1.0), ValueError, "high_freq_factor"),
]


@pytest.mark.parametrize("call,exc,match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_clear_error(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_environment_variable_chooses_backend(monkeypatch):
    monkeypatch.setenv("AXIAL_ROPE_BACKEND", "reference")
    assert ops.select_backend(None, CALL).name == "reference"
    # the argument wins over the environment
    assert ops.select_backend("torch", CALL).name == "torch"
    monkeypatch.setenv("AXIAL_ROPE_BACKEND", "fastest")
    with pytest.raises(ValueError, match="AXIAL_ROPE_BACKEND"):
        rope2(q4, k2, pos2)


def test_automatic_choice_on_cpu_is_torch(monkeypatch):
    monkeypatch.delenv("AXIAL_ROPE_BACKEND", raising=False)
    assert ops.select_backend(None, CALL).name == "torch"


def test_explicit_backend_that_cannot_run_raises_with_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="backend 'triton'.*cannot run rotate_qk: .+"):
        rope2(q4, k2, pos2, backend="triton")
    monkeypatch.setenv("AXIAL_ROPE_BACKEND", "triton")
    with pytest.raises(RuntimeError, match="AXIAL_ROPE_BACKEND"):
        ar.apply_rope(q4, cos, sin)
