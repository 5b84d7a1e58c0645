"""Tiny random diffusers video transformers whose pipelines pass the rotary tables in (crop or scaled grids):
Allegro, ConsisID. :data:`ENTRIES` holds, per class name, the fields of a :class:`models.tiny_diffusers.Tiny`
(that module builds them). One layer, two heads, batch 2; the inputs carry the tables the pipeline would pass.
"""

from __future__ import annotations

B = 2  # batch

ENTRIES: dict[str, dict] = {}
