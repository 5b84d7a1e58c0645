"""Each diffusers record's ``qk_norm`` is the norm its model's rotary attention applies to q and k (issue 45).

The records say which QK-norm the stock processors apply right before the rotation (read in diffusers 0.42.1's
processors); here every served class's tiny model is run once with a pre-hook on each query-norm module of its
rotary blocks' attention modules, and the norms actually called are compared with the record: the kind from the
module's class (an RMSNorm or a LayerNorm), the span from its input (a 4-D ``[B, S, H, D]`` or ``[B, H, S, D]``
input, or a packed ``[N, H, D]`` one whose last dim is the module's ``head_dim``, is normalised per head; a token's
row ``[B, S, H * D]`` across heads). A record whose family calls no norm before rotating says ``None``; so do the
SANA families, whose processors put a ReLU kernel between their norm and the rotation (checked in their source).
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from test_conventions_integration import _ltx  # noqa: E402

from axial_rope.conventions._registry import DIFFUSERS, QK_NORMS  # noqa: E402
from models import tiny_diffusers as tiny  # noqa: E402

_QUERY = re.compile(r"(^|_)q(_|$)|query")  # norm_q, norm_added_q, q_rms_norm(_t), query_norm, img_attn_q_norm, q_norm
# one tiny model per record (HunyuanDiT's ControlNet shares HunyuanDiT's record and attention)
CLASSES = sorted(n for n in DIFFUSERS if n in tiny.TINY or n == "LTXVideoTransformer3DModel")


def _build(name: str):
    return _ltx() if name == "LTXVideoTransformer3DModel" else tiny.build(name)


def _norms_called(name: str) -> set[str]:
    """The QK-norms (in the records' words) that the tiny model's rotary attention modules call on their queries."""
    family = DIFFUSERS[name]
    model, inputs = _build(name)
    called, hooks = set(), []
    for path, module in model.named_modules():
        if getattr(module, "processor", None) is None or not (path + ".").startswith(family.blocks):
            continue
        for attr, child in module.named_children():
            kind = type(child).__name__.lower()
            if "norm" not in kind or not _QUERY.search(attr):
                continue
            kind = "rms" if "rms" in kind else "layer" if "layernorm" in kind else kind

            def record(norm, args, kind=kind, module=module):
                x = args[0]
                per_head = x.ndim == 4 or getattr(module, "head_dim", None) == x.shape[-1]
                called.add(kind if per_head else f"{kind} across heads")

            hooks.append(child.register_forward_pre_hook(record))
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    return called


@pytest.mark.parametrize("name", CLASSES)
def test_record_names_the_qk_norm_its_model_applies(name):
    family = DIFFUSERS[name]
    called = _norms_called(name)
    if family.qk_norm is None and family.name in ("sana_video", "sana_wm"):
        return  # a norm, then a ReLU kernel, then the rotation: test_sana_puts_a_kernel_between_norm_and_rotation
    assert called == ({family.qk_norm} if family.qk_norm else set()), f"{name}: record {family.qk_norm!r}"


def test_sana_puts_a_kernel_between_norm_and_rotation():
    # the order in upstream's source: the norm, the ReLU kernel, then the rotation
    from diffusers.models.transformers import transformer_sana_video, transformer_sana_wm

    for code, steps in (
        (transformer_sana_video.SanaLinearAttnProcessor3_0.__call__,
         ("attn.norm_q(query)", "F.relu(query)", "apply_rotary_emb(query")),
        (transformer_sana_wm.BidirectionalGDNUCPESinglePathLiteLA.forward,
         ("self.q_norm(query", "self.kernel_func(query)", "attn_output = self.attn(")),
    ):  # fmt: skip
        source = inspect.getsource(code)
        where = [source.index(step) for step in steps]
        assert where == sorted(where), steps


def test_qk_norm_is_one_of_the_named_norms():
    from axial_rope.conventions._registry import DiffusersFamily

    assert {f.qk_norm for f in DIFFUSERS.values()} <= set(QK_NORMS)
    with pytest.raises(ValueError, match="qk_norm must be one of"):
        DiffusersFamily(name="x", classes=(), rope=None, tables=("fixed", ""), positions=None, qk_norm="rms_norm")
