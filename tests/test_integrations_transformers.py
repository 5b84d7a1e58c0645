"""``apply_axial_rope`` on a tiny random model of every family (``models/tiny_transformers.py``): logits,
greedy generation with the KV cache and gradients equal stock, the patched model compiles with
``fullgraph=True``, ``remove()`` restores stock bit for bit; the fused QK-norm against stock's separate norm
and rotation (float32 within a derived bound, float64 to rounding); float64 angles at position 1e5; a model
patched by another library, or not served, is refused with a message.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from helpers import U32, U64, chain_bound  # noqa: E402

from axial_rope.integrations import transformers_rotation as rotation  # noqa: E402
from axial_rope.integrations.transformers import apply_axial_rope, serves  # noqa: E402
from models import tiny_transformers as ts  # noqa: E402 - imports transformers

# Stock and ours are one model evaluated in other orders (the rotation's products and sums; from_config: tables
# from float64 angles, within (2 p + 2) u of stock's at p <= 16, below one stage's share). The sums of a forward:
# per layer q/k/v projections, attention scores, weighted values, o_proj, the MLP's two projections and two norms
# (7), then the final norm and lm_head (2), at most 64 terms each: helpers.chain_bound(u, 64, 7 * 2 + 2) of the
# logits' scale; the backward doubles the stages. float64: 9e-13 (the equality claim); float32: 4.9e-4.
FORWARD, BACKWARD = chain_bound(U64, 64, 16), chain_bound(U64, 64, 32)
FORWARD32 = chain_bound(U32, 64, 16)
# Stock stages computed in float32 whatever the model's dtype: Llama 4's rotation (xq.float()), Gemma 3's norms
# (self._norm(x.float()): its backward is float32); a float64 model of these is held to the float32 bound
STOCK_FLOAT32 = {"llama4_text", "gemma3"}
U = U32
# compiled: one case per family (Llama's scalings change the tables stock computes, not the code traced; with
# "dynamic", stock itself breaks the graph: dynamic_frequency_update branches on max(position_ids))
COMPILED = tuple(name for name in ts.NAMES if "-" not in name)


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("name", ts.NAMES)
def test_logits_equal_stock_in_float64_and_remove_restores_it_bit_for_bit(name):
    """By the model's tables (the fused QK-norm turns by float64 angles and normalises in the input's dtype,
    stock's norm in float32: test_fused_qk_norm_equals_stock_norm_then_rotation)."""
    case = ts.case64(name)
    stock = logits(case.model, case.inputs)
    handle = apply_axial_rope(case.model, fuse_qk_norm=False)
    assert not handle.fused, handle
    patched = logits(case.model, case.inputs)
    handle.remove()
    bound = FORWARD32 if name in STOCK_FLOAT32 else FORWARD
    assert (patched - stock).abs().max() <= bound * stock.abs().max()
    assert torch.equal(logits(case.model, case.inputs), stock)
    assert not any("forward" in vars(m) or m._get_name() == "ConfigRotary" for m in case.model.modules())


@pytest.mark.parametrize("from_config", [False, True], ids=["tables", "from_config"])
@pytest.mark.parametrize("name", ts.NAMES)
def test_float32_logits_within_the_bound_and_remove_restores_them(name, from_config):
    case = ts.case(name)
    stock = logits(case.model, case.inputs)
    with apply_axial_rope(case.model, from_config=from_config) as handle:
        assert len(handle.fused) == case.fused, handle
        patched = logits(case.model, case.inputs)
    assert (patched - stock).abs().max() <= FORWARD32 * stock.abs().max()
    assert torch.equal(logits(case.model, case.inputs), stock)
    assert not any("forward" in vars(m) or m._get_name() == "ConfigRotary" for m in case.model.modules())


@pytest.mark.parametrize("name", ts.NAMES)
def test_greedy_generation_with_the_cache_chooses_the_stock_tokens(name):
    case = ts.case(name)
    generate = dict(case.inputs, max_new_tokens=3, do_sample=False, use_cache=True)
    stock = case.model.generate(**generate)
    with apply_axial_rope(case.model):
        assert torch.equal(case.model.generate(**generate), stock)


def gradients(model, inputs) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(**inputs).logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("name", ts.NAMES)
def test_gradients_equal_stock_in_float64(name):
    case = ts.case64(name)
    stock = gradients(case.model, case.inputs)
    with apply_axial_rope(case.model, fuse_qk_norm=False):
        patched = gradients(case.model, case.inputs)
    assert patched.keys() == stock.keys() and stock
    bound = 2 * FORWARD32 if name in STOCK_FLOAT32 else BACKWARD
    for key, want in stock.items():  # of each gradient's scale (its largest entry)
        assert (patched[key] - want).abs().max() <= bound * want.abs().max(), key


