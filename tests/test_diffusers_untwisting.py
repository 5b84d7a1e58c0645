"""Untwisting RoPE (arXiv 2602.05013) through the diffusers adapter: ``set_rope_processors(flux, untwisting=...)``.

FLUX.1 Kontext marks the reference image's ids with index 1 in their first column (``FluxKontextPipeline``); the
adapter's tables module then appends the keys' per-channel factor, ``s_d`` on the reference rows over the planes of
the grid axes ``(y, x)``, and our processor scales the rotated keys by it. Checked against the project page's
formula transcribed here in float64 (one attention module), exactly against installs that must agree with it, under
``torch.compile`` with the schedule read from each forward's ``timestep``, and its refusals.
"""

from __future__ import annotations

import pytest
import torch
from helpers import U32
from rotation_oracle import channels, planes

import axial_rope as ar
from axial_rope.methods import Untwisting

diffusers = pytest.importorskip("diffusers")

from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

NAME = "FluxTransformer2DModel"
HF, LF, BETA = (0.25, 0.75), (1.0, 1.5), 2.0  # at t = 0.5 both scales are exact binary fractions: 0.5 and 1.25


def _model():
    model, inputs = tiny.build(NAME, depth=1)
    inputs = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    ids = inputs["img_ids"].clone()
    ids[ids.shape[0] // 2 :, 0] = 1  # the second half of the image tokens: a reference image (Kontext's index 1)
    return model.double().eval(), dict(inputs, img_ids=ids)


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


def _page_scale(n: int, t: float) -> torch.Tensor:
    """The page's ``s_d`` for ``n`` planes from the axis' highest frequency, at noise level ``t`` (1 first step)."""
    progress = 1.0 - t
    s_hf = HF[0] + (HF[1] - HF[0]) * progress
    s_lf = LF[0] + (LF[1] - LF[0]) * progress
    return s_hf + (s_lf - s_hf) * (torch.arange(n, dtype=torch.float64) / (n - 1)) ** BETA


def test_one_attention_module_is_the_pages_formula():
    """The single-stream attention on [text, image] with the adapter's tables against: norms in float64, q turned by
    exp(i pos F), the reference keys' planes by s_d exp(i pos F) (the index axis left alone), SDPA."""
    model, inputs = _model()
    handle = set_rope_processors(model, untwisting=Untwisting(HF, LF, BETA))
    t = 0.3
    handle.tables.time.fill_(t)  # what the pre-forward step writes from timestep = 0.3 (Flux: the noise level)
    ids = torch.cat([inputs["txt_ids"], inputs["img_ids"]])  # [S, 3], text first as the model passes them
    attn = model.single_transformer_blocks[0].attn
    x = torch.randn(2, ids.shape[0], attn.query_dim, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        tables = model.pos_embed(ids)  # (cos, sin, key factor): our tables module answers
        assert len(tables) == 3
        got = attn.processor(attn, x, image_rotary_emb=tables)
        heads = attn.heads
        q, k, v = (proj(x).unflatten(-1, (heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        q, k = attn.norm_q(q), attn.norm_k(k)
        widths = model.config.axes_dims_rope  # (index, y, x) channels
        freqs = ar.conventions.flux(widths).freqs.double()  # [3, n], one axis per plane
        angle = ids.double() @ freqs  # [S, n]
        s = torch.cat([torch.ones(widths[0] // 2, dtype=torch.float64)] + [_page_scale(w // 2, t) for w in widths[1:]])
        amp = torch.where((ids[:, 0] != 0)[:, None], s, torch.ones_like(s))  # [S, n]
        n = angle.shape[1]
        turn = lambda x, a: channels(planes(x, n, "interleaved") * torch.polar(a, angle)[None, :, None], "interleaved")
        attend = lambda q, k: (
            torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
            .transpose(1, 2)
            .flatten(2)
        )
        q, k_plain, k = turn(q, torch.ones_like(angle)), turn(k, torch.ones_like(angle)), turn(k, amp)
        want, unscaled = attend(q, k), attend(q, k_plain)
    # the tables and the key factor are float32 (each entry within u32 of its float64 value): a rotated channel moves
    # by at most 2 u32 |plane|, a scaled key by 3 u32 |plane| more, so each logit by at most 5 u32 D |q| |k| / sqrt(D);
    # softmax weights then move by at most 2 x that (relative), the output by that times max |v|
    d = q.shape[-1]
    logit = 5 * U32 * d**0.5 * float(q.abs().max() * k.abs().max())
    err = (got - want).abs().max()
    assert err <= 2 * logit * float(v.abs().max()) + 8 * U32 * float(want.abs().max())
    assert err * 1000 < (want - unscaled).abs().max()  # the check sees the scaling: unscaled keys would fail it
    handle.remove()


def test_scales_of_one_and_no_reference_rows_change_nothing_and_remove_restores_stock():
    """Exactly (float64): the factor 1 leaves the keys as the same tables module unscaled leaves them (``mode="none"``
    at the grid: our tables, plain positions), on every reference row or none."""
    model, inputs = _model()
    stock = _run(model, inputs)
    grid = (4, 6)  # the tiny Flux's image grid, in tokens
    handle = set_rope_processors(model, mode="none", train_size=grid)
    plain = _run(model, inputs)
    handle.remove()
    handle = set_rope_processors(model, untwisting=Untwisting(1.0, 1.0))
    assert torch.equal(_run(model, inputs), plain)
    handle.remove()
    unmarked = dict(inputs, img_ids=tiny.build(NAME)[1]["img_ids"].double())  # index 0 everywhere: no references
    handle = set_rope_processors(model, mode="none", train_size=grid)
    plain_unmarked = _run(model, unmarked)
    handle.remove()
    handle = set_rope_processors(model, untwisting=Untwisting(HF, LF, BETA))
    assert torch.equal(_run(model, unmarked), plain_unmarked)
    assert not torch.allclose(_run(model, inputs), plain)  # with references, the keys move
    handle.remove()
    assert torch.equal(_run(model, inputs), stock)  # the stock model, bit for bit


def test_the_schedule_follows_each_forwards_timestep():
    """At timestep 0.5 (Flux's noise level) the scheduled scales are 0.5 and 1.25: the same output, bit for bit, as
    an install of those scales unscheduled; at another timestep the two differ (the timestep embedding alike)."""
    model, inputs = _model()
    handle = set_rope_processors(model, untwisting=Untwisting(HF, LF, BETA))
    at = lambda t: _run(model, dict(inputs, timestep=torch.full_like(inputs["timestep"], t)))
    scheduled, later = at(0.5), at(0.1)
    handle.remove()
    handle = set_rope_processors(model, untwisting=Untwisting(0.5, 1.25, BETA))
    assert torch.equal(at(0.5), scheduled)
    assert (at(0.1) - later).abs().max() > 1e-3  # at 0.1 the schedule's scales are 0.7 and 1.45, not 0.5 and 1.25
    handle.remove()


def test_compiles_fullgraph_once_for_every_step():
    model, inputs = _model()
    model = model.float()
    inputs = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    handle = set_rope_processors(model, untwisting=Untwisting(HF, LF, BETA))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    steps = [dict(inputs, timestep=torch.full_like(inputs["timestep"], t)) for t in (0.9, 0.4)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        outs = [_run(compiled, step) for step in steps]
    for out, step in zip(outs, steps):
        torch.testing.assert_close(out, _run(model, step))
    assert not torch.allclose(outs[0], outs[1])
    handle.remove()


def test_refusals_name_the_cause():
    model, _ = _model()
    with pytest.raises(TypeError, match="axial_rope.methods.Untwisting"):
        set_rope_processors(model, untwisting=(0.5, 1.2))
    wan, _ = tiny.build("WanTransformer3DModel")
    with pytest.raises(ValueError, match=r"reference image's rows.*families that do: flux"):
        set_rope_processors(wan, untwisting=Untwisting())
    assert not hasattr(wan, "_axial_rope_handle") or wan._axial_rope_handle is None
