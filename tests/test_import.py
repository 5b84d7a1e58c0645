"""`import axial_rope` needs torch only: optional packages are never imported eagerly; the import graph of
axial_rope has no cycle, and every module imports on its own."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

OPTIONAL = [
    "triton",
    "diffusers",
    "timm",
    "transformers",
    "safetensors",
    "tqdm",
    "matplotlib",
    "PIL",
    "accelerate",
    "einops",
]


def test_import_works_with_optional_packages_blocked():
    code = textwrap.dedent(
        f"""
        import sys, importlib.machinery, importlib.util

        BLOCKED = {OPTIONAL!r}

        class Hide(importlib.machinery.PathFinder):
            # the blocked packages look uninstalled: find_spec finds nothing
            @classmethod
            def find_spec(cls, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    return None
                return super().find_spec(name, path, target)

        sys.meta_path[:] = [Hide if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
        assert importlib.util.find_spec("triton") is None
        import torch
        import axial_rope as ar

        rope = ar.AxialRoPE((8, 8))
        q = torch.randn(1, 6, 2, 16)
        q2, k2 = rope(q, q, ar.grid(2, 3))
        assert q2.shape == q.shape
        loaded = sorted(m for m in BLOCKED if m in sys.modules)
        assert not loaded, loaded
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- the import graph of axial_rope: acyclic, every module importable on its own ---------------------

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "axial_rope"


def package_modules() -> dict[str, pathlib.Path]:
    """``axial_rope.x.y`` -> its file, for every module and package of axial_rope."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The axial_rope modules that ``name`` imports anywhere in its file (a lazy import inside a function
    is still an edge: it closes a circle at call time)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
            base = node.module if node.level == 0 else base
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def test_import_graph_has_no_cycle():
    modules = package_modules()
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph["axial_rope.scaling"] == {"axial_rope.hf_config", "axial_rope.scaling_checks"}
    done, path = set(), []

    def visit(name: str) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        path.append(name)
        for target in sorted(graph[name]):
            visit(target)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_every_module_imports_on_its_own():
    """Each module imported first, with only what it imports (the package's ``__init__`` replaced by an
    empty package): no module depends on being imported after another."""
    names = sorted(package_modules())
    code = textwrap.dedent(
        f"""
        import importlib, sys, types
        import torch

        failures = []
        for name in {names!r}:
            for loaded in [m for m in sys.modules if m == "axial_rope" or m.startswith("axial_rope.")]:
                del sys.modules[loaded]
            if name != "axial_rope":
                stub = types.ModuleType("axial_rope")
                stub.__path__ = [{str(PACKAGE)!r}]
                sys.modules["axial_rope"] = stub
            try:
                importlib.import_module(name)
            except Exception as error:
                failures.append(f"{{name}}: {{type(error).__name__}}: {{error}}")
        print("\\n".join(failures) or "ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout
