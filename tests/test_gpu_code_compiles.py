"""The GPU wheel: request.sh's one recipe builds it on this CPU-only machine.

tests/gpu/build_gpu_wheel.sh runs request.sh in a second venv (.venv-cuda)
holding TensorFlow's CUDA build, tensorflow==2.21.0. request.sh then installs
the CUDA 12 toolchain TensorFlow was built with (addons/cuda_root.py) and
builds with --config=cuda: the op library becomes a GOOGLE_CUDA build with the
GPU kernels and the CUDA core linked in, with -Wl,--no-undefined (a kernel
calling a core function nobody defines fails the build). These tests check
the wheel that comes out: that it is built for TensorFlow's CUDA, which
libraries and which GPU code it carries, that it loads and registers its GPU
kernels, and that it runs the user example on this machine's CPU. Nothing
here needs a GPU; a missing compiler or package is a failure, not a skip.

The first run builds the venv and the library (minutes); later runs only
re-check.
"""

import collections
import json
import os
import re
import struct
import subprocess
import zipfile

import numpy as np
import pytest

import sok_ev_reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "tests", "gpu", "build_gpu_wheel.sh")
# The script's venv (SOK_EV_GPU_VENV overrides it there too).
VENV = os.environ.get("SOK_EV_GPU_VENV", os.path.join(ROOT, ".venv-cuda"))
PYTHON = os.path.join(VENV, "bin", "python")

# The ISA of the PTX a CUDA release's driver can compile, by release.
PTX_ISA_OF_CUDA = {"12.5": (8, 5)}
# ELF ABI version of the cubins CUDA 12's ptxas writes (CUDA 13's write 8,
# which CUDA 12 drivers do not load).
CUDA_12_CUBIN_ABI = 7
EM_CUDA = 190
# Ops that have a CPU kernel only, by design; every other op needs both.
HOST_ONLY_OPS = {
    # Reads a host-side count of the GPU path's host synchronisations.
    "SokEv>GpuHostSyncs",
    # Draws an NCCL id on the host (GPU builds only).
    "SokEv>NcclUniqueId",
}
# GPU builds only, GPU tensors only: NCCL moves nothing on the CPU.
GPU_ONLY_OPS = {"SokEv>NcclAlltoall"}


