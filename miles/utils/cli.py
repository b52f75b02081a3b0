"""How the drivers turn configuration errors and runtime-guard stops into one clean line on stderr."""

import sys

from miles.utils.errors import MilesConfigError, OffPolicyGuardError

CONFIG_ERROR_EXIT_STATUS = 2  # argparse's status for bad command-line input
GUARD_ERROR_EXIT_STATUS = 1  # the run started and was stopped by the runtime guard


def run_cli(main) -> None:
    """Run ``main()``. A ``MilesConfigError`` prints ``error: ...`` and exits 2; an ``OffPolicyGuardError`` prints
    ``error: ...`` and exits 1 (after the run saved and shut Ray down); anything else keeps its traceback."""
    try:
        main()
    except MilesConfigError as error:
        print(f"error: {_user_message(error, MilesConfigError)}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_STATUS)
    except OffPolicyGuardError as error:
        print(f"error: {_user_message(error, OffPolicyGuardError)}", file=sys.stderr)
        sys.exit(GUARD_ERROR_EXIT_STATUS)


def _user_message(error: Exception, kind: type) -> Exception:
    # An error raised inside a Ray actor arrives wrapped (a RayTaskError that is also of the original type); its
    # .cause is the original, whose message is the one meant for the user.
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, kind) else error
