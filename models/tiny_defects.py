"""Seeded RoPE defects on tiny models: the public incidents the RoPE doctor must name.

Each :class:`Defect` rebuilds one incident on a model of :mod:`models.tiny_transformers` (fresh, seeded; or of
:mod:`models.tiny_diffusers`, named ``"diffusers:<class>"``) and
says which class of :data:`axial_rope.doctor.CLASSES` the doctor should report. :func:`seeded` is a context
manager: a defect that rebinds a modeling function (a pairing mismatch) puts it back on exit.
:func:`confusion_table` runs the doctor over every defect and the healthy models, for ``docs/doctor.md``
(``tests/test_doctor_defects.py`` checks that the page holds the table this code gives).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from models import tiny_transformers

__all__ = ["DEFECTS", "EXAMPLES", "HEALTHY", "Defect", "alarms", "confusion_table", "example", "flux_like", "healthy_llama",
           "llama31", "seeded"]  # fmt: skip


def _fresh(name: str) -> tiny_transformers.Case:
    """A new tiny model (not the cached one other tests share: a defect changes it)."""
    return tiny_transformers.case.__wrapped__(name)


def _text_config(model: nn.Module):
    return model.config.get_text_config()


def _rotary_path(model: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if n.rsplit(".", 1)[-1] == "rotary_emb")


def _replace_rotary(model: nn.Module, build: Callable[[object], nn.Module]) -> None:
    """Replace the text rotary module by ``build(config)`` (the config as the faulty code read it)."""
    path = _rotary_path(model)
    parent, _, attr = path.rpartition(".")
    stock = model.get_submodule(path)
    setattr(model.get_submodule(parent), attr, build(stock.config))


def _config_with(config, **rope_changes):
    """A copy of a text config whose ``rope_parameters`` (or other fields) were read otherwise."""
    config = copy.deepcopy(config)
    params = dict(config.rope_parameters)
    for key, value in rope_changes.items():
        if key in ("rope_type", "rope_theta", "partial_rotary_factor", "mrope_section"):
            params[key] = value
        else:
            setattr(config, key, value)
    if params.get("rope_type") == "default":
        params = {k: v for k, v in params.items() if k in ("rope_type", "rope_theta", "partial_rotary_factor",
                                                          "mrope_section")}  # fmt: skip
    config.rope_parameters = params
    return config


def _stock_rotary(model: nn.Module) -> type:
    return type(model.get_submodule(_rotary_path(model)))


class MatmulRotary(nn.Module):
    """A Llama rotary that computes its angles with a matmul and no autocast guard (transformers' rotary before the
    guard): under ``torch.autocast`` the matmul, and so every angle, is computed in bfloat16."""

    def __init__(self, stock: nn.Module):
        super().__init__()
        self.config, self.attention_scaling = stock.config, stock.attention_scaling
        self.register_buffer("inv_freq", stock.inv_freq.clone(), persistent=False)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)  # [B, D/2, 1]
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)  # [B, S, D/2]: bfloat16 under autocast
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class Bf16Rotary(MatmulRotary):
    """A rotary that casts positions and inverse frequencies to bfloat16 before the product (always)."""

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].bfloat16() * self.inv_freq.bfloat16()  # [B, S, D/2] in bfloat16
        emb = torch.cat((freqs, freqs), dim=-1).float()
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def _interleaved_rotation(q, k, cos, sin, unsqueeze_dim=1):
    """Meta's rotation (planes ``(2j, 2j+1)``) by Hugging Face's rotate_half tables: what runs when a checkpoint
    converted to Hugging Face's layout (q, k rows permuted) meets code that still pairs channels as Meta did."""
    half = cos.shape[-1] // 2
    c = cos[..., :half].repeat_interleave(2, -1).unsqueeze(unsqueeze_dim)
    s = sin[..., :half].repeat_interleave(2, -1).unsqueeze(unsqueeze_dim)

    def turn(x):
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return x * c + rotated * s

    return turn(q), turn(k)


@dataclass(frozen=True)
class Defect:
    """One seeded incident: its name, the class the doctor must report, the tiny model it is built on, and how.

    Attributes:
        incident: the public report it rebuilds, in words with its reference.
        seed: ``(model, inputs) -> context manager or None``: breaks the model (a context where the break is a
            rebinding to undo).
    """

    name: str
    expected: str
    model: str
    incident: str
    seed: Callable


