"""LTX-Video through ``set_rope_processors``: the same stock-equality checks as Flux and Wan, on a tiny
random-initialised ``LTXVideoTransformer3DModel`` (diffusers 0.42.1)."""

from __future__ import annotations

import pytest
import torch

from axial_rope import conventions as conv

# Stock against our processors, in float32 (the model's dtype): each side rotates q and k once, and
# from there on runs the same float32 arithmetic. LTX-Video's float64 video_coords give float64 angles
# on both sides, so the tables agree to their float32 rounding; both rotations are within 6 u |z| of
# exact (helpers.TOL, u = 2**-24): a relative perturbation delta = 12 u = 7e-7 of q and k, which moves a
# softmax weight by 2 delta |s| relative (|s| = O(1) at this initialisation) and an output by about
# 4 delta of its scale per layer: 3e-6, within TOL = 1e-5 (a first-order estimate). The pipeline's
# float32 grid path puts upstream's angles up to theta pi / 2 |2 g - 1| = 1.6e4 rad per unit of
# 2 g - 1, float32_angle_bound = 2e-2 rad at the top frequency (of the few planes that reach it):
# outputs within 1e-4, an estimate again.
TOL = 1e-5

diffusers = pytest.importorskip("diffusers")

from axial_rope.integrations.diffusers import SUPPORTED, remove_rope_processors, set_rope_processors  # noqa: E402

B, T, H, W = 2, 3, 4, 5


def _ltx():
    model = diffusers.LTXVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                 attention_head_dim=16, cross_attention_dim=32, num_layers=1,
                                                 caption_channels=8)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    inputs = dict(
        hidden_states=torch.randn(B, T * H * W, 4, generator=gen),
        encoder_hidden_states=torch.randn(B, 6, 8, generator=gen),
        timestep=torch.rand(B, generator=gen) * 1000,
        encoder_attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]),
        num_frames=T,
        height=H,
        width=W,
        rope_interpolation_scale=(8 / 25, 32, 32),  # the pipeline's (vae_t / frame_rate, vae_s, vae_s)
        return_dict=False,
    )
    return model.eval(), inputs


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


def test_ltx_video_processors_match_stock_output():
    assert "LTXVideoTransformer3DModel" in SUPPORTED
    model, inputs = _ltx()
    stock = _run(model, inputs)
    handle = set_rope_processors(model)
    assert handle.names and all(
        type(model.attn_processors[n]).__module__.startswith("axial_rope") for n in handle.names
    )
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)
    # the installed rope is the LTX-Video convention of the config (per-head F, position map)
    assert torch.equal(handle.rope.freqs, conv.ltx_video(2, 16).freqs)
    remove_rope_processors(model)
    assert torch.equal(_run(model, inputs), stock)


def test_ltx_video_convention_tables_match_stock_tables():
    # the convention from the model's config, at float64 video_coords (upstream's angles are float64 too), gives
    # the stock tables to float32 rounding (ours are float64 values rounded once: within 2**-24 of each entry;
    # 1e-6 leaves room for upstream's own float64 arithmetic). The whole model against stock: the tests above.
    from axial_rope.integrations.diffusers_ltx import ltx_rope

    model, inputs = _ltx()
    rope = ltx_rope(model)
    coords = conv.ltx_video_positions(T, H, W, frame_rate=25.0).T[None].expand(B, 3, -1)
    stock = model.rope(inputs["hidden_states"], T, H, W, rope_interpolation_scale=None, video_coords=coords)
    cos, sin = rope.cos_sin(coords[0].T)  # [S, H, D]
    torch.testing.assert_close(cos.flatten(-2).double(), stock[0][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.flatten(-2).double(), stock[1][0], atol=1e-6, rtol=0)


def test_ltx_video_bfloat16_matches_stock_to_bf16_rounding():
    model, inputs = _ltx()
    model.to(torch.bfloat16)
    inputs = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in inputs.items()}  # fmt: skip
    stock = _run(model, inputs)
    set_rope_processors(model)
    out = _run(model, inputs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), stock.float(), atol=2e-2, rtol=2e-2)


def test_ltx_video_refuses_scaling():
    # per-head frequencies, no spectrum: the scaling methods are refused (position modes: test_diffusers_ltx_video)
    from axial_rope.scaling import Linear

    model, _ = _ltx()
    with pytest.raises(ValueError, match="no per-axis spectrum"):
        set_rope_processors(model, scaling=Linear(2.0))
