"""The registry of conventions: what each reproduces, where its upstream code lives, and how close it is.

Every convention module registers its constructors here with :func:`register`; the docs table of
``docs/conventions.md`` is :func:`table`, and the pictures of ``docs/img/conventions/`` are drawn
from :attr:`Convention.example`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Convention", "FAMILIES", "REGISTRY", "builds_rope", "register", "table"]


def builds_rope(build: Callable) -> Callable:
    """A convention constructor computes its frequency model on the CPU, also under a meta default device, and
    hands back ropes whose buffers sit on the caller's default device (as every module's do)."""

    @functools.wraps(build)
    def constructor(*args, **kwargs):
        device = torch.get_default_device()
        with torch.device("cpu"):
            result = build(*args, **kwargs)
        for rope in _ropes(result):
            rope.to(device)
        return result

    return constructor


def _ropes(result):
    """The rope modules in a constructor's result: a rope, a list of them, or per-layer records holding one."""
    if isinstance(result, nn.Module):
        yield result
    elif isinstance(result, (list, tuple)):
        for item in result:
            yield from _ropes(item)
    elif isinstance(getattr(result, "rope", None), nn.Module):
        yield result.rope


@dataclass(frozen=True)
class Convention:
    """One production RoPE convention.

    Attributes:
        name: the constructor's name in :mod:`axial_rope.conventions`.
        family: the picture it is drawn in (``docs/img/conventions/<family>.png``).
        source: the upstream file, symbol and version the tests compare against.
        axes: axes and sections, in words.
        pairing: ``"interleaved"`` or ``"half"`` (``"per layer"`` for layer conventions).
        positions: the positions and their transform, in words.
        max_diff: the largest cos/sin difference from the upstream tables measured by the tests at
            their sizes (0 = bit for bit); the test asserts it stays at or below this.
        example: a small instance, for the pictures and the docs.
        reference: ``"upstream"`` when the tests run the installed upstream code, else the citation
            of the published formula they transcribe.
    """

    name: str
    family: str
    source: str
    axes: str
    pairing: str
    positions: str
    max_diff: float
    example: Callable[[], object]
    reference: str = "upstream"


REGISTRY: dict[str, Convention] = {}

# the order of the docs table and pictures: diffusion video/image models, ViTs, multimodal, language models
FAMILIES = ("flux", "hunyuan", "wan", "cogvideox", "ltx", "lumina", "mochi", "timm", "dinov3", "qwen_vl", "videorope",
            "llm", "layers")  # fmt: skip


def register(convention: Convention) -> Convention:
    if convention.name in REGISTRY:
        raise ValueError(f"convention {convention.name!r} is registered twice")
    REGISTRY[convention.name] = convention
    return convention


def _diff(value: float) -> str:
    return "0 (bit for bit)" if value == 0 else f"{value:.0e}"


def table() -> str:
    """The markdown table of every convention (the one in ``docs/conventions.md``)."""
    rows = [
        "| convention | upstream (checked against) | axes and sections | pairing | positions | max diff |",
        "|---|---|---|---|---|---|",
    ]
    order = {family: i for i, family in enumerate(FAMILIES)}
    for c in sorted(REGISTRY.values(), key=lambda c: order.get(c.family, len(order))):  # stable within a family
        source = c.source if c.reference == "upstream" else f"{c.source} (transcribed: {c.reference})"
        rows.append(f"| `{c.name}` | {source} | {c.axes} | {c.pairing} | {c.positions} | {_diff(c.max_diff)} |")
    return "\n".join(rows) + "\n"