def _scaling_dropped(model, inputs):  # Unsloth PR #6197: the replacement rotary never read rope_scaling
    cls = _stock_rotary(model)
    _replace_rotary(model, lambda c: cls(_config_with(c, rope_type="default")))


def _yarn_noop_mrope(model, inputs):  # jundot/omlx PR #3594: YaRN in rope_parameters ignored by the M-RoPE path
    cls = _stock_rotary(model)
    _replace_rotary(model, lambda c: cls(_config_with(c, rope_type="default")))


def _positions_ignored(model, inputs):  # NVIDIA-NeMo/Automodel PR #2377: position_ids' values not used
    def drop(module, args, kwargs):
        return args, {**kwargs, "position_ids": None}

    model.model.register_forward_pre_hook(drop, with_kwargs=True)


def _autocast_tables(model, inputs):  # diffusers 6e8c8c4: tables computed under torch.autocast collapse
    _replace_rotary(model, lambda c: MatmulRotary(model.get_submodule(_rotary_path(model))))


def _bf16_angles(model, inputs):
    _replace_rotary(model, lambda c: Bf16Rotary(model.get_submodule(_rotary_path(model))))


@contextlib.contextmanager
def _meta_pairing(model, inputs):  # a Meta checkpoint converted to HF layout, rotated with Meta's pairing
    from transformers.models.llama import modeling_llama

    stock = modeling_llama.apply_rotary_pos_emb
    modeling_llama.apply_rotary_pos_emb = _interleaved_rotation
    try:
        yield
    finally:
        modeling_llama.apply_rotary_pos_emb = stock


def _partial_ignored(model, inputs):  # a rotary that rotates the whole head, partial_rotary_factor ignored
    cls = _stock_rotary(model)
    _replace_rotary(model, lambda c: cls(_config_with(c, partial_rotary_factor=1.0)))


def _wrong_theta(model, inputs):  # a rotary built with another base than the config's
    cls = _stock_rotary(model)
    _replace_rotary(model, lambda c: cls(_config_with(c, rope_theta=1e6)))


def _sections_swapped(model, inputs):  # M-RoPE sections read in another order than the config's
    cls = _stock_rotary(model)
    _replace_rotary(model, lambda c: cls(_config_with(c, mrope_section=[6, 6, 4])))


def _factor_dropped(model, inputs):  # YaRN's frequencies applied, its attention factor (cos, sin amplitude) not
    model.get_submodule(_rotary_path(model)).attention_scaling = 1.0


def _ideogram_before_the_fix(model, inputs):  # diffusers 6e8c8c4: Ideogram 4's M-RoPE under torch.autocast
    from diffusers.models.transformers.transformer_ideogram4 import Ideogram4MRoPE

    class BeforeTheFix(Ideogram4MRoPE):
        """The tables as computed before diffusers 6e8c8c4 disabled autocast around their matmul: under autocast the
        matmul's operands are rounded to bfloat16, so the image positions (from 65536) collapse to multiples of
        512 (what upstream's comment describes)."""

        def forward(self, position_ids):
            if torch.is_autocast_enabled(position_ids.device.type):
                position_ids = position_ids.to(torch.bfloat16).to(position_ids.dtype)
            return super().forward(position_ids)

    model.rotary_emb.__class__ = BeforeTheFix


def _shuffled(model, inputs):  # inverse frequencies in a scrambled order: no convention lays them out so
    rotary = model.get_submodule(_rotary_path(model))
    order = torch.randperm(rotary.inv_freq.shape[0], generator=torch.Generator().manual_seed(0))
    rotary.inv_freq = rotary.inv_freq[order]


LLAMA_YARN_MROPE = "qwen2_vl-yarn"  # Qwen2-VL with YaRN in its rope_parameters (built by _model below)

