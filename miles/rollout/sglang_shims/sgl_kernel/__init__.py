"""Stand-in for SGLang's compiled ``sgl_kernel`` (no CPU wheel for AVX2): every name is a ``StandIn`` that logs and
raises if called (miles/rollout/sglang_shims/__init__.py). SGLang's torch-native CPU path imports, never calls them."""

import sys

from miles_stand_in import StandInModule

__version__ = "0.0.0+miles.stand-in"
sys.modules[__name__].__class__ = StandInModule