def _run(command, timeout, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("SOK_EV_PYTHON", None)
    return subprocess.run(command,
                          stdin=subprocess.DEVNULL,
                          capture_output=True,
                          text=True,
                          timeout=timeout,
                          env=env,
                          **kwargs)


@pytest.fixture(scope="module")
def wheel():
    """Path of the GPU wheel, built by the project's recipe."""
    build = _run(["bash", BUILD], timeout=3000, cwd=ROOT)
    assert build.returncode == 0, (f"{os.path.relpath(BUILD, ROOT)} failed (exit "
                                   f"{build.returncode}):\n{build.stderr[-8000:]}")
    path = build.stdout.strip().splitlines()[-1]
    assert os.path.isfile(path), f"no wheel at {path}:\n{build.stderr[-4000:]}"
    return path


@pytest.fixture(scope="module")
def tensorflow_cuda(wheel):
    """The CUDA version the venv's TensorFlow was built with, e.g. "12.5.1"."""
    query = _run([PYTHON, os.path.join(ROOT, "addons", "cuda_root.py"), "tensorflow-cuda"],
                 timeout=120)
    assert query.returncode == 0 and query.stdout.strip(), query.stderr
    return query.stdout.strip()


@pytest.fixture(scope="module")
def op_library(wheel):
    """Bytes of the op library inside the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.read("sok_ev/_sok_ev_ops.so")


def _cuda_images(library):
    """(sm, ELF ABI version) of every CUDA cubin embedded in `library`."""
    images = []
    start = library.find(b"\x7fELF", 1)
    while start >= 0:
        if struct.unpack_from("<H", library, start + 18)[0] == EM_CUDA:
            flags = struct.unpack_from("<I", library, start + 48)[0]
            images.append((flags & 0xFF, library[start + 8]))
        start = library.find(b"\x7fELF", start + 1)
    return images


@pytest.mark.timeout(3600)
def test_wheel_records_the_tensorflow_and_cuda_it_is_built_for(wheel, tensorflow_cuda):
    with zipfile.ZipFile(wheel) as archive:
        info = json.loads(archive.read("sok_ev/_build_info.json"))
        metadata = archive.read("sok_ev-%s.dist-info/METADATA" %
                                os.path.basename(wheel).split("-")[1]).decode()
    assert info == {
        "tensorflow": "2.21.0",
        "cuda": tensorflow_cuda,
        "cuda_archs": ["sm_80", "sm_90"],
        "cuda_ptx": "sm_90",
    }
    # pip brings the CUDA runtime the library loads, as tensorflow[and-cuda] does.
    major, minor = tensorflow_cuda.split(".")[:2]
    assert f"Requires-Dist: nvidia-cuda-runtime-cu{major}<{int(major) + 1},>={major}.{minor}" in (
        metadata), metadata


@pytest.mark.timeout(3600)
def test_op_library_links_tensorflow_and_the_cuda_12_runtime_only(op_library, tmp_path):
    path = tmp_path / "_sok_ev_ops.so"
    path.write_bytes(op_library)
    dynamic = _run(["readelf", "-d", str(path)], timeout=60)
    assert dynamic.returncode == 0, dynamic.stderr
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic.stdout)
    assert "libtensorflow_framework.so.2" in needed and "libcudart.so.12" in needed, needed
    # The driver library is opened by the runtime, and no other CUDA library
    # (a CUDA 13 one least of all) may be needed.
    assert not [
        n for n in needed if re.match(r"lib(cuda|cudart|cublas|nv)", n) and n != "libcudart.so.12"
    ], needed
    runpath = re.search(r"\(RUNPATH\).*\[(.+)\]", dynamic.stdout).group(1).split(":")
    assert "$ORIGIN/../nvidia/cuda_runtime/lib" in runpath, runpath


@pytest.mark.timeout(3600)
def test_gpu_code_is_cuda_12_machine_code_for_sm80_sm90_and_sm90_ptx(op_library, tensorflow_cuda):
    images = _cuda_images(op_library)
    assert images, "no CUDA machine code in the op library"
    assert {sm for sm, _ in images} == {80, 90}, collections.Counter(images)
    # Every translation unit with kernels carries both.
    counts = collections.Counter(sm for sm, _ in images)
    assert counts[80] == counts[90], counts
    assert {abi for _, abi in images} == {CUDA_12_CUBIN_ABI}, collections.Counter(images)

    # PTX is stored uncompressed (readable by any CUDA 12 driver), so its
    # header lines are plain text in the library.
    cuda = ".".join(tensorflow_cuda.split(".")[:2])
    assert cuda in PTX_ISA_OF_CUDA, f"add the PTX ISA of CUDA {cuda} to PTX_ISA_OF_CUDA"
    versions = {tuple(map(int, v)) for v in re.findall(rb"\n\.version (\d+)\.(\d+)\n", op_library)}
    targets = set(re.findall(rb"\n\.target (sm_\d+)", op_library))
    assert versions and max(versions) <= PTX_ISA_OF_CUDA[cuda], versions
    assert targets == {b"sm_90"}, targets
    assert len(re.findall(rb"\n\.target sm_90", op_library)) == counts[90]


@pytest.mark.timeout(3600)
def test_installed_gpu_wheel_loads_and_registers_gpu_kernels_without_a_gpu(wheel):
    script = """
import json, tensorflow as tf
from tensorflow.python.framework import kernels
import sok_ev, sok_ev._ops as o
o.ops()
devices = {}
for k in kernels.get_all_registered_kernels().kernel:
    if k.op.startswith("SokEv>"):
        devices.setdefault(k.op, set()).add(k.device_type)
print(json.dumps({
    "file": sok_ev.__file__,
    "library": o.LIBRARY_PATH,
    "gpus": len(tf.config.list_physical_devices("GPU")),
    "devices": {op: sorted(d) for op, d in devices.items()},
}))
"""
    # From outside the checkout: the wheel request.sh installed in the venv.
    result = _run([PYTHON, "-c", script], timeout=300, cwd="/")
    assert result.returncode == 0, result.stderr[-4000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    site = os.path.join(VENV, "lib")
    assert loaded["file"].startswith(site) and loaded["library"].startswith(site), loaded
    assert loaded["gpus"] == 0
    assert len(loaded["devices"]) >= 10, loaded["devices"]
    without_gpu = [
        n for n, devices in loaded["devices"].items()
        if devices != ["CPU", "GPU"] and not (n in HOST_ONLY_OPS and devices == ["CPU"]) and
        not (n in GPU_ONLY_OPS and devices == ["GPU"])
    ]
    assert not without_gpu, f"ops without both CPU and GPU kernels: {without_gpu}"


@pytest.mark.timeout(3600)
def test_gpu_wheel_runs_the_example_on_the_cpu(wheel):
    result = _run([PYTHON, ref.EXAMPLE], timeout=300, cwd="/")
    assert result.returncode == 0, result.stderr[-4000:]
    printed = [float(x) for x in ref.PRINTED_FLOAT.findall(result.stdout)]
    np.testing.assert_allclose(printed, ref.example_replay(), rtol=1e-5, err_msg=result.stdout)
