#!/usr/bin/env bash
# What can be checked of the SOK build without a GPU: each library's
# dependencies (ldd, with the device's search path imitated by TensorFlow's
# directory, CUDA 13's and the cache's link-time libraries) and the strong symbols
# none of them defines (those must come from the driver, libcuda.so.1, on the
# device), then whether `import sparse_operation_kit` loads the three
# libraries into TensorFlow 2.21 here (the driver replaced by the empty stub:
# lazy binding lets a library load whose driver calls are never made).
# Fails if a library has an undefined cuda* (runtime) symbol or needs a
# libcudart: TensorFlow's exported CUDA 12.5 stub would then serve SOK's CUDA 13
# calls (build_sok.sh, 8.). Driver symbols (cu*) are fine.
#   bash benchmarks/peers/check_sok_libs.sh [.peers]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$root/.peers}
venv=${SOK_EV_GPU_VENV:-$root/.venv-cuda}
cache=${SOK_PEERS_CACHE:-$HOME/.cache/sok-ev-peers}
lib=$out/sok/sparse_operation_kit/lib
tf_dir=$(TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -c 'import os, tensorflow as tf; print(os.path.dirname(tf.__file__))' 2>/dev/null)
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
ln -s "$cache/cuda13/lib/libcuda.so" "$stub/libcuda.so.1"
export LD_LIBRARY_PATH=$lib:$tf_dir:/usr/local/cuda/lib64:$cache/cuda13/lib:$stub
rc=0
for so in "$lib"/*.so; do
    echo "== $(basename "$so") ($(du -k "$so" | cut -f1) KiB)"
    ldd "$so" | grep -vE 'linux-vdso|ld-linux' | sed 's/ (0x.*//; s/^\s*/   /'
    ldd "$so" | grep -q 'not found' && rc=1
    cudart_und=$(readelf -W --dyn-syms "$so" | awk '$7 == "UND" {print $8}' | sed 's/@.*//' | grep -E '^(__)?cuda' | sort -u)
    cudart_needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(libcudart[^]]*\)\]/\1/p')
    echo "   cuda runtime: $(echo "$cudart_und" | grep -c .) undefined cuda* symbols, NEEDED libcudart: ${cudart_needed:-none}"
    if [[ -n $cudart_und || -n $cudart_needed ]]; then
        echo "$cudart_und" | head -20 | sed 's/^/     UND /'
        echo "   FAIL: its CUDA runtime calls are left to whichever cudart is loaded first (TensorFlow's)"
        rc=1
    fi
    deps=$(ldd "$so" | awk '$3 ~ /^\// {print $3} $1 ~ /ld-linux/ {print $1}')
    # shellcheck disable=SC2086
    unresolved=$(comm -23 <(nm -D --undefined-only "$so" | awk '$1 == "U" {print $2}' | sed 's/@.*//' | sort -u) \
        <(for d in $deps; do nm -D --defined-only "$d" 2>/dev/null | awk '{print $3}' | sed 's/@.*//'; done | sort -u))
    echo "   undefined here: $(echo "$unresolved" | grep -c .) symbols; not from the driver (cu*):"
    echo "$unresolved" | grep -v '^cu[A-Z]' | sed 's/^/     /'
    echo "$unresolved" | grep -qv '^cu[A-Z]\|^$' && rc=1
done
echo "== import sparse_operation_kit (TensorFlow $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow"))'), no GPU)"
(cd /tmp && PYTHONPATH=$out/sok TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -c '
import sparse_operation_kit as sok
ops = [n for n in dir(sok.raw_ops) if not n.startswith("_")]
print("imported", sok.__file__, "version", sok.__version__, "with", len(ops), "ops")') 2>&1 | grep -v "oneDNN\|absl::Init\|^WARNING: All log" || rc=1
exit $rc
