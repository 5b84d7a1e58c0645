"""Regenerate the generated parts of docs/doctor.md: the example reports, their pictures, the confusion table.

    python -m scripts.doctor_page

Each generated block of the page sits between ``<!-- doctor:NAME -->`` and ``<!-- /doctor:NAME -->``; the
pictures go to ``docs/img/doctor/NAME.png``. The examples and the seeded defects are ``models/tiny_defects.py``'s.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from axial_rope.doctor import CLASSES
from models.tiny_defects import EXAMPLES, confusion_table, example

PAGE = Path("docs/doctor.md")
PICTURES = Path("docs/img/doctor")


def replace_block(page: str, name: str, body: str) -> str:
    """``page`` with the block ``name`` holding ``body`` (``ValueError`` if the page has no such block)."""
    pattern = re.compile(rf"(<!-- doctor:{name} -->\n).*?(<!-- /doctor:{name} -->)", re.S)
    if not pattern.search(page):
        raise ValueError(f"{PAGE} has no block <!-- doctor:{name} --> ... <!-- /doctor:{name} -->")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), page)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[*EXAMPLES, "classes", "confusion"], help="regenerate one block")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    PICTURES.mkdir(parents=True, exist_ok=True)
    for name in EXAMPLES:
        if args.only not in (None, name):
            continue
        report = example(name)
        report.picture(str(PICTURES / f"{name}.png"))
        page = replace_block(page, name, f"```text\n{report}\n```\n")
        print(f"{name}: {len(report.alarms)} alarm(s)")
    if args.only in (None, "classes"):
        rows = ["| class | what it means |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in CLASSES.items()]
        page = replace_block(page, "classes", "\n".join(rows) + "\n")
    if args.only in (None, "confusion"):
        page = replace_block(page, "confusion", confusion_table())
    PAGE.write_text(page)


if __name__ == "__main__":
    main()
