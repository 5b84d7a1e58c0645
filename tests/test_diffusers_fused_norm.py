"""The diffusers processors' QK-norm + rotation as one ``ops.norm_apply_rope`` call (issue 45).

Our processors serve Flux (per-head RMSNorm, its text tokens by their own norms), HunyuanVideo (per-head
RMSNorm, video tokens), Wan (RMSNorm across heads), CogVideoX (per-head LayerNorm, video tokens) and LTX-Video
(RMSNorm across heads, its table over the hidden size as one head), and the families whose stock attention is one
of those: Chroma, Bria and Bria-Fibo (Flux's, or its steps copied), ConsisID (CogVideoX's), Wan VACE, Wan Animate and
ChronoEdit (Wan's, copied into their files: the same code), and SkyReels-V2 (Wan's, the context-parallel config passed
to cross-attention too: SkyReelsV2RopeProcessor). For each, unscaled and scaled: the fused
call is taken; in float64 the output equals the processor's unfused path (the model's norm modules called in
float64, then the float64 rotation), an equality of two float64 evaluations; in float32 it is within a stated
bound of the stock model's (whose rotation, diffusers' ``apply_rotary_emb``, computes in float32 even for
float64 models).
"""

from __future__ import annotations

import pytest
import torch
from helpers import U32, U64, chain_bound

import axial_rope as ar

diffusers = pytest.importorskip("diffusers")

from test_conventions_integration import _ltx  # noqa: E402

from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations import diffusers_ltx, diffusers_processors  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

# the five processors' own families, then the classes whose record names one of them for its stock processor
FAMILIES = ("flux", "hunyuan_video", "wan", "cogvideox", "ltx_video", "ChromaTransformer2DModel",
            "ConsisIDTransformer3DModel", "WanVACETransformer3DModel", "WanAnimateTransformer3DModel",
            "ChronoEditTransformer3DModel", "HunyuanVideoFramepackTransformer3DModel",
            "SkyReelsV2Transformer3DModel", "BriaTransformer2DModel", "BriaFiboTransformer2DModel")  # fmt: skip
SCALABLE = tuple(f for f in FAMILIES if f != "ltx_video")  # LTX-Video's per-head schedule takes no scaling
_POSITIONAL = ("img_ids", "txt_ids", "image_rotary_emb")  # positions and upstream's tables keep their dtype


def _model(family: str, dtype: torch.dtype):
    model, inputs = _ltx() if family == "ltx_video" else tiny.build(family)
    cast = lambda v: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
    inputs = {k: v if k in _POSITIONAL else [cast(t) for t in v] if isinstance(v, list) else cast(v)
              for k, v in inputs.items()}  # fmt: skip  (Bria-Fibo's text_encoder_layers: a list of states)
    return model.to(dtype).eval(), inputs


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the processors' ops.norm_apply_rope calls."""
    calls = []
    for module in (diffusers_processors, diffusers_ltx):
        real = module.norm_apply_rope
        monkeypatch.setattr(module, "norm_apply_rope", lambda *a, real=real, **kw: calls.append(1) or real(*a, **kw))
    return calls


def _unfused(monkeypatch) -> None:
    """The processors as before the fusion: every norm module called, then the rotation."""
    for module in (diffusers_processors, diffusers_ltx):
        monkeypatch.setattr(module, "read_norm", lambda *a, **kw: None)


def _float64_norms(model) -> None:
    """diffusers' RMSNorm takes the mean square in float32 even for float64 inputs: the QK-norms of the attention
    modules our processors serve swapped for torch's (same weight and eps), which computes in its input's dtype,
    so the unfused path is a float64 norm."""
    from diffusers.models.normalization import RMSNorm

    for module in list(model.modules()):
        if not type(getattr(module, "processor", None)).__module__.startswith("axial_rope"):
            continue
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k", "q_norm", "k_norm"):  # (LongCat-AudioDiT: q_norm)
            child = getattr(module, name, None)
            if type(child) is RMSNorm and child.bias is None:
                exact = torch.nn.RMSNorm(child.dim, eps=child.eps, elementwise_affine=child.weight is not None,
                                         dtype=torch.float64)  # fmt: skip
                exact.load_state_dict(child.state_dict())
                setattr(module, name, exact)


def _scaling(family: str, model):
    n_axes = DIFFUSERS[tiny.ALIASES.get(family, family)].rope(model.config).n_axes
    return (None,) * (n_axes - 1) + (ar.scaling.Linear(2.0),)


CASES = [(family, scaled) for family in FAMILIES for scaled in ((False, True) if family in SCALABLE else (False,))]


