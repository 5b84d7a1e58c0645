"""The walkthroughs of docs/architecture.md are true (a new scaling method is one class), and the boundaries the tree
shows hold: no module uses another module's private names."""

from __future__ import annotations

import ast
import json
import pathlib
import shutil
import sys
from dataclasses import dataclass

import torch

import axial_rope as ar
from axial_rope import scaling


def test_a_new_scaling_method_is_one_class(monkeypatch):
    monkeypatch.setattr(scaling, "REGISTRY", dict(scaling.REGISTRY))  # keep the registry as it was

    @dataclass(frozen=True)
    class Halved(scaling.Scaling):
        """Every frequency halved past pair ``start`` (a toy method)."""

        rope_type = "halved"
        start: int

        def __call__(self, dim, theta, seq_len):
            inv = scaling.base_inv_freq(dim, theta)
            inv[self.start :] /= 2
            return inv, 1.0

    method = Halved(2)
    assert scaling.REGISTRY["halved"] is Halved
    assert scaling.from_dict(json.loads(json.dumps(method.to_dict()))) == method
    assert scaling.from_rope_parameters({"rope_type": "halved", "start": 2, "rope_theta": 100.0}) == method
    rope = ar.AxialRoPE(8, scaling={"rope_type": "halved", "start": 2})
    expected = ar.inv_freq(8)[0]
    expected[2:] /= 2
    torch.testing.assert_close(rope.freqs[0], expected, rtol=0, atol=0)


# -- private names stay in their module ---------------------------------------------------------------

PACKAGE = pathlib.Path(ar.__file__).resolve().parent

# (source module, private name) -> why another module may import it. Nothing else crosses.
ALLOWED_CROSSINGS = {
    **{("axial_rope.ops._triton_kernels", name): "the Triton kernel files are one kernel cut for size (private modules "
       "of ops): their @triton.jit device helpers, resolved by global name in the kernels, are shared inside it"
       for name in ("_load_planes", "_program_cos_sin", "_rest", "_rotate", "_rows", "_store_planes",
                    "_table_cos_sin", "_tokens")},
    **{("axial_rope.ops._triton_norm_table_kernels", name): "the same kernel family (the table norm's backward)"
       for name in ("_centred", "_load_tile", "_param_planes", "_param_rest", "_program", "_program_index",
                    "_row_sum", "_stats", "_token_stats", "_valid_planes")},
}  # fmt: skip


def _modules() -> dict[str, pathlib.Path]:
    """``axial_rope.x.y`` -> its file, for every module and package of axial_rope."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _defined_privates(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, assignments (``self._x = ...`` included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets if isinstance(node, (ast.Assign, ast.AnnAssign)) else []:
            for t in ast.walk(target):
                names |= {t.id} if isinstance(t, ast.Name) else {t.attr} if isinstance(t, ast.Attribute) else set()
    return {n for n in names if _private(n)}


def private_crossings() -> list[str]:
    """Every use of another module's private name: ``from .mod import _x``, a private module reached from outside
    its package (``from ..pkg._mod import x``), ``mod._x`` on an imported module, and ``obj._x`` where ``_x`` is
    defined by another module of the package only (``rope._frequencies_for``)."""
    modules = _modules()
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    defined = {name: _defined_privates(tree) for name, tree in trees.items()}
    found = []
    for name, tree in trees.items():
        package = name.split(".") if modules[name].name == "__init__.py" else name.split(".")[:-1]
        aliases = {}  # local name -> the package module it is bound to
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module if node.level == 0 else ".".join(package[: len(package) - node.level + 1] +
                                                                [node.module or ""]).strip(".")  # fmt: skip
            if base.split(".")[0] != "axial_rope":
                continue
            parts = base.split(".")
            found += [f"{name}: from {base} import ... (private module {'.'.join(parts[: i + 1])})"
                      for i in range(1, len(parts)) if _private(parts[i]) and not _inside(name, ".".join(parts[:i]))]
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    aliases[alias.asname or alias.name] = target
                    if _private(alias.name) and not _inside(name, base):
                        found.append(f"{name}: from {base} import {alias.name} (private module)")
                elif _private(alias.name) and (base, alias.name) not in ALLOWED_CROSSINGS:
                    found.append(f"{name}: from {base} import {alias.name}")
        others = set().union(*(d for m, d in defined.items() if m != name)) - defined[name]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)):
                continue
            owner = node.value.id
            if owner in aliases and aliases[owner] != name and (aliases[owner], node.attr) not in ALLOWED_CROSSINGS:
                found.append(f"{name}:{node.lineno}: {owner}.{node.attr} (module {aliases[owner]})")
            elif owner not in aliases and owner not in ("self", "cls") and node.attr in others:
                found.append(f"{name}:{node.lineno}: {owner}.{node.attr} (defined in another module)")
    return found


def test_no_module_uses_another_modules_private_names():
    """A private name (``_x``) stays in its module and a private module in its package: what another floor needs
    is a public helper (``axial_rope.ops`` exports ``seq_dim``, ``rms_norm``, ...), listed exceptions aside."""
    assert private_crossings() == []


def test_the_private_crossings_check_finds_each_form(tmp_path, monkeypatch):
    """The check above fails for the bugs it is about: each form of crossing, written into a copy of the package."""
    copy = tmp_path / "axial_rope"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "crossing.py").write_text(
        "from .ops._common import seq_dim\nfrom .scaling import _build\nfrom . import rope\n"
        "def f(r):\n    return rope._OWN, r.call_frequencies, r._spectrum\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    found = private_crossings()
    assert [line.split(":")[0] for line in found] == ["axial_rope.crossing"] * 4, found
    assert any("private module axial_rope.ops._common" in line for line in found)
    assert any("import _build" in line for line in found)
    assert any("rope._OWN" in line for line in found)
    assert any("r._spectrum" in line for line in found)
