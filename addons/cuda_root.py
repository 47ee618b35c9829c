"""The CUDA toolchain of a GPU build: which packages, and the CUDA root made of them.

A GPU build of sok-ev must load wherever the installed TensorFlow's GPU build
runs: TensorFlow 2.21 is built with CUDA 12.5, and its users have CUDA 12
drivers, which cannot load device code or a CUDA runtime from a newer major
release. So the device code is compiled against the CUDA release TensorFlow
names in its build info (`tf.sysconfig.get_build_info()["cuda_version"]`),
from PyPI:

  nvidia-cuda-nvcc-cu12    ptxas, libdevice and the crt headers
  nvidia-cuda-runtime-cu12 CUDA runtime headers and libcudart.so.12
  nvidia-cuda-cccl-cu12    CUB, Thrust and libcu++ headers

PyPI's CUDA 12 nvcc package carries no nvcc driver or C++ front end, so the
CUDA sources are compiled by Debian's clang, which TensorFlow itself uses for
its CUDA kernels; clang emits PTX of the ISA that CUDA 12.5 reads (8.5) and
runs CUDA 12.5's ptxas on it. The cubins and the PTX are bundled by NVIDIA's
`fatbinary`, which PyPI ships only in the CUDA 13 nvcc package: it only packs
the CUDA 12 images into the fatbin container the CUDA runtime registers, and
runs with --compress=false, so no newer compression scheme can reach a CUDA 12
driver. tests/test_gpu_code_compiles.py checks what comes out: cubins of
CUDA 12's ELF ABI for sm_80 and sm_90, PTX of ISA 8.5.
clang's CUDA wrapper force-includes curand_mtgp32_kernel.h; those headers
come from the CUDA 12.5 headers TensorFlow's wheel ships.

The CUDA root (`assemble`) is a directory of symlinks with the layout clang's
--cuda-path expects: bin/{clang++,ptxas,fatbinary}, include/, nvvm/libdevice,
lib64/libcudart.so.12, plus toolchain.json naming every version.

Usage (with the Python of the venv that holds TensorFlow):
  python cuda_root.py tensorflow-cuda      TensorFlow's CUDA version, or nothing
  python cuda_root.py apt-packages         Debian packages (the compiler)
  python cuda_root.py pip-packages         CUDA 12 packages matching TensorFlow
  python cuda_root.py pip-nodeps-packages  packages installed without deps
  python cuda_root.py assemble DIR         (re)creates the CUDA root DIR
"""

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys

# The CUDA compiler: Debian 12's clang 22 knows CUDA 12.5 (PTX ISA 8.5) and
# every intrinsic the core uses (clang 19 lacks __ldcg).
CLANG_PACKAGE = "clang-22"
CLANG = "/usr/bin/clang++-22"
# Only its fatbinary is used; installed without dependencies.
FATBINARY_PACKAGE = "nvidia-cuda-nvcc==13.0.*"
CUDA_PACKAGES = ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12")


def _fail(message):
    sys.exit(f"cuda_root.py: {message}")


def tensorflow_dir():
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        _fail(f"{sys.executable} has no tensorflow installed")
    return list(spec.submodule_search_locations)[0]


def tensorflow_cuda_version():
    """The CUDA version TensorFlow was built with, e.g. "12.5.1" (None: CPU build).

    Read from the build_info module behind tf.sysconfig.get_build_info(),
    without importing TensorFlow (seconds).
    """
    path = os.path.join(tensorflow_dir(), "python", "platform", "build_info.py")
    loader = importlib.machinery.SourceFileLoader("_tf_build_info", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    info = module.build_info
    return info.get("cuda_version") if info.get("is_cuda_build") else None


def _major_minor():
    version = tensorflow_cuda_version()
    if not version:
        _fail("the installed TensorFlow is not a CUDA build")
    return ".".join(version.split(".")[:2])


def pip_packages():
    return [f"{name}=={_major_minor()}.*" for name in CUDA_PACKAGES]


def _package_dir(module):
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        _fail(f"{module} is not installed (run `bash request.sh`)")
    return list(spec.submodule_search_locations)[0]


def _symlink(target, link):
    if not os.path.exists(target):
        _fail(f"{target} is missing (reinstall the package that ships it)")
    os.symlink(target, link)


def assemble(root):
    """Recreates the CUDA root `root` from the installed packages."""
    cuda = _major_minor()
    versions = {}
    for name in CUDA_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            _fail(f"{name}=={cuda}.* is not installed (run `bash request.sh`)")
        if not versions[name].startswith(cuda + "."):
            _fail(f"{name} {versions[name]} does not match the CUDA {cuda} "
                  f"TensorFlow was built with: pip install '{name}=={cuda}.*'")
    nvcc = _package_dir("nvidia.cuda_nvcc")
    runtime = _package_dir("nvidia.cuda_runtime")
    cccl = _package_dir("nvidia.cuda_cccl")
    fatbinary = os.path.join(_package_dir("nvidia.cu13"), "bin", "fatbinary")
    tf_cuda_headers = os.path.join(tensorflow_dir(), "include", "third_party", "gpus", "cuda",
                                   "include")
    if not os.access(CLANG, os.X_OK):
        _fail(f"{CLANG} not found: apt-get install {CLANG_PACKAGE}")

    shutil.rmtree(root, ignore_errors=True)
    for sub in ("bin", "include", "lib64"):
        os.makedirs(os.path.join(root, sub))
    _symlink(CLANG, os.path.join(root, "bin", "clang++"))
    _symlink(os.path.join(nvcc, "bin", "ptxas"), os.path.join(root, "bin", "ptxas"))
    _symlink(fatbinary, os.path.join(root, "bin", "fatbinary"))
    _symlink(os.path.join(nvcc, "nvvm"), os.path.join(root, "nvvm"))
    _symlink(os.path.join(runtime, "lib", "libcudart.so.12"),
             os.path.join(root, "lib64", "libcudart.so.12"))
    headers = [os.path.join(d, "include") for d in (runtime, nvcc, cccl)]
    for include in headers:
        for entry in sorted(os.listdir(include)):
            if entry in ("__init__.py", "__pycache__"):
                continue
            link = os.path.join(root, "include", entry)
            if os.path.lexists(link):
                _fail(f"{entry} is shipped by two CUDA packages ({include} and another)")
            _symlink(os.path.join(include, entry), link)
    for entry in sorted(os.listdir(tf_cuda_headers)):
        if entry.startswith("curand"):
            _symlink(os.path.join(tf_cuda_headers, entry), os.path.join(root, "include", entry))
    with open(os.path.join(root, "toolchain.json"), "w") as f:
        json.dump(
            {
                "cuda_version": tensorflow_cuda_version(),
                "packages": versions,
                "fatbinary": FATBINARY_PACKAGE,
                "compiler": CLANG,
            },
            f,
            indent=1,
            sort_keys=True)
        f.write("\n")


def main(argv):
    if argv[:1] == ["tensorflow-cuda"]:
        print(tensorflow_cuda_version() or "")
    elif argv[:1] == ["apt-packages"]:
        print(CLANG_PACKAGE)
    elif argv[:1] == ["pip-packages"]:
        print("\n".join(pip_packages()))
    elif argv[:1] == ["pip-nodeps-packages"]:
        print(FATBINARY_PACKAGE)
    elif argv[:1] == ["assemble"] and len(argv) == 2:
        assemble(os.path.abspath(argv[1]))
    else:
        _fail(__doc__.split("Usage", 1)[1])


if __name__ == "__main__":
    main(sys.argv[1:])
