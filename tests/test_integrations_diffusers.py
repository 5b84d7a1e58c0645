"""axial_rope.integrations.diffusers on tiny random-initialised Flux, HunyuanVideo, Wan and CogVideoX transformers.

Our processors against the stock ones is an equality, checked in float64 (models and inputs; the
bfloat16 test aside). What stays float32 is upstream's: diffusers builds the Flux, HunyuanVideo and
CogVideoX tables in float32 (Wan's agree bit for bit), each entry within
``conventions_support.float32_angle_bound`` of ours, ``|angle| 8 u + 2 u`` = 2.5e-6 at the
``|angle| <= 5`` rad of these grids (u = 2**-24). Such a relative perturbation delta of q and k
moves a softmax weight by ``2 delta |s|`` relative; at this initialisation the logits are O(1), so
an attention output moves by about ``4 delta`` of the values' scale per layer, and ``TOL = 1e-5``
(``atol = rtol``) covers two layers: a first-order estimate, the rest of both models being the same
float64 arithmetic (within ``helpers.chain_bound(U64, 256, 20)`` = 5e-12). A changed frequency moves
the outputs by more (the scaled installs below differ from stock by more than 1e-4).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import axial_rope as ar

diffusers = pytest.importorskip("diffusers")

from diffusers.models.transformers.transformer_flux import FluxAttnProcessor  # noqa: E402

from axial_rope.integrations.diffusers import (  # noqa: E402
    SUPPORTED,
    remove_rope_processors,
    set_rope_processors,
)
from models import tiny_diffusers as tiny  # noqa: E402

B = 2
TOL = 1e-5  # stock vs ours in float64, upstream's float32 tables (module docstring)
_POSITIONAL = ("img_ids", "txt_ids", "image_rotary_emb")  # positions and tables keep their dtype


def _double(model, inputs):
    """The model and its floating-point inputs in float64 (positions and upstream's tables as they are)."""
    cast = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in _POSITIONAL else v
            for k, v in inputs.items()}  # fmt: skip
    return model.double(), cast


def _family(name: str):
    return lambda: tiny.build(name)


# tiny random transformers (models/tiny_diffusers.py: the one place their configs live) and their inputs
MODELS = {name: _family(name) for name in tiny.FAMILIES}
_flux, _hunyuan_video, _wan, _cogvideox = (MODELS[n] for n in ("flux", "hunyuan_video", "wan", "cogvideox"))
COGVIDEOX = tiny.COGVIDEOX


def _eval(name: str):
    """The model ``name`` of :data:`MODELS` in eval mode, and its inputs."""
    model, inputs = _double(*MODELS[name]())
    return model.eval(), inputs


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.fixture(params=list(MODELS))
def model_and_inputs(request):
    return _eval(request.param)


def test_unscaled_processors_match_stock_output(model_and_inputs):
    model, inputs = model_and_inputs
    stock = _run(model, inputs)
    handle = set_rope_processors(model)
    assert handle.names and all(
        type(model.attn_processors[n]).__module__.startswith("axial_rope") for n in handle.names
    )
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)


def test_bfloat16_processors_match_stock_to_bf16_rounding(model_and_inputs):
    # the fused norm + rotation rounds once (float32 inside), the stock path after the norm too
    model, inputs = model_and_inputs
    model.to(torch.bfloat16)
    positional = ("img_ids", "txt_ids", "image_rotary_emb")  # positions and tables stay float32
    inputs = {
        k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in positional else v
        for k, v in inputs.items()
    }
    stock = _run(model, inputs)
    set_rope_processors(model)
    out = _run(model, inputs)
    assert out.dtype == torch.bfloat16
    # bfloat16 weights and activations: 2**-9 relative per rounding, a few along each path: within 2e-2
    torch.testing.assert_close(out.float(), stock.float(), atol=2e-2, rtol=2e-2)


