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


def test_readme_quickstart_commands_are_the_ci_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = 'pip install -e ".[dev]" && python -m pytest -q'
    assert test_command in readme and test_command in ci
