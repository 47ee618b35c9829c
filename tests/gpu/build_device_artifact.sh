#!/usr/bin/env bash
# Puts together in .device/ (git-ignored) what a device run of
# tests/gpu/run_on_device.sh needs from this machine, built from the current
# tree:
#   .device/wheel/sok_ev-*.whl        the shipped GPU wheel, built by the one
#                                     recipe (tests/gpu/build_gpu_wheel.sh:
#                                     request.sh with tensorflow==2.21.0)
#   .device/harness/libsokev_gpu.so   the ctypes harness of tests/gpu/, built by
#                                     cc/gpu_harness/build.sh with this
#                                     machine's CUDA 13 nvcc (the device's
#                                     PyTorch is a CUDA 13 build)
#   .device/MANIFEST                  the tree (commit, changed files) and the
#                                     sha256 of both files, checked on the device
# Run here, from any directory:  bash tests/gpu/build_device_artifact.sh
# It ends by printing the size to carry and the device call to make.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$root/.device
# Working tree + carried folders must stay under 64 MiB per device call.
limit_mib=60
cd "$root"

echo "==> GPU wheel (request.sh in .venv-cuda; minutes the first time)"
wheel=$(bash tests/gpu/build_gpu_wheel.sh | tail -1)
echo "==> harness library (cc/gpu_harness/build.sh, $(nvcc --version | tail -1))"
harness_build=$(mktemp -d)
trap 'rm -rf "$harness_build"' EXIT
bash cc/gpu_harness/build.sh "$harness_build" >/dev/null

# tf_keras is no dependency of the kit's TensorFlow; its wheel travels in
# .whl/ (git-ignored), the version request.sh installs here.
keras_pin=$(grep -o 'tf_keras==[0-9.]*' request.sh | head -1)
if ! ls .whl/tf_keras-*.whl >/dev/null 2>&1; then
    echo "==> $keras_pin's wheel into .whl/ (carry it: carry=[\".device\", \".whl\"])"
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    .venv-cuda/bin/python -m pip download -q --no-deps --only-binary=:all: -d .whl "$keras_pin"
fi

rm -rf "$out"
mkdir -p "$out/wheel" "$out/harness"
cp "$wheel" "$out/wheel/"
cp "$harness_build/libsokev_gpu.so" "$out/harness/"
{
    echo "tree: $(git rev-parse HEAD) $(git status --porcelain | wc -l) changed files"
    git status --porcelain | sed 's/^/  /'
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    (cd "$out" && sha256sum wheel/*.whl harness/libsokev_gpu.so)
} >"$out/MANIFEST"

tree_kib=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -k 2>/dev/null |
    awk '{s += $1} END {print s}')
device_kib=$(du -sk "$out" .whl 2>/dev/null | awk '{s += $1} END {print s}')
total_mib=$(((tree_kib + device_kib + 1023) / 1024))
cat "$out/MANIFEST"
echo "==> .device: $((device_kib / 1024)) MiB; with the working tree $total_mib MiB to carry (limit 64)"
((total_mib <= limit_mib)) || { echo "too large to carry in one device call" >&2; exit 1; }
echo 'device call: run(command="bash tests/gpu/run_on_device.sh", carry=[".device", ".whl"], timeout_s=600)'
