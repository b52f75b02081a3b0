"""SIGINT and SIGTERM during a run: the first asks for a clean stop, the second stops at once.

The first signal only records itself; the run finishes the rollout in progress, saves it (with ``--save``), writes
the summary and raises ``RunInterrupted`` (exit 128 + the signal: 130 for SIGINT, 143 for SIGTERM). A second one
raises ``RunInterrupted`` where the driver is, so the run's context managers release Ray without saving.

Ray's ``ray.init`` installs its own handlers in the driver (a SIGTERM prints a C++ stack dump and exits 134), so
``handled()`` is entered after ``ray.init`` and puts the previous handlers back before ``ray.shutdown``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from miles.utils.errors import RunInterrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The first stop signal received during ``handled()`` (None until one arrives). ``checkpoint_note()`` says
    what the run has saved, for the line of a second signal."""

    def __init__(self, checkpoint_note: Callable[[], str] = str) -> None:
        self.signum: int | None = None
        self.checkpoint_note = checkpoint_note

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @contextlib.contextmanager
    def handled(self) -> Iterator[StopRequest]:
        """Handle SIGINT and SIGTERM as above inside the block, restoring the previous handlers after it. Python
        runs signal handlers in the main thread only; a run driven from another thread keeps the handlers it has."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                # None: a handler installed outside Python (Ray's C++ one); the default is the closest restorable.
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"miles: {self.name} received: stopping after the rollout in progress (again to stop at once)",
                  file=sys.stderr, flush=True)
            return
        raise RunInterrupted(
            f"{signal.Signals(signum).name} received after {self.name}: stopped at once; the rollout in progress is "
            "not saved. "
            f"{self.checkpoint_note()}",
            signum,
        )
