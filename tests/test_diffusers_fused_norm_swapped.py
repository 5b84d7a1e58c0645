"""Our processors for Qwen-Image (``diffusers_qwen_image``), FLUX.2 (``diffusers_flux2``), HunyuanVideo 1.5
(``diffusers_hunyuan_video15``), HiDream (``diffusers_hidream``), FLUX.3 (``diffusers_flux3``), Bria-Fibo 2
(``diffusers_bria_fibo2``), Ideogram 4 (``diffusers_ideogram4``), CogView4 and GLM-Image (``diffusers_cogview4``),
Z-Image (``diffusers_z_image``), Lumina 2 (``diffusers_lumina2``), HunyuanImage 2.1 (HunyuanVideo's processor, whose
steps its stock processor copies), Ovis-Image and LongCat-Image (Flux's, likewise), Krea 2 (``diffusers_krea2``),
NucleusMoE-Image (``diffusers_nucleus``), PRX (``diffusers_prx``), Kandinsky 5 (``diffusers_kandinsky5``), Kandinsky 6
and 6 SR (``diffusers_kandinsky6``), JoyImage Edit and Edit Plus (``diffusers_joyimage``),
Motif-Video (``diffusers_motif_video``), Cosmos (``diffusers_cosmos``), Helios (``diffusers_helios``),
EasyAnimate (``diffusers_easyanimate``), HunyuanDiT and its ControlNet (``diffusers_hunyuan_dit``),
Lumina-Next (``diffusers_lumina_next``), ACE-Step 1.5 (``diffusers_ace_step``),
LongCat-AudioDiT (``diffusers_longcat_audio``), AnyFlow (``diffusers_anyflow``): QK-norm and rotation as one
``ops.norm_apply_rope`` call (issue 45), installed by ``set_rope_processors`` (their records name them).

The installer swaps the rotary blocks' stock processors, module by module through ``set_processor`` (HiDream's
transformer has no ``attn_processors``), over the model's own tables and over the adapter's scaled ones. These
tests check what
tests/test_diffusers_fused_norm.py checks for the installed families: the fused call is taken; in float64 the output
equals the same processor with the model's norms called in float64 and then the rotation; in float32 it is within a
stated bound of the stock model; putting the stock processors back gives the stock model; and the model compiles
whole and over sizes without recompiling (tests/test_compile_diffusers.py's checks).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import U32, U64, chain_bound

import axial_rope as ar

diffusers = pytest.importorskip("diffusers")

from test_diffusers_fused_norm import _float64_norms  # noqa: E402

from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations import diffusers_processors  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from axial_rope.integrations.diffusers_ace_step import AceStepRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_anyflow import AnyFlowRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_bria_fibo2 import BriaFibo2RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_cogview4 import CogView4RopeProcessor, GlmImageRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_cosmos import CosmosRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_easyanimate import EasyAnimateRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_flux2 import Flux2RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_flux3 import Flux3RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_helios import HeliosRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_hidream import HiDreamRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_hunyuan_dit import HunyuanDiTRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_hunyuan_video15 import HunyuanVideo15RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_ideogram4 import Ideogram4RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_joyimage import JoyImageEditPlusRopeProcessor, JoyImageRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_kandinsky5 import Kandinsky5RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_kandinsky6 import Kandinsky6RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_krea2 import Krea2RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_longcat_audio import LongCatAudioRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_lumina2 import Lumina2RopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_lumina_next import LuminaNextRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_motif_video import MotifVideoRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_nucleus import NucleusRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_processors import FluxRopeProcessor, HunyuanVideoRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_prx import PRXRopeProcessor  # noqa: E402
from axial_rope.integrations.diffusers_qwen_image import QwenImageRopeProcessor, complex_tables  # noqa: E402
from axial_rope.integrations.diffusers_z_image import ZImageRopeProcessor  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

PROCESSORS = {"QwenImageTransformer2DModel": QwenImageRopeProcessor, "Flux2Transformer2DModel": Flux2RopeProcessor,
              "HunyuanVideo15Transformer3DModel": HunyuanVideo15RopeProcessor,
              "HiDreamImageTransformer2DModel": HiDreamRopeProcessor, "Flux3Transformer2DModel": Flux3RopeProcessor,
              "BriaFibo2Transformer2DModel": BriaFibo2RopeProcessor,
              "Ideogram4Transformer2DModel": Ideogram4RopeProcessor, "CogView4Transformer2DModel": CogView4RopeProcessor,
              "GlmImageTransformer2DModel": GlmImageRopeProcessor,
              "ZImageTransformer2DModel": ZImageRopeProcessor, "Lumina2Transformer2DModel": Lumina2RopeProcessor,
              "HunyuanImageTransformer2DModel": HunyuanVideoRopeProcessor,
              "OvisImageTransformer2DModel": FluxRopeProcessor, "LongCatImageTransformer2DModel": FluxRopeProcessor,
              "Krea2Transformer2DModel": Krea2RopeProcessor, "NucleusMoEImageTransformer2DModel": NucleusRopeProcessor,
              "PRXTransformer2DModel": PRXRopeProcessor, "Kandinsky5Transformer3DModel": Kandinsky5RopeProcessor,
              "Kandinsky6Transformer3DModel": Kandinsky6RopeProcessor,
              "Kandinsky6SRTransformer3DModel": Kandinsky6RopeProcessor,
              "JoyImageEditTransformer3DModel": JoyImageRopeProcessor,
              "JoyImageEditPlusTransformer3DModel": JoyImageEditPlusRopeProcessor,
              "MotifVideoTransformer3DModel": MotifVideoRopeProcessor,
              "CosmosTransformer3DModel": CosmosRopeProcessor, "HeliosTransformer3DModel": HeliosRopeProcessor,
              "EasyAnimateTransformer3DModel": EasyAnimateRopeProcessor,
              "HunyuanDiT2DModel": HunyuanDiTRopeProcessor, "LuminaNextDiT2DModel": LuminaNextRopeProcessor,
              "AceStepTransformer1DModel": AceStepRopeProcessor,
              "LongCatAudioDiTTransformer": LongCatAudioRopeProcessor,
              "AnyFlowTransformer3DModel": AnyFlowRopeProcessor}  # fmt: skip
CLASSES = tuple(PROCESSORS)
# two blocks of each kind, but HiDream's tiny inputs carry one text-encoder state per block of one
DEPTH = {name: 1 if name == "HiDreamImageTransformer2DModel" else 2 for name in CLASSES}
# the stock model cannot run in float64 (its one-module check below stands in)
NO_FLOAT64 = {"Kandinsky5Transformer3DModel": "its time embedding casts the timestep to float32 before a float64 "
              "linear layer (models/tiny_diffusers_more.py)",
              "MotifVideoTransformer3DModel": "its time embedding is float32 always (Timesteps), with no cast to "
              "float64 weights (models/tiny_diffusers_video.py)"}  # fmt: skip
# the swapped processors that rotate nothing, by name, where not a "cross_attention"
UNROTATED = {"CosmosTransformer3DModel": ".attn2.", "HeliosTransformer3DModel": ".attn2.",
             "HunyuanDiT2DModel": ".attn2.", "LuminaNextDiT2DModel": ".attn2.",
             "AceStepTransformer1DModel": ".cross_attn."}  # (HunyuanDiT's, Lumina-Next's: their queries only)
# stock rounds the rotated q and k to this dtype (and back) whatever the model's, and so does ours, after it
ROUNDED = {"Kandinsky5Transformer3DModel": torch.bfloat16}


def _model(name: str, dtype: torch.dtype, depth: int = 1):
    model, inputs = tiny.build(name, depth=depth)
    return model.to(dtype).eval(), {k: _cast(v, dtype) for k, v in inputs.items()}


def _cast(value, dtype: torch.dtype):  # tensors, and lists of them (Z-Image's latents and captions)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


def _swap(model) -> tuple[list[str], callable]:
    """Our processors as the installer puts them (the installed handle's, or an unscaled install); returns the
    swapped processors' names and the undo."""
    handle = getattr(model, "_axial_rope_processors", None) or set_rope_processors(model)
    ours = PROCESSORS[type(model).__name__]  # the record names this class: the installer put it there
    assert all(type(m.processor) is ours for n, m in model.named_modules() if f"{n}.processor" in handle.names)
    return list(handle.names), handle.remove


def _norm_width(model) -> int:
    """The widest query norm (``norm_q``; HiDream's ``q_rms_norm``, across heads; Kandinsky's ``query_norm``; JoyImage's
    ``img_attn_q_norm`` and ``txt_attn_q_norm``; LongCat-AudioDiT's ``q_norm``): the ``n`` of its error bound."""
    names = ("norm_q", "q_rms_norm", "query_norm", "img_attn_q_norm", "txt_attn_q_norm", "q_norm")
    norms = [getattr(m, a) for m in model.modules() for a in names if hasattr(m, a)]
    # (a LayerNorm without affine weights, CogView4's: its normalized_shape)
    return max(math.prod(getattr(n, "normalized_shape", None) or n.weight.shape) for n in norms
               if isinstance(n, torch.nn.Module))  # fmt: skip


def _float64_zero_centred_norms(monkeypatch) -> None:
    """Krea2RMSNorm normalises float32 copies whatever its input: its forward in the input's dtype here (the same
    norm of ``1 + weight``), so that the unfused path of a float64 model is a float64 norm; the modules stay
    Krea2RMSNorms, read by the fused path with their offset."""
    from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

    monkeypatch.setattr(Krea2RMSNorm, "forward",
                        lambda self, x: F.rms_norm(x, (self.dim,), weight=self.weight + 1.0, eps=self.eps))  # fmt: skip


@pytest.fixture
def fused_calls(monkeypatch):
    calls = []
    real = diffusers_processors.norm_apply_rope
    monkeypatch.setattr(diffusers_processors, "norm_apply_rope", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def test_complex_tables_are_the_interleaved_cos_sin_of_each_plane():
    angles = torch.tensor([[0.5, -1.25], [2.0, 3.0]], dtype=torch.float64)  # [S, D/2]
    tables = complex_tables(torch.polar(torch.ones_like(angles), angles), None)
    torch.testing.assert_close(tables.cos, angles.cos().repeat_interleave(2, -1), atol=0, rtol=0)
    torch.testing.assert_close(tables.sin, angles.sin().repeat_interleave(2, -1), atol=0, rtol=0)


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("name", CLASSES)
def test_fused_equals_norm_then_rotation_in_float64(name, scaled, fused_calls, monkeypatch):
    if name in NO_FLOAT64:
        pytest.skip(f"stock {name}: {NO_FLOAT64[name]}")
    model, inputs = _model(name, torch.float64, depth=DEPTH[name])
    stock = _run(model, inputs)
    n_axes = DIFFUSERS[name].rope(model.config).n_axes
    scaling = (None,) * (n_axes - 1) + (ar.scaling.Linear(2.0),)
    if name == "Ideogram4Transformer2DModel":  # one spectrum cycled through its axes: one scaling for them all
        scaling = ar.scaling.Linear(2.0)
    handle = set_rope_processors(model, scaling=scaling if scaled else None)
    names, undo = _swap(model)
    assert len(names) >= 2
    _float64_norms(model)
    _float64_zero_centred_norms(monkeypatch)
    fused = _run(model, inputs)
    # every swapped processor that rotates fused (a joint block: once per stream); Bria-Fibo 2's cross-attention to
    # the text (its injection blocks) is swapped too and rotates nothing, and so are Cosmos's and Helios's (attn2)
    unrotated = UNROTATED.get(name, "cross_attention")
    assert len(fused_calls) >= len([n for n in names if "cross_attention" not in n and unrotated not in n])
    monkeypatch.setattr(diffusers_processors, "read_norm", lambda *a, **kw: None)  # the norm modules called
    unfused = _run(model, inputs)
    # two float64 evaluations of one model, the same arithmetic but for the order within the norm and the rotation:
    # helpers.chain_bound(U64, 256 terms, 20 stages) of the outputs' scale
    torch.testing.assert_close(fused, unfused, atol=chain_bound(U64, 256, 20) * float(unfused.abs().max()), rtol=0)
    undo()
    handle.remove()
    assert not any(
        type(m.processor).__module__.startswith("axial_rope") for m in model.modules() if hasattr(m, "processor")
    )
    # (the norms now torch's float64 ones: close to the first stock run, not equal)
    torch.testing.assert_close(_run(model, inputs), stock, atol=1e-5 * float(stock.abs().max()), rtol=0)


@pytest.mark.parametrize("name", CLASSES)
def test_fused_equals_stock_in_float32_within_bound(name, fused_calls):
    model, inputs = _model(name, torch.float32, depth=DEPTH[name])
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert fused_calls
    # q and k of each stream: the norm within (n / 2 + 8) u of its row (n channels: D, or H * D across heads), the
    # rotation 6 u (tests/helpers.py TOL), so the two differ by delta = 2 (n / 2 + 14) u relative; an attention
    # output with O(1) logits moves by 4 delta of the values' scale (tests/test_integrations_diffusers.py), once per
    # rotary attention layer
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    if name in ROUNDED:  # two values delta apart, each rounded to within its unit roundoff u': apart by delta + 2 u'
        delta += torch.finfo(ROUNDED[name]).eps  # eps = 2 u'
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    assert torch.equal(_run(model, inputs), stock)  # the stock processors back: the stock model


@pytest.mark.parametrize("check", ["fullgraph", "dynamic", "repeated blocks"])
@pytest.mark.parametrize("name", CLASSES)
def test_compiles_without_recompiling(name, check):
    # tests/test_compile_diffusers.py's checks (diffusers' TorchCompileTesterMixin) with our processor in place of
    # the stock one, on the model's own tables; skipped, with the reason, where the stock model fails them
    from test_compile_diffusers import _close
    from torch._dynamo.testing import CompileCounter

    why = {"fullgraph": tiny.TINY[name].no_fullgraph, "dynamic": tiny.TINY[name].no_fullgraph or tiny.TINY[name].no_dynamic,
           "repeated blocks": tiny.TINY[name].no_repeated}[check]  # fmt: skip
    if why:
        pytest.skip(f"stock {name}: {why}")
    model, inputs = tiny.build(name)
    _swap(model)
    torch._dynamo.reset()
    time = DIFFUSERS[name].timing.argument
    t = inputs[time]
    later = dict(inputs, **{time: t * 0.5 if t.is_floating_point() else t // 2})  # the next step, same dtype
    if check == "repeated blocks":
        if not model._repeated_blocks:
            pytest.skip(f"{name} declares no _repeated_blocks")
        expected = [_run(model, step) for step in (inputs, later)]
        model.compile_repeated_blocks(fullgraph=True, backend="eager")
        with torch._dynamo.config.patch(recompile_limit=1):
            for step, want in zip((inputs, later), expected):
                _close(_run(model, step), want)
        return
    steps = ((inputs, later) if check == "fullgraph"
             else [tiny.inputs(name, h, w) for h, w in ((4, 4), (4, 8), (8, 8))])  # fmt: skip
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, dynamic=check == "dynamic" or None, backend=counter)
    with torch.fx.experimental._config.patch(use_duck_shape=False):
        for step in steps:
            with torch._dynamo.config.patch(error_on_recompile=True):
                _close(_run(compiled, step), _run(model, step))
    assert counter.frame_count == 1


def test_qwen_image_keeps_the_stock_processors_refusals():
    model, _ = _model("QwenImageTransformer2DModel", torch.float32)
    _swap(model)
    attn = model.transformer_blocks[0].attn
    x = torch.zeros(1, 4, 32)
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        attn.processor(attn, x)
    with pytest.raises(ValueError, match="attention_mask"):
        attn.processor(attn, x, x, attention_mask=torch.ones(1, 8, dtype=torch.bool))


def test_hidream_rotates_the_first_half_of_a_wider_head_as_stock(fused_calls):
    # axes_dims_rope summing to D / 2: the stock processor rotates the first half of each head, by tables of D / 4
    # planes (its else branch); ours is the partial rotation of norm_apply_rope, the other half passing through
    from diffusers.models.transformers.transformer_hidream_image import HiDreamAttnProcessor

    from axial_rope.conventions.hidream import rotation_matrices

    model, _ = _model("HiDreamImageTransformer2DModel", torch.float32, depth=1)
    attn = model.double_stream_blocks[0].block.attn1
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 6, attn.query_dim, generator=g), torch.randn(2, 3, attn.query_dim, generator=g)
    angles = torch.rand(2, 9, attn.inner_dim // attn.heads // 4, generator=g, dtype=torch.float64) * 6  # [B, S, D/4]
    cos, sin = (f(angles).repeat_interleave(2, -1).float() for f in (torch.cos, torch.sin))
    tables = rotation_matrices(cos, sin).unsqueeze(-4)  # [B, S, 1, D/4, 2, 2]
    with torch.no_grad():
        stock = HiDreamAttnProcessor()(attn, x, encoder_hidden_states=text, image_rotary_emb=tables)
        ours = HiDreamRopeProcessor()(attn, x, encoder_hidden_states=text, image_rotary_emb=tables)
    assert fused_calls
    # one attention layer, the norm across H * D channels: 4 delta of the values' scale (as above)
    delta = 2 * (attn.inner_dim / 2 + 14) * U32
    for a, b in zip(ours, stock):
        torch.testing.assert_close(a, b, atol=4 * delta * float(b.abs().max()), rtol=0)


@pytest.mark.parametrize("name", ["CogView4Transformer2DModel", "GlmImageTransformer2DModel"])
def test_cogview4_and_glm_image_masks_and_kv_cache_as_stock(name, fused_calls):
    # the joint mask from the text's padding (stock's 0/1 float mask), and GLM-Image's KV cache: the rotated keys of
    # a "write" forward prepended in a "read" one; ours against the stock processor on one attention module
    from diffusers.models.transformers.transformer_glm_image import GlmImageLayerKVCache

    model, _ = _model(name, torch.float32)
    attn = model.transformer_blocks[0].attn1
    stock_processor = attn.processor
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 6, attn.query_dim, generator=g), torch.randn(2, 3, attn.query_dim, generator=g)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    angles = torch.rand(6, attn.inner_dim // attn.heads // 2, generator=g, dtype=torch.float64) * 6  # [S_img, D/2]
    tables = tuple(torch.cat([f(angles)] * 2, -1).float() for f in (torch.cos, torch.sin))  # half pairing
    glm = name == "GlmImageTransformer2DModel"
    outputs = []
    for processor in (stock_processor, PROCESSORS[name]()):
        kw = {}
        if glm:  # write this forward's keys, then read them back before the next one's
            kw["kv_cache"] = cache = GlmImageLayerKVCache()
            cache.mode = "write"
            with torch.no_grad():
                processor(attn, x[:1], text[:1], image_rotary_emb=tables, **kw)
            cache.mode = "read"
        with torch.no_grad():
            outputs.append(processor(attn, x, text, attention_mask=None if glm else mask, image_rotary_emb=tables, **kw))
    assert fused_calls
    # one attention layer, per-head norm of D channels: 4 delta of the values' scale (as above)
    delta = 2 * (attn.inner_dim // attn.heads / 2 + 14) * U32
    for ours, stock in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(ours, stock, atol=4 * delta * float(stock.abs().max()), rtol=0)


def test_z_image_mask_and_padding_rows_as_stock(fused_calls):
    # the [B, S] key mask of items of unequal length (the model passes one where its padded sequences differ) and
    # the zero rows of freqs_cis past an item's length (its q and k zeroed): ours against the stock processor on one
    # attention module
    model, _ = _model("ZImageTransformer2DModel", torch.float32)
    attn = model.layers[0].attention
    stock_processor = attn.processor
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, attn.query_dim, generator=g)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2], dtype=torch.bool)
    angles = torch.rand(2, 6, attn.inner_dim // attn.heads // 2, generator=g, dtype=torch.float64) * 6  # [B, S, D/2]
    freqs = torch.polar(torch.ones_like(angles), angles).to(torch.complex64) * mask[..., None]
    with torch.no_grad():
        stock = stock_processor(attn, x, attention_mask=mask, freqs_cis=freqs)
        ours = ZImageRopeProcessor()(attn, x, attention_mask=mask, freqs_cis=freqs)
    assert fused_calls
    # one attention layer, per-head norm of D channels: 4 delta of the values' scale (as above)
    delta = 2 * (attn.inner_dim // attn.heads / 2 + 14) * U32
    torch.testing.assert_close(ours, stock, atol=4 * delta * float(stock.abs().max()), rtol=0)


def test_lumina2_mask_grouped_heads_and_proportional_attention_as_stock(fused_calls):
    # one key head for two query heads (the tiny model's kv_heads), the [B, S] key mask with the zero rows of the
    # table past an item's length, and the proportional softmax scale of base_sequence_length (the model passes none):
    # ours against the stock processor on one attention module
    model, _ = _model("Lumina2Transformer2DModel", torch.float32)
    attn = model.layers[0].attn
    assert attn.heads == 2 and attn.to_k.out_features == attn.to_q.out_features // 2
    stock_processor = attn.processor
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, attn.query_dim, generator=g)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    angles = torch.rand(2, 6, attn.inner_dim // attn.heads // 2, generator=g, dtype=torch.float64) * 6  # [B, S, D/2]
    freqs = torch.polar(torch.ones_like(angles), angles).to(torch.complex64) * mask[..., None]
    outputs = []
    for processor in (stock_processor, Lumina2RopeProcessor()):
        with torch.no_grad():
            outputs.append(processor(attn, x, x, attention_mask=mask, image_rotary_emb=freqs, base_sequence_length=4))
    assert fused_calls
    # one attention layer, per-head norm of D channels: 4 delta of the values' scale (as above)
    delta = 2 * (attn.inner_dim // attn.heads / 2 + 14) * U32
    ours, stock = outputs[1], outputs[0]
    torch.testing.assert_close(ours, stock, atol=4 * delta * float(stock.abs().max()), rtol=0)


def test_krea2_zero_centred_norms_grouped_heads_and_mask_as_stock(fused_calls):
    # Krea2RMSNorm's multiplier is 1 + weight (zero at init, so the model tests read 1): random weights here, one key
    # head for two query heads (the tiny model's), the joint [B, 1, 1, S] text-padding mask; ours against the stock
    # processor on one attention module
    model, _ = _model("Krea2Transformer2DModel", torch.float32)
    attn = model.transformer_blocks[0].attn
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
    stock_processor = attn.processor
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for norm in (attn.norm_q, attn.norm_k):
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))
    x = torch.randn(2, 6, attn.hidden_size, generator=g)
    mask = torch.tensor([[True] * 6, [True] * 2 + [False] + [True] * 3])[:, None, None, :]
    angles = torch.rand(6, attn.head_dim // 2, generator=g, dtype=torch.float64) * 6  # [S, D/2]
    tables = tuple(f(angles).repeat_interleave(2, -1).float() for f in (torch.cos, torch.sin))  # interleaved
    with torch.no_grad():
        stock = stock_processor(attn, x, attention_mask=mask, image_rotary_emb=tables)
        ours = Krea2RopeProcessor()(attn, x, attention_mask=mask, image_rotary_emb=tables)
    assert fused_calls
    # one attention layer, per-head norm of D channels: 4 delta of the values' scale (as above)
    delta = 2 * (attn.head_dim / 2 + 14) * U32
    torch.testing.assert_close(ours, stock, atol=4 * delta * float(stock.abs().max()), rtol=0)


@pytest.mark.parametrize("cached", [False, True])
def test_nucleus_grouped_heads_text_keys_and_cache_as_stock(cached, fused_calls):
    # one key head for two query heads (num_key_value_heads=1; the tiny model has none), the text's keys (normalised
    # by norm_added_k and rotated by the text's table, unfused) or the cached ones, the joint [B, S] mask; ours
    # against the stock processor on one attention module
    model = diffusers.NucleusMoEImageTransformer2DModel(
        patch_size=2, in_channels=16, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        num_key_value_heads=1, joint_attention_dim=16, axes_dims_rope=(4, 6, 6), moe_enabled=False,
    ).eval()  # fmt: skip
    attn = model.transformer_blocks[0].attn
    stock_processor = attn.processor
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 6, attn.query_dim, generator=g), torch.randn(2, 3, attn.query_dim, generator=g)
    mask = torch.tensor([[True] * 9, [True] * 7 + [False] * 2])
    head_dim = attn.inner_dim // attn.heads
    angles = torch.rand(9, head_dim // 2, generator=g, dtype=torch.float64) * 6  # [S_img + S_txt, D/2]
    freqs = torch.polar(torch.ones_like(angles), angles).to(torch.complex64).split([6, 3])
    kw = dict(attention_mask=mask, image_rotary_emb=freqs)
    if cached:  # keys and values as a text cache holds them: [B, S_txt, H_kv, D]
        kw.update(cached_txt_key=torch.randn(2, 3, 1, head_dim, generator=g),
                  cached_txt_value=torch.randn(2, 3, 1, head_dim, generator=g))  # fmt: skip
    with torch.no_grad():
        stock = stock_processor(attn, x, None if cached else text, **kw)
        ours = NucleusRopeProcessor()(attn, x, None if cached else text, **kw)
    assert fused_calls
    # one attention layer, per-head norm of D channels: 4 delta of the values' scale (as above)
    delta = 2 * (head_dim / 2 + 14) * U32
    torch.testing.assert_close(ours, stock, atol=4 * delta * float(stock.abs().max()), rtol=0)


def test_kandinsky5_rotated_q_k_as_stock_and_fused_equals_unfused(fused_calls, monkeypatch):
    # stock rounds the rotated q and k to bfloat16 whatever the model's dtype, so the model's output is held to
    # stock only at bfloat16's precision (above). Here, on one self-attention module, the rotated q and k themselves
    # (caught where the NABLA mask is built from them): ours without the round trip, in float64, within one bfloat16
    # rounding of stock's; ours with it against stock's; and, in float64 without it, the fused call against the norm
    # modules called then the rotation
    import copy

    from diffusers.models.transformers import transformer_kandinsky

    from axial_rope.integrations import diffusers_kandinsky5

    model, _ = _model("Kandinsky5Transformer3DModel", torch.float32)
    attn = model.visual_transformer_blocks[0].self_attention
    head_dim = attn.to_query.out_features // attn.num_heads
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for norm in (attn.query_norm, attn.key_norm):  # ones at init: random weights, so they count
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) + 0.5)
    x = torch.randn(2, 6, attn.to_query.in_features, generator=g)
    angles = torch.rand(2, 6, head_dim // 2, generator=g, dtype=torch.float64) * 6  # [B, S, D/2]
    c, s = angles.cos(), angles.sin()
    rope = torch.stack([c, -s, s, c], dim=-1).view(2, 6, 1, head_dim // 2, 2, 2)  # [B, S, 1, D/2, 2, 2]
    seen = []
    capture = lambda q, k, sta_mask, thr: seen.append((q, k))  # noqa: E731  # (no mask: dense attention)
    monkeypatch.setattr(transformer_kandinsky, "nablaT_v2", capture)
    monkeypatch.setattr(diffusers_kandinsky5, "nablaT_v2", capture)
    sparse = {"sta_mask": None, "P": None}
    exact = Kandinsky5RopeProcessor()
    exact.rotated_dtype = None
    attn64 = copy.deepcopy(attn).double()
    with torch.no_grad():
        stock_out = attn.processor(attn, x, rotary_emb=rope.float(), sparse_params=sparse)
        ours_out = Kandinsky5RopeProcessor()(attn, x, rotary_emb=rope.float(), sparse_params=sparse)
        exact(attn64, x.double(), rotary_emb=rope, sparse_params=sparse)
        monkeypatch.setattr(diffusers_processors, "read_norm", lambda *a, **kw: None)  # the norm modules called
        exact(attn64, x.double(), rotary_emb=rope, sparse_params=sparse)
    assert len(fused_calls) == 2 and len(seen) == 4
    (stock_q, stock_k), (ours_q, ours_k), (fused_q, fused_k), (unfused_q, unfused_k) = seen
    # per element: stock's float32 norm and rotation within delta = 2 (D / 2 + 14) u32 of the exact values, then one
    # bfloat16 rounding (unit roundoff u' = eps / 2); ours with the round trip: its float32 values delta apart from
    # stock's, each rounded (delta + eps)
    delta, eps = 2 * (head_dim / 2 + 14) * U32, torch.finfo(torch.bfloat16).eps
    for stock, ours, fused, unfused in ((stock_q, ours_q, fused_q, unfused_q), (stock_k, ours_k, fused_k, unfused_k)):
        scale = float(stock.abs().max())
        torch.testing.assert_close(fused.float(), stock, atol=(delta + eps / 2) * scale, rtol=0)
        torch.testing.assert_close(ours, stock, atol=(delta + eps) * scale, rtol=0)
        torch.testing.assert_close(fused, unfused, atol=chain_bound(U64, 256, 20) * scale, rtol=0)
    # the attention output: q and k delta + eps apart relative, 4 (delta + eps) of the values' scale (as above)
    torch.testing.assert_close(ours_out, stock_out, atol=4 * (delta + eps) * float(stock_out.abs().max()), rtol=0)


@pytest.mark.parametrize("scaled", [False, True])
def test_joyimage_edit_mrope_rotates_the_text_as_stock(scaled, fused_calls):
    # rope_type "mrope" (the tiny model's is "rope"): the text's q and k rotated too, by the text's own tables, after
    # the grid; each stream fused: twice per block. float32 against stock (scaled: the same tables for both, since
    # our tables module stays in place while the stock processors come back)
    import diffusers

    model = diffusers.JoyImageEditTransformer3DModel(
        in_channels=4, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=2, rope_dim_list=[4, 6, 6],
        rope_type="mrope",
    ).eval()  # fmt: skip
    frames, h, w = tiny.TINY["JoyImageEditTransformer3DModel"].grid
    inputs = tiny.inputs("JoyImageEditTransformer3DModel", h, w, frames=frames)
    handle = set_rope_processors(model, scaling=(None, None, ar.scaling.Linear(2.0)) if scaled else None)
    names = list(handle.names)
    out = _run(model, inputs)
    assert len(fused_calls) == 2 * len(names)  # the image's and the text's
    for name in names:  # the stock processors, our tables kept
        model.get_submodule(name.removesuffix(".processor")).set_processor(handle.originals[name])
    stock = _run(model, inputs)
    # per-head norm of D channels, 2 layers: 4 x 2 delta of the output's scale (as above)
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)


def _motif(**options):
    import diffusers

    torch.manual_seed(0)
    return diffusers.MotifVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=2, num_single_layers=2,
        patch_size=1, text_embed_dim=16, rope_axes_dim=(2, 4, 4), **options,
    ).eval()  # fmt: skip


def test_motif_video_text_cross_attention_and_decoder_as_stock(fused_calls):
    # the tiny model has neither: the text cross-attention (the video's queries rotated, the text's keys not; the
    # mask's text columns) in both kinds of block, and a decoder block (the last single block: the video appended to
    # itself as the "text", no mask, no cross-attention). float32 against stock
    model = _motif(enable_text_cross_attention_dual=True, enable_text_cross_attention_single=True,
                   num_decoder_layers=1)  # fmt: skip
    frames, h, w = tiny.TINY["MotifVideoTransformer3DModel"].grid
    inputs = tiny.inputs("MotifVideoTransformer3DModel", h, w, frames=frames)
    stock = _run(model, inputs)
    names, undo = _swap(model)
    assert len(names) == 7 and sum("cross_attn" in n for n in names) == 3
    out = _run(model, inputs)
    assert len(fused_calls) == 4  # the self-attention of each block
    # per-head norm of D channels, one delta per swapped layer: 4 x layers x delta of the output's scale (as above)
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    assert torch.equal(_run(model, inputs), stock)


def test_motif_video_fused_equals_unfused_in_float64(monkeypatch, fused_calls):
    # the stock model cannot run in float64 (NO_FLOAT64): each kind of self-attention module (dual-stream: the text's
    # own projections; single-stream: the text rows appended, not rotated) and the text cross-attention, in float64,
    # fused against the norm modules called and then the rotation
    import copy

    model = _motif(enable_text_cross_attention_dual=True, enable_text_cross_attention_single=True)
    head = 10
    g = torch.Generator().manual_seed(0)
    angles = torch.rand(6, head // 2, generator=g, dtype=torch.float64) * 6
    tables = tuple(f(angles).repeat_interleave(2, -1) for f in (torch.cos, torch.sin))  # [S, D] interleaved
    x, text = torch.randn(2, 6, 20, generator=g, dtype=torch.float64), torch.randn(2, 3, 20, generator=g,
                                                                                     dtype=torch.float64)  # fmt: skip
    mask = torch.tensor([[True] * 9, [True] * 7 + [False] * 2])[:, None, None, :]
    modules = (model.transformer_blocks[0].attn, model.single_transformer_blocks[0].attn,
               model.transformer_blocks[0].cross_attn)  # fmt: skip
    for attn in modules:
        attn = copy.deepcopy(attn).double()
        with torch.no_grad():
            for norm in (attn.norm_q, attn.norm_k):  # ones at init: random weights, so they count
                norm.weight.copy_(torch.rand(norm.weight.shape, generator=g, dtype=torch.float64) + 0.5)
        kw = dict(attention_mask=mask, image_rotary_emb=tables)
        outputs = []
        for read in (True, False):
            with monkeypatch.context() as m:
                if not read:
                    m.setattr(diffusers_processors, "read_norm", lambda *a, **k: None)
                with torch.no_grad():
                    outputs.append(MotifVideoRopeProcessor()(attn, x, text, **kw))
        for fused, unfused in zip(*(o if isinstance(o, tuple) else (o,) for o in outputs)):
            torch.testing.assert_close(fused, unfused, atol=chain_bound(U64, 256, 20) * float(unfused.abs().max()),
                                       rtol=0)  # fmt: skip
    assert len(fused_calls) == 2  # the two self-attentions (the cross-attention's queries have no keys to pair with)


def test_cosmos_image_context_as_stock(fused_calls, monkeypatch):
    # Cosmos 2.5's image context (the tiny model has none): its cross-attention modules are CosmosAttention, whose
    # stock processor (CosmosAttnProcessor2_5) adds an unrotated image branch. The whole model in float32 against
    # stock; then one such module given rotation tables and no text (stock then attends the tokens to themselves and
    # rotates their q and k; the model passes no tables there): ours against stock in float32, and fused against
    # unfused in float64
    import copy

    import diffusers

    torch.manual_seed(0)
    model = diffusers.CosmosTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=2, mlp_ratio=2.0,
        text_embed_dim=16, adaln_lora_dim=4, max_size=(16, 32, 32), concat_padding_mask=False,
        extra_pos_embed_type=None, img_context_dim_in=8, img_context_num_tokens=3, img_context_dim_out=24,
    ).eval()  # fmt: skip
    frames, h, w = tiny.TINY["CosmosTransformer3DModel"].grid
    inputs = tiny.inputs("CosmosTransformer3DModel", h, w, frames=frames)
    g = torch.Generator().manual_seed(0)
    inputs["encoder_hidden_states"] = (inputs["encoder_hidden_states"], torch.randn(2, 3, 8, generator=g))
    stock = _run(model, inputs)
    names, undo = _swap(model)
    assert sum(type(model.get_submodule(n.removesuffix(".processor"))).__name__ == "CosmosAttention"
               for n in names) == 2  # fmt: skip
    out = _run(model, inputs)
    assert len(fused_calls) == 2  # the self-attentions
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()

    from diffusers.models.transformers.transformer_cosmos import CosmosAttention, CosmosAttnProcessor2_5

    # (the model's take the text's width as keys: a module whose keys are the tokens' own)
    attn = CosmosAttention(query_dim=24, heads=2, dim_head=12, qk_norm="rms_norm", elementwise_affine=True,
                           processor=CosmosAttnProcessor2_5())  # fmt: skip
    stock_processor = attn.processor
    x, image = torch.randn(2, 6, 24, generator=g), torch.randn(2, 3, 24, generator=g)
    angles = torch.rand(6, 6, generator=g, dtype=torch.float64) * 6  # [S, D/2], half pairing: the table twice
    tables = tuple(torch.cat([f(angles)] * 2, -1) for f in (torch.cos, torch.sin))
    mask = (None, torch.tensor([[True] * 3, [True] * 2 + [False]])[:, None, None, :])  # (text, image)
    with torch.no_grad():
        for norm in (attn.norm_q, attn.norm_k):  # ones at init: random weights, so they count
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) + 0.5)
        kw = dict(attention_mask=mask, image_rotary_emb=tuple(t.float() for t in tables))
        want = stock_processor(attn, x, (None, image), **kw)
        ours = CosmosRopeProcessor()(attn, x, (None, image), **kw)
    delta = 2 * (12 / 2 + 14) * U32  # one attention layer: 4 delta of the values' scale (as above)
    torch.testing.assert_close(ours, want, atol=4 * delta * float(want.abs().max()), rtol=0)
    attn64 = copy.deepcopy(attn).double()
    for name in ("norm_q", "norm_k"):  # torch's RMSNorm: a float64 norm in the unfused path
        child = getattr(attn64, name)
        exact = torch.nn.RMSNorm(child.dim, eps=child.eps, dtype=torch.float64)
        exact.load_state_dict(child.state_dict())
        setattr(attn64, name, exact)
    args = (x.double(), (None, image.double()))
    with torch.no_grad():
        fused = CosmosRopeProcessor()(attn64, *args, attention_mask=mask, image_rotary_emb=tables)
        monkeypatch.setattr(diffusers_processors, "read_norm", lambda *a, **k: None)
        unfused = CosmosRopeProcessor()(attn64, *args, attention_mask=mask, image_rotary_emb=tables)
    assert len(fused_calls) == 4
    torch.testing.assert_close(fused, unfused, atol=chain_bound(U64, 256, 20) * float(unfused.abs().max()), rtol=0)


