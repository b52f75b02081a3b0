"""Stand-in for ``torchvision`` (its only wheel for torch 2.13 is a CUDA build): this package and every submodule
SGLang imports (``torchvision.transforms.functional``, ...) resolve every name to a ``StandIn`` that logs and raises
if called (miles/rollout/sglang_shims/__init__.py). Only SGLang's multimodal code imports it; a text model never
runs that code."""

import importlib.abc
import importlib.machinery
import sys

from miles_stand_in import StandInModule


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``torchvision.<sub>`` import gives an empty ``StandInModule`` package."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


__version__ = "0.0.0+miles.stand-in"
sys.meta_path.insert(0, _SubmoduleFinder())
sys.modules[__name__].__class__ = StandInModule
