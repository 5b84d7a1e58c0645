"""Reference models: image DiT, video DiT, RoPE language model with KV cache; the docs' examples run."""

from __future__ import annotations

import ast
import math
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # models/ is not installed: import it from the repository root
    sys.path.insert(0, str(ROOT))

from helpers import U32, U64, chain_bound  # noqa: E402

import axial_rope as ar  # noqa: E402
from models.dit import PRESETS as DIT_PRESETS  # noqa: E402
from models.dit import DiT, DiTConfig, initialize_weights  # noqa: E402
from models.gpt import GPT, GPTConfig, sample  # noqa: E402
from models.video_dit import VideoDiT, VideoDiTConfig, default_axes_dim  # noqa: E402

COMPILE_BACKEND = os.environ.get("AXIAL_ROPE_COMPILE_BACKEND", "aot_eager")  # see tests/test_layers.py

# the DiT paper's Table 1 (Peebles & Xie 2023), millions of parameters
PAPER_PARAMS = {"DiT-S/2": 33e6, "DiT-B/2": 130e6, "DiT-L/2": 458e6, "DiT-XL/2": 675e6}

TINY_DIT = DiTConfig(input_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=2, num_heads=2, num_classes=5)
TINY_GPT = GPTConfig(vocab_size=64, depth=2, num_heads=4, num_kv_heads=2, hidden_size=32, max_seq_len=8)


def _randomize(module: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)
    return module


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# -- image DiT -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PAPER_PARAMS))
def test_dit_preset_parameter_count_matches_the_paper(name):
    config = DIT_PRESETS[name]
    # build one block for real (XL would be 2.7 GB in float32): total = the depth-1 model + (depth - 1) blocks
    one = DiT(replace(config, depth=1))
    count = _n_params(one) + (config.depth - 1) * _n_params(one.blocks[0])
    assert abs(count / PAPER_PARAMS[name] - 1) < 0.02, f"{name}: {count:,} vs {PAPER_PARAMS[name]:,.0f}"


def test_dit_xl_has_head_dim_72_and_tiny_has_1_28m_parameters():
    xl = DIT_PRESETS["DiT-XL/2"]
    assert (xl.hidden_size, xl.depth, xl.num_heads, xl.hidden_size // xl.num_heads) == (1152, 28, 16, 72)
    tiny = DiT(DIT_PRESETS["tiny"])
    assert tiny.rope.axes_dim == (16, 16)
    assert abs(_n_params(tiny) / 1.28e6 - 1) < 0.02  # 1.28 M parameters, as docs/models.md says


@pytest.mark.parametrize("size", [(8, 8), (6, 10), (14, 4), (2, 2)])
@pytest.mark.parametrize("pos_mode", ["none", "interpolate", "ntk", "yarn", "normalize"])
def test_dit_runs_at_any_resolution_and_aspect(size, pos_mode):
    model = _randomize(DiT(TINY_DIT))
    x = torch.randn(2, 3, *size)
    out = model(x, torch.rand(2), torch.tensor([0, 4]), pos_mode=pos_mode)
    assert out.shape == (2, 6, *size) and torch.isfinite(out).all()


def test_dit_position_modes_agree_at_the_training_size_and_differ_beyond():
    model = _randomize(DiT(TINY_DIT), std=0.3).double().eval()  # eval: no label dropout
    args = (torch.rand(2, dtype=torch.float64), torch.tensor([1, 2]))
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    ref = model(x, *args, pos_mode="none")
    for mode in ("interpolate", "ntk", "yarn", "normalize"):  # normalize = centred integers: a translation
        # float64: nothing scaled, or a translation (angles < 10 rad, 1e-15 rad of rounding): < 1e-12 apart
        torch.testing.assert_close(model(x, *args, pos_mode=mode), ref, atol=1e-9, rtol=1e-9)
    big = torch.randn(2, 3, 16, 8, dtype=torch.float64)
    outs = {mode: model(big, *args, pos_mode=mode) for mode in ("none", "interpolate", "ntk", "yarn")}
    for mode in ("interpolate", "ntk", "yarn"):
        assert (outs[mode] - outs["none"]).abs().max() > 1e-4, mode
    # the config field sets the default
    model_i = DiT(replace(TINY_DIT, pos_mode="interpolate"))
    model_i.load_state_dict(model.float().state_dict())
    # the same float32 arithmetic on both sides (the mode from the config or the call): equal
    torch.testing.assert_close(model_i(big.float(), *args), model(big.float(), *args, pos_mode="interpolate"))


def test_dit_is_zero_at_init_and_gradients_reach_every_parameter():
    model = DiT(TINY_DIT)
    x, t, y = torch.randn(2, 3, 6, 4), torch.rand(2), torch.tensor([0, 3])
    assert model(x, t, y).abs().max() == 0  # adaLN-Zero and a zero final layer
    model = _randomize(model).train()
    model(x, t, y).square().mean().backward()
    for name, p in model.named_parameters():
        if name == "y_embedder.embedding_table.weight":  # only rows of the labels seen get a gradient
            assert p.grad[[0, 3]].abs().sum() > 0
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_dit_positions_are_positions_for_size_and_forward_leaves_the_rope_as_built():
    model = DiT(TINY_DIT)  # trained grid 4 x 4 tokens
    for mode in ar.POSITION_MODES:
        pos, scaling = model.positions(8, 3, mode)
        expected = ar.positions_for_size((8, 3), (4, 4), mode)
        torch.testing.assert_close(pos, expected.pos)
        assert scaling == expected.scaling
    assert model.positions(4, 4, "yarn")[1] == (None, None)  # nothing scaled at the trained size
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 16), torch.tensor([500.0]), torch.tensor([1]), pos_mode="ntk")
    assert model.rope.scaling == (None, None) and not hasattr(model, "_scaled_ropes")


