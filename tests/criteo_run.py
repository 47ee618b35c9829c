"""benchmarks/criteo/run.py run in a child process, from the repository's
root, as a user runs it (TensorFlow's log quieted)."""
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(*args, timeout=280):
    """run.py with `args` (str()-ed); returns the CompletedProcess, text output."""
    return subprocess.run([sys.executable, "benchmarks/criteo/run.py", *map(str, args)],
                          cwd=REPO_ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          capture_output=True,
                          text=True,
                          timeout=timeout)


def run_py_ok(*args, timeout=280):
    """run_py, asserting that it exited 0 (its output's tail otherwise)."""
    result = run_py(*args, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