@pytest.mark.parametrize("family,scaled", CASES)
def test_fused_equals_norm_then_rotation_in_float64(family, scaled, fused_calls, monkeypatch):
    # the float64 norm (the model's modules, called) then the float64 rotation, against the fused call
    model, inputs = _model(family, torch.float64)
    stock = _run(model, inputs)
    handle = set_rope_processors(model, scaling=_scaling(family, model) if scaled else None)
    _float64_norms(model)  # also the norm of unrotated tokens (HunyuanVideo's text), which calls the module
    fused = _run(model, inputs)
    assert fused_calls, f"{family}: no fused QK-norm + rotation call"
    _unfused(monkeypatch)
    unfused = _run(model, inputs)
    # the same float64 arithmetic but for the order within the norm and the rotation: two evaluations of one
    # model, helpers.chain_bound(U64, 256 terms, 20 stages) of the outputs' scale
    tol = chain_bound(U64, 256, 20) * float(unfused.abs().max())
    torch.testing.assert_close(fused, unfused, atol=tol, rtol=0)
    handle.remove()
    processors = [m.processor for m in model.modules() if hasattr(m, "set_processor")]  # (Framepack: no attn_processors)
    assert all(type(p).__module__.startswith("diffusers") for p in processors)  # stock again
    stock_again = _run(model, inputs)  # (with the float64 norms: close to the first stock run, not equal)
    torch.testing.assert_close(stock_again, stock, atol=1e-5 * float(stock.abs().max()), rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_equals_stock_in_float32_within_bound(family, fused_calls):
    model, inputs = _model(family, torch.float32)
    stock = _run(model, inputs)
    handle = set_rope_processors(model)
    out = _run(model, inputs)
    assert fused_calls
    # q and k: each side's norm is within (n / 2 + 8) u of its row (n channels: D, or H * D across heads) and
    # the rotation adds 6 u (tests/helpers.py TOL), so the two differ by delta = 2 (n / 2 + 14) u relative; with
    # O(1) logits an attention output moves by 4 delta of the values' scale (tests/test_integrations_diffusers.py),
    # once per rotary attention layer the tokens pass, the rest of both models being the same float32 arithmetic
    widths = []
    for module in model.modules():
        norm = getattr(module, "norm_q", None)
        if isinstance(norm, torch.nn.Module):
            widths.append(next((p.numel() for p in norm.parameters()), 0))
    n = max(widths)
    delta = 2 * (n / 2 + 14) * U32
    tol = 4 * len(handle.names) * delta * float(stock.abs().max())
    torch.testing.assert_close(out, stock, atol=tol, rtol=0)


def test_a_norm_the_processor_cannot_read_is_called_as_stock(fused_calls, monkeypatch):
    # a subclass may compute more than its fields say (Mochi's RMSNorm, a user's): never read, called
    model, inputs = _model("flux", torch.float64)

    class Custom(torch.nn.RMSNorm):
        pass

    for module in model.modules():
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            old = getattr(module, name, None)
            if isinstance(old, torch.nn.RMSNorm):
                new = Custom(old.normalized_shape, eps=old.eps, dtype=torch.float64)
                new.load_state_dict(old.state_dict())
                setattr(module, name, new)
    set_rope_processors(model)
    out = _run(model, inputs)
    assert not fused_calls
    _unfused(monkeypatch)
    assert torch.equal(out, _run(model, inputs))  # the unfused path itself


def test_read_norm_reads_weights_eps_and_span():
    from diffusers.models.normalization import RMSNorm

    read = diffusers_processors.read_norm
    per_head = read(torch.nn.RMSNorm(8, eps=1e-5), torch.nn.RMSNorm(8, eps=1e-5), 3, 8, torch.float32)
    assert per_head.kind == "rms" and per_head.span == "head" and per_head.eps == 1e-5
    across = read(RMSNorm(24, eps=1e-6), RMSNorm(24, eps=1e-6), 3, 8, torch.float32)
    assert across.span == "heads" and across.q_weight.shape == (24,)
    layer = read(torch.nn.LayerNorm(8), torch.nn.LayerNorm(8), 3, 8, torch.float32)
    assert layer.kind == "layer" and layer.q_bias is not None
    assert read(torch.nn.RMSNorm(8), torch.nn.RMSNorm(8), 3, 8, torch.bfloat16).eps == torch.finfo(torch.bfloat16).eps
    assert read(torch.nn.RMSNorm(8, eps=1e-5), torch.nn.RMSNorm(8, eps=1e-6), 3, 8, torch.float32) is None
    assert read(torch.nn.RMSNorm(8), torch.nn.LayerNorm(8), 3, 8, torch.float32) is None
    assert read(torch.nn.RMSNorm(10), torch.nn.RMSNorm(10), 3, 8, torch.float32) is None
    assert read(None, None, 3, 8, torch.float32) is None


@pytest.mark.parametrize("name,cross", [("WanTransformer3DModel", False), ("SkyReelsV2Transformer3DModel", True)])
def test_cross_attention_gets_the_parallel_config_where_stock_passes_it(name, cross, monkeypatch):
    # SkyReelsV2AttnProcessor passes its context-parallel config to every attention, WanAttnProcessor to
    # self-attention only (diffusers PR #12909): one WanRopeProcessor for both would drop it, or pass it, wrongly
    model, inputs = _model(name, torch.float32)
    set_rope_processors(model)
    config = object()  # what set_attention_backend's parallel setup leaves on the processor
    for module in model.modules():
        if type(getattr(module, "processor", None)).__module__.startswith("axial_rope"):
            module.processor._parallel_config = config
    seen = []
    real = diffusers_processors.dispatch_attention_fn

    def spy(q, k, v, **kw):
        seen.append((q.shape[1] == k.shape[1], kw["parallel_config"] is config))  # (self-attention, config passed)
        return real(q, k, v, **dict(kw, parallel_config=None))

    monkeypatch.setattr(diffusers_processors, "dispatch_attention_fn", spy)
    _run(model, inputs)
    assert {passed for is_self, passed in seen if is_self} == {True}
    assert {passed for is_self, passed in seen if not is_self} == {cross}
