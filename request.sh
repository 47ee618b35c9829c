#!/usr/bin/env bash
# Installs everything sok-ev needs to build and test, then builds and installs
# sok-ev itself into .venv. Idempotent: each step checks first and skips what is
# already right, so a second run only re-checks. Fetches from PyPI and Debian
# apt only.
#
# With a CUDA-enabled TensorFlow (SOK_EV_TF_PACKAGE=tensorflow==2.21.0) it
# builds the GPU op library: the CUDA 12 toolchain TensorFlow was built with
# comes from PyPI and Debian (addons/cuda_root.py) and Bazel runs with
# --config=cuda. No GPU is needed to build.
#
# Environment:
#   SOK_EV_TF_PACKAGE    TensorFlow requirement (default tensorflow-cpu==2.21.0)
#   SOK_EV_BASE_PYTHON   interpreter that creates the venv (default python3)
#   SOK_EV_VENV          the venv (default .venv). Another venv gets its own
#                        Bazel output base inside it and leaves the checkout's
#                        sok_ev/ alone, so a GPU build beside the CPU one
#                        disturbs neither (tests/test_gpu_code_compiles.py).
#   SOK_EV_WITH_HOROVOD  0 skips Horovod (default 1)
set -Eeuo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$PWD
VENV=$(realpath -m "${SOK_EV_VENV:-$ROOT/.venv}")
PY=$VENV/bin/python
# The checkout's own venv: the one `bazel build` and in-tree imports use.
DEFAULT_VENV=0
[[ $VENV == "$(realpath -m "$ROOT/.venv")" ]] && DEFAULT_VENV=1
TF_PACKAGE=${SOK_EV_TF_PACKAGE:-tensorflow-cpu==2.21.0}
HOROVOD_VERSION=0.28.1
# clang-format: Debian 12 pins it at 14, the version tests/test_formatting.py
# checks the C++ and CUDA sources against.
APT_PACKAGES=(bazel-bootstrap bazel-rules-java build-essential cmake clang-format)
# yapf pinned: formatting must not change under a new release. scikit-learn,
# matplotlib and tqdm: the Criteo benchmark's AUC, plots and progress bar;
# pyarrow: its Parquet reader (benchmarks/criteo/formats.py; optional there).
PY_PACKAGES=("$TF_PACKAGE" numpy pytest pytest-timeout wheel setuptools yapf==0.43.0
    scikit-learn matplotlib tqdm pyarrow)
# Installed without their dependencies. tf_keras: legacy Keras
# (TF_USE_LEGACY_KERAS=1), the release matching TensorFlow 2.21, which
# tests/test_legacy_keras.py runs sok-ev under; it requires the package named
# `tensorflow`, which would pull the CUDA wheel in beside tensorflow-cpu.
PY_PACKAGES_NO_DEPS=(tf_keras==2.21.0)
# TensorFlow's INFO/WARNING start-up chatter would drown the step output.
# No pip cache: the two TensorFlow wheels (CPU here, CUDA for the GPU build)
# would stay in it as another gigabyte on a disk two venvs already fill.
export TF_CPP_MIN_LOG_LEVEL=2 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

STEP="start"
trap 'echo "request.sh: FAILED in step [$STEP] (line $LINENO: $BASH_COMMAND)" >&2' ERR

step() {
    STEP=$1
    echo "==> [$1] $2"
}

# Runs the venv's Python with stderr shown only on failure (TensorFlow logs a
# few lines at import even with TF_CPP_MIN_LOG_LEVEL set).
py_quiet() {
    local err rc=0
    err=$(mktemp)
    "$PY" "$@" 2>"$err" || rc=$?
    ((rc == 0)) || cat "$err" >&2
    rm -f "$err"
    return "$rc"
}

# Where the project's stamps live: inside the venv, so a new venv starts clean.
stamp_matches() { [[ -f $VENV/.sok_ev-$1 && $(<"$VENV/.sok_ev-$1") == "$2" ]]; }
write_stamp() { printf '%s' "$2" >"$VENV/.sok_ev-$1"; }

apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        local sudo=()
        [[ $(id -u) == 0 ]] || sudo=(sudo)
        echo "installing: ${missing[*]}"
        "${sudo[@]}" apt-get update -q
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "already installed"
    fi
}