def test_remove_restores_original_processors(model_and_inputs):
    model, inputs = model_and_inputs
    before = dict(model.attn_processors)
    stock = _run(model, inputs)
    set_rope_processors(model, scaling=ar.scaling.Linear(2.0))
    assert _run(model, inputs).sub(stock).abs().max() > 1e-4  # installed and scaled
    remove_rope_processors(model)
    after = model.attn_processors
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert torch.equal(_run(model, inputs), stock)
    with pytest.raises(ValueError, match="no axial_rope processors"):
        remove_rope_processors(model)


def test_reinstalling_replaces_not_stacks():
    model, inputs = _eval("flux")
    stock = _run(model, inputs)
    set_rope_processors(model, scaling=ar.scaling.NTK(4.0))
    handle = set_rope_processors(model)  # replaces the scaled install
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)
    handle.remove()
    assert all(type(p).__name__ == "FluxAttnProcessor" for p in model.attn_processors.values())


def test_hunyuan_token_refiner_processors_are_left_alone():
    model, _ = _hunyuan_video()
    before = dict(model.attn_processors)
    handle = set_rope_processors(model)
    kept = [n for n in before if n not in handle.names]
    assert kept and all(model.attn_processors[n] is before[n] for n in kept)  # the refiner has no RoPE


def test_unsupported_model_error_lists_supported_classes():
    model = diffusers.SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        out_channels=4,
    )
    with pytest.raises(TypeError, match="SD3Transformer2DModel") as err:
        set_rope_processors(model)
    for name in SUPPORTED:
        assert name in str(err.value)
    with pytest.raises(TypeError, match="FluxTransformer2DModel"):
        set_rope_processors(torch.nn.Linear(2, 2))


def test_foreign_processors_stay_and_rotate_by_the_scaled_tables():
    class CustomProcessor(FluxAttnProcessor):  # e.g. a user's or an IP-adapter processor
        pass

    model, inputs = _eval("flux")
    expected = set_rope_processors(model, scaling=ar.scaling.Linear(2.0)) and _run(model, inputs)
    remove_rope_processors(model)
    custom = CustomProcessor()
    model.single_transformer_blocks[0].attn.set_processor(custom)
    handle = set_rope_processors(model, scaling=ar.scaling.Linear(2.0))
    assert model.single_transformer_blocks[0].attn.processor is custom  # left as it is
    assert "single_transformer_blocks.0.attn.processor" not in handle.names
    torch.testing.assert_close(_run(model, inputs), expected, atol=TOL, rtol=TOL)  # and scaled like ours
    handle.remove()
    assert model.single_transformer_blocks[0].attn.processor is custom


def test_backend_is_checked_and_used():
    model, inputs = _eval("flux")
    with pytest.raises(ValueError, match="backend"):
        set_rope_processors(model, backend="cuda")
    stock = _run(model, inputs)
    handle = set_rope_processors(model, backend="reference")  # the complex-number oracle
    assert handle.rope.backend == "reference"
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)


def test_flux_linear_scaling_equals_stock_at_half_positions():
    # Flux's angles are ids * inv_freq, so dividing every frequency by 2 is the stock model at ids / 2
    model, inputs = _eval("flux")
    halved = dict(inputs, img_ids=inputs["img_ids"] / 2)
    expected = _run(model, halved)
    handle = set_rope_processors(model, scaling=ar.scaling.Linear(2.0))
    torch.testing.assert_close(handle.rope.freqs, ar.AxialRoPE((4, 6, 6)).freqs / 2)
    torch.testing.assert_close(_run(model, inputs), expected, atol=TOL, rtol=TOL)


