#!/usr/bin/env bash
# Builds NVIDIA SOK 2.1.0 (the `merlin-sok` sdist on PyPI) for TensorFlow 2.21
# on this CPU machine, and writes .peers/ (git-ignored) at the repo root: the
# artifact a device call carries beside .device/ (tests/gpu/run_on_device.sh,
# part `peers`). SOK's own code never enters the repository: the sdist is
# downloaded into a cache outside it and patched in a temporary directory.
#
#   bash benchmarks/peers/build_sok.sh   (about 10 min from scratch; cache: SOK_PEERS_CACHE)
#
# Toolchain: CUDA 13 (/usr/local/cuda's nvcc), device code for sm_90 only.
# PyPI's CUDA 12 nvcc package carries ptxas but no nvcc driver or front end,
# so the CUDA 12.5 that TensorFlow was built with cannot compile SOK here (the
# device's driver is CUDA 13). Headers and link-time libraries that
# /usr/local/cuda lacks come from CUDA 13 wheels (NCCL, cuRAND, cuSPARSE) and
# from TensorFlow's wheel (cuBLAS, cuDNN and NVML headers; none is linked).
# CUDA 13's runtime is linked in statically and hidden (8. below): at run time
# SOK needs no libcudart, only libcurand.so.10, libnccl.so.2 and the driver
# (libcuda.so.1, dlopened), on the device's LD_LIBRARY_PATH after /tmp/gpu-tf/env.sh.
#
# The patches (each applied with a check that its anchor is still there):
#  1. CMakeLists.txt: `find_package(MPI REQUIRED)` is dropped. SOK uses MPI
#     nowhere: every MPI call in HugeCTR's core23 is under `#ifdef ENABLE_MPI`,
#     which nothing defines, and ${MPI_CXX_LIBRARIES} is only appended to the
#     link line; without the package it is empty and the libraries need no
#     libmpi. Horovod (Gloo or NCCL) is SOK's only communication at run time.
#  2. kit_src/**/kernels/*.cc: TF 2.21 no longer exports
#     stream_executor::gpu::AsGpuStreamValue, which SOK declares and calls in
#     6 files; each declaration becomes an inline definition through the public
#     Stream::platform_specific_handle() (as ../shared/gpu-tf/build_horovod.sh
#     does for Horovod).
#  3. kit_src/lookup/impl/core_impl/gpu_resource_impl.hpp: the same stream
#     was read through Stream::implementation()->GpuStreamMemberHack(), gone
#     from TF 2.21: platform_specific_handle() again.
#  4. concurrent_unordered_map.cuh: CUDA 13's cudaMemPrefetchAsync takes a
#     cudaMemLocation and flags instead of a device id.
#  5. sparse_operation_kit/lookup.py: importlib.find_loader, gone in Python
#     3.12 (the device's), becomes importlib.util.find_spec.
#  6. HugeCTR/core23/kernel_params.cpp (diagnostic): a failed
#     cudaGetDeviceProperties throws, naming the error, instead of leaving the
#     warp size that later divides (the first lookups died of SIGFPE there);
#     the values it read go to stderr once.
#  7. generic_lookup.cuh's get_kernel_config_use_warp (diagnostic and
#     workaround): the second device run showed the SIGFPE is its division by
#     saturate_num = num_sms * (threads per SM / warp size) * multiple, zero
#     although KernelParams::init ran. When it is not positive, the values
#     it got go to stderr once and the current device's own SM count and
#     threads per SM are used instead, so the lookup can go on.
#  8. Link flags, no source change: libtensorflow_framework.so.2 exports
#     unversioned cudart symbols (its stub forwarding to CUDA 12.5's runtime),
#     and glibc lets them satisfy SOK's cuda*@libcudart.so.13 references: SOK's
#     CUDA 13 code ran on CUDA 12.5's runtime (patch 6 read num_sms 1, fields
#     at offsets that moved in cudaDeviceProp; HKV's illegal access). Each
#     library now takes libcudart_static.a whole, before its objects and
#     TensorFlow on the link line (CMake's Static runtime alone comes after
#     TensorFlow, whose definitions then win), hidden by --exclude-libs.
#     check_sok_libs.sh fails on any UND cuda* symbol or NEEDED libcudart.
#  9. Every SOK kernel binds its stream's device and returns a thrown
#     std::exception as its error Status (HKV's crash was one, lost in TF).
# 10. HKV sums its bucket sizes on the host instead of thrust::reduce, whose
#     CUB failed with "invalid device ordinal" (diagnostic printed once).
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL=3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$root/.peers}
venv=${SOK_EV_GPU_VENV:-$root/.venv-cuda}
cache=${SOK_PEERS_CACHE:-$HOME/.cache/sok-ev-peers}
jobs=${SOK_PEERS_JOBS:-2}
sok_version=2.1.0
cuda=/usr/local/cuda
limit_mib=40 # .peers/ beside .device/ (14 MiB) and the tree, under 64 MiB
[[ -x $venv/bin/python ]] || { echo "no $venv: build .venv-cuda first (tests/gpu/build_gpu_wheel.sh)" >&2; exit 2; }
"$venv/bin/python" -c 'import tensorflow as tf; assert tf.__version__ == "2.21.0", tf.__version__' ||
    { echo "$venv must hold tensorflow 2.21.0" >&2; exit 2; }
