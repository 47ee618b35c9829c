"""An op library that cannot be loaded fails with an error naming its build.

sok_ev loads `_sok_ev_ops.so` on first use; when TensorFlow cannot load it
(built for another TensorFlow, or a GPU build without its CUDA runtime), the
ImportError names the TensorFlow and CUDA the build recorded in
`_build_info.json`, the TensorFlow installed, and the fix. Checked on a copy
of the package under test whose library is not a loadable file.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import sok_ev_reference as ref

BUILDS = {
    "cpu": ({
        "tensorflow": "2.99.0",
        "cuda": None
    }, "TensorFlow 2.99.0, CPU only"),
    "gpu": ({
        "tensorflow": "2.99.0",
        "cuda": "12.5.1",
        "cuda_archs": ["sm_80", "sm_90"],
        "cuda_ptx": "sm_90"
    }, "TensorFlow 2.99.0 with CUDA 12.5.1 (GPU code for sm_80, sm_90, PTX sm_90)"),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_unloadable_library_error_names_its_build_and_the_installed_tensorflow(tmp_path, build):
    info, described = BUILDS[build]
    package = tmp_path / "sok_ev"
    shutil.copytree(os.path.join(ref.sok_ev_import_root(), "sok_ev"),
                    package,
                    ignore=shutil.ignore_patterns("*.so", "_build_info.json", "__pycache__"))
    (package / "_sok_ev_ops.so").write_bytes(b"not a shared library")
    (package / "_build_info.json").write_text(json.dumps(info))
    script = "import sok_ev._ops as o\ntry:\n    o.ops()\nexcept ImportError as e:\n    print(e)\n"
    result = subprocess.run([sys.executable, "-c", script],
                            cwd=tmp_path,
                            capture_output=True,
                            text=True,
                            timeout=120,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    message = result.stdout
    assert str(package / "_sok_ev_ops.so") in message, message
    assert f"built for {described}" in message, message
    assert f"TensorFlow {tf.__version__}" in message and "installed" in message, message
    assert "bash request.sh" in message, message
