"""Stopping a run at a step boundary on Ctrl-C (SIGINT) or SIGTERM (what schedulers and containers send).

Inside :class:`DeferredStop` the signals only set :attr:`DeferredStop.requested`; the trainer
looks at it between steps, so a signal never lands inside the optimizer step and the state it
saves is always that of a whole number of steps. A second Ctrl-C stops at once (a
``KeyboardInterrupt``); the trainer then keeps its last checkpoint rather than save a state
that may be half a step. In the final save the save is abandoned: it writes a temporary file
and renames it, so the file on disk is a whole checkpoint, the new one or the one before.
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["DeferredStop"]


class DeferredStop:
    """Context manager: SIGINT and SIGTERM request a stop instead of raising; handlers restored on exit."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT" and self.requested == "SIGINT":
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if self.requested is None:
            again = " (Ctrl-C again stops at once, without saving)" if name == "SIGINT" else ""
            print(f"\n{name}: stopping after this step and saving{again}", file=sys.stderr, flush=True)
        if self.requested is None or name == "SIGINT":  # after SIGTERM, Ctrl-C twice still forces
            self.requested = name

    def __enter__(self) -> DeferredStop:
        # signal handlers can only be set from the main thread; elsewhere signals keep their behaviour
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                signum = getattr(signal, name, None)
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            # None: a handler not set from Python; the default is the closest to it that can be set
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