@pytest.mark.parametrize("mode", ["per_head", "scalar"])
def test_helios_amplified_history_keys_as_stock(mode, fused_calls):
    # is_amplify_history (the tiny model's is off): the history rows' rotated keys scaled, per head or by one
    # factor, in the self-attention. float32 against stock
    import diffusers

    from models.tiny_diffusers_common import WAN

    torch.manual_seed(0)
    model = diffusers.HeliosTransformer3DModel(**dict(WAN, num_layers=2), rope_dim=(4, 4, 4), is_amplify_history=True,
                                               history_scale_mode=mode).eval()  # fmt: skip
    with torch.no_grad():  # a scale of its own per block (and head)
        for block in model.blocks:
            block.attn1.history_key_scale.normal_()
    frames, h, w = tiny.TINY["HeliosTransformer3DModel"].grid
    inputs = tiny.inputs("HeliosTransformer3DModel", h, w, frames=frames)
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert len(fused_calls) == 2
    delta = 2 * (_norm_width(model) / 2 + 14) * U32  # across heads: n = H * D
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()


def test_easyanimate_single_stream_blocks_as_stock(fused_calls, monkeypatch):
    # EasyAnimate's blocks past mmdit_layers (the tiny model's are all MMDiT) have no text projections: the text
    # rows go before the video's through the same projections and norms, and only the video rows are rotated. The
    # model in float32 against stock, and fused against unfused in float64
    import diffusers

    torch.manual_seed(0)
    model = diffusers.EasyAnimateTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=15, num_layers=2,
        mmdit_layers=1, text_embed_dim=16, time_embed_dim=8,
    ).eval()  # fmt: skip
    with torch.no_grad():  # LayerNorms of ones and zeros at init: random weights and biases, so they count
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if ".norm_q." in name or ".norm_k." in name or ".norm_added_" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    frames, h, w = tiny.TINY["EasyAnimateTransformer3DModel"].grid
    inputs = tiny.inputs("EasyAnimateTransformer3DModel", h, w, frames=frames)
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert len(fused_calls) == 2  # one MMDiT block, one single-stream block
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    model, inputs = model.double(), {k: _cast(v, torch.float64) for k, v in inputs.items()}
    names, undo = _swap(model)
    _float64_norms(model)
    fused = _run(model, inputs)
    monkeypatch.setattr(diffusers_processors, "read_norm", lambda *a, **kw: None)
    unfused = _run(model, inputs)
    assert len(fused_calls) == 4
    torch.testing.assert_close(fused, unfused, atol=chain_bound(U64, 256, 20) * float(unfused.abs().max()), rtol=0)
    undo()


