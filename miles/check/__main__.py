"""``python -m miles.check``: the same as the ``miles-check`` console script."""

import sys

from miles.check.cli import main

sys.exit(main())
