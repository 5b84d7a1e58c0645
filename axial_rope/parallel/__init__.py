"""Sequence (context) parallelism: one sequence sharded over the ranks of a process group.

``ContextParallel(group, method, layout)`` says which tokens each rank holds and how
attention crosses the shards (``"ulysses"`` all-to-all or ``"ring"``);
``sequence_parallel_attention`` is the attention itself, and
``axial_rope.layers.Attention(..., context_parallel=cp)`` calls it. Positions stay
global: each rank rotates its own tokens with their coordinates in the whole sequence.
Eager calls first check that the ranks agree (``ContextParallel.check_consistent``); a
collective broken by another rank's failure raises ``RankFailedError``.
See ``docs/distributed.md``.
"""

from .comm import RankFailedError, reset_sent_bytes, sent_bytes
from .functional import communication_bytes, sequence_parallel_attention
from .ring import ring_attention
from .sharding import LAYOUTS, METHODS, ContextParallel, padded_length, split_groups
from .ulysses import ulysses_attention

__all__ = [
    "ContextParallel",
    "LAYOUTS",
    "METHODS",
    "RankFailedError",
    "communication_bytes",
    "padded_length",
    "reset_sent_bytes",
    "ring_attention",
    "sent_bytes",
    "sequence_parallel_attention",
    "split_groups",
    "ulysses_attention",
]
