"""Packaging of the sok_ev wheel.

Normally run by `bazel build //:build_sok` in a staging dir holding setup.py
next to sok_ev/ (Python files, _sok_ev_ops.so and _build_info.json), with
SOK_EV_VERSION set.
Run from a checkout (python python/setup.py bdist_wheel) it packages the repo's
sok_ev/ and reads the version from addons/build_defs.bzl.
"""

import json
import os
import re

from setuptools import Distribution, find_namespace_packages, setup

try:  # setuptools >= 70.1 ships bdist_wheel itself.
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = HERE if os.path.isdir(os.path.join(HERE, "sok_ev")) else os.path.dirname(HERE)


def _version():
    if os.environ.get("SOK_EV_VERSION"):
        return os.environ["SOK_EV_VERSION"]
    with open(os.path.join(ROOT, "addons", "build_defs.bzl")) as f:
        match = re.search(r'^SOK_EV_VERSION = "([^"]+)"', f.read(), re.M)
    if not match:
        raise SystemExit("SOK_EV_VERSION not found in addons/build_defs.bzl")
    return match.group(1)


def _cuda_requirements():
    """The CUDA runtime a GPU op library loads (libcudart.so.12), as pip names it.

    TensorFlow's own GPU install (tensorflow[and-cuda]) brings the same
    package; a CPU build needs nothing.
    """
    path = os.path.join(ROOT, "sok_ev", "_build_info.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        cuda = json.load(f).get("cuda")
    if not cuda:
        return []
    major, minor = cuda.split(".")[:2]
    return [f"nvidia-cuda-runtime-cu{major}>={major}.{minor},<{int(major) + 1}"]


class BdistWheel(bdist_wheel):
    """Tags the wheel py3-none-linux_x86_64.

    _sok_ev_ops.so is a TensorFlow plugin, not a CPython extension: it depends
    on the TensorFlow build it was compiled against, not on the Python ABI.
    """

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", "linux_x86_64"


class BinaryDistribution(Distribution):
    """Puts the package in platlib: it ships a native library."""

    def has_ext_modules(self):
        return True


os.chdir(ROOT)
setup(
    name="sok_ev",
    version=_version(),
    description="Hash embedding variables and grouped sparse lookups for TensorFlow",
    packages=find_namespace_packages(include=["sok_ev", "sok_ev.*"]),
    package_data={"sok_ev": ["_sok_ev_ops.so", "_build_info.json"]},
    python_requires=">=3.9",
    # TensorFlow itself is left out on purpose: the op library only works with
    # the exact TensorFlow it was built against, which the venv already has,
    # and tensorflow / tensorflow-cpu are different distribution names.
    install_requires=["numpy"] + _cuda_requirements(),
    cmdclass={"bdist_wheel": BdistWheel},
    distclass=BinaryDistribution,
    zip_safe=False,
)
