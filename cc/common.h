// Types shared by every stage of the framework-neutral core.
//
// The core never includes TensorFlow, Horovod or CUDA runtime headers in its
// public headers: a framework layer (the TF op kernels in sok_ev/cc/, the GPU
// harness in cc/gpu_harness/) adapts its own tensors, thread pool and stream
// to the plain pointers and contexts declared here.
#ifndef SOK_EV_CC_COMMON_H_
#define SOK_EV_CC_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#if defined(__CUDACC__)
#define SOK_EV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SOK_EV_HOST_DEVICE inline
#endif

// Marks the CPU core's hot row loops: besides the baseline x86-64 code, GCC
// builds an AVX2 clone that the loader picks on CPUs that have AVX2 (an
// ifunc), so the wheel still runs on any x86-64. Neither clone uses FMA
// (-ffp-contract=off), so both give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define SOK_EV_ROW_LOOPS __attribute__((target_clones("avx2", "default")))
#else
#define SOK_EV_ROW_LOOPS
#endif

namespace sok_ev {

// Result of a core call. The framework layer turns a failed Status into its
// own error (tensorflow::errors::InvalidArgument in the op kernels).
struct Status {
  enum class Code { kOk = 0, kInvalidArgument = 1, kInternal = 2, kResourceExhausted = 3 };
  Code code = Code::kOk;
  std::string message;

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status{Code::kInvalidArgument, std::move(msg)};
  }
  static Status Internal(std::string msg) { return Status{Code::kInternal, std::move(msg)}; }
  // Memory the system would not give.
  static Status ResourceExhausted(std::string msg) {
    return Status{Code::kResourceExhausted, std::move(msg)};
  }
  bool ok() const { return code == Code::kOk; }
};

// How the embeddings of one sample's keys are reduced to one vector; the
// same meaning as tf.nn.embedding_lookup_sparse's `combiner`.
enum class Combiner : int32_t {
  kSum = 0,    // sum_j w_j * v_j
  kMean = 1,   // sum_j w_j * v_j / sum_j w_j
  kSqrtn = 2,  // sum_j w_j * v_j / sqrt(sum_j w_j^2)
};

// CPU execution context: how a core function spreads a batch over threads.
// parallel_for(total, cost_per_unit, work) must call work(begin, end) over
// disjoint ranges that together cover [0, total). The TF layer passes
// TF's intra-op thread pool; tests may pass a serial loop.
struct CpuContext {
  using Work = std::function<void(int64_t begin, int64_t end)>;
  std::function<void(int64_t total, int64_t cost_per_unit, const Work& work)> parallel_for;
  // Threads parallel_for may spread over (1: it runs every range in turn on
  // the calling thread), so a core function can size its units of work.
  int parallelism = 1;

  // A context that runs every range on the calling thread.
  static CpuContext Serial() {
    CpuContext context;
    context.parallel_for = [](int64_t total, int64_t, const Work& work) {
      if (total > 0) work(0, total);
    };
    return context;
  }
};

// Device memory the GPU core borrows for scratch space. The framework layer
// supplies its own allocator (TF's, PyTorch's caching allocator, cudaMalloc).
struct DeviceAllocator {
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* pointer) = 0;
};

// GPU execution context. `stream` is a cudaStream_t kept opaque so that this
// header compiles without the CUDA toolkit.
struct GpuContext {
  void* stream = nullptr;
  DeviceAllocator* allocator = nullptr;
  // Set while the work runs on a stream beside the framework's own (a
  // multi-table op's side stream, sok_ev/cc/kernels/side_streams_gpu.h). The
  // framework's allocator orders reuse on that home stream only, so memory
  // handed out may still be read or written there: the core orders a new
  // buffer's first use after the home stream (gpu::order_after_home) and
  // frees a buffer only once the side stream's work on it is done.
  void* home_stream = nullptr;
  // Threads for the core's host-side work (the host tier of a tiered
  // table); null: the calling thread alone.
  const CpuContext* host = nullptr;
};

// Whole rows of stored keys, as a table exports them (host memory, valid
// while the callback that receives them runs).
template <typename Key>
struct RowBatch {
  const Key* keys;             // (count,)
  const float* rows;           // (count, row_width)
  const int64_t* frequencies;  // (count,)
  const int64_t* versions;     // (count,)
  int64_t count;
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_COMMON_H_
