"""``python -m miles.utils.check``: deprecated, runs ``python -m miles.check`` (the same checker, same output)."""

import sys

from miles.check.cli import main

sys.exit(main())
