"""Adapters for other libraries: ``axial_rope.integrations.diffusers`` and ``axial_rope.integrations.timm``.

Nothing is imported here, so ``import axial_rope`` never imports diffusers or timm.
"""