def test_hunyuan_dit_controlnet_as_stock(fused_calls):
    # HunyuanDiT's ControlNet (no tiny model of its own): its blocks are the transformer's, with its record and
    # processor. Float32 against stock, random LayerNorm weights and biases; the self-attentions fused, the
    # cross-attentions' queries rotated after their norm modules
    import diffusers

    from models.tiny_diffusers_image import HUNYUAN_DIT, hunyuan_dit_inputs

    torch.manual_seed(0)
    model = diffusers.HunyuanDiT2DControlNetModel(**HUNYUAN_DIT, transformer_num_layers=4).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for zeroed in (*model.controlnet_blocks, model.input_block):  # zero-initialised: give them weights
            torch.nn.init.normal_(zeroed.weight, std=0.5, generator=g)
        for name, p in model.named_parameters():
            if ".norm_q." in name or ".norm_k." in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    inputs = hunyuan_dit_inputs(4, 6, 1, g)
    inputs.update(controlnet_cond=torch.randn(2, 4, 8, 12, generator=g), conditioning_scale=1.0)

    def run():
        with torch.no_grad():
            return torch.stack(model(**inputs)[0])

    stock = run()
    handle = set_rope_processors(model)  # (not a tiny model: not in PROCESSORS)
    names, undo = list(handle.names), handle.remove
    assert all(type(m.processor) is HunyuanDiTRopeProcessor for n, m in model.named_modules() if f"{n}.processor" in names)
    out = run()
    assert len(fused_calls) == len([n for n in names if ".attn1." in n]) > 0
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    assert torch.equal(run(), stock)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_lumina_next_proportional_attention_and_norm_weights_as_stock(kv_heads, fused_calls, monkeypatch):
    # Lumina-Next with the pipeline's proportional attention (base_sequence_length) and random LayerNorm weights
    # and biases (each over its own tensor's heads: k's over kv_heads), grouped-query heads or not: float32 against
    # stock, and fused against unfused in float64
    import diffusers

    from models.tiny_diffusers_image import _lumina_next_inputs

    torch.manual_seed(0)
    model = diffusers.LuminaNextDiT2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=2, num_attention_heads=2,
        num_kv_heads=kv_heads, multiple_of=16, learn_sigma=False, cross_attention_dim=16,
    ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm_q." in name or ".norm_k." in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            if name.endswith(".gate"):  # zeros at init: the cross-attention would not count
                p.normal_(generator=g)
    inputs = dict(_lumina_next_inputs(4, 6, 1, g), cross_attention_kwargs={"base_sequence_length": 16})
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert len(fused_calls) == 2  # the self-attentions
    delta = 2 * (_norm_width(model) / 2 + 14) * U32  # across heads: n = H * D
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    model, inputs = model.double(), {k: _cast(v, torch.float64) for k, v in inputs.items()}
    names, undo = _swap(model)
    fused = _run(model, inputs)
    monkeypatch.setattr(diffusers_processors, "read_norm", lambda *a, **kw: None)
    unfused = _run(model, inputs)
    assert len(fused_calls) == 4
    torch.testing.assert_close(fused, unfused, atol=chain_bound(U64, 256, 20) * float(unfused.abs().max()), rtol=0)
    undo()


