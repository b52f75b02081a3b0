"""How the drivers turn configuration errors into one clean line on stderr (argparse's convention)."""

import sys

from miles.utils.errors import MilesConfigError

CONFIG_ERROR_EXIT_STATUS = 2  # argparse's status for bad command-line input


def run_cli(main) -> None:
    """Run ``main()``; a ``MilesConfigError`` prints ``error: ...`` and exits 2, anything else keeps its traceback."""
    try:
        main()
    except MilesConfigError as error:
        # An error raised inside a Ray actor arrives wrapped (a RayTaskError that is also a MilesConfigError);
        # its .cause is the original, whose message is the one meant for the user.
        cause = getattr(error, "cause", None)
        print(f"error: {cause if isinstance(cause, MilesConfigError) else error}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_STATUS)
