"""Keeps the GPU code compiling and linking on CPU-only CI.

No GPU is needed to compile. First nvcc builds //cc:core_gpu under
--config=cuda, and every cc/*_gpu.cu must come out as an object. Then, since
the GPU machines have no TensorFlow, the TF GPU op layer is built here:
sok_ev/cc/check_gpu_layer.sh compiles the op library as a GOOGLE_CUDA build
against the CUDA-enabled tensorflow==2.21.0 wheel's headers and links it,
with those CUDA objects, with -Wl,--no-undefined against the wheel's
libtensorflow_framework.so.2 and libcudart. Nothing is run. A missing nvcc
or wheel is a failure, not a skip, so the code cannot rot unnoticed.

The wheel (572 MB) is cached in .whl/ (ignored by git) or taken from
SOK_EV_TF_GPU_WHEEL; the extracted headers are reused between runs.
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Must match SOK_EV_CUDA_HOME in .bazelrc's config:cuda.
CUDA_HOME = "/usr/local/cuda"
NVCC = os.path.join(CUDA_HOME, "bin", "nvcc")
BUILD = ["build", "--config=cuda", "//cc:core_gpu"]
SCRIPT = os.path.join(ROOT, "sok_ev", "cc", "check_gpu_layer.sh")
TF_REQUIREMENT = "tensorflow==2.21.0"
CACHE = os.environ.get("SOK_EV_CACHE_DIR", os.path.join(ROOT, ".whl"))


def _run(command, timeout):
    return subprocess.run(command,
                          cwd=ROOT,
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cuda_objects():
    """Builds //cc:core_gpu with nvcc; returns the folder of its objects."""
    assert os.access(NVCC, os.X_OK), (
        f"nvcc not found at {NVCC}: the CUDA toolkit is required to check that "
        "the GPU code still compiles (set SOK_EV_CUDA_HOME in .bazelrc if it lives elsewhere)")
    bazel = shutil.which("bazel")
    assert bazel, "bazel is not on PATH: run `bash request.sh` (Debian package bazel-bootstrap)"
    build = _run([bazel, *BUILD], timeout=3000)
    assert build.returncode == 0, (
        f"bazel {' '.join(BUILD)} failed (exit {build.returncode}):\n{build.stderr[-8000:]}")
    info = _run([bazel, "info", "--config=cuda", "bazel-bin"], timeout=600)
    assert info.returncode == 0, info.stderr[-2000:]
    return os.path.join(info.stdout.strip(), "cc", "_nvcc", "core_gpu_nvcc")


def _tf_gpu_wheel():
    """The CUDA-enabled TF wheel, downloaded into CACHE if not there yet."""
    given = os.environ.get("SOK_EV_TF_GPU_WHEEL")
    if given:
        assert os.path.isfile(given), f"SOK_EV_TF_GPU_WHEEL={given} is not a file"
        return given
    pattern = os.path.join(CACHE, "tensorflow-2.21.0-cp311-*manylinux*x86_64.whl")
    if not glob.glob(pattern):
        os.makedirs(CACHE, exist_ok=True)
        download = _run([
            sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
            "--python-version", "3.11", "--platform", "manylinux_2_27_x86_64", "-d", CACHE,
            TF_REQUIREMENT
        ],
                        timeout=900)
        assert download.returncode == 0, (
            f"could not download the CUDA-enabled {TF_REQUIREMENT} wheel into {CACHE} "
            f"(pip exit {download.returncode}); download it by hand and set "
            f"SOK_EV_TF_GPU_WHEEL to its path:\n{download.stderr[-4000:]}")
    found = sorted(glob.glob(pattern))
    assert found, f"no {pattern} after downloading {TF_REQUIREMENT}"
    return found[-1]


@pytest.mark.timeout(3600)
def test_every_cuda_source_compiles(cuda_objects):
    missing = []
    for src in sorted(glob.glob(os.path.join(ROOT, "cc", "*_gpu.cu"))):
        obj = os.path.join(cuda_objects, os.path.basename(src)[:-len(".cu")] + ".pic.o")
        if not (os.path.isfile(obj) and os.path.getsize(obj) > 0):
            missing.append(os.path.relpath(src, ROOT))
    assert not missing, f"nvcc produced no object for: {', '.join(missing)} (in {cuda_objects})"


@pytest.mark.timeout(3600)
def test_tf_gpu_op_layer_compiles_and_links(cuda_objects):
    check = _run(
        ["bash", SCRIPT,
         _tf_gpu_wheel(), cuda_objects,
         os.path.join(CACHE, "gpu_layer_check")],
        timeout=1500)
    assert check.returncode == 0, (
        f"{os.path.relpath(SCRIPT, ROOT)} failed (exit {check.returncode}):\n"
        f"{check.stdout[-8000:]}\n{check.stderr[-8000:]}")
    assert "linked with no undefined symbols" in check.stdout, check.stdout[-2000:]
