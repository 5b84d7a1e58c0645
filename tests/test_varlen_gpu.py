"""The CUDA paths of packed attention (axial_rope.varlen) and the packed DiT on CUDA (skipped without a GPU).

Run by ``scripts/gpu_check.sh`` (``-m gpu``). Each path against the definition, SDPA on each item
alone computed in float32 from the same inputs: float16/bfloat16 kernels to their dtype's tolerance,
FlexAttention in float32 to 1e-4; forward and backward, with grouped-query heads and causal masks.
The CPU tests of ``tests/test_varlen.py`` check the loop, dense and CPU FlexAttention paths to 1e-6.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_varlen import LENGTHS, _grads, _per_item

from axial_rope.varlen import Segments, choose_backend, varlen_attention

# Per element, absolute and relative. Half-precision kernels accumulate in float32 but round the softmax
# weights p to their dtype before p v (half an ulp: 2**-9 bfloat16, 2**-12 float16) and round the output:
# |error| <= 2**-9 max |v| + 2**-9 |out| (bfloat16; |v| < 4 here: 8e-3 + ...), within 2e-2, and 2**-12 of
# those for float16, within 2e-3. FlexAttention in float32 sums in other orders than SDPA: within
# helpers.chain_bound(U32, 64, 3) = 9e-5 of the scale, so 1e-4 (the 1e-5 once used sat below it).
# Gradients: 4x the forward's, an estimate (three chained products of the same kind), not a bound.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _inputs(dtype, heads=8, kv_heads=2, dim=64):
    gen = torch.Generator().manual_seed(0)
    T = sum(LENGTHS)
    return [
        torch.randn(T, h, dim, generator=gen).cuda().to(dtype).requires_grad_() for h in (heads, kv_heads, kv_heads)
    ]


def _available(backend: str, dtype) -> None:
    q = torch.empty(1, 1, 8, device="cuda", dtype=dtype)
    try:
        choose_backend(q, requires_grad=True, backend=backend)
    except RuntimeError as err:
        pytest.skip(str(err))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend, dtype",
    [("varlen", torch.bfloat16), ("varlen", torch.float16), ("flash_attn", torch.bfloat16), ("flex", torch.float32)],
)
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_path_equals_per_item_attention(backend, dtype, causal):
    _available(backend, dtype)
    q, k, v = _inputs(dtype)
    seg = Segments(LENGTHS, device="cuda")
    out = varlen_attention(q, k, v, seg, causal=causal, backend=backend)
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]  # the definition in float32
    ref = _per_item(*exact, causal)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    for a, b in zip(_grads(out, (q, k, v)), _grads(ref, exact)):
        torch.testing.assert_close(a.float(), b, atol=4 * tol, rtol=4 * tol)


@pytest.mark.gpu
def test_cuda_automatic_choice_is_a_varlen_kernel_for_half_precision():
    q = torch.empty(4, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    choice = choose_backend(q)
    assert choice.name in ("varlen", "flash_attn", "flex"), choice  # never the CPU loop on CUDA
    assert choose_backend(q.detach().float()).name in ("flex", "loop")  # float32: no varlen kernel takes it


@pytest.mark.gpu
def test_packed_dit_on_cuda_equals_each_image_alone():
    from models.dit import PRESETS, DiT

    torch.manual_seed(0)
    model = DiT(replace(PRESETS["tiny"], depth=2)).cuda().eval()
    xs = [torch.randn(3, h, w, device="cuda") for h, w in ((16, 48), (32, 32), (40, 24))]
    t, y = torch.tensor([500.0, 300.0, 900.0], device="cuda"), torch.tensor([0, 1, 2], device="cuda")
    with torch.no_grad():
        outs = model(xs, t, y, pos_mode="yarn")
        for i, x in enumerate(xs):
            alone = model(x[None], t[i : i + 1], y[i : i + 1], pos_mode="yarn")[0]
            torch.testing.assert_close(outs[i], alone, atol=1e-4, rtol=1e-4)
