"""Griffe extension for the API reference: read the library's docstrings as Google style.

Two habits of the docstrings that the Google parser of mkdocstrings does not know are
rewritten before parsing (the library source is not changed):

- reStructuredText roles (``:class:`~axial_rope.AxialRoPE```, ``:func:`grid```), which
  would be shown literally, become code spans of the name Sphinx displays: the last
  component with ``~``, else the target as written;
- a group of parameter names spread over several lines of an ``Args:`` section (each
  line but the last ending with a comma) is joined into one ``names: description`` item.

Loaded by the ``mkdocstrings`` python handler (``extensions`` in mkdocs.yml).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")
ARGS = ("Args:", "Arguments:", "Parameters:", "Params:")


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by a code span."""
    return ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


def join_name_groups(text: str) -> str:
    """Join ``Args:`` items whose line ends with a comma to the item line that follows."""
    lines, out = text.split("\n"), []
    in_args, item_indent = False, None
    for line in lines:
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        if stripped in ARGS and not line.startswith(" "):
            in_args, item_indent = True, None
        elif in_args and stripped and indent == 0:
            in_args = False
        elif in_args and stripped:
            item_indent = indent if item_indent is None else item_indent
            prev = out[-1] if out else ""
            if indent == item_indent and prev.endswith(",") and len(prev) - len(prev.lstrip()) == item_indent:
                out[-1] = f"{prev} {stripped}"
                continue
        out.append(line)
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring with :func:`plain_roles` and :func:`join_name_groups`."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = join_name_groups(plain_roles(obj.docstring.value))
