#!/usr/bin/env bash
# Builds the GPU wheel with the project's one recipe, request.sh, in a second
# venv holding TensorFlow's CUDA build (tensorflow==2.21.0): .venv-cuda at the
# repo root, or $SOK_EV_GPU_VENV. Horovod is skipped (the wheel does not need
# it; SOK_EV_WITH_HOROVOD=1 builds it too). No GPU needed. Prints the wheel's
# path as its last line.
#   tests/gpu/build_gpu_wheel.sh        (used by tests/test_gpu_code_compiles.py
#                                        and tests/gpu/build_device_artifact.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${SOK_EV_GPU_VENV:-$root/.venv-cuda}
SOK_EV_VENV=$venv SOK_EV_TF_PACKAGE=tensorflow==2.21.0 SOK_EV_WITH_HOROVOD=${SOK_EV_WITH_HOROVOD:-0} \
    bash "$root/request.sh" >&2
cat "$venv/.sok_ev-wheel-path"
echo