DEFECTS: tuple[Defect, ...] = (
    Defect("scaling dropped (Llama 3.1)", "scaling_not_applied", "llama-llama3",
           "Unsloth ran Llama 3.1/3.2/3.3 unscaled: its rotary class never read rope_scaling (unsloth PR #6197)",
           _scaling_dropped),
    Defect("YaRN no-op in M-RoPE", "scaling_not_applied", LLAMA_YARN_MROPE,
           "YaRN in rope_parameters was a silent no-op in an M-RoPE path (jundot/omlx PR #3594)", _yarn_noop_mrope),
    Defect("position ids ignored", "positions_ignored", "llama",
           "a Llama path ignored the values of position_ids (NVIDIA-NeMo/Automodel PR #2377)", _positions_ignored),
    Defect("tables under bf16 autocast", "autocast_collapse", "llama",
           "tables computed under torch.autocast collapsed (diffusers commit 6e8c8c4, Ideogram 4)", _autocast_tables),
    Defect("Meta <-> HF pairing", "wrong_pairing", "llama",
           "a checkpoint converted to Hugging Face's layout rotated with Meta's interleaved pairing", _meta_pairing),
    Defect("partial rotary ignored", "partial_rotary_width", "gpt_neox",
           "a rotary rotating the whole head of a partial-rotary model (partial_rotary_factor ignored)",
           _partial_ignored),
    Defect("wrong theta", "wrong_theta", "llama", "a rotary built with rope_theta 1e6 for a config of 1e4",
           _wrong_theta),
    Defect("M-RoPE sections swapped", "mrope_sections", "qwen2_vl",
           "M-RoPE sections [6, 6, 4] read for the config's [4, 6, 6]", _sections_swapped),
    Defect("bf16 angles", "low_precision_angles", "llama", "angles computed in bfloat16 (every forward)",
           _bf16_angles),
    Defect("YaRN factor dropped", "attention_factor", "llama-yarn",
           "YaRN's frequencies applied without its attention factor", _factor_dropped),
    Defect("shuffled frequencies", "unexplained_layout", "llama", "inverse frequencies in a scrambled order",
           _shuffled),
    Defect("Ideogram 4 under autocast", "autocast_collapse", "diffusers:Ideogram4Transformer2DModel",
           "Ideogram 4's M-RoPE tables collapsed under torch.autocast before diffusers commit 6e8c8c4",
           _ideogram_before_the_fix),
)  # fmt: skip


def _model(name: str) -> tiny_transformers.Case:
    if name.startswith("diffusers:"):  # a tiny diffusers transformer (models/tiny_diffusers.py)
        from models import tiny_diffusers

        model, inputs = tiny_diffusers.build(name.removeprefix("diffusers:"))
        return tiny_transformers.Case(model, inputs)
    if name != LLAMA_YARN_MROPE:
        return _fresh(name)
    import transformers

    model_cls, config_cls, sections, vision, fused = tiny_transformers.VISION["qwen2_vl"]
    rope = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16,
            "mrope_section": sections}  # fmt: skip
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(
        text_config=tiny_transformers.SIZES | {"rope_parameters": rope}, vision_config=vision,
        image_token_id=tiny_transformers.IMAGE, video_token_id=63, vision_start_token_id=tiny_transformers.START,
        vision_end_token_id=tiny_transformers.END,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    model = getattr(transformers, model_cls)(config).eval()
    return tiny_transformers.Case(model, tiny_transformers.case("qwen2_vl").inputs, fused)


@contextlib.contextmanager
def seeded(defect: Defect | None, model: str | None = None) -> Iterator[tuple[nn.Module, dict]]:
    """``(model, inputs)`` of a fresh tiny model with ``defect`` seeded (``None``: the healthy ``model``)."""
    case = _model(defect.model if defect is not None else model)
    context = defect.seed(case.model, case.inputs) if defect is not None else None
    with context if context is not None else contextlib.nullcontext():
        yield case.model, case.inputs


def healthy_llama() -> tuple[nn.Module, dict]:
    """A fresh tiny Llama and its inputs (a command-line target: ``python -m axial_rope.doctor
    models.tiny_defects:healthy_llama``)."""
    case = _fresh("llama")
    return case.model, case.inputs


LLAMA31 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}  # Llama 3.1's rope_parameters (its config.json)  # fmt: skip


def llama31(scaling_dropped: bool = False) -> tuple[nn.Module, dict]:
    """A one-layer Llama with Llama 3.1's head (128 channels) and rope_parameters, and its inputs; with
    ``scaling_dropped``, Unsloth's incident: a rotary that never read the scaling."""
    import transformers

    torch.manual_seed(0)
    fields = tiny_transformers.SIZES | {"hidden_size": 256, "head_dim": 128, "num_hidden_layers": 1,
                                        "max_position_embeddings": 131072, "rope_parameters": dict(LLAMA31)}  # fmt: skip
    config = transformers.LlamaConfig(**fields)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config).eval()
    if scaling_dropped:
        _scaling_dropped(model, None)
    return model, {"input_ids": tiny_transformers.case("llama").inputs["input_ids"]}