# ---------------------------------------------------------------------------
step apt "Debian packages: ${APT_PACKAGES[*]}"
apt_install "${APT_PACKAGES[@]}"

# ---------------------------------------------------------------------------
step venv "Python venv ${VENV#"$ROOT"/} with ${PY_PACKAGES[*]}"
if ! "$PY" -c 'import sys' 2>/dev/null; then
    rm -rf "$VENV"
    "${SOK_EV_BASE_PYTHON:-python3}" -m venv "$VENV"
fi
# Checked against the installed metadata, offline, so a no-change run does
# not ask the index anything.
py_requirements_met() {
    "$PY" - "$@" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    from packaging.requirements import Requirement
except ImportError:
    sys.exit(1)
for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        installed = version(req.name)
    except PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(installed, prereleases=True):
        sys.exit(1)
EOF
}
TF_CHANGED=0
# tensorflow and tensorflow-cpu install the same files: switching between
# them (CPU <-> GPU build) removes the other one first.
other_tf=$("$PY" - "$TF_PACKAGE" <<'EOF'
import importlib.metadata as md, re, sys
wanted = re.split(r"[<>=!~\[; ]", sys.argv[1])[0].lower().replace("_", "-")
dists = md.packages_distributions().get("tensorflow", [])
print(" ".join(d for d in dists if d.lower().replace("_", "-") != wanted))
EOF
)
if [[ -n $other_tf ]]; then
    echo "replacing $other_tf with $TF_PACKAGE"
    "$PY" -m pip uninstall -q -y $other_tf
    # The files the two share are gone now; Horovod was built against the other.
    "$PY" -m pip install -q --force-reinstall --no-deps "$TF_PACKAGE"
    rm -f "$VENV/.sok_ev-horovod"
    TF_CHANGED=1
fi
if py_requirements_met "${PY_PACKAGES[@]}"; then
    echo "already installed"
else
    "$PY" -m pip install -q "${PY_PACKAGES[@]}"
    TF_CHANGED=1
fi
if ! py_requirements_met "${PY_PACKAGES_NO_DEPS[@]}"; then
    "$PY" -m pip install -q --no-deps "${PY_PACKAGES_NO_DEPS[@]}"
