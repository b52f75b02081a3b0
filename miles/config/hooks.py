"""Loading a function named by a flag (``package.module.function``), so a bad path fails at startup.

Torch-free itself: the named module may import what it likes, once the launch is otherwise valid.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from miles.config.errors import MilesConfigError


def load_function(flag: str, path: str, example: str) -> Callable:
    """The function ``path`` names (``package.module.function``, or ``package.module:function``); a bad path is a
    ``MilesConfigError`` naming ``flag``, the path, what is wrong and ``example``."""
    module_name, _, function_name = path.replace(":", ".").rpartition(".")
    fix = f"Pass a dotted path package.module.function importable from the run's Python path, e.g. {flag} {example}"
    if not module_name or not function_name:
        raise MilesConfigError(f"{flag} is {path!r}, but it must name a module and a function in it. {fix}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise MilesConfigError(f"{flag} is {path!r}, but its module {module_name!r} cannot be imported ({error}). "
                               f"{fix}.") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise MilesConfigError(f"{flag} is {path!r}, but module {module_name!r} has no function {function_name!r}. "
                               f"{fix}.")
    return function
