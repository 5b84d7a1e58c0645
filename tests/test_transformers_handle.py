"""What an ``apply_axial_rope`` handle owns: a copy of an installed model (``copy.deepcopy``, ``torch.save`` of the
whole module) comes out stock, and ``serves`` agrees with ``apply_axial_rope`` on every model it is asked about.
"""

from __future__ import annotations

import copy
import zipfile

import pytest
import torch

transformers = pytest.importorskip("transformers")
from helpers import U32, chain_bound  # noqa: E402

from axial_rope.integrations.transformers import apply_axial_rope, serves  # noqa: E402
from models import tiny_transformers as ts  # noqa: E402 - imports transformers

FORWARD32 = chain_bound(U32, 64, 16)  # float32 logits of a 2-layer forward (tests/test_integrations_transformers.py)


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def installed_pieces(model) -> list[str]:
    """What apply_axial_rope puts into a model: fused forwards (and their pickling), rope children, ConfigRotary."""
    found = []
    for name, m in model.named_modules():
        found += [f"{name}.{key}" for key in ("forward", "__reduce_ex__") if key in vars(m)]
        found += [f"{name}.axial_rope" for _ in [0] if "axial_rope" in m._modules]
        found += [name for _ in [0] if type(m).__name__ == "ConfigRotary"]
    return found


def saved_and_loaded(model, folder) -> tuple[torch.nn.Module, bytes]:
    path = folder / "model.pt"
    torch.save(model, path)
    with zipfile.ZipFile(path) as archive:
        pickled = b"".join(archive.read(n) for n in archive.namelist() if n.endswith(".pkl"))
    return torch.load(path, weights_only=False), pickled


@pytest.mark.parametrize("how", ["deepcopy", "torch_save"])
@pytest.mark.parametrize("name, from_config", [("qwen3", False), ("gemma3", True), ("llama-linear", True)])
def test_a_copy_of_an_installed_model_is_stock_and_the_handle_stays_with_the_original(name, from_config, how,
                                                                                      tmp_path):  # fmt: skip
    """Before: the copy carried the fused forwards (bound to itself) and the ConfigRotary, and stayed patched after
    ``remove()``. Now the copy is the stock model (it unpickles without axial_rope); while the handle is installed
    it rotates through the rebound function like every model of its modeling module; after ``remove()`` both are
    stock bit for bit."""
    case = ts.case(name)
    stock = logits(case.model, case.inputs)
    with apply_axial_rope(case.model, from_config=from_config) as handle:
        assert len(handle.fused) == case.fused and len(handle.rotaries) == int(from_config)
        before = installed_pieces(case.model)
        assert before
        if how == "deepcopy":
            copied = copy.deepcopy(case.model)
        else:
            copied, pickled = saved_and_loaded(case.model, tmp_path)
            assert b"axial_rope" not in pickled  # nothing of the library in the pickle
        assert installed_pieces(copied) == [] and installed_pieces(case.model) == before
        assert type(copied.model.rotary_emb) is type(handle.model.model.rotary_emb) or from_config
        assert (logits(copied, case.inputs) - stock).abs().max() <= FORWARD32 * stock.abs().max()
    assert torch.equal(logits(copied, case.inputs), stock) and torch.equal(logits(case.model, case.inputs), stock)
    assert installed_pieces(case.model) == []
    assert type(copied.model.rotary_emb).__name__.endswith("RotaryEmbedding")  # the stock rotary, not ConfigRotary


def test_a_copy_can_get_its_own_handle_once_the_first_is_removed():
    case = ts.case("qwen3")
    stock = logits(case.model, case.inputs)
    with apply_axial_rope(case.model):
        copied = copy.deepcopy(case.model)
    with apply_axial_rope(copied) as handle:  # the copy is stock: fusable like any model
        assert len(handle.fused) == 2 and handle.by_positions == 2
        assert (logits(copied, case.inputs) - stock).abs().max() <= FORWARD32 * stock.abs().max()
    assert torch.equal(logits(copied, case.inputs), stock)


def agree(model, from_config: bool) -> tuple[str | None, str | None]:
    """(serves' reason, apply_axial_rope's error) for one model; the handle is removed at once."""
    reason = serves(model, from_config=from_config)
    try:
        apply_axial_rope(model, from_config=from_config).remove()
        error = None
    except (TypeError, ValueError, RuntimeError) as raised:
        error = str(raised)
    return reason, error


@pytest.mark.parametrize("from_config", [False, True], ids=["tables", "from_config"])
@pytest.mark.parametrize("name", ts.NAMES)
def test_serves_and_apply_agree_on_every_family(name, from_config):
    reason, error = agree(ts.case(name).model, from_config)
    assert reason is None and error is None, (reason, error)
    assert serves(ts.case(name).model.config, from_config=from_config) is None


def test_serves_names_what_apply_would_refuse_on_a_patched_class(monkeypatch):
    """Before: serves(config) said served while apply_axial_rope raised on Unsloth's rebound attention forward."""
    from transformers.models.llama import modeling_llama

    stock = modeling_llama.LlamaAttention.forward

    def fast_forward(self, *args, **kwargs):
        return stock(self, *args, **kwargs)

    fast_forward.__module__, fast_forward.__qualname__ = "unsloth.models.llama", "LlamaAttention_fast_forward"
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", fast_forward)
    model = ts.case("llama").model
    for asked in (model.config, model):
        assert "LlamaAttention.forward is unsloth.models.llama" in serves(asked)
    reason, error = agree(model, False)
    assert reason == error


@pytest.mark.parametrize("config_cls, fields", [
    ("EsmConfig", {"position_embedding_type": "absolute"}),  # no rotary module: nothing to rebuild
    ("RecurrentGemmaConfig", {"block_types": ["recurrent", "attention"]}),  # its rotary's config is another
])  # fmt: skip
def test_serves_given_the_model_names_why_from_config_is_refused(config_cls, fields):
    """Before: serves said served (from a config) where apply_axial_rope(from_config=True) raised. Given the model,
    serves runs apply_axial_rope's own checks: one answer; from a config alone it says what a config can say."""
    import model_types_support as mts

    model_type = getattr(transformers, config_cls).model_type
    config = mts.tiny_config(model_type)
    for key, value in fields.items():
        setattr(config, key, value)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    reason, error = agree(model, True)
    assert reason == error and "no rotary module of the text config" in reason
    assert agree(model, False) == (None, None)


@pytest.mark.slow
def test_serves_and_apply_agree_on_every_swept_model_type():
    """Every model type with a rotary whose tiny config is served (model_types_support), built on the meta device:
    serves(model) and apply_axial_rope agree, with and without from_config; serves(config) as well for the
    default. (Found by this sweep: from_config on ESM, BLT, GraniteMoeHybrid and RecurrentGemma.)"""
    import model_types_support as mts

    checked, disagree = 0, []
    for model_type in mts.rotary_model_types():
        try:
            config = mts.tiny_config(model_type)
        except mts.NotSwept:
            continue
        if serves(config) is not None:
            continue
        try:
            with torch.device("meta"):
                model = transformers.AutoModel.from_config(config)
        except Exception:  # noqa: BLE001 - no base model from this config: nothing to apply to
            continue
        for from_config in (False, True):
            reason, error = agree(model, from_config)
            if (reason is None) != (error is None):
                disagree.append((model_type, from_config, reason, error))
        checked += 1
    assert checked > 100 and not disagree, disagree
