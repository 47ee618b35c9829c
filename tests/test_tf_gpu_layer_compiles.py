"""Keeps the TF GPU op layer compiling and linking on CPU-only CI.

The GPU machines have no TensorFlow, so the GPU kernels of sok_ev/cc/kernels
are built here instead: sok_ev/cc/check_gpu_layer.sh compiles the op library
as a GOOGLE_CUDA build against the CUDA-enabled tensorflow==2.21.0 wheel's
headers, compiles cc/*_gpu.cu with nvcc, and links it all with
-Wl,--no-undefined against the wheel's libtensorflow_framework.so.2 and
libcudart. Nothing is run. A missing nvcc or wheel is a failure, not a skip.

The wheel (572 MB) is cached in .whl/ (ignored by git) or taken from
SOK_EV_TF_GPU_WHEEL; the extracted headers are reused between runs.
"""

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "sok_ev", "cc", "check_gpu_layer.sh")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
NVCC = os.path.join(CUDA_HOME, "bin", "nvcc")
TF_REQUIREMENT = "tensorflow==2.21.0"
CACHE = os.environ.get("SOK_EV_CACHE_DIR", os.path.join(ROOT, ".whl"))


def _wheel():
    """The CUDA-enabled TF wheel, downloaded into CACHE if not there yet."""
    given = os.environ.get("SOK_EV_TF_GPU_WHEEL")
    if given:
        assert os.path.isfile(given), f"SOK_EV_TF_GPU_WHEEL={given} is not a file"
        return given
    pattern = os.path.join(CACHE, "tensorflow-2.21.0-cp311-*manylinux*x86_64.whl")
    found = sorted(glob.glob(pattern))
    if found:
        return found[-1]
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    python = venv_python if os.access(venv_python, os.X_OK) else sys.executable
    os.makedirs(CACHE, exist_ok=True)
    download = subprocess.run(
        [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
         "--python-version", "3.11", "--platform", "manylinux_2_27_x86_64",
         "-d", CACHE, TF_REQUIREMENT],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
    )
    found = sorted(glob.glob(pattern))
    assert download.returncode == 0 and found, (
        f"could not download the CUDA-enabled {TF_REQUIREMENT} wheel into {CACHE} "
        f"(pip exit {download.returncode}); download it by hand and set "
        f"SOK_EV_TF_GPU_WHEEL to its path:\n{download.stderr[-4000:]}"
    )
    return found[-1]


@pytest.mark.timeout(1800)
def test_tf_gpu_layer_compiles_and_links():
    assert os.access(NVCC, os.X_OK), (
        f"nvcc not found at {NVCC}: the CUDA toolkit is required to check that the TF "
        "GPU op layer compiles and links (set CUDA_HOME if it lives elsewhere)"
    )
    wheel = _wheel()
    work = os.path.join(CACHE, "gpu_layer_check")
    check = subprocess.run(
        ["bash", SCRIPT, wheel, work], cwd=ROOT, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=1500,
    )
    assert check.returncode == 0, (
        f"{os.path.relpath(SCRIPT, ROOT)} failed (exit {check.returncode}):\n"
        f"{check.stdout[-8000:]}\n{check.stderr[-8000:]}"
    )
    assert "linked with no undefined symbols" in check.stdout, check.stdout[-2000:]
