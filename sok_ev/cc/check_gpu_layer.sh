#!/bin/bash
# Compile-and-link check of the TF GPU op layer, for CPU-only CI.
#
# The GPU machines have no TensorFlow, so the GPU kernels of sok_ev/cc/kernels
# can only be built here, against the CUDA-enabled tensorflow wheel's headers
# and libtensorflow_framework.so.2. This builds the whole op library as a
# GOOGLE_CUDA build: ops and kernels (g++, -DGOOGLE_CUDA=1 -DEIGEN_USE_GPU)
# and the CPU core (g++), then links them and the GPU core's objects (built
# by `bazel build --config=cuda //cc:core_gpu`, so nvcc's flags stay in
# addons/build_defs.bzl) with -Wl,--no-undefined against that
# libtensorflow_framework.so.2 and libcudart, so a GPU kernel calling a core
# function nobody defines fails. Nothing is loaded or run: the wheel's TF
# needs CUDA 12 and a GPU.
#
# Usage: sok_ev/cc/check_gpu_layer.sh WHEEL CUDA_OBJECTS [WORK_DIR]
#   WHEEL         tensorflow-2.21.0-cp311-*.whl (CUDA-enabled manylinux wheel)
#   CUDA_OBJECTS  folder of the cc/*_gpu.cu objects (*.pic.o) Bazel built
#   WORK_DIR      scratch for the extracted headers and objects; reused
#                 between runs (extraction happens once per wheel). Default:
#                 a temp dir.
# Environment: CUDA_HOME (default /usr/local/cuda), CXX (default g++),
#   JOBS (parallel compiles, default nproc).
set -euo pipefail

wheel=${1:?usage: $0 WHEEL CUDA_OBJECTS [WORK_DIR]}
cuda_objects=${2:?usage: $0 WHEEL CUDA_OBJECTS [WORK_DIR]}
work=${3:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
cxx=${CXX:-g++}
jobs=${JOBS:-$(nproc)}

[ -f "$wheel" ] || { echo "check_gpu_layer: no wheel at $wheel" >&2; exit 2; }
compgen -G "$cuda_objects/*.pic.o" > /dev/null ||
  { echo "check_gpu_layer: no CUDA objects in $cuda_objects" >&2; exit 2; }
mkdir -p "$work"
work=$(cd "$work" && pwd)

# Headers and framework library, extracted once per wheel.
tf=$work/tf
stamp=$tf/.extracted-$(basename "$wheel")
if [ ! -f "$stamp" ]; then
  rm -rf "$tf"
  mkdir -p "$tf"
  unzip -q -o "$wheel" 'tensorflow/include/*' 'tensorflow/libtensorflow_framework.so.2' -d "$tf"
  touch "$stamp"
fi
tf_include=$tf/tensorflow/include
tf_lib=$tf/tensorflow

obj=$work/obj
rm -rf "$obj"
mkdir -p "$obj"

# -O0: only compiling and linking matters, and it keeps every inline call
# the kernels make as a symbol reference the link must resolve.
host_flags=(-std=c++17 -O0 -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -DEIGEN_MAX_ALIGN_BYTES=64
            -DGOOGLE_CUDA=1 -DEIGEN_USE_GPU -I"$root" -I"$tf_include" -I"$cuda/include"
            -Wno-deprecated-declarations -Wno-ignored-attributes)

compile() {  # compile SOURCE: one object under $obj, its log beside it
  local src=$1 out
  out=$obj/$(echo "$src" | tr / _).o
  "$cxx" "${host_flags[@]}" -c "$root/$src" -o "$out" > "$out.log" 2>&1 ||
    { echo "FAILED: $src"; cat "$out.log"; touch "$out.failed"; }
}
cd "$root"
sources=(sok_ev/cc/kernels/*.cc sok_ev/cc/ops/*.cc cc/*_cpu.cc)
for src in "${sources[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  compile "$src" &
done
wait
# Failures are marked by file: a background job's exit status can be lost.
if compgen -G "$obj/*.failed" > /dev/null; then
  echo "check_gpu_layer: compile failed:" $(cd "$obj" && ls *.failed) >&2
  exit 1
fi

lib=$work/_sok_ev_ops_gpu.so
"$cxx" -shared -o "$lib" "$obj"/*.o "$cuda_objects"/*.pic.o -Wl,--no-undefined \
  -L"$tf_lib" -l:libtensorflow_framework.so.2 -L"$cuda/lib64" -lcudart
echo "check_gpu_layer: OK: ${#sources[@]} sources compiled, $lib linked with no undefined symbols"