def compile_target(case, name):
    """The module and inputs to compile: the language model at get_rope_index's M-RoPE positions for the
    vision-language families (their image placement is data-dependent in stock), else the whole model."""
    if name not in ts.VISION:
        return case.model, case.inputs
    model, inputs = case.model.model, case.inputs
    with torch.no_grad():
        pos, _ = model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                      image_grid_thw=inputs["image_grid_thw"])  # fmt: skip
        embeds = model.get_input_embeddings()(inputs["input_ids"])
    return model.language_model, {"inputs_embeds": embeds, "position_ids": pos}  # pos [3, B, S]


@pytest.mark.parametrize("name", COMPILED)
def test_compiles_fullgraph_without_a_graph_break(name):
    case = ts.case(name)
    target, inputs = compile_target(case, name)
    torch._dynamo.reset()
    with apply_axial_rope(case.model), torch.no_grad():
        eager = target(**inputs)[0]
        compiled = torch.compile(target, fullgraph=True, backend="eager")  # raises at a graph break
        assert (compiled(**inputs)[0] - eager).abs().max() <= FORWARD32 * eager.abs().max()  # the same ops, traced


def stock_norm_rotate(attn, module, h, cos, sin):
    """Stock's separate steps: q_norm / k_norm over [B, S, H, D], then apply_rotary_pos_emb (bhsd)."""
    shape = (*h.shape[:-1], -1, attn.head_dim)
    q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
    return module.apply_rotary_pos_emb(q, k, cos, sin)


def fused_norm_rotate(attn, h, cos, sin, position_ids, settings=None):
    shape = (*h.shape[:-1], -1, attn.head_dim)
    settings = settings or attn.forward.args[1]  # the installed partial(fused_forward, attn, settings)
    q, k = attn.q_proj(h).view(shape), attn.k_proj(h).view(shape)
    q, k = rotation._norm_rotate(attn, settings, q, k, (cos, sin), position_ids)
    return q.transpose(1, 2), k.transpose(1, 2)


def fused_bound(attn, positions: torch.Tensor) -> float:
    """float32 |fused - stock| per entry. A normalised channel is at most sqrt(D) max|w| in size; stock's angle
    fl(fl(p) * fl(inv_freq)) is off by at most 2 p max(inv_freq) U (inv_freq <= 1) and its cos/sin by U more,
    ours by U: each output a cos - b sin then differs by 2 sqrt(D) max|w| (2 p U + 2 U), plus the roundings of
    the norm and the two products and sum (4 U of the value)."""
    weight = max(float((n.weight.float() + (1 if n.weight.abs().mean() < 0.5 else 0)).abs().max())
                 for n in (attn.q_norm, attn.k_norm))  # fmt: skip  # Gemma's (1 + w), w drawn near 0
    size = math.sqrt(attn.head_dim) * weight
    return 2 * size * (2 * float(positions.max()) * U + 2 * U) + 4 * U * size