def test_dit_initialisation_is_dits_scheme():
    torch.manual_seed(0)
    model = DiT(DIT_PRESETS["tiny"])  # class_init_std 1.0
    params = dict(model.named_parameters())

    def xavier_bound(w):
        fan_out, fan_in = w.shape[0], w[0].numel()
        return math.sqrt(6 / (fan_in + fan_out))

    for name, p in params.items():
        if name.endswith("bias") or "adaLN_modulation" in name or name.startswith("final_layer"):
            assert p.abs().max() == 0, name  # zero biases, adaLN-Zero, zero final layer
        elif name.startswith(("x_embedder", "blocks")):  # xavier-uniform, the patch kernel as a linear map
            bound = xavier_bound(p)
            assert p.abs().max() <= bound and p.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1), name
    for name in ("t_embedder.mlp.0.weight", "t_embedder.mlp.2.weight"):
        assert params[name].std().item() == pytest.approx(0.02, rel=0.05), name
    assert params["y_embedder.embedding_table.weight"].std().item() == pytest.approx(1.0, rel=0.2)
    # initialize_weights draws every parameter: two differently perturbed models, re-initialised from
    # one seed, are equal (and a model built from that seed is DiT's scheme again)
    a, b = _randomize(DiT(TINY_DIT)), _randomize(DiT(TINY_DIT), std=1.0)
    for m in (a, b):
        torch.manual_seed(3)
        initialize_weights(m)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


def test_video_dit_initialisation_shares_the_scheme():
    config = VideoDiTConfig(in_channels=3, hidden_size=48, depth=1, num_heads=2, num_classes=3, cond_dim=5)
    a, b = _randomize(VideoDiT(config)), _randomize(VideoDiT(config), std=1.0)
    for m in (a, b):
        torch.manual_seed(3)
        initialize_weights(m)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    x = torch.randn(1, 3, 2, 4, 4)
    assert a(x, torch.rand(1), torch.tensor([1]), torch.randn(1, 5)).abs().max() == 0
    assert a.y_embedder.embedding_table.weight.std().item() == pytest.approx(0.02, rel=0.3)


def test_dit_guidance_scale_one_is_the_conditional_prediction():
    model = _randomize(DiT(TINY_DIT)).eval().double()
    x, t, y = torch.randn(2, 3, 4, 6, dtype=torch.float64), torch.rand(2, dtype=torch.float64), torch.tensor([1, 2])
    # an equality, in float64: the guided batch is twice as large (other matmul blockings) and adds
    # u + 1 * (c - u): a chain of < 1e3 roundings of 1.1e-16, amplified < 1e2 by two blocks: < 1e-11
    torch.testing.assert_close(model.forward_with_cfg(x, t, y, 1.0), model(x, t, y), atol=1e-10, rtol=1e-10)
    assert model.forward_with_cfg(x, t, y, 4.0).shape == (2, 6, 4, 6)


