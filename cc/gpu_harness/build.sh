#!/usr/bin/env bash
# Builds the GPU core and its C ABI into cc/gpu_harness/build/libsokev_gpu.so
# (one nvcc per file, in parallel). -fmad=false: no multiply-add
# contraction, so initializer and optimizer arithmetic gives the CPU twin's bits.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/cc/gpu_harness/build}"
mkdir -p "$out"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
flags=(-O3 -std=c++17 -arch=sm_90 -fmad=false -lineinfo -Xcompiler -fPIC -I"$root")
objects=()
pids=()
# The tiered table's host tier (cc/host_tier.h) is host code.
for source in "$root"/cc/*_gpu.cu "$root"/cc/host_tier_cpu.cc "$root"/cc/gpu_harness/harness.cu; do
  object="$out/$(basename "${source%.*}").o"
  objects+=("$object")
  "$nvcc" "${flags[@]}" -c "$source" -o "$object" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$nvcc" -shared "${objects[@]}" -o "$out/libsokev_gpu.so"
echo "built $out/libsokev_gpu.so"
