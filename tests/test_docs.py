"""The README's and the core docs pages' code blocks run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Pages whose examples this file runs (others are run by the test file of their topic).
PAGES = ["README.md", "docs/index.md", "docs/concepts.md"]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page):
    blocks = python_blocks(ROOT / page)
    assert blocks, f"{page} has no python example"
    namespace: dict = {}
    for block in blocks:  # blocks of one page share a namespace, as a reader's session would
        exec(compile(block, f"{page}:example", "exec"), namespace)


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return [p for item in node for p in _nav_pages(item)]


def test_every_docs_page_is_in_nav():
    # mkdocs --strict does not fail on a page left out of nav (it only logs it), so check here.
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages, (
        f"not in nav: {sorted(set(pages) - set(nav))}, missing: {sorted(set(nav) - set(pages))}"
    )


def test_install_page_names_every_extra():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = (ROOT / "docs" / "install.md").read_text()
    missing = [name for name in extras if f"| `{name}` |" not in install]
    assert not missing, f"docs/install.md does not describe the extras {missing}"
    for command in ("pip install -e .", "mkdocs build --strict", "python -m pytest -q", "TRITON_INTERPRET=1"):
        assert command in install


def test_readme_quickstart_commands_are_the_ci_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = 'pip install -e ".[dev]" && python -m pytest -q'
    assert test_command in readme and test_command in ci