def _stock_with_tables(model, inputs, rope: ar.AxialRoPE, shape) -> torch.Tensor:
    """The stock model, its rotary module's output replaced by ``rope``'s tables (a test-only hook)."""

    def hook(module, args, output):
        _, _, t, h, w = args[0].shape
        p_t, p_h, p_w = getattr(module, "patch_size_t", None), module.patch_size, module.patch_size
        if isinstance(module.patch_size, tuple):
            p_t, p_h, p_w = module.patch_size
        cos, sin = rope.cos_sin(ar.grid(t // p_t, h // p_h, w // p_w))
        return cos.reshape(shape(cos)), sin.reshape(shape(sin))

    handle = model.rope.register_forward_hook(hook)
    try:
        return _run(model, inputs)
    finally:
        handle.remove()


@pytest.mark.parametrize(
    "name, scaling, table_shape",
    [
        ("hunyuan_video", (ar.scaling.RIFLEx(k=1, test_length=3), ar.scaling.NTK(2.0), ar.scaling.NTK(2.0)), None),
        (
            "wan",
            (ar.scaling.RIFLEx(k=2, test_length=3), None, ar.scaling.YaRN(2.0, 2)),
            lambda c: (1, -1, 1, c.shape[-1]),
        ),
    ],
)
def test_video_scaling_uses_scaled_frequencies(name, scaling, table_shape):
    model, inputs = _eval(name)
    stock = _run(model, inputs)
    handle = set_rope_processors(model, scaling=scaling)
    out = _run(model, inputs)
    assert out.sub(stock).abs().max() > 1e-4
    expected_rope = ar.AxialRoPE(handle.rope.axes_dim, handle.rope.theta, scaling)
    torch.testing.assert_close(handle.rope.freqs, expected_rope.freqs)
    unscaled = ar.AxialRoPE(handle.rope.axes_dim, handle.rope.theta).freqs
    t_planes = handle.rope.axes_dim[0] // 2
    k = scaling[0].k - 1  # RIFLEx changes exactly one temporal plane
    changed = (handle.rope.freqs[0, :t_planes] != unscaled[0, :t_planes]).nonzero().flatten().tolist()
    assert changed == [k]
    handle.remove()
    shape = table_shape or (lambda c: c.shape)
    torch.testing.assert_close(_stock_with_tables(model, inputs, expected_rope, shape), out, atol=TOL, rtol=TOL)


def test_cogvideox_scaling_rotates_the_integer_latent_grid():
    model, inputs = _eval("cogvideox")
    scaling = (None, ar.scaling.Linear(2.0), ar.scaling.Linear(2.0))
    rope = ar.AxialRoPE((4, 6, 6), scaling=scaling)
    expected = _run(model, dict(inputs, image_rotary_emb=rope.cos_sin(ar.grid(3, 4, 4))))
    set_rope_processors(model, scaling=scaling)
    out = _run(model, inputs)  # the pipeline's unscaled tables are ignored when scaled
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)


def test_scaling_per_axis_count_is_checked():
    model, _ = _wan()
    with pytest.raises(ValueError, match="one per axis"):
        set_rope_processors(model, scaling=(ar.scaling.Linear(2.0), None))
    assert not any(type(p).__module__.startswith("axial_rope") for p in model.attn_processors.values())
    handle = set_rope_processors(model)
    with pytest.raises(ValueError, match="one per axis"):  # a failed re-install keeps the working one
        set_rope_processors(model, scaling=(None,) * 4)
    assert all(type(model.attn_processors[n]).__module__.startswith("axial_rope") for n in handle.names)


def test_import_axial_rope_does_not_import_diffusers_or_timm():
    code = "import sys, axial_rope, axial_rope.integrations; assert not {'diffusers', 'timm'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def _doc_blocks(section: str) -> list[str]:
    """The ``python`` blocks (run) of one ``## section`` of docs/integrations.md; ``py`` blocks download weights."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    body = re.split(r"^## ", text, flags=re.M)
    (part,) = [b for b in body if b.startswith(section)]
    return re.findall(r"```python\n(.*?)```", part, flags=re.S)


def test_docs_diffusers_examples_run():
    blocks = _doc_blocks("diffusers")
    assert len(blocks) == 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/integrations.md:diffusers", "exec"), namespace)


def test_attention_called_alone_rotates_by_the_tables_it_is_given():
    # no transformer forward: the processor rotates by the tables passed in, the model's own or the scaled ones
    model, _ = _double(*_flux())
    attn = model.single_transformer_blocks[0].attn
    x, ids = torch.randn(1, 7, 32, dtype=torch.float64), ar.grid(7, 1, 1)
    tables = model.pos_embed(ids)
    with torch.no_grad():
        stock = attn(x, image_rotary_emb=tables)
        set_rope_processors(model)
        torch.testing.assert_close(attn(x, image_rotary_emb=tables), stock, atol=TOL, rtol=TOL)
        set_rope_processors(model, scaling=ar.scaling.Linear(2.0))
        scaled = model.pos_embed(ids)  # the tables module now computes the scaled tables
        expected = ar.AxialRoPE((4, 6, 6), scaling=ar.scaling.Linear(2.0)).cos_sin(ids)
        for got, want in zip(scaled, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(attn(x, image_rotary_emb=scaled), stock_with(attn, x, scaled), atol=TOL, rtol=TOL)


def stock_with(attn, x, tables):
    """The stock processor's output for the same tables."""
    ours = attn.processor
    attn.set_processor(FluxAttnProcessor())
    try:
        return attn(x, image_rotary_emb=tables)
    finally:
        attn.set_processor(ours)


def test_gradients_match_stock_through_fused_norm_and_rotation():
    # fine-tuning (e.g. LoRA on to_q/to_k) backpropagates through the fused QK-RMSNorm + RoPE
    model, inputs = _double(*_flux())

    def grads():
        model.zero_grad()
        model(**inputs)[0].square().sum().backward()
        attn = model.transformer_blocks[0].attn
        return attn.to_q.weight.grad.clone(), attn.norm_q.weight.grad.clone(), attn.norm_added_k.weight.grad.clone()

    stock = grads()
    set_rope_processors(model)
    for got, expected in zip(grads(), stock):
        torch.testing.assert_close(got, expected, atol=TOL, rtol=TOL)


def test_gradient_checkpointing_recomputes_with_each_forwards_own_positions():
    # two forwards with as many tokens but other positions, then backward of the first: with activation
    # checkpointing the first forward's blocks are recomputed after the second forward ran
    def first_grads(install: bool):
        torch.manual_seed(0)
        model, inputs = _double(*_flux())
        model.enable_gradient_checkpointing()
        if install:
            set_rope_processors(model)
        shifted = dict(inputs, img_ids=ar.grid(1, 4, 6, offset=(0.0, 7.0, 3.0)))
        loss = model(**inputs)[0].square().sum()
        model(**shifted)[0].square().sum()  # its graph is dropped; only its positions were recorded
        loss.backward()
        return model.transformer_blocks[0].attn.to_q.weight.grad

    torch.testing.assert_close(first_grads(True), first_grads(False), atol=TOL, rtol=TOL)


def test_fusing_projections_after_installing_keeps_the_scaling():
    # fuse_qkv_projections() replaces every processor by diffusers' fused one: they rotate by the same tables
    model, inputs = _eval("cogvideox")
    handle = set_rope_processors(model, scaling=(ar.scaling.RIFLEx(1, 6), None, None))
    scaled = _run(model, inputs)
    model.fuse_qkv_projections()
    assert not any(_ours(p) for p in model.attn_processors.values())
    torch.testing.assert_close(_run(model, inputs), scaled, atol=TOL, rtol=TOL)
    handle.remove()  # the tables go back to the pipeline's; the fused stock processors stay
    stock_fused = _run(model, inputs)
    set_rope_processors(model)  # installed after fusing: our processors run the fused projections
    torch.testing.assert_close(_run(model, inputs), stock_fused, atol=TOL, rtol=TOL)


def _ours(processor) -> bool:
    return type(processor).__module__.startswith("axial_rope")


def test_cogvideox_head_dim_not_divisible_by_16_is_a_clear_error():
    model = diffusers.CogVideoXTransformer3DModel(**dict(COGVIDEOX, attention_head_dim=24))
    with pytest.raises(ValueError, match="attention_head_dim must be divisible by 16.*got 24"):
        set_rope_processors(model)


def test_flux_mode_interpolate_equals_stock_at_interpolated_ids():
    model, inputs = _eval("flux")  # a 4 x 6 image grid
    half = dict(inputs, img_ids=ar.grid(1, 4, 6, scale=(1.0, 0.5, 0.5)))
    stock = _run(model, half)
    set_rope_processors(model, mode="interpolate", train_size=(2, 3))  # 2x the training grid per axis
    torch.testing.assert_close(_run(model, inputs), stock, atol=TOL, rtol=TOL)


def test_video_mode_sizes_each_forward_like_the_explicit_scaling():
    model, inputs = _eval("wan")  # latent 3 x 4 x 6, patch (1, 2, 2): a 3 x 2 x 3 token grid
    set_rope_processors(model, scaling=(None, ar.scaling.NTK(2.0), ar.scaling.NTK(3.0)))
    explicit = _run(model, inputs)
    set_rope_processors(model, mode=("none", "ntk", "ntk"), train_size=(3, 1, 1))
    torch.testing.assert_close(_run(model, inputs), explicit, atol=TOL, rtol=TOL)
    set_rope_processors(model, mode="yarn", train_size=(3, 2, 3))  # at the training grid: unscaled
    sized = _run(model, inputs)
    remove_rope_processors(model)
    torch.testing.assert_close(sized, _run(model, inputs), atol=TOL, rtol=TOL)


def test_mode_arguments_are_checked():
    model, _ = _flux()
    with pytest.raises(ValueError, match="not both"):
        set_rope_processors(model, mode="ntk", train_size=(2, 3), scaling=ar.scaling.NTK(2.0))
    with pytest.raises(ValueError, match="refuses mode 'normalize': it would centre the image grid"):
        set_rope_processors(model, mode="normalize", train_size=(2, 3))
    with pytest.raises(ValueError, match="train_size"):
        set_rope_processors(model, mode="yarn")
    with pytest.raises(ValueError, match="mode must be one of"):
        set_rope_processors(model, mode="stretch", train_size=(2, 3))


def test_a_later_blocks_processor_replaced_by_stock_still_rotates_by_the_scaled_tables():
    model, inputs = _eval("flux")
    set_rope_processors(model, scaling=ar.scaling.NTK(2.0))
    scaled = _run(model, inputs)
    model.single_transformer_blocks[0].attn.set_processor(FluxAttnProcessor())  # the last block, back to stock
    torch.testing.assert_close(_run(model, inputs), scaled, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("name, equal", [("wan", True), ("hunyuan_video", False), ("cogvideox", False)])
def test_normalize_at_the_training_size_equals_stock_only_where_every_token_is_rotated(name, equal):
    # normalize centres the grid: a shift of every position, invisible to attention between rotated tokens
    # (Wan's self-attention) but not to HunyuanVideo's and CogVideoX's unrotated text tokens in joint attention
    model, inputs = _eval(name)
    stock = _run(model, inputs)
    grid = {"wan": (3, 2, 3), "hunyuan_video": (3, 4, 6), "cogvideox": (3, 4, 4)}[name]
    set_rope_processors(model, mode="normalize", train_size=grid)
    diff = _run(model, inputs).sub(stock).abs().max()
    assert diff < TOL if equal else diff > 1e-3


@pytest.mark.parametrize("train_size", [(0, 2, 3), (3, -2, 3), (3, 2.0, 3), "323", (3, 2), None, (3, True, 3)])
def test_train_size_is_checked_at_install(train_size):
    model, _ = _wan()
    with pytest.raises(ValueError, match="train_size"):
        set_rope_processors(model, mode="interpolate", train_size=train_size)
    assert not any(type(p).__module__.startswith("axial_rope") for p in model.attn_processors.values())
