"""Deprecated alias of ``miles.check`` (the launch-script checker moved there); kept for one release.

``python -m miles.utils.check`` and ``from miles.utils.check import ...`` keep working; use ``miles-check``,
``python -m miles.check`` or ``from miles.check import ...`` instead. This alias goes away in the next release.
"""

from miles.check import *  # noqa: F401,F403  (the alias re-exports exactly the package's public names)
from miles.check import __all__  # noqa: F401
