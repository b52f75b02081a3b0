"""``python -m miles.utils.check``: the same as the ``miles-check`` console script."""

import sys

from miles.utils.check.cli import main

sys.exit(main())
