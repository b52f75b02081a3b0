"""One event loop per process, on a thread of its own, for the coroutines miles awaits from plain code.

Upstream's ``miles.utils.async_utils.run``: a generate or reward function's HTTP client (``miles.utils.http_utils``)
is bound to the loop that first used it, so every rollout of a process must run on the same loop; ``asyncio.run``
would make a new one each time and leave the client's connections on a closed loop.
"""

from __future__ import annotations

import asyncio
import threading

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """This process's loop, started on a daemon thread at the first call."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="miles-event-loop", daemon=True).start()
        return _loop


def run(coro):
    """Run ``coro`` on this process's loop and return its result (its exception is raised here)."""
    return asyncio.run_coroutine_threadsafe(coro, event_loop()).result()