def test_ace_step_norm_weights_sliding_window_and_grouped_heads_as_stock(fused_calls):
    # ACE-Step 1.5 (the tiny model: a sliding-window layer and a full one per depth, one kv head of two) with random
    # RMSNorm weights (ones at init): float32 against stock; the cross-attentions normalise only
    name = "AceStepTransformer1DModel"
    model, inputs = _model(name, torch.float32, depth=2)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".norm_q." in n or ".norm_k." in n:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert len(fused_calls) == len([n for n in names if ".self_attn." in n]) == 4
    delta = 2 * (_norm_width(model) / 2 + 14) * U32
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    assert torch.equal(_run(model, inputs), stock)


def test_longcat_audio_norm_weights_and_padding_as_stock(fused_calls):
    # LongCat-AudioDiT with random RMSNorm weights across heads (ones at init) and the tiny inputs' padded second
    # item (its masked rows' outputs zeroed, as stock): float32 against stock; the cross-attentions stay stock
    name = "LongCatAudioDiTTransformer"
    model, inputs = _model(name, torch.float32, depth=2)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".q_norm." in n or ".k_norm." in n:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert all(".self_attn." in n for n in names) and len(fused_calls) == len(names) == 2
    delta = 2 * (_norm_width(model) / 2 + 14) * U32  # across heads: n = H * D
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    assert torch.equal(_run(model, inputs), stock)


