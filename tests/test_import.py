"""`import axial_rope` needs torch only: optional packages are never imported eagerly."""

from __future__ import annotations

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
