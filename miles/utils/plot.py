"""Deprecated alias of ``miles.tracking.plot`` (the curves moved there with the rest of tracking); kept for one
release. ``python -m miles.utils.plot RUN_DIR`` keeps working; use ``miles-plot RUN_DIR`` or
``python -m miles.tracking.plot RUN_DIR`` instead."""

import sys

from miles.tracking.plot import main, plot_bands, plot_run  # noqa: F401  (the names callers imported from here)

if __name__ == "__main__":
    sys.exit(main())
