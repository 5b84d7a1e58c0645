"""Construction that a meta-device build reproduces: structure first, weights drawn once by ``reset_parameters``.

Large models are built the way FSDP2 users build them: under ``torch.device("meta")`` (no memory,
no random numbers), sharded, materialised with ``to_empty(device=...)``, then initialised. For that
last step to give the weights the normal constructor gives, the constructor must draw its random
numbers in the same place. So every module of the library builds inside :class:`deferred_init`:

    def __init__(self, ...):
        super().__init__()
        with deferred_init(self):          # children built on the meta device: no draws, no memory
            self.qkv = nn.Linear(...)
        # on exit: to_empty(the caller's default device), then self.reset_parameters()

and ``reset_parameters()`` initialises every parameter and buffer of the module, children included.
Then ``torch.manual_seed(s); M(...)`` and ``with torch.device("meta"): m = M(...)`` followed by
``m.to_empty(device=d); torch.manual_seed(s); m.reset_parameters()`` give the same weights (tested
for every module and model). Inside an outer ``deferred_init`` (or a user's meta context) the
default device is meta, so nested modules stay on meta and draw nothing until the outermost one
resets them all.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["deferred_init"]


class deferred_init:  # noqa: N801 (a context manager, used like a function)
    """``with deferred_init(module):`` build children on meta; on exit, materialise on the caller's device and reset."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self) -> nn.Module:
        self.device = torch.get_default_device()
        self._meta = torch.device("meta")
        self._meta.__enter__()
        return self.module

    def __exit__(self, *exc) -> None:
        self._meta.__exit__(*exc)
        if exc[0] is None and self.device.type != "meta":
            # to_empty for what was built here only: a child passed in (a shared rope) keeps its values
            device = self.device
            self.module._apply(lambda t: torch.empty_like(t, device=device) if t.is_meta else t)
            self.module.reset_parameters()
