"""Every RoPE transformer of the installed diffusers is served by a family record, or listed as unsupported with
its reason (or, while the work goes on, as pending): a diffusers upgrade shows here what is new.

"Uses RoPE" is read from the source of the class's module, as a reader would: it applies rotary embeddings
(``apply_rotary_emb``, a ``rotary``/``rope`` module, ``freqs_cis``).
"""

from __future__ import annotations

import inspect
import re

import pytest

from axial_rope.conventions._registry import DIFFUSERS, DIFFUSERS_PENDING, DIFFUSERS_UNSUPPORTED, diffusers_table

diffusers = pytest.importorskip("diffusers")

ROPE_SOURCE = re.compile(r"apply_rotary_emb|rotary|RoPE|rope|freqs_cis")


def _transformer_classes() -> dict[str, type]:
    found = {}
    for name in dir(diffusers):
        if not name.endswith("Model") or not ("Transformer" in name or "DiT" in name):
            continue
        cls = getattr(diffusers, name)
        if isinstance(cls, type):
            found[name] = cls
    return found


def _uses_rope(cls: type) -> bool:
    return bool(ROPE_SOURCE.search(inspect.getsource(inspect.getmodule(cls))))


def test_every_rope_transformer_is_served_unsupported_with_a_reason_or_pending():
    classes = _transformer_classes()
    rope = {name for name, cls in classes.items() if _uses_rope(cls)}
    served, unsupported = set(DIFFUSERS), set(DIFFUSERS_UNSUPPORTED)
    assert not served & unsupported and not served & DIFFUSERS_PENDING and not unsupported & DIFFUSERS_PENDING
    unknown = sorted(rope - served - unsupported - DIFFUSERS_PENDING)
    assert not unknown, f"RoPE transformers neither served, unsupported nor pending: {unknown}"
    stale = sorted((served | unsupported | DIFFUSERS_PENDING) - set(classes))
    assert not stale, f"listed classes this diffusers does not have: {stale}"
    assert all(len(reason) > 20 for reason in DIFFUSERS_UNSUPPORTED.values())
    print(f"{len(classes)} transformer classes, {len(rope)} with RoPE: {len(served)} served, "
          f"{len(unsupported)} unsupported, {len(DIFFUSERS_PENDING)} pending")  # fmt: skip


def test_every_served_class_builds_its_records_rope_and_the_docs_hold_the_table():
    from pathlib import Path

    for name, family in DIFFUSERS.items():
        assert name in _transformer_classes(), name
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
