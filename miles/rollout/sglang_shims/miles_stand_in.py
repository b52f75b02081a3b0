"""The stand-in names themselves, importable as the top-level module ``miles_stand_in`` wherever this folder is on
``sys.path``: the stand-in packages import it by that name, so they need no ``miles`` package (the upstream
conformance environment, which has upstream's own ``miles``, uses them too: docs/conformance.md)."""

from __future__ import annotations

import os
import types

LOG_ENV = "MILES_SGLANG_STAND_IN_LOG"


class StandInCalled(RuntimeError):
    """A stand-in was called: SGLang took a path that needs the real compiled package."""


class StandIn:
    """A name of a missing package: attribute access gives further stand-ins (module-level constants such as
    ``InterpolationMode.BICUBIC`` in SGLang's imports); a call logs and raises."""

    def __init__(self, qualified_name: str) -> None:
        self._qualified_name = qualified_name

    def __getattr__(self, attr: str) -> StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self._qualified_name}.{attr}")

    def __call__(self, *args, **kwargs):
        message = f"{self._qualified_name} was called, but it is a miles stand-in (docs/sglang.md, 'Stand-ins')"
        log_path = os.environ.get(LOG_ENV)
        if log_path:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"pid {os.getpid()}: {message}\n")
        raise StandInCalled(message)

    def __repr__(self) -> str:
        return f"<miles stand-in {self._qualified_name}>"


class StandInModule(types.ModuleType):
    """A module whose every missing attribute is a ``StandIn`` of that name."""

    def __getattr__(self, attr: str) -> StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self.__name__}.{attr}")
