"""The records of Cosmos 3 Omni and LongCat-AudioDiT reproduce their model's tables, and their scaling acts where it
should.

Cosmos 3: the record's tables equal the stock ``rotary_emb``'s on every call, and what the decoder layers receive for
each pathway (the text's, and the generation pathway's at the modality margin, 15000 past the text); the whole model
adapted unscaled is the stock model bit for bit; one scaling method serves its shared spectrum, a different method
per axis and ``mode`` (its positions are the pipeline's coordinates) are refused with the family named. LongCat-
AudioDiT: the record's tables equal the stock ones on both calls (audio and text); a sized forward sizes the text's
call by the audio's length. The generic checks (replaced at the training size, scaled at twice it, ``remove()``) are
``tests/test_diffusers_families.py``'s.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from test_diffusers_families import _double, _run, records_tables  # noqa: E402

from axial_rope import scaling  # noqa: E402
from axial_rope.conventions._registry import DIFFUSERS  # noqa: E402
from axial_rope.integrations.diffusers import set_rope_processors  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402
from models.tiny_diffusers_cosmos3_longcat_audio import COSMOS3, ENTRIES  # noqa: E402

U = 2.0**-24  # float32 unit roundoff
NAMES = sorted(ENTRIES)
COSMOS = "Cosmos3OmniTransformer"
AUDIO = "LongCatAudioDiTTransformer"


def _model(name: str, h: int | None = None, w: int | None = None, frames: int | None = None):
    """The tiny model and its inputs in float64 (``h x w`` tokens, ``frames`` latent frames; default its grid)."""
    model, inputs = tiny.build(name)
    if h is not None:
        inputs = tiny.inputs(name, h, w, frames=frames)
    return model.double(), _double(inputs)


def _assert_within_bound(ours: torch.Tensor, stock: torch.Tensor, angles: torch.Tensor) -> None:
    """Upstream computes its angles in float32 (``inv_freq = 1 / theta ** (2j / D)``: a power and a division, each
    rounded; the product with the exact positions rounded once more), at most 5 u |angle| off, and rounds cos/sin
    once more (u); ours are float64 angles rounded once to float32 (u). So, element by element in float64,
    ``|ours - stock| <= 5 u |angle| + 4 u``. A wrong plane, axis or position is off by O(1)."""
    assert ours.shape == stock.shape and ours.dtype == stock.dtype
    bound = 5 * U * angles.abs() + 4 * U
    excess = (ours.double() - stock.double()).abs() - bound
    assert excess.max() <= 0, f"past the bound by {excess.max().item():.3g}"


def _half_angles(rope, pos: torch.Tensor) -> torch.Tensor:
    """The exact angles of each channel of half-paired tables at ``pos`` ``[..., S, A]``: ``[..., S, 2n]``."""
    angles = pos.double() @ rope.freqs.double().cpu()  # [..., S, n]
    return torch.cat([angles, angles], dim=-1)


def _stock_calls(model, attr: str, inputs: dict) -> list:
    """``(args, kwargs, output)`` of every call of the stock tables module ``attr`` in one forward."""
    calls = []
    hook = getattr(model, attr).register_forward_hook(
        lambda module, args, kwargs, output: calls.append((args, kwargs, output)), with_kwargs=True
    )
    try:
        _run(model, inputs)
    finally:
        hook.remove()
    return calls


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", [None, (3, 5, 3)])
def test_unscaled_tables_equal_the_stock_tables_on_every_call(name, size):
    model, inputs = _model(name, *(size or (None, None, None)))
    (attr, ours), = records_tables(model).items()  # fmt: skip
    calls = _stock_calls(model, attr, inputs)
    assert len(calls) == {COSMOS: 1, AUDIO: 2}[name]  # LongCat: the audio's call and the text's
    for args, kwargs, stock in calls:
        pos, *_ = ours.positions(ours.rope, None, *args, **kwargs)
        with torch.no_grad():
            got = ours(*args, **kwargs)
        for table, want in zip(got, stock, strict=True):
            _assert_within_bound(table, want, _half_angles(ours.rope, pos))


def _pathway_tables(model, inputs: dict) -> tuple[torch.Tensor, ...]:
    """``(cos_und, sin_und, cos_gen, sin_gen)`` as the first decoder layer's attention receives them."""
    seen = []
    hook = model.layers[0].self_attn.register_forward_pre_hook(lambda module, args: seen.append(args[2]))
    try:
        _run(model, inputs)
    finally:
        hook.remove()
    return seen[0]


def test_cosmos3_both_pathways_get_the_records_tables_with_the_modality_margin():
    model, inputs = _model(COSMOS)
    und_len, position_ids = inputs["und_len"], inputs["position_ids"]  # [3, N]
    margin = model.config.unified_3d_mrope_temporal_modality_margin
    assert margin == COSMOS3["unified_3d_mrope_temporal_modality_margin"] == 15000
    assert torch.equal(position_ids[:, und_len - 1], torch.full((3,), und_len - 1.0))  # the text's diagonal
    assert position_ids[0, und_len] == und_len + margin  # the generation pathway starts past the margin
    rope = DIFFUSERS[COSMOS].rope(model.config)
    cos, sin = rope.cos_sin(position_ids.T.double())  # float32 [N, D] from float64 angles
    angles = _half_angles(rope, position_ids.T)
    stock = _pathway_tables(model, inputs)
    ours = (cos[:und_len], sin[:und_len], cos[und_len:], sin[und_len:])
    spans = (angles[:und_len], angles[:und_len], angles[und_len:], angles[und_len:])
    assert angles[und_len:].abs().max() > margin  # the comparison covers the margin's angles
    for got, want, span in zip(ours, stock, spans, strict=True):
        _assert_within_bound(got.double(), want, span)