fi
# Which TensorFlow is installed ("<version> <dir>"), read from metadata:
# importing TensorFlow takes seconds.
TF_ID=$(py_quiet -c '
import importlib.metadata as md, importlib.util as iu
dist = md.packages_distributions()["tensorflow"][0]
print(md.version(dist), iu.find_spec("tensorflow").submodule_search_locations[0])')
echo "TensorFlow $TF_ID"
TF_CUDA=$(py_quiet addons/cuda_root.py tensorflow-cuda)

# ---------------------------------------------------------------------------
BAZEL_FLAGS=()
CUDA_CHANGED=0
if [[ -n $TF_CUDA ]]; then
    step cuda "CUDA toolchain matching TensorFlow's CUDA $TF_CUDA (addons/cuda_root.py)"
    mapfile -t CUDA_APT < <(py_quiet addons/cuda_root.py apt-packages)
    mapfile -t CUDA_PIP < <(py_quiet addons/cuda_root.py pip-packages)
    mapfile -t CUDA_PIP_NODEPS < <(py_quiet addons/cuda_root.py pip-nodeps-packages)
    apt_install "${CUDA_APT[@]}"
    if ! py_requirements_met "${CUDA_PIP[@]}"; then
        "$PY" -m pip install -q "${CUDA_PIP[@]}"
        CUDA_CHANGED=1
    fi
    if ! py_requirements_met "${CUDA_PIP_NODEPS[@]}"; then
        "$PY" -m pip install -q --no-deps "${CUDA_PIP_NODEPS[@]}"
        CUDA_CHANGED=1
    fi
    # The root is symlinks into the packages: cheap to remake, and remade
    # whenever they or the recipe change.
    root_id="$(sha256sum addons/cuda_root.py | cut -d' ' -f1) $("$PY" -m pip freeze 2>/dev/null | grep -i '^nvidia-cuda' | tr '\n' ' ')"
    if ((CUDA_CHANGED)) || ! stamp_matches cuda-root "$root_id" || [[ ! -f $VENV/cuda/toolchain.json ]]; then
        py_quiet addons/cuda_root.py assemble "$VENV/cuda"
        write_stamp cuda-root "$root_id"
        CUDA_CHANGED=1
    fi
    echo "CUDA root $VENV/cuda: $(tr -d '\n ' <"$VENV/cuda/toolchain.json")"
    BAZEL_FLAGS+=(--config=cuda)
fi

# ---------------------------------------------------------------------------
step horovod "Horovod $HOROVOD_VERSION (TensorFlow + Gloo, no MPI)"
# Horovod's op library is compiled against one TensorFlow build, so the stamp
# records which one; a different TensorFlow means a rebuild.
HVD_STAMP="horovod==$HOROVOD_VERSION tf=$TF_ID"
horovod_ok() {
    stamp_matches horovod "$HVD_STAMP" &&
        "$PY" -c 'import sys, horovod.tensorflow as hvd; sys.exit(0 if hvd.gloo_built() else 1)' 2>/dev/null
}
if [[ ${SOK_EV_WITH_HOROVOD:-1} == 0 ]]; then
    echo "skipped (SOK_EV_WITH_HOROVOD=0)"
elif horovod_ok; then
    echo "already installed"
else
    HVD_TMP=$(mktemp -d)
    trap 'rm -rf "$HVD_TMP"' EXIT
    "$PY" -m pip download -q --no-binary :all: --no-deps -d "$HVD_TMP" "horovod==$HOROVOD_VERSION"
    tar -xzf "$HVD_TMP/horovod-$HOROVOD_VERSION.tar.gz" -C "$HVD_TMP"
    HVD_SRC=$HVD_TMP/horovod-$HOROVOD_VERSION
    # The XLA ops no longer build against TensorFlow 2.21's XLA headers and
    # are not needed (no XLA/MPI path is used), so drop them from TF_SOURCES.
    sed -i '\#horovod/tensorflow/xla_mpi_ops.cc#d' "$HVD_SRC/horovod/tensorflow/CMakeLists.txt"
    if grep -q xla_mpi_ops.cc "$HVD_SRC/horovod/tensorflow/CMakeLists.txt"; then
        echo "could not drop xla_mpi_ops.cc from horovod's CMakeLists.txt" >&2
        false
    fi
    HVD_ENV=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
        HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
        CMAKE_POLICY_VERSION_MINIMUM=3.5)
    # GPU collectives only when both a CUDA-enabled TensorFlow and NCCL exist;
    # never required. NCCL may come from the system or from pip's nvidia-nccl.
    if "$PY" -c 'import sys, tensorflow as tf; sys.exit(0 if tf.test.is_built_with_cuda() else 1)' 2>/dev/null; then
        NCCL_DIR=$("$PY" - <<'EOF'
import glob, os, sysconfig
candidates = [os.environ.get("NCCL_HOME", ""), "/usr", "/usr/local/nccl", "/usr/local/cuda"]
candidates += glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "nccl"))
for d in candidates:
    if d and os.path.exists(os.path.join(d, "include", "nccl.h")):
        print(d)
        break
EOF
        )
        if [[ -n $NCCL_DIR ]]; then
            echo "CUDA TensorFlow and NCCL ($NCCL_DIR) found: HOROVOD_GPU_OPERATIONS=NCCL"
            HVD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_NCCL_HOME=$NCCL_DIR"
                "HOROVOD_CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}")
        fi
    fi
    echo "building horovod (about 3 minutes)"
    # TensorFlow must be importable while horovod builds: no build isolation.
    env "${HVD_ENV[@]}" "$PY" -m pip install -q --no-build-isolation "$HVD_SRC"
    rm -rf "$HVD_TMP"
    trap - EXIT
    py_quiet -c 'import sys, horovod.tensorflow as hvd; sys.exit(0 if hvd.gloo_built() else 1)'
    out=$(cd / && PATH="$VENV/bin:$PATH" horovodrun --gloo -np 2 -H localhost:2 \
        python -c 'import horovod.tensorflow as hvd; hvd.init(); print("hvd-rank", hvd.rank())' 2>&1) || {
        echo "$out" >&2
        false
    }
    for rank in 0 1; do
        grep -q "hvd-rank $rank" <<<"$out" || { echo "$out" >&2; echo "horovodrun: rank $rank did not run" >&2; false; }
    done
    echo "horovodrun --gloo -np 2: ok"
    write_stamp horovod "$HVD_STAMP"