def test_dit_rejects_unknown_pos_mode_and_odd_sizes():
    model = DiT(TINY_DIT)
    with pytest.raises(ValueError, match="pos_mode"):
        model(torch.randn(1, 3, 4, 4), torch.rand(1), torch.tensor([0]), pos_mode="bilinear")
    with pytest.raises(ValueError, match="divisible"):
        model(torch.randn(1, 3, 5, 4), torch.rand(1), torch.tensor([0]))


# -- video DiT -------------------------------------------------------------------


def test_video_axes_split_follows_wan():
    assert default_axes_dim(128) == (44, 42, 42)
    assert default_axes_dim(64) == (24, 20, 20)
    assert sum(default_axes_dim(32)) <= 32


@pytest.mark.parametrize("frames,size", [(1, (4, 6)), (3, (2, 2)), (5, (6, 4))])
def test_video_dit_any_frame_count_with_class_or_vector_conditioning(frames, size):
    config = VideoDiTConfig(in_channels=3, hidden_size=48, depth=1, num_heads=2, num_classes=3, cond_dim=5)
    model = _randomize(VideoDiT(config))
    x = torch.randn(2, 3, frames, *size)
    out = model(x, torch.rand(2), torch.tensor([0, 2]), torch.randn(2, 5))
    assert out.shape == x.shape and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="cond is required"):
        model(x, torch.rand(2), torch.tensor([0, 2]))


def test_video_dit_temporal_scaling_riflex_changes_only_time():
    config = VideoDiTConfig(in_channels=3, hidden_size=48, depth=1, num_heads=2, cond_dim=4)
    model = _randomize(VideoDiT(config), std=0.3)
    x, t, cond = torch.randn(1, 3, 6, 4, 4), torch.rand(1), torch.randn(1, 4)
    plain = model(x, t, cond=cond)
    riflex = ar.scaling.RIFLEx(k=2, test_length=6)
    out = model(x, t, cond=cond, temporal_scaling=riflex)
    assert (out - plain).abs().max() > 1e-4
    # the scaled rotation is computed per call from the trained rope, which forward never changes
    assert model.rope.scaling == (None, None, None) and not hasattr(model, "_scaled_ropes")
    torch.testing.assert_close(model(x, t, cond=cond), plain)
    # one frame: every token has t = 0, so the temporal spectrum cannot matter
    x1 = x[:, :, :1]  # time angles exactly 0 either way: the same arithmetic
    torch.testing.assert_close(model(x1, t, cond=cond, temporal_scaling=riflex), model(x1, t, cond=cond))


# -- language model ----------------------------------------------------------------


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        ar.scaling.Linear(2.0),
        ar.scaling.NTK(4.0),
        ar.scaling.DynamicNTK(2.0, 8),
        ar.scaling.YaRN(4.0, 8),
        ar.scaling.Llama3(8.0, 8),
        ar.scaling.LongRoPE((1.0, 1.2, 1.5, 2.0), (1.0, 2.0, 4.0, 8.0), 8, factor=4.0),
    ],
    ids=lambda s: type(s).__name__,
)
@pytest.mark.parametrize("num_kv_heads,dtype", [(4, torch.float32), (1, torch.float32), (2, torch.float64)], ids=str)
def test_greedy_decoding_with_cache_equals_full_recomputation(scaling, num_kv_heads, dtype):
    model = GPT(replace(TINY_GPT, scaling=scaling, num_kv_heads=num_kv_heads)).to(dtype).eval()
    _randomize(model, std=0.5)  # larger logit gaps, so an argmax tie cannot decide the test
    prompt = torch.randint(0, 64, (2, 5))
    cached, cached_logits = model.generate(prompt, 9, temperature=0, return_logits=True)
    full, full_logits = model.generate(prompt, 9, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, full)
    # decoding one row and recomputing all rows sum each dot product (<= 128 terms: norms, projections,
    # attention, MLP, the tied output; 10 stages) in other orders (other matmul kernels): within
    # chain_bound of the logits' scale, 6e-4 in float32 (above the 1e-4 this test used), 1.1e-12 in float64
    tol = chain_bound(U32 if dtype == torch.float32 else U64, 128, 10) * float(full_logits.abs().max())
    torch.testing.assert_close(cached_logits, full_logits, atol=tol, rtol=0)
    # the reference really recomputes: last step's logits = a plain forward over the sequence
    plain = model(full[:, :-1], seq_len=full.shape[1])[:, -1]
    torch.testing.assert_close(full_logits[:, -1], plain, atol=tol, rtol=0)


