"""The two import stand-ins: invisible until an SGLang engine activates them, and loud if SGLang ever calls one.
Each check runs in a fresh interpreter, so this test process's sys.path stays untouched."""

import subprocess
import sys
from importlib.metadata import distributions

import torch

from miles.rollout.sglang_shims import STAND_IN_DIR


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_they_are_not_importable_before_activation():
    for name in ("sgl_kernel", "torchvision"):
        result = _run(f"import miles.rollout.sglang_engine, miles.rollout.sglang_shims; import {name}")
        assert result.returncode == 1 and f"No module named '{name}'" in result.stderr


def test_a_call_logs_and_raises_an_import_does_not(tmp_path):
    log = tmp_path / "stand_ins.log"
    code = (f"from miles.rollout import sglang_shims; sglang_shims.activate({str(log)!r}); "
            "from sgl_kernel import copy_all_layer_kv_cache_cpu; "
            "import torchvision.transforms as T; from torchvision.transforms.functional import InterpolationMode; "
            "T.Compose; InterpolationMode.BICUBIC; print('imported'); "
            "copy_all_layer_kv_cache_cpu(1, 2)")
    result = _run(code)
    assert result.stdout.strip() == "imported"
    assert "StandInCalled: sgl_kernel.copy_all_layer_kv_cache_cpu was called, but it is a miles stand-in" in result.stderr
    assert log.read_text().endswith("sgl_kernel.copy_all_layer_kv_cache_cpu was called, but it is a miles stand-in "
                                    "(docs/sglang.md, 'Stand-ins')\n")
    result = _run(f"from miles.rollout import sglang_shims; sglang_shims.activate({str(log)!r}); "
                  "from torchvision.transforms import v2; v2.functional.resize(None)")
    assert "torchvision.transforms.v2.functional.resize was called" in log.read_text().splitlines()[-1]


def test_the_stand_ins_live_inside_miles_and_no_cuda_package_is_installed():
    assert STAND_IN_DIR.endswith("miles/rollout/sglang_shims")
    names = sorted(d.metadata["Name"].lower() for d in distributions())
    cuda = [n for n in names if n.startswith(("nvidia-", "cuda-")) or n in ("torchvision", "sgl-kernel", "sglang-kernel")]
    assert cuda == []
    assert torch.version.cuda is None


def test_a_real_package_that_loads_is_used_instead_of_its_stand_in(tmp_path):
    """A loadable sgl_kernel (as on a CUDA machine) wins; a broken torchvision (a CUDA build on a CPU torch) gets
    the stand-in, and only it."""
    real = tmp_path / "site"
    (real / "sgl_kernel").mkdir(parents=True)
    (real / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    (real / "torchvision").mkdir()
    (real / "torchvision" / "__init__.py").write_text("raise OSError('libcudart.so: cannot open shared object')\n")
    code = (f"import sys; sys.path.append({str(real)!r}); import os; os.environ['PYTHONPATH'] = {str(real)!r}; "
            f"from miles.rollout import sglang_shims; sglang_shims.activate({str(tmp_path / 'stand_ins.log')!r}); "
            "import sgl_kernel, torchvision; print(sgl_kernel.REAL, 'miles' in repr(torchvision.transforms))")
    result = _run(code)
    assert result.stdout.split() == ["True", "True"], result.stderr