@pytest.mark.parametrize("name", NAMES)
def test_adapted_unscaled_equals_stock_bit_for_bit(name):
    model, inputs = _model(name)
    stock = _run(model, inputs)
    handle = set_rope_processors(model)
    assert handle.tables is None  # unscaled: the model's own tables
    if DIFFUSERS[name].processor is None:  # and the stock processors
        assert torch.equal(_run(model, inputs), stock)
        return
    # LongCat-AudioDiT's self-attention takes our processor (float64 inside; stock's RMSNorm takes the mean square in
    # float32 and its rotation rounds q and k to float32): within 4 x swapped layers x 2 (n/2 + 14) u32 of the outputs'
    # scale, n = H * D (tests/test_diffusers_fused_norm_swapped.py)
    n = model.config.dit_dim
    bound = 4 * len(handle.names) * 2 * (n / 2 + 14) * 2.0**-24 * float(stock.abs().max())
    assert float((_run(model, inputs) - stock).abs().max()) <= bound


def test_cosmos3_one_scaling_method_scales_both_pathways():
    model, inputs = _model(COSMOS, 4, 6, 4)  # twice the default grid and frames
    position_ids, und_len = inputs["position_ids"], inputs["und_len"]
    set_rope_processors(model, scaling=scaling.Linear(2.0))
    rope = DIFFUSERS[COSMOS].rope(model.config).with_scaling(scaling.Linear(2.0))
    cos, sin = rope.cos_sin(position_ids.T.double())
    want = (cos[:und_len], sin[:und_len], cos[und_len:], sin[und_len:])
    for got, table in zip(_pathway_tables(model, inputs), want, strict=True):  # both float32 of float64 angles
        torch.testing.assert_close(got, table.double(), atol=2 * U, rtol=0)
    unscaled = DIFFUSERS[COSMOS].rope(model.config).cos_sin(position_ids.T.double())[0]
    assert (cos[und_len:] - unscaled[und_len:]).abs().max() > 0.5  # the vision angles halved: far from stock


def test_cosmos3_refuses_a_method_per_axis_and_mode_naming_the_family():
    model, _ = _model(COSMOS)
    with pytest.raises(ValueError, match=r"Cosmos3OmniTransformer \(cosmos3.*one value with spectrum"):
        set_rope_processors(model, scaling=(scaling.Linear(2.0), None, None))
    with pytest.raises(ValueError, match=r"cosmos3's positions are coordinates its pipeline computes"):
        set_rope_processors(model, mode="interpolate", train_size=(2, 2, 3))
    with pytest.raises(ValueError, match=r"Cosmos3OmniTransformer \(cosmos3\) has its time on axis 0: RIFLEx"):
        set_rope_processors(model, scaling=scaling.RIFLEx(2, 8))


def _audio_tables(model, inputs: dict) -> tuple:
    """``(rope, cond_rope)``: the audio's and the text's tables, as the first block receives them."""
    seen = []
    hook = model.blocks[0].register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["rope"], kwargs["cond_rope"])), with_kwargs=True
    )
    try:
        _run(model, inputs)
    finally:
        hook.remove()
    return seen[0]


@pytest.mark.parametrize("mode", ["interpolate", "yarn"])
def test_longcat_audio_sizes_the_texts_call_by_the_audios_length(mode):
    model, inputs = _model(AUDIO, 4, 6)  # 24 latent frames, twice the 12 of training; a text of 5 tokens
    set_rope_processors(model, mode=mode, train_size=(12,))
    audio, text = _audio_tables(model, inputs)
    rope = DIFFUSERS[AUDIO].rope(model.config)
    if mode == "yarn":  # the text (5 < 12 tokens) takes the audio's YaRN, not its own (none)
        rope, step = rope.with_scaling(scaling.YaRN(2.0, 12)), 1.0
    else:  # the text's indices at the audio's spacing
        step = 0.5
    for got, n in ((audio, 24), (text, 5)):
        want = rope.cos_sin(torch.arange(n, dtype=torch.float64)[:, None] * step)
        for table, expected in zip(got, want, strict=True):  # both float32 of float64 angles
            torch.testing.assert_close(table, expected.double(), atol=2 * U, rtol=0)


def test_longcat_audio_takes_one_method_for_its_axis_and_names_the_axis_of_a_bad_one():
    model, inputs = _model(AUDIO, 4, 6)
    stock = _run(model, inputs)
    set_rope_processors(model, scaling=(scaling.YaRN(2.0, 12),))
    scaled = _run(model, inputs)
    assert torch.isfinite(scaled).all() and (scaled - stock).abs().max() > 1e-4
    with pytest.raises(ValueError, match=r"LongCatAudioDiTTransformer \(longcat_audio: axes \('t',\)\)"):
        set_rope_processors(model, scaling=(scaling.Linear(2.0), None))