def test_gpt_ties_embeddings_and_has_1_82m_parameters():
    model = GPT(GPTConfig())
    assert model.output.weight is model.tok_embeddings.weight
    assert abs(_n_params(model) / 1.82e6 - 1) < 0.02  # the byte model of docs/experiments.md (1.8 M)
    assert GPT(replace(TINY_GPT, tie_embeddings=False)).output.weight is not None


def test_sampling_top_k_and_temperature():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0, 3.0]]).repeat(200, 1)
    gen = torch.Generator().manual_seed(0)
    drawn = sample(logits, temperature=1.0, top_k=2, generator=gen)
    assert set(drawn.flatten().tolist()) == {1, 2}
    assert torch.equal(sample(logits, temperature=0), torch.ones(200, 1, dtype=torch.long))
    model = GPT(TINY_GPT)
    prompt = torch.randint(0, 64, (1, 3))
    a = model.generate(prompt, 4, top_k=5, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 4, top_k=5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (1, 7)


def test_gpt_cache_overflow_raises():
    model = GPT(TINY_GPT)
    caches = model.new_caches(1, 4)
    with pytest.raises(ValueError, match="overflow"):
        model(torch.zeros(1, 1, dtype=torch.long), torch.tensor([4]), caches)


@pytest.mark.slow
def test_one_decoding_step_compiles_fullgraph_on_cpu():
    torch._dynamo.reset()
    model = GPT(replace(TINY_GPT, scaling=ar.scaling.YaRN(2.0, 8))).eval().double()  # float64: an equality
    prompt = torch.randint(0, 64, (1, 4))
    caches = model.new_caches(1, 8)
    eager_caches = model.new_caches(1, 8)
    with torch.no_grad():
        model(prompt, torch.arange(4), caches)
        model(prompt, torch.arange(4), eager_caches)
        step = torch.compile(
            lambda idx, input_pos: model(idx, input_pos, caches), fullgraph=True, backend=COMPILE_BACKEND
        )
        for i in range(4, 6):  # two steps: the second reuses the graph
            token = torch.tensor([[i]])
            # the compiled graph may sum in another order: chain_bound(U64, 128, 10) = 1.1e-12 of the scale
            torch.testing.assert_close(
                step(token, torch.tensor([i])), model(token, torch.tensor([i]), eager_caches), atol=1e-10, rtol=1e-10
            )
    torch.testing.assert_close(caches[0].k, eager_caches[0].k)


# -- layout ----------------------------------------------------------------------------


def _training_imports(source: str) -> list[int]:
    """Line numbers of the imports of ``models.training`` (absolute or relative from ``models/``) in ``source``."""
    lines = []
    for node in ast.walk(ast.parse(source)):  # every import, those inside functions included
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            targets = [base] + [base + ("" if base.endswith(".") else ".") + a.name for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        if any(t.startswith(("models.training", ".training")) for t in targets):
            lines.append(node.lineno)
    return lines


def test_model_files_import_nothing_from_training():
    # models/ top level holds the models; models/training imports them, never the reverse
    offenders = [
        "from .training import x",
        "from . import training",
        "import models.training.export",
        "def f():\n    from models.training.trainer import train",
        "from models import training",
    ]
    assert all(_training_imports(source) for source in offenders)  # the check sees every spelling
    assert not _training_imports("from . import dit\nfrom .flow import T_SCALE\nimport models.dit")
    files = sorted((ROOT / "models").glob("*.py"))
    assert {"dit.py", "flow.py", "pipeline.py", "diffusers_models.py"} <= {f.name for f in files}
    for path in files:
        assert not _training_imports(path.read_text()), f"{path.relative_to(ROOT)} imports from models.training"


# -- docs ----------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["layers.md", "models.md"])
def test_docs_examples_run(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / "docs" / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"no python examples in docs/{page}"
    namespace: dict = {"__name__": f"docs_{page}"}
    for block in blocks:  # blocks of one page share a namespace, as a reader runs them in order
        exec(compile(block, f"docs/{page}", "exec"), namespace)
