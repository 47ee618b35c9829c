"""The code is formatted by the pinned formatters, so diffs carry only
meaning: Python by yapf (.style.yapf; pinned in request.sh), C++ and CUDA by
Debian's clang-format 14 (.clang-format). Each failure message gives the
command that fixes it.
"""
import glob
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON_PATHS = ["sok_ev", "python", "tests", "benchmarks", "cc/gpu_harness"]
CPP_PATTERNS = ["cc/**/*.h", "cc/**/*.cc", "cc/**/*.cu", "sok_ev/cc/**/*.h", "sok_ev/cc/**/*.cc"]


def test_python_is_yapf_formatted():
    yapf = os.path.join(os.path.dirname(sys.executable), "yapf")
    assert os.access(yapf, os.X_OK), f"no yapf next to {sys.executable}: run `bash request.sh`"
    result = subprocess.run([yapf, "--diff", "--recursive", *PYTHON_PATHS],
                            cwd=ROOT,
                            capture_output=True,
                            text=True,
                            timeout=600)
    assert result.returncode == 0 and not result.stdout, (
        f"Python not formatted; fix with `{yapf} -i -r {' '.join(PYTHON_PATHS)}`:\n"
        f"{result.stdout[-4000:]}{result.stderr[-2000:]}")


def test_cpp_and_cuda_are_clang_formatted():
    clang_format = shutil.which("clang-format")
    assert clang_format, "clang-format is not on PATH: run `bash request.sh` (Debian package)"
    files = sorted(
        {f for p in CPP_PATTERNS for f in glob.glob(os.path.join(ROOT, p), recursive=True)})
    result = subprocess.run([clang_format, "--dry-run", "--Werror", *files],
                            cwd=ROOT,
                            capture_output=True,
                            text=True,
                            timeout=600)
    assert result.returncode == 0, (
        "C++/CUDA not formatted; fix with `clang-format -i` on the files below:\n"
        f"{result.stderr[-4000:]}")
