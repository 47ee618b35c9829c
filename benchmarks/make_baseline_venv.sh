#!/usr/bin/env bash
# Makes the venv that benchmarks/cpu_sparse_step.py runs its TensorFlow 2.16.2
# baselines in (the dense path on TF 2.16.2, and TFRA 0.8.1), beside the
# project's .venv (TF 2.21): the git-ignored .venv-tf2.16 at the root of
# the checkout (outside the folders the formatters walk).
#
# TFRA 0.8.1 requires tensorflow<=2.16.2 and imports tf_keras on TF >= 2.16;
# its op libraries are linked against the `tensorflow` wheel and do not load
# on `tensorflow-cpu`, so the full wheel is installed. Idempotent: a second
# run only checks. Uses pip's cache.
#
# Environment: SOK_EV_BASE_PYTHON  interpreter that creates the venv
#              (default python3.11, the Python of .venv)
set -Eeuo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=$PWD/.venv-tf2.16
PACKAGES=(tensorflow==2.16.2 tf_keras==2.16.0 tensorflow-recommenders-addons==0.8.1)
export PIP_DISABLE_PIP_VERSION_CHECK=1 TF_CPP_MIN_LOG_LEVEL=2

if ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$VENV"
    "${SOK_EV_BASE_PYTHON:-python3.11}" -m venv "$VENV"
fi
if "$VENV/bin/python" - "${PACKAGES[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(any(version(s.split("==")[0]) != s.split("==")[1] for s in sys.argv[1:]))
PY
    echo "already installed: ${PACKAGES[*]}"
else
    "$VENV/bin/python" -m pip install -q "${PACKAGES[@]}"
fi
# TFRA's op libraries must load against this TensorFlow.
"$VENV/bin/python" -c '
import tensorflow as tf
from tensorflow_recommenders_addons import dynamic_embedding as de
de.get_variable("probe", key_dtype=tf.int64, dim=2).size()
print("TensorFlow", tf.__version__, "+ TFRA in", __import__("sys").prefix)' 2>&1 | tail -1