def flux_like() -> tuple[nn.Module, dict]:
    """A one-block Flux with FLUX.1's rope (axes 16, 56, 56 of a 128-channel head, theta 10000) on an 8 x 8 latent."""
    from models.tiny_diffusers_common import flux, flux_inputs

    torch.manual_seed(0)
    return flux(1, 2, (16, 56, 56)).eval(), flux_inputs(8, 8, 1, torch.Generator().manual_seed(0))


def ideogram4_before_the_fix() -> tuple[nn.Module, dict]:
    """A one-block Ideogram 4 with a 128-channel head (M-RoPE sections 24, 20, 20, as a 128-channel head
    splits in Qwen3-VL) on an 8 x 8 latent, its tables computed as before diffusers 6e8c8c4 (the Ideogram 4 defect)."""
    import diffusers

    from models import tiny_diffusers

    torch.manual_seed(0)
    model = diffusers.Ideogram4Transformer2DModel(
        in_channels=4, num_layers=1, attention_head_dim=128, num_attention_heads=1, intermediate_size=32,
        adaln_dim=16, llm_features_dim=8, mrope_section=(24, 20, 20),
    ).eval()  # fmt: skip
    inputs = tiny_diffusers.inputs("Ideogram4Transformer2DModel", 8, 8)
    _ideogram_before_the_fix(model, inputs)
    return model, inputs


# the examples of docs/doctor.md: name -> (what, () -> (model, inputs) or a context giving them, doctor arguments)
EXAMPLES = {
    "flux": ("a healthy Flux-like model, planned at 2048 x 2048 px (128 x 128 tokens)", flux_like,
             {"size": (128, 128)}),
    "llama31_scaling_dropped": ("Llama 3.1's rope with the scaling dropped (Unsloth's incident), planned at 128K",
                                lambda: llama31(scaling_dropped=True), {"size": 131072}),
    "ideogram4_autocast": ("Ideogram 4's M-RoPE before the fix (tables under autocast), planned at 4096 x 4096 px",
                           ideogram4_before_the_fix, {"size": (256, 256)}),
}  # fmt: skip


def example(name: str):
    """The doctor's report on one of :data:`EXAMPLES`."""
    from axial_rope.doctor import doctor

    _, build, kwargs = EXAMPLES[name]
    made = build()
    with made if hasattr(made, "__enter__") else contextlib.nullcontext(made) as (model, inputs):
        return doctor(model, example_inputs=inputs, **kwargs)


def alarms(defect: Defect | None, model: str | None = None) -> frozenset[str]:
    """The classes of the doctor's alarms on a seeded defect (``None``: the healthy ``model``)."""
    from axial_rope.doctor import doctor

    with seeded(defect, model) as (net, inputs):
        return frozenset(f.kind for f in doctor(net, example_inputs=inputs).alarms)


HEALTHY = (*tiny_transformers.NAMES, LLAMA_YARN_MROPE)  # the healthy row of the table: every tiny model


def confusion_table(found: Callable[[Defect | None, str | None], frozenset[str]] = alarms) -> str:
    """The markdown table of ``docs/doctor.md``: one row per seeded defect (and one for the healthy tiny models,
    counting their alarms), the doctor's classes in the columns, ``x`` where it raised that class.

    Args:
        found: ``(defect, model) -> classes of the alarms`` (default :func:`alarms`; the tests pass a cached one).
    """
    from axial_rope.doctor import CLASSES

    kinds = list(CLASSES)
    lines = ["| seeded defect | expected | " + " | ".join(f"`{k}`" for k in kinds) + " |",
             "|" + "---|" * (len(kinds) + 2)]  # fmt: skip
    healthy = [kind for name in HEALTHY for kind in found(None, name)]
    lines.append(f"| none ({len(HEALTHY)} healthy models) | - | "
                 + " | ".join(str(healthy.count(k) or "") for k in kinds) + " |")  # fmt: skip
    for defect in DEFECTS:
        marked = found(defect, None)
        lines.append(f"| {defect.name} | `{defect.expected}` | " + " | ".join("x" if k in marked else ""
                                                                             for k in kinds) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"
