#include <atomic>

#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {
thread_local Status pending_error;
std::atomic<int64_t> sync_count{0};
}  // namespace

Status synchronize(cudaStream_t stream) {
  sync_count.fetch_add(1, std::memory_order_relaxed);
  return cuda_status(cudaStreamSynchronize(stream), "stream synchronize");
}

int64_t host_syncs() { return sync_count.load(std::memory_order_relaxed); }

Status order_after_home(const GpuContext& context) {
  if (context.home_stream == nullptr) return Status::Ok();
  cudaEvent_t event;
  SOK_EV_CUDA_RETURN(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  // A destroyed event stays valid for the wait already queued on it.
  cudaError_t error = cudaEventRecord(event, static_cast<cudaStream_t>(context.home_stream));
  if (error == cudaSuccess) error = cudaStreamWaitEvent(stream_of(context), event, 0);
  cudaEventDestroy(event);
  return cuda_status(error, "ordering a side stream after its home stream");
}

Status take_last_error() {
  Status result = pending_error;
  pending_error = Status::Ok();
  return result;
}

void record_error(const Status& status) {
  if (!status.ok() && pending_error.ok()) pending_error = status;
}

ScratchBuffer::ScratchBuffer(const GpuContext& context, size_t bytes)
    : context_(context), bytes_(bytes) {
  if (bytes == 0) return;
  if (context.allocator != nullptr) {
    pointer_ = context.allocator->allocate(bytes);
  } else if (cudaMallocAsync(&pointer_, bytes, stream_of(context)) != cudaSuccess) {
    pointer_ = nullptr;
  }
}

ScratchBuffer::~ScratchBuffer() {
  if (pointer_ == nullptr) return;
  if (context_.allocator != nullptr) {
    context_.allocator->deallocate(pointer_);
  } else {
    cudaFreeAsync(pointer_, stream_of(context_));
  }
}

}  // namespace gpu
}  // namespace sok_ev
