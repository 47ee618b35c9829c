// CUDA error handling and scratch memory shared by the GPU core (.cu only).
//
// The gpu:: free functions declared in the shared headers return void, so a
// failure inside them is recorded per host thread and read back with
// gpu::take_last_error(); the hash table's methods return Status directly.
#ifndef SOK_EV_CC_STATUS_GPU_H_
#define SOK_EV_CC_STATUS_GPU_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/common.h"

namespace sok_ev {
namespace gpu {

// The first error recorded on this host thread since the last call, then
// cleared. Ok when every gpu:: call since then succeeded.
Status take_last_error();
// Records `status` unless an earlier error is still pending.
void record_error(const Status& status);

inline Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(error));
}

inline cudaStream_t stream_of(const GpuContext& context) {
  return static_cast<cudaStream_t>(context.stream);
}

// Waits for the stream: every host synchronisation of the GPU core goes
// through here, so that benchmarks can count them (host_syncs()).
Status synchronize(cudaStream_t stream);
// Number of synchronize() calls in this process so far.
int64_t host_syncs();

// On a side stream (context.home_stream set), the stream waits for the work
// queued on the home stream so far; nothing otherwise. Called after a fresh
// allocation, before its first use.
Status order_after_home(const GpuContext& context);

// Scratch device memory from the context's allocator, stream-ordered
// cudaMallocAsync when the context has none. Freed when it goes out of scope
// (the allocators we accept are stream-ordered, so queued kernels stay safe).
class ScratchBuffer {
 public:
  ScratchBuffer(const GpuContext& context, size_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* get() const { return pointer_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(pointer_);
  }
  bool ok() const { return bytes_ == 0 || pointer_ != nullptr; }

 private:
  GpuContext context_;
  size_t bytes_;
  void* pointer_ = nullptr;
};

// Grid size for a grid-stride loop over n items.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 1 << 20) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned>(blocks);
}

}  // namespace gpu
}  // namespace sok_ev

// Returns the Status of a failed CUDA call from the enclosing function.
#define SOK_EV_CUDA_RETURN(expr)                                                               \
  do {                                                                                         \
    cudaError_t sok_ev_error_ = (expr);                                                        \
    if (sok_ev_error_ != cudaSuccess) return ::sok_ev::gpu::cuda_status(sok_ev_error_, #expr); \
  } while (0)

#define SOK_EV_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::sok_ev::Status sok_ev_status_ = (expr);        \
    if (!sok_ev_status_.ok()) return sok_ev_status_; \
  } while (0)

// Checks the launch just made (configuration errors, earlier async faults).
#define SOK_EV_LAUNCH_CHECK(what) SOK_EV_CUDA_RETURN(cudaGetLastError())

#endif  // SOK_EV_CC_STATUS_GPU_H_
