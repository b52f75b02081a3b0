"""The separate environment that holds upstream miles (``miles-rl``), created once and reused, and the one call
into it: upstream's parser records and namespaces (``parser_spec.py`` run by that environment's Python).

``miles-rl`` ships its own ``miles`` package (and vendors Megatron-LM and SGLang), so it can never be installed
next to this one. The environment is a plain venv with two ``.pth`` lines instead of a second copy of everything:
this environment's site-packages (torch, transformers, ray, ... as they are installed here; a ``.pth`` line adds
the folder only, so this project's own editable ``miles`` is not on that path) and the SGLang import stand-ins
(``miles/rollout/sglang_shims``: the vendored SGLang imports ``torchvision``, whose only wheel for this torch is a
CUDA build). Only ``miles-rl`` and ``sglang-router``, which upstream's arguments import, are installed into it,
without dependencies. Its own site-packages come first on its ``sys.path``, so ``import miles`` there is upstream's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from miles.rollout.sglang_shims import STAND_IN_DIR

UPSTREAM_PACKAGES = ("miles-rl==0.0.2", "sglang-router==0.3.2")
DEFAULT_ENV_DIR = Path(__file__).resolve().parents[2] / ".venv-upstream"
PARSER_SPEC_SCRIPT = Path(__file__).with_name("parser_spec.py")
_MARKER = "miles-conformance.json"  # what the environment was built with; a different build is rebuilt


class UpstreamEnvError(RuntimeError):
    """The upstream environment could not be built or its parser could not be dumped."""


def _wanted() -> dict:
    return {"packages": list(UPSTREAM_PACKAGES), "python": sys.version.split()[0],
            "site_packages": sysconfig.get_paths()["purelib"], "stand_ins": STAND_IN_DIR}


def _env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def _run(command: list, what: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, check=False, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise UpstreamEnvError(f"{what} failed (exit status {result.returncode}):\n{tail}")
    return result


def ensure_upstream_env(env_dir: Path = DEFAULT_ENV_DIR, log=print) -> Path:
    """The upstream environment's Python, building the environment first unless ``env_dir`` already holds one
    built the same way (same packages, same Python, same site-packages)."""
    marker = env_dir / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == _wanted() and _env_python(env_dir).exists():
        return _env_python(env_dir)
    log(f"building the upstream environment in {env_dir} ({', '.join(UPSTREAM_PACKAGES)}; about a minute)")
    venv.EnvBuilder(clear=True, with_pip=True).create(env_dir)
    python = _env_python(env_dir)
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   "finding the upstream environment's site-packages").stdout.strip()
    Path(purelib, "_miles_project_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    Path(purelib, "_miles_sglang_stand_ins.pth").write_text(STAND_IN_DIR + "\n")
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *UPSTREAM_PACKAGES],
         f"pip install --no-deps {' '.join(UPSTREAM_PACKAGES)}")
    marker.write_text(json.dumps(_wanted()))
    return python


def upstream_parser_dump(python: Path, command_lines: list[list[str]]) -> dict:
    """``{"options": {flag: record}, "namespaces": [{"namespace": ...} or {"error": ...}]}`` from upstream's own
    parser, for ``command_lines``; run from the environment's folder with no ``PYTHONPATH``, so nothing of this
    project's ``miles`` is importable there."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = _run([str(python), str(PARSER_SPEC_SCRIPT)], "dumping upstream's parser", cwd=python.parent.parent,
                  env=env, input=json.dumps({"command_lines": command_lines}))
    return json.loads(result.stdout)
