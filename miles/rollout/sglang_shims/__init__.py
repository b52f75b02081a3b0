"""Import stand-ins that let SGLang 0.5.23 start on a CPU-only torch, activated only inside an SGLang engine's process.

SGLang imports two packages that have no CPU build for this torch (docs/sglang.md, "Stand-ins"):

- ``sgl_kernel``: ``sglang/kernels/ops/kvcache/cache_move.py`` (and a few CPU helpers) import names from it at
  import time; the registry's ``sgl-kernel``/``sglang-kernel`` wheels are CUDA builds, and SGLang's CPU kernels come
  only from a source build for AVX512/AMX. The torch-native CPU path (``SGLANG_USE_CPU_ENGINE=1``) never calls them.
- ``torchvision``: imported by SGLang's multimodal configs and processors, which a text model never runs; the only
  wheel for torch 2.13 is a CUDA build that fails to load with the CPU torch.

Each stand-in provides every name it is asked for as a ``StandIn`` that, if it is ever *called*, appends a line to
the file named by ``$MILES_SGLANG_STAND_IN_LOG`` and raises ``StandInCalled``; the e2e tests assert that file stays
empty over full training runs. ``activate(log_path)`` puts this folder first on ``sys.path`` of the current process
(the engine's Ray actor; SGLang's scheduler processes are spawned from it and inherit its ``sys.path``) and is
called only by ``SGLangRolloutEngine``: no other process of a run, and no other code, ever sees these modules. Each
stand-in is activated only where the real package is missing or fails to import (a CUDA machine with the real
``sgl-kernel`` gets it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib.util import find_spec

from miles.rollout.sglang_shims.miles_stand_in import LOG_ENV

STAND_IN_DIR = os.path.dirname(os.path.abspath(__file__))


STAND_INS = ("sgl_kernel", "torchvision")


def real_package_loads(name: str) -> bool:
    """Whether the installed ``name`` (if any) imports, tried in a fresh interpreter: a CUDA build on a CPU torch can
    fail half-way (leaving half a package in ``sys.modules``) or abort the process."""
    if find_spec(name) is None:
        return False
    tried = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, timeout=300, check=False)
    return tried.returncode == 0


def activate(log_path: str | None) -> None:
    """Make ``sgl_kernel`` and ``torchvision`` importable in this process (and the processes it spawns), logging any
    call to ``log_path``, each only where the real package cannot load: a machine where it loads (a CUDA machine with
    ``sgl-kernel``) gets the real one. Idempotent."""
    if log_path:
        os.environ[LOG_ENV] = log_path
    missing = [name for name in STAND_INS if not real_package_loads(name)]
    if not missing:
        return
    folder = STAND_IN_DIR if len(missing) == len(STAND_INS) else _folder_with(missing, log_path)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _folder_with(names: list[str], log_path: str | None) -> str:
    """A folder holding only the stand-ins of ``names`` (links), so the real other package stays importable."""
    folder = tempfile.mkdtemp(prefix="sglang_stand_ins_", dir=os.path.dirname(log_path) if log_path else None)
    for entry in (*names, "miles_stand_in.py"):
        os.symlink(os.path.join(STAND_IN_DIR, entry), os.path.join(folder, entry))
    return folder