def float64_norm_rotate(attn, h, cos, sin):
    """The float64 reference, written out: RMSNorm over D (Gemma: times 1 + w), then q cos + rotate_half(q) sin."""
    shape = (*h.shape[:-1], -1, attn.head_dim)
    out = []
    for proj, norm in ((attn.q_proj, attn.q_norm), (attn.k_proj, attn.k_norm)):
        x = proj(h).view(shape).transpose(1, 2)  # [B, H, S, D]
        w = norm.weight + (1.0 if type(norm).__name__.startswith("Gemma") else 0.0)
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps_value) * w
        half = torch.cat((-x[..., attn.head_dim // 2 :], x[..., : attn.head_dim // 2]), -1)
        out.append(x * cos[:, None] + half * sin[:, None])
    return out


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "qwen3_vl"])
def test_fused_qk_norm_equals_stock_norm_then_rotation(name):
    """float32: within :func:`fused_bound` of stock (by positions for Qwen3 and Gemma 3, by the tables for
    Qwen3-VL, whose attention gets no M-RoPE positions); float64: a float64 norm then rotation, to rounding,
    forward and backward (by the input and both norm weights)."""
    case = ts.case(name)
    text = case.model.model.language_model if name in ts.VISION else case.model.model
    module = __import__(type(text).__module__, fromlist=["apply_rotary_pos_emb"])
    h = torch.randn(2, 7, text.config.hidden_size, generator=torch.Generator().manual_seed(5))
    position_ids = torch.stack([torch.arange(7), torch.arange(20, 27)])  # [B, S]
    attn = text.layers[-1].self_attn  # Gemma 3: the global layer, theta 1e6 with linear scaling
    rotary_ids = position_ids.expand(3, -1, -1) if name in ts.VISION else position_ids
    rotary_args = (attn.layer_type,) if name == "gemma3" else ()
    with torch.no_grad():
        cos, sin = text.rotary_emb(h, rotary_ids, *rotary_args)
        want = stock_norm_rotate(attn, module, h, cos, sin)
        with apply_axial_rope(case.model):
            assert ("axial_rope" in attn._modules) == (name != "qwen3_vl")  # positions reach the attention
            got = fused_norm_rotate(attn, h, cos, sin, position_ids)
            settings = attn.forward.args[1]
            attn64 = copy.deepcopy(attn).double()  # a copy is stock: give it the fused attention's rope
            if "axial_rope" in attn._modules:
                attn64.add_module("axial_rope", copy.deepcopy(attn.axial_rope))
        for g, w in zip(got, want):
            assert (g - w).abs().max() <= fused_bound(attn, position_ids)
    if "axial_rope" in attn64._modules:  # by positions: F at float64 angles
        rot = attn64.axial_rope.rotation(position_ids[..., None])
        angles = position_ids[..., None].double() * rot.freqs[0]  # [B, S, n]
        factor = 1.0 if rot.attention_factor is None else rot.attention_factor
        cos64, sin64 = (torch.cat((t, t), -1) * factor for t in (angles.cos(), angles.sin()))
    else:  # by the tables: any float64 tables
        cos64, sin64 = cos.double(), sin.double()
    h64 = h.double().requires_grad_()
    for norm in (attn64.q_norm, attn64.k_norm):
        norm.eps_value = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    got64 = fused_norm_rotate(attn64, h64, cos64, sin64, position_ids, settings)
    want64 = float64_norm_rotate(attn64, h64, cos64, sin64)
    for g, w in zip(got64, want64):
        assert g.dtype == torch.float64 and (g - w).abs().max() <= 1e-12
    # backward: the gradients of <out, g> for a random g, by the input and by both norms' weights
    upstream = [torch.randn(t.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64) for t in want64]
    leaves = (h64, attn64.q_norm.weight, attn64.k_norm.weight)
    grads = torch.autograd.grad(sum((t * u).sum() for t, u in zip(got64, upstream)), leaves)
    wants = torch.autograd.grad(sum((t * u).sum() for t, u in zip(want64, upstream)), leaves)
    for g, w in zip(grads, wants):  # sums of at most 2 * 7 * 32 terms: within chain_bound(U64, 448, 4) of the scale
        assert (g - w).abs().max() <= chain_bound(U64, 448, 4) * w.abs().max()


def test_from_config_angles_at_position_1e5_are_float64_accurate():
    """Stock multiplies positions by inverse frequencies in float32 (angles off by up to 1e-2 rad at 1e5); the rope
    rebuilt from the config turns by float64 angles: the float32 logits land >100x closer to a float64 model's."""
    case = ts.case("llama")
    ids = case.inputs["input_ids"]
    far = {"input_ids": ids, "position_ids": (100_000 + torch.arange(ids.shape[1])).expand(ids.shape[0], -1)}
    model64 = copy.deepcopy(case.model).double()
    with apply_axial_rope(model64, from_config=True):
        reference = logits(model64, far)  # float64 angles, tables and arithmetic
    stock = (logits(case.model, far).double() - reference).abs().max()
    with apply_axial_rope(case.model, from_config=True):
        ours = (logits(case.model, far).double() - reference).abs().max()
    # ours: the float32 rounding of one forward (FORWARD32 of the scale); stock's angles are off by up to
    # 2 u p = 1.2e-2 rad besides, which lands it outside that bound; the docs' ">100x" is this seeded case's
    bound = FORWARD32 * reference.abs().max()
    assert ours <= bound < stock and ours * 100 <= stock, (float(ours), float(stock), float(bound))


def test_a_model_patched_by_another_library_is_refused(monkeypatch):
    """Liger-Kernel rebinds modeling_llama.apply_rotary_pos_emb; Unsloth rebinds LlamaAttention.forward."""
    from transformers.models.llama import modeling_llama

    model = ts.case("llama").model

    def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        return q, k

    liger_rotary_pos_emb.__module__, liger_rotary_pos_emb.__qualname__ = (
        "liger_kernel.transformers.rope",
        "liger_rotary_pos_emb",
    )
    with monkeypatch.context() as patch:
        patch.setattr(modeling_llama, "apply_rotary_pos_emb", liger_rotary_pos_emb)
        with pytest.raises(
            RuntimeError, match="is liger_kernel.transformers.rope.liger_rotary_pos_emb, not transformers"
        ):
            apply_axial_rope(model)
    stock = modeling_llama.LlamaAttention.forward

    def fast_forward(self, *args, **kwargs):
        return stock(self, *args, **kwargs)

    fast_forward.__module__, fast_forward.__qualname__ = "unsloth.models.llama", "LlamaAttention_fast_forward"
    with monkeypatch.context() as patch:
        patch.setattr(modeling_llama.LlamaAttention, "forward", fast_forward)
        with pytest.raises(RuntimeError, match="LlamaAttention.forward is unsloth.models.llama"):
            apply_axial_rope(model)
    assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__  # nothing left behind


def test_a_kernels_function_module_is_read_through_and_a_kernelized_one_refused(monkeypatch):
    """transformers 5.25 with ``kernels``: apply_rotary_pos_emb is a function module calling the stock function (its
    digest is the stock one); once ``kernelize`` gives the instance a forward of its own, it runs a hub kernel."""
    import copy

    from transformers.models.llama import modeling_llama

    from axial_rope.integrations import transformers_rotation as rotary_code

    fn = modeling_llama.apply_rotary_pos_emb
    if not isinstance(fn, torch.nn.Module):
        pytest.skip("this transformers keeps apply_rotary_pos_emb a function (no kernels function module)")
    plain = rotary_code.plain_function(fn)
    assert plain is not fn and plain.__name__ == "apply_rotary_pos_emb" and rotary_code.digest(fn) in rotary_code.BODIES
    kernelized = copy.copy(fn)
    kernelized.forward = lambda *args, **kwargs: args[:2]  # what kernelize binds: a hub kernel's forward
    assert rotary_code.plain_function(kernelized) is None
    with monkeypatch.context() as patch:
        patch.setattr(modeling_llama, "apply_rotary_pos_emb", kernelized)
        with pytest.raises(RuntimeError, match="patched by another library"):
            apply_axial_rope(ts.case("llama").model)
    assert modeling_llama.apply_rotary_pos_emb is fn


def test_liger_kernel_patch_is_detected():
    liger = pytest.importorskip("liger_kernel.transformers")
    from transformers.models.llama import modeling_llama

    stock = modeling_llama.apply_rotary_pos_emb
    try:
        liger.apply_liger_kernel_to_llama(rope=True, rms_norm=False, swiglu=False, cross_entropy=False,
                                          fused_linear_cross_entropy=False)  # fmt: skip
        with pytest.raises(RuntimeError, match="patched by another library"):
            apply_axial_rope(ts.case("llama").model)
    finally:
        modeling_llama.apply_rotary_pos_emb = stock


def test_a_second_handle_on_the_same_module_is_refused_and_remove_is_idempotent():
    model = ts.case("qwen2").model
    with apply_axial_rope(model) as handle:
        with pytest.raises(RuntimeError, match="already axial_rope's: another handle"):
            apply_axial_rope(model)
    handle.remove()
    from transformers.models.qwen2 import modeling_qwen2

    assert rotation.digest(modeling_qwen2.apply_rotary_pos_emb) in rotation.BODIES


def test_an_unsupported_model_is_refused_naming_its_model_type_and_the_served_families():
    config = transformers.GPTJConfig(n_embd=64, n_head=2, n_layer=1, vocab_size=64, rotary_dim=16)
    with pytest.raises(TypeError, match=r"model_type 'gptj' \(GPTJForCausalLM\): model_type 'gptj' is refused: "
                                        r"its rotary covers .* Served: Llama \(llama\), Mistral"):  # fmt: skip
        apply_axial_rope(transformers.GPTJForCausalLM(config))
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel, got Linear"):
        apply_axial_rope(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="backend must be None or one of"):
        apply_axial_rope(ts.case("llama").model, backend="cuda")
    gpt_oss = transformers.GptOssConfig(**{k: v for k, v in ts.SIZES.items() if k != "initializer_range"})
    assert "its rotation function is not one of the pinned forms" in serves(gpt_oss)
    assert serves(ts.case("qwen2_5_vl").model.config) is None


_IMPORT_CHECK = """
import importlib, inspect, sys
assert not any(name.startswith("axial_rope") for name in sys.modules)
modules = [importlib.import_module(f"transformers.models.{n}.modeling_{n}") for n in sys.argv[1:]]
before = {(m.__name__, k): v for m in modules for k, v in vars(m).items()}
# getattr_static: the class's forward function, not a bound method made anew per read (kernels' function modules)
forwards = {(m.__name__, k): inspect.getattr_static(v, "forward") for m in modules for k, v in vars(m).items()
            if hasattr(v, "forward")}
for name in ("axial_rope", "axial_rope.integrations.transformers", "axial_rope.integrations.transformers_rotation"):
    importlib.reload(importlib.import_module(name))
changed = [key for m in modules for key, v in vars(m).items() if before.get((m.__name__, key), v) is not v]
changed += [key for key, f in forwards.items()
            if inspect.getattr_static(vars(sys.modules[key[0]])[key[1]], "forward") is not f]
assert not changed, changed
print(len(modules), len(before))
"""


def test_importing_axial_rope_and_the_integration_changes_nothing_in_transformers():
    """In a fresh process: every served family's modeling module (its functions, its classes' forwards) is the
    same object after importing, and re-importing, axial_rope and the integration; only apply_axial_rope rebinds."""
    import pathlib
    import subprocess
    import sys

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    from axial_rope.integrations.transformers import FAMILIES

    names = sorted({model_type_to_module_name(t) for types, _ in FAMILIES.values() for t in types})
    root = pathlib.Path(__file__).resolve().parents[1]  # this checkout's axial_rope
    result = subprocess.run([sys.executable, "-c", _IMPORT_CHECK, *names], capture_output=True, text=True,
                            timeout=120, cwd=root)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    modules, names = map(int, result.stdout.split())
    assert modules >= 12 and names > 100


def sweep() -> tuple[list[str], dict[str, str]]:
    """Every model type of the installed transformers with a rotary (model_types_support): served by
    apply_axial_rope on its tiny config, or refused with the reason (no tiny config, not pinned, ...)."""
    import model_types_support as mts

    served, refused = [], {}
    for model_type in mts.rotary_model_types():
        try:
            reason = serves(mts.tiny_config(model_type))
        except mts.NotSwept as error:
            reason = str(error)
        if reason is None:
            served.append(model_type)
        else:
            refused[model_type] = reason
    return served, refused


def test_sweep_of_every_rotary_model_type_serves_the_families_and_gives_each_refusal_a_reason():
    from axial_rope.integrations.transformers import FAMILIES

    served, refused = sweep()
    print(f"\nrotary model types: {len(served) + len(refused)}, served {len(served)}, refused {len(refused)}")
    for model_type, reason in sorted(refused.items()):
        print(f"  refused {model_type}: {reason}")
    assert len(served) + len(refused) > 300 and len(served) > 100  # transformers 5.24: 371 types, 174 served
    families = {t for types, _ in FAMILIES.values() for t in types}
    assert families <= set(served), sorted(families - set(served))
    assert all(len(reason) > 10 for reason in refused.values())


def test_docs_transformers_section_runs_and_lists_every_family():
    import re
    from pathlib import Path

    from axial_rope.integrations.transformers import FAMILIES

    text = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    (part,) = [b for b in re.split(r"^## ", text, flags=re.M) if b.startswith("transformers")]
    blocks = re.findall(r"```python\n(.*?)```", part, flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/integrations.md:transformers", "exec"), {})
    for family, (types, _) in FAMILIES.items():
        assert f"| {family} | {', '.join(f'`{t}`' for t in types)} |" in part, family


def test_bench_transformers_times_stock_and_ours_for_a_family():
    from scripts import bench_transformers

    (row,) = bench_transformers.main(["--families", "qwen3", "--seq", "16", "--repeat", "1", "--rounds", "1"])
    assert row["family"] == "qwen3" and row["fused layers"] == 2
    assert row["rotation ours / stock"] > 0 and row["forward ours / stock"] > 0


def test_gpu_transformers_script_runs_its_small_shapes_on_the_cpu():
    from scripts import gpu_transformers

    attention, mrope = gpu_transformers.main(["--small", "--repeat", "1"])
    assert attention["fused layers"] == 1 and attention["patched max diff"] < 1e-2  # bf16: an ulp of O(1)
    assert mrope["axial_rope max diff"] <= 2**-6 and "liger" in mrope["not run"]  # bf16: an ulp of |x| < 4


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_an_explicit_backend_rotates_every_layer_and_keeps_the_design_signature(backend):
    import inspect

    params = inspect.signature(apply_axial_rope).parameters  # DESIGN.md: apply_axial_rope(model, backend, fuse_qk_norm)
    assert list(params)[:3] == ["model", "backend", "fuse_qk_norm"] and params["fuse_qk_norm"].default is True
    case = ts.case64("qwen3")
    stock = logits(case.model, case.inputs)
    with apply_axial_rope(case.model, backend, False):
        patched = logits(case.model, case.inputs)
    assert (patched - stock).abs().max() <= FORWARD * stock.abs().max()
