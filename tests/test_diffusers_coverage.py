"""Every RoPE model the installed diffusers exports is served by a family record, or listed with its reason: a
transformer as unsupported (or, while the work goes on, as pending), a model beside the denoising transformer
(ControlNet, VAE, condition encoder) as auxiliary. A diffusers upgrade shows here what is new.

"A model" is every class ``dir(diffusers)`` names that subclasses ``diffusers.ModelMixin``, whatever its name.
"Uses RoPE" is read from the source of the class's module, as a reader would: it applies rotary embeddings
(``apply_rotary_emb``, a ``rotary``/``rope`` module or field, ``freqs_cis``).
"""

from __future__ import annotations

import functools
import inspect
import re

import pytest

from axial_rope.conventions._registry import (
    DIFFUSERS,
    DIFFUSERS_AUXILIARY,
    DIFFUSERS_PENDING,
    DIFFUSERS_UNSUPPORTED,
    diffusers_family,
    diffusers_table,
)

diffusers = pytest.importorskip("diffusers")

# "rope" as a word or part of a snake_case name (rope_theta, self.rope, cond_rope), never inside "property" or "proper"
ROPE_SOURCE = re.compile(r"apply_rotary_emb|rotary|RoPE|\brope|_rope|rope_|freqs_cis")


@functools.cache
def _models() -> dict[str, type]:
    """Every model class diffusers exports, by name: the subclasses of ``ModelMixin`` (itself aside) that
    ``dir(diffusers)`` names (importing each lazily exported module once, pipelines included: some hold models)."""
    found = {}
    for name in dir(diffusers):
        obj = getattr(diffusers, name)
        if isinstance(obj, type) and issubclass(obj, diffusers.ModelMixin) and obj is not diffusers.ModelMixin:
            found[name] = obj
    return found


def _uses_rope(cls: type) -> bool:
    return bool(ROPE_SOURCE.search(inspect.getsource(inspect.getmodule(cls))))


def test_the_rope_detection_reads_rope_names_and_not_property():
    for text in ("apply_rotary_emb(q, freqs)", "self.rope(ids)", "rope_theta=256", "cond_rope = x", "partial RoPE",
                 "freqs_cis", "image_rotary_emb"):  # fmt: skip
        assert ROPE_SOURCE.search(text), text
    for text in ("@property\ndef dtype(self):", "the proper shape", "properties of the conv"):
        assert not ROPE_SOURCE.search(text), text


def test_every_rope_model_is_served_or_listed_with_a_reason():
    models = _models()
    rope = {name for name, cls in models.items() if _uses_rope(cls)}
    served, unsupported, auxiliary = set(DIFFUSERS), set(DIFFUSERS_UNSUPPORTED), set(DIFFUSERS_AUXILIARY)
    lists = (served, unsupported, set(DIFFUSERS_PENDING), auxiliary)
    listed = set().union(*lists)
    assert sum(map(len, lists)) == len(listed), "a class is in two of served, unsupported, pending, auxiliary"
    unknown = sorted(rope - listed)
    assert not unknown, f"RoPE models neither served nor listed (unsupported, pending, auxiliary): {unknown}"
    stale = sorted(listed - set(models))
    assert not stale, f"listed classes this diffusers does not export as models: {stale}"
    no_rope = sorted(listed - rope)
    assert not no_rope, f"listed classes whose module shows no RoPE: {no_rope}"
    assert all(len(reason) > 20 for reason in (*DIFFUSERS_UNSUPPORTED.values(), *DIFFUSERS_AUXILIARY.values()))
    transformers = served | unsupported | set(DIFFUSERS_PENDING)
    print(f"{len(models)} model classes, {len(rope)} with RoPE: {len(transformers)} RoPE transformers ({len(served)} "
          f"served, {len(unsupported)} unsupported, {len(DIFFUSERS_PENDING)} pending) and {len(auxiliary)} models "
          "beside them (ControlNets, VAEs, condition encoders), each listed with its reason")  # fmt: skip


def test_a_model_listed_with_a_reason_gets_it_from_the_adapter():
    for name, reason in (*DIFFUSERS_UNSUPPORTED.items(), *DIFFUSERS_AUXILIARY.items()):
        with pytest.raises(TypeError, match=re.escape(f"{name}: {reason}")):
            diffusers_family(type(name, (), {})())


def test_every_served_class_builds_its_records_rope_and_the_docs_hold_the_table():
    from pathlib import Path

    for name, family in DIFFUSERS.items():
        assert name in _models(), name
        assert family.tables[0] in ("module", "method", "argument", "block argument", "fixed")
        assert (family.positions is None) == (family.tables[0] == "fixed")
    page = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    assert diffusers_table() in page, "docs/integrations.md must hold axial_rope.conventions.diffusers_table() verbatim"


def test_the_words_count_the_served_classes_from_the_records():
    # the docs' count is the table's last line (written from the records); the processors table names the families
    # whose record has a fused processor; the adapter's docstring names no hand-counted set of classes
    from pathlib import Path

    import axial_rope.integrations.diffusers as adapter

    page = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    families = len({family.name for family in DIFFUSERS.values()})
    assert f"\n{len(DIFFUSERS)} classes of {families} families are served." in page
    section = page.split("### RoPE of diffusers' transformers through axial_rope")[1].split("###")[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert listed == {name for name, family in DIFFUSERS.items() if family.processor is not None}
    assert "SUPPORTED" in adapter.__doc__
    assert not re.search(r"\b(five|six|seven|\d+) (model )?(families|classes)\b", adapter.__doc__ + section)