mkdir -p "$cache"

echo "==> sources and libraries (cached in $cache)"
sdist=$cache/merlin-sok-$sok_version.tar.gz
[[ -f $sdist ]] || "$venv/bin/pip" download -q "merlin-sok==$sok_version" --no-deps --no-binary :all: -d "$cache"
# CUDA 13 libraries the toolkit here lacks: headers and link-time .so only.
cuda_extra=$cache/cuda13
if [[ ! -f $cuda_extra/done ]]; then
    rm -rf "$cuda_extra" && mkdir -p "$cuda_extra/wheels"
    "$venv/bin/pip" download -q --no-deps --only-binary :all: -d "$cuda_extra/wheels" \
        nvidia-nccl-cu13==2.30.7 nvidia-curand==10.4.0.35 nvidia-cusparse==12.6.3.3
    "$venv/bin/python" - "$cuda_extra" <<'PY'
import glob, os, re, sys, zipfile
dst = sys.argv[1]
for wheel in glob.glob(os.path.join(dst, "wheels", "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            m = re.match(r"nvidia/[^/]+/(include|lib)/(.+)$", name)
            if m and not name.endswith("/"):
                path = os.path.join(dst, m.group(1), m.group(2))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with z.open(name) as f, open(path, "wb") as g:
                    g.write(f.read())
PY
    for lib in "$cuda_extra"/lib/*.so.*; do ln -sf "$(basename "$lib")" "${lib%%.so.*}.so"; done
    # The toolkit here has no libcuda stub: an empty library with the driver's
    # soname records the dependency; its symbols resolve to the device's driver.
    echo 'void sok_ev_peers_cuda_stub(void) {}' >"$cuda_extra/stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda_extra/lib/libcuda.so" "$cuda_extra/stub.c"
    # core23's error.hpp includes cuBLAS, cuDNN and NVML headers (for their
    # error codes; no calls): TensorFlow's wheel ships them, beside nothing else.
    tf_headers=$("$venv/bin/python" -c 'import os, tensorflow as tf; print(os.path.dirname(tf.__file__))' 2>/dev/null)/include/third_party/gpus
    cp "$tf_headers"/cuda/include/cublas*.h "$tf_headers"/cudnn/include/cudnn*.h "$tf_headers"/cuda/nvml/include/nvml.h \
        "$cuda_extra/include/"
    rm -rf "$cuda_extra/wheels" && touch "$cuda_extra/done"
fi

# HugeCTR's utils.hpp includes numa.h (inline helpers SOK never calls):
# Debian's header package, unpacked into the cache, not installed.
if [[ ! -f $cuda_extra/include/numa.h ]]; then
    (cd "$cuda_extra" && apt-get download -q libnuma-dev 2>/dev/null && dpkg -x libnuma-dev_*.deb numa &&
        cp numa/usr/include/numa*.h include/ && rm -rf numa libnuma-dev_*.deb)
fi

# The sdist is unpacked and patched afresh in a temporary directory, then
# synced into the cache's source tree file by file, rewriting only files whose
# content changed (files CMake generates there stay): with the build directory
# kept too, a rebuild compiles only what a changed patch touches.
work=$(mktemp -d /tmp/sok-build.XXXX)
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$work/merlin-sok-$sok_version

echo "==> patches"
"$venv/bin/python" - "$src" <<'PY'
import glob, os, sys
src = sys.argv[1]

def patch(path, old, new, count=1):
    path = os.path.join(src, path)
    text = open(path).read()
    assert text.count(old) == count, f"{path}: patch point {old!r} found {text.count(old)} times, not {count}"
    open(path, "w").write(text.replace(old, new))

# 1. No MPI: nothing in SOK's build defines ENABLE_MPI, the only guard of MPI calls.
patch("CMakeLists.txt", "find_package(MPI REQUIRED)\n", "")
# 2. AsGpuStreamValue: defined inline through the public Stream API of TF 2.21.
declaration = "cudaStream_t AsGpuStreamValue(Stream* stream);\n"
definition = ("inline cudaStream_t AsGpuStreamValue(Stream* stream) {\n"
              "  return static_cast<cudaStream_t>(stream->platform_specific_handle().stream);\n}\n")
files = [p for p in glob.glob(os.path.join(src, "kit_src", "**", "*.cc"), recursive=True)
         if declaration in open(p).read()]
assert len(files) == 6, files
for path in files:
    patch(path, declaration, definition)
    patch(path, "namespace stream_executor {\n", '#include "xla/stream_executor/stream.h"\nnamespace stream_executor {\n')
# 3. The same stream, read through Stream::implementation()->GpuStreamMemberHack(),
#    which TF 2.21's Stream no longer has: the public handle again.
patch("kit_src/lookup/impl/core_impl/gpu_resource_impl.hpp",
      "    cudaStream_t *stream =\n"
      "        reinterpret_cast<cudaStream_t *>(gpu_dc->stream()->implementation()->GpuStreamMemberHack());\n",
      "    cudaStream_t stream_handle =\n"
      "        static_cast<cudaStream_t>(gpu_dc->stream()->platform_specific_handle().stream);\n"
      "    cudaStream_t *stream = stream_handle ? &stream_handle : nullptr;\n")
# 4. CUDA 13 takes a cudaMemLocation (and flags) where CUDA 12 took a device id
#    (the DET backend's table on managed memory; HKV does not call it).
patch("kit_src/variable/impl/dynamic_embedding_table/cudf/concurrent_unordered_map.cuh",
      "m_hashtbl_size * sizeof(value_type), dev_id, 0));",
      "m_hashtbl_size * sizeof(value_type),\n"
      "                                 cudaMemLocation{cudaMemLocationTypeDevice, dev_id}, 0, 0));")
# 5. Python 3.12 removed importlib.find_loader, which SOK's lookup calls to
#    test for DeepRec's kv_variable_ops (the device's Python is 3.12; the first
#    device run failed there): importlib.util.find_spec answers the same.
patch("sparse_operation_kit/lookup.py", "importlib.find_loader(", "importlib.util.find_spec(", count=3)
patch("sparse_operation_kit/lookup.py", "import importlib\n", "import importlib\nimport importlib.util\n")
# 6. Diagnostic: HugeCTR's KernelParams::init ignores cudaGetDeviceProperties'
#    result, and its warp size and threads per SM become divisors
#    (get_kernel_config_use_warp). The first device run died of SIGFPE under
#    ModelForward::sparse_forward; a failed call now throws, naming the error.
patch("HugeCTR/core23/kernel_params.cpp", "  cudaGetDeviceProperties(&device_prop, 0);\n",
      "  const cudaError_t status = cudaGetDeviceProperties(&device_prop, 0);\n"
      "  if (status != cudaSuccess || device_prop.warpSize <= 0) {\n"
      "    throw std::runtime_error(std::string(\"KernelParams: cudaGetDeviceProperties(0): \") +\n"
      "                             cudaGetErrorString(status) + \", warpSize \" +\n"
      "                             std::to_string(device_prop.warpSize));\n"
      "  }\n")
patch("HugeCTR/core23/kernel_params.cpp", "  this->max_thread_per_block = device_prop.maxThreadsPerBlock;\n",
      "  this->max_thread_per_block = device_prop.maxThreadsPerBlock;\n"
      "  static bool reported = false;\n"
      "  if (!reported) {\n"
      "    reported = true;\n"
      "    fprintf(stderr, \"[sok-ev patch 6] KernelParams::init: num_sms %d warp_size %d \"\n"
      "            \"max_thread_per_sm %d max_thread_per_block %d\\n\", num_sms, warp_size,\n"
      "            max_thread_per_sm, max_thread_per_block);\n"
      "  }\n")
patch("HugeCTR/core23/kernel_params.cpp", "#include <core23/kernel_params.hpp>\n",
      "#include <core23/kernel_params.hpp>\n#include <cstdio>\n#include <stdexcept>\n#include <string>\n")
# 7. Diagnostic and workaround: the SIGFPE is get_kernel_config_use_warp's
#    division by saturate_num, zero although KernelParams::init ran.
patch("HugeCTR/embedding/operators/generic_lookup.cuh", "#include <embedding/common.hpp>\n",
      "#include <cstdio>\n#include <embedding/common.hpp>\n")
patch("HugeCTR/embedding/operators/generic_lookup.cuh",
      "  int saturate_num = num_sms * warp_num_per_sm * multiple_num;\n",
      "  int saturate_num = num_sms * warp_num_per_sm * multiple_num;\n"
      "  if (saturate_num <= 0) {\n"
      "    static bool reported = false;\n"
      "    if (!reported) {\n"
      "      reported = true;\n"
      "      fprintf(stderr, \"[sok-ev patch 7] get_kernel_config_use_warp got num_sms %d \"\n"
      "              \"threads per SM %d warp size %d; using the current device's\\n\", num_sms,\n"
      "              num_thread_per_sm, warp_size);\n"
      "    }\n"
      "    int device = 0, sms = 0, threads = 0;\n"
      "    cudaGetDevice(&device);\n"
      "    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);\n"
      "    cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device);\n"
      "    warp_num_per_sm = threads / 32;\n"
      "    warp_num_per_block = block_size / 32;\n"
      "    saturate_num = sms * warp_num_per_sm * multiple_num;\n"
      "  }\n")
# 9. HKV's training crash (2026-11-23, e783b10): thrust's reduction inside HKV, called
#    from the optimizer's DummyVarSparseRead, threw "invalid device ordinal"
#    (CUB's answer when cudaGetDevice fails on the calling thread) through the
#    TF kernel, and TensorFlow died translating the C++ exception. Every
#    kernel in the six patched files now (a) makes its thread's current
#    device, in SOK's private runtime, the device of the op's stream, saying
#    once on stderr when it had to and what cudaGetDevice answered; (b) turns
#    a thrown std::exception into the op's error Status.
binder = (
    "namespace sok_ev_patch9 {\n"
    "inline void BindDevice(tensorflow::OpKernelContext* ctx, const char* op) {\n"
    "  auto* device_ctx = ctx->op_device_context();\n"
    "  if (device_ctx == nullptr || device_ctx->stream() == nullptr) return;  // a CPU kernel\n"
    "  cudaStream_t stream = stream_executor::gpu::AsGpuStreamValue(device_ctx->stream());\n"
    "  int wanted = -1, current = -1;\n"
    "  const cudaError_t stream_status = cudaStreamGetDevice(stream, &wanted);\n"
    "  const cudaError_t current_status = cudaGetDevice(&current);\n"
    "  if (stream_status == cudaSuccess && current_status == cudaSuccess && wanted == current) return;\n"
    "  static std::atomic<int> reports{0};\n"
    "  if (reports.fetch_add(1) < 8) {\n"
    "    int count = -1;\n"
    "    const cudaError_t count_status = cudaGetDeviceCount(&count);\n"
    "    fprintf(stderr, \"[sok-ev patch 9] %s: stream's device %d (%s), thread's device %d (%s), \"\n"
    "            \"device count %d (%s); binding the stream's device\\n\", op, wanted,\n"
    "            cudaGetErrorString(stream_status), current, cudaGetErrorString(current_status), count,\n"
    "            cudaGetErrorString(count_status));\n"
    "  }\n"
    "  cudaGetLastError();  // drop the failed query's error, not sticky\n"
    "  if (stream_status == cudaSuccess) cudaSetDevice(wanted);\n"
    "}\n"
    "}  // namespace sok_ev_patch9\n")
guarded = ("  void Compute(OpKernelContext* ctx) override {\n"
           "    sok_ev_patch9::BindDevice(ctx, this->name().c_str());\n"
           "    try {\n"
           "      ComputeUnguarded(ctx);\n"
           "    } catch (const std::exception& error) {\n"
           "      ctx->CtxFailure(__FILE__, __LINE__,\n"
           "                      errors::Internal(\"SOK op \", this->name(), \" threw: \", error.what()));\n"
           "    }\n"
           "  }\n"
           "  void ComputeUnguarded(OpKernelContext* ctx) {\n")
unguarded = "  void Compute(OpKernelContext* ctx) override {\n"
guarded_kernels = 0
for path in files:
    text = open(path).read()
    count = text.count(unguarded)
    patch(path, "}  // namespace stream_executor\n",
          "}  // namespace stream_executor\n#include <atomic>\n#include <cstdio>\n" + binder)
    if count:
        patch(path, unguarded, guarded, count=count)
        guarded_kernels += count
assert guarded_kernels == 23, guarded_kernels
# 10. Workaround, with a diagnostic: patch 9's run showed the thread's device
#     right (no binding needed) and HKV's thrust::reduce of its bucket sizes
#     still failing with "invalid device ordinal", which CUB returns when its
#     cached device count is not above the current device. HKV's two such
#     reductions (fast_load_factor, size) now copy the bucket sizes to the
#     host and sum them there; the first call prints what CUB and the runtime
#     report, for the record.
hkv = "third_party/HierarchicalKV/include/merlin_hashtable.cuh"
patch(hkv, "namespace nv {\nnamespace merlin {\n",
      "namespace nv {\nnamespace merlin {\n"
      "namespace sok_ev_patch10 {\n"
      "inline int64_t sum_bucket_sizes(const int* sizes, size_t n, cudaStream_t stream) {\n"
      "  static std::atomic<bool> reported{false};\n"
      "  if (!reported.exchange(true)) {\n"
      "    int count = -1;\n"
      "    const cudaError_t status = cudaGetDeviceCount(&count);\n"
      "    fprintf(stderr, \"[sok-ev patch 10] HKV bucket sizes summed on the host; cub::DeviceCount() \"\n"
      "            \"%d, cub::CurrentDevice() %d, cudaGetDeviceCount %d (%s)\\n\", cub::DeviceCount(),\n"
      "            cub::CurrentDevice(), count, cudaGetErrorString(status));\n"
      "  }\n"
      "  std::vector<int> host(n);\n"
      "  CUDA_CHECK(cudaMemcpyAsync(host.data(), sizes, n * sizeof(int), cudaMemcpyDeviceToHost, stream));\n"
      "  CUDA_CHECK(cudaStreamSynchronize(stream));\n"
      "  int64_t total = 0;\n"
      "  for (int size : host) total += size;\n"
      "  return total;\n"
      "}\n"
      "}  // namespace sok_ev_patch10\n")
patch(hkv, "    int size = thrust::reduce(thrust_par.on(stream), size_ptr, size_ptr + N, 0,\n"
           "                              thrust::plus<int>());\n",
      "    int size = static_cast<int>(\n"
      "        sok_ev_patch10::sum_bucket_sizes(table_->buckets_size, N, stream));\n")
patch(hkv, "      h_size += thrust::reduce(thrust_par.on(stream), size_ptr + start_i,\n"
           "                               size_ptr + end_i, 0, thrust::plus<int>());\n",
      "      h_size += sok_ev_patch10::sum_bucket_sizes(table_->buckets_size + start_i,\n"
      "                                                 end_i - start_i, stream);\n")
patch(hkv, "#include <atomic>\n", "#include <atomic>\n#include <cstdio>\n#include <vector>\n")
print(f"patched CMakeLists.txt, {len(files)} kernels, gpu_resource_impl.hpp, concurrent_unordered_map.cuh, "
      f"lookup.py, kernel_params.cpp, generic_lookup.cuh, {guarded_kernels} guarded Compute methods, "
      "merlin_hashtable.cuh")
PY

mkdir -p "$cache/src/merlin-sok-$sok_version"
"$venv/bin/python" - "$src" "$cache/src/merlin-sok-$sok_version" <<'PY'
import filecmp, os, shutil, sys
source, target = sys.argv[1], sys.argv[2]
for directory, _, files in os.walk(source):
    for name in files:
        relative = os.path.relpath(os.path.join(directory, name), source)
        old, new = os.path.join(target, relative), os.path.join(source, relative)
        if not os.path.exists(old) or not filecmp.cmp(old, new, shallow=False):
            os.makedirs(os.path.dirname(old), exist_ok=True)
            shutil.copy2(new, old) if not os.path.exists(old) else shutil.copyfile(new, old)
PY
src=$cache/src/merlin-sok-$sok_version

echo "==> configure ($($cuda/bin/nvcc --version | tail -1))"
build=$cache/build
# 8.: CUDA 13's runtime in each library, before TensorFlow's exported stub, hidden.
[[ -f $cuda/lib64/libcudart_static.a ]] || { echo "no $cuda/lib64/libcudart_static.a" >&2; exit 2; }
cudart_static="-Wl,--whole-archive $cuda/lib64/libcudart_static.a -Wl,--no-whole-archive -Wl,--exclude-libs,ALL"
# CMake imports TensorFlow through `python`: the venv's comes first on PATH.
PATH=$venv/bin:$cuda/bin:$PATH NCCL_DIR=$cuda_extra nice -n 19 cmake -S "$src" -B "$build" -G Ninja \
    -DSKBUILD=ON -DSM=90 -DCMAKE_BUILD_TYPE=Release -DUSE_NVTX=OFF -DENABLE_DEEPREC=OFF \
    -DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc -DCMAKE_CUDA_RUNTIME_LIBRARY=Static \
    -DCUDAToolkit_ROOT=$cuda -DCUDA_cuda_driver_LIBRARY="$cuda_extra/lib/libcuda.so" \
    -DCUDA_curand_LIBRARY="$cuda_extra/lib/libcurand.so" -DCUDA_cusparse_LIBRARY="$cuda_extra/lib/libcusparse.so" \
    -DCMAKE_CXX_FLAGS="-I$cuda_extra/include" -DCMAKE_CUDA_FLAGS="-I$cuda_extra/include" \
    -DCMAKE_SHARED_LINKER_FLAGS="-L$cuda_extra/lib -Wl,--as-needed $cudart_static" >"$work/configure.log" 2>&1 ||
    { tail -40 "$work/configure.log"; exit 1; }

echo "==> build (nice, $jobs jobs; log $cache/build.log)"
t0=$SECONDS
PATH=$venv/bin:$cuda/bin:$PATH nice -n 19 ninja -C "$build" -j "$jobs" -k 0 >"$cache/build.log" 2>&1 ||
    { grep -E "error:|^FAILED" "$cache/build.log" | head -40; echo "build failed, log in $cache/build.log" >&2; exit 1; }
echo "built in $((SECONDS - t0)) s"

echo "==> artifact $out"
rm -rf "$out"
mkdir -p "$out/sok/sparse_operation_kit/lib"
cp "$src"/sparse_operation_kit/*.py "$out/sok/sparse_operation_kit/"
# SOK's __init__ looks for its libraries in <sys.path entry>/sparse_operation_kit/lib.
for lib in libsparse_operation_kit.so libembedding.so libhugectr_core23.so; do
    strip --strip-unneeded -o "$out/sok/sparse_operation_kit/lib/$lib" "$build/lib/$lib"
done
cp "$src/LICENSE.txt" "$out/sok/"
{
    echo "merlin-sok $sok_version sdist sha256 $(sha256sum "$sdist" | cut -d' ' -f1)"
    echo "tree: $(git -C "$root" rev-parse HEAD) $(git -C "$root" status --porcelain | wc -l) changed files"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $($cuda/bin/nvcc --version | tail -1), sm_90"
    (cd "$out" && find sok -type f | sort | xargs sha256sum)
} >"$out/MANIFEST"
echo "$out: $(du -sm "$out" | cut -f1) MiB"
((($(du -sk "$out" | cut -f1) + 1023) / 1024 <= limit_mib)) || { echo "too large to carry with .device" >&2; exit 1; }
bash "$root/benchmarks/peers/check_sok_libs.sh" "$out" ||
    { echo "check_sok_libs.sh failed: $out is not fit to carry" >&2; exit 1; }