def test_anyflow_norm_weights_and_two_tables_as_stock(fused_calls):
    # AnyFlow with random RMSNorm weights across heads (ones at init): float32 against stock; then one self-attention
    # module given two table objects (query, key: no one table for both, so the norm modules, then each rotation)
    # against its stock processor
    name = "AnyFlowTransformer3DModel"
    model, inputs = _model(name, torch.float32, depth=2)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".norm_q." in n or ".norm_k." in n:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    stock = _run(model, inputs)
    names, undo = _swap(model)
    out = _run(model, inputs)
    assert all(".attn1." in n for n in names) and len(fused_calls) == len(names) == 2
    delta = 2 * (_norm_width(model) / 2 + 14) * U32  # across heads: n = H * D
    torch.testing.assert_close(out, stock, atol=4 * len(names) * delta * float(stock.abs().max()), rtol=0)
    undo()
    attn = model.blocks[0].attn1
    x = torch.randn(2, 5, attn.to_q.in_features, generator=g)
    angles = torch.rand(1, 1, 5, attn.to_q.out_features // attn.heads // 2, generator=g, dtype=torch.float64) * 6
    freqs = torch.polar(torch.ones_like(angles), angles)
    tables = {"query": freqs, "key": freqs.clone()}
    with torch.no_grad():
        want, ours = attn.processor(attn, x, rotary_emb=tables), AnyFlowRopeProcessor()(attn, x, rotary_emb=tables)
    assert len(fused_calls) == 2
    torch.testing.assert_close(ours, want, atol=4 * delta * float(want.abs().max()), rtol=0)