fi

# ---------------------------------------------------------------------------
step build "bazel build ${BAZEL_FLAGS[*]} //:build_sok"
# The build uses the venv's TensorFlow. For .venv, leave SOK_EV_PYTHON unset
# (addons/tensorflow.bzl defaults to .venv) so plain `bazel build` runs share
# this run's cache, and override one that points elsewhere.
BAZEL=(bazel)
if ((DEFAULT_VENV)); then
    if [[ -n ${SOK_EV_PYTHON:-} && ${SOK_EV_PYTHON} != "$PY" ]]; then
        echo "SOK_EV_PYTHON=$SOK_EV_PYTHON ignored: request.sh builds against $PY"
        export SOK_EV_PYTHON=$PY
    fi
else
    # Another venv: its own output base (one per checkout), so neither build
    # invalidates the other's cache, and no bazel-* links in the checkout.
    export SOK_EV_PYTHON=$PY
    BAZEL+=("--output_base=$VENV/bazel-output-base-$(printf %s "$ROOT" | sha256sum | cut -c1-8)")
    BAZEL_FLAGS+=(--symlink_prefix=/)
fi
# Bazel cannot see files outside the workspace change: re-read TensorFlow's
# location, flags and CUDA root whenever this run changed them.
if ((TF_CHANGED || CUDA_CHANGED)); then
    "${BAZEL[@]}" sync --only=local_tensorflow
fi
"${BAZEL[@]}" build "${BAZEL_FLAGS[@]}" //:build_sok
if ((DEFAULT_VENV)); then
    BIN=bazel-bin
else
    BIN=$("${BAZEL[@]}" info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)
fi
version=$(sed -n 's/^SOK_EV_VERSION = "\(.*\)"$/\1/p' addons/build_defs.bzl)
WHEEL=$BIN/sok_ev-$version-py3-none-linux_x86_64.whl
[[ -f $WHEEL ]] || { echo "expected wheel $WHEEL was not built" >&2; false; }
# Where the wheel is, for scripts that ship it (tests/gpu/build_gpu_wheel.sh).
write_stamp wheel-path "$WHEEL"

# ---------------------------------------------------------------------------
step install "pip install ${WHEEL#"$ROOT"/}"
wheel_sum=$(sha256sum "$WHEEL" | cut -d' ' -f1)
if stamp_matches wheel "$wheel_sum" && "$PY" -m pip show -q sok_ev >/dev/null 2>&1; then
    echo "already installed"
else
    "$PY" -m pip install -q --force-reinstall --no-deps "$WHEEL"
    write_stamp wheel "$wheel_sum"
fi
# Running from the checkout (pytest from the repo root, python -c in it) puts
# the source sok_ev/ first on sys.path, so it needs the op library too: the
# checkout's .venv build only.
if ((DEFAULT_VENV)); then
    cmp -s "$BIN/sok_ev/_sok_ev_ops.so" sok_ev/_sok_ev_ops.so ||
        install -m 0755 "$BIN/sok_ev/_sok_ev_ops.so" sok_ev/_sok_ev_ops.so
    cmp -s "$BIN/sok_ev/_build_info.json" sok_ev/_build_info.json ||
        install -m 0644 "$BIN/sok_ev/_build_info.json" sok_ev/_build_info.json
fi
# From outside the checkout this is the installed wheel; loading its op
# library explicitly catches unresolved symbols even before sok_ev loads it.
(cd / && py_quiet -c '
import sok_ev, sok_ev._ops as o
o.ops()
print("loaded", o.LIBRARY_PATH, "built for", o.describe_build(o.build_info()))')
if ((DEFAULT_VENV)); then
    py_quiet -c 'import sok_ev'
fi
echo "==> done: ${PY#"$ROOT"/} -c 'import sok_ev' works"
