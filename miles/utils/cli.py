"""How the drivers turn configuration errors and run stops into one clean line on stderr."""

import importlib
import re
import sys

from miles.utils.errors import MilesConfigError, MilesRunError

CONFIG_ERROR_EXIT_STATUS = 2  # argparse's status for bad command-line input

# The last line of a Python traceback that Ray keeps, as text only, for an error raised in an actor's __init__.
_RAISED_MILES_ERROR = re.compile(r"^(miles(?:\.\w+)+)\.(\w+): (.*)\Z", re.MULTILINE | re.DOTALL)


def run_cli(main) -> None:
    """Run ``main()``. A ``MilesConfigError`` prints ``error: ...`` and exits 2; a ``MilesRunError`` (guard,
    divergence, signal, dead process) prints ``<label>: ...`` and exits with its status, after the run saved what it
    could and shut Ray down; the same holds for either raised in a Ray actor's ``__init__``. Anything else keeps
    its traceback."""
    try:
        main()
    except MilesConfigError as error:
        _exit(CONFIG_ERROR_EXIT_STATUS, "error", _user_message(error, MilesConfigError))
    except MilesRunError as error:
        cause = _user_message(error, MilesRunError)
        _exit(cause.exit_status, cause.label, cause)
    except Exception as error:
        raised_in_init = _error_raised_in_actor_init(error)
        if raised_in_init is None:
            raise
        kind, message = raised_in_init
        if issubclass(kind, MilesConfigError):
            _exit(CONFIG_ERROR_EXIT_STATUS, "error", message)
        _exit(kind.exit_status, kind.label, message)


def _exit(status: int, label: str, message) -> None:
    print(f"{label}: {message}", file=sys.stderr)
    sys.exit(status)


def _user_message(error: Exception, kind: type) -> Exception:
    # An error raised inside a Ray actor arrives wrapped (a RayTaskError that is also of the original type); its
    # .cause is the original, whose message is the one meant for the user.
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, kind) else error


def _error_raised_in_actor_init(error: Exception) -> tuple[type, str] | None:
    """(class, message) of a miles error raised in a Ray actor's ``__init__``, else None.

    Ray reports such an actor as dead (``ActorDiedError`` with ``actor_init_failed``, possibly wrapped by the actor
    that called it) and keeps the original error only as traceback text, whose last line names its class."""
    while error is not None and not getattr(error, "actor_init_failed", False):
        error = getattr(error, "cause", None)
    if error is None:
        return None
    match = _RAISED_MILES_ERROR.search(str(error))
    if match is None:
        return None
    module, name, message = match.groups()
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(kind, type) and issubclass(kind, (MilesConfigError, MilesRunError))):
        return None
    return kind, message.strip()
