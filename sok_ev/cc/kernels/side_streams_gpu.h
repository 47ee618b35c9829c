// Streams beside TensorFlow's compute stream, on which a multi-table GPU op
// runs its tables side by side (ForEachTable in device_core_gpu.h). One
// table's stages are small, latency-bound kernels (a one-hot Criteo table's
// combine fills a quarter of an H200); queued one table after another on
// one stream they leave the GPU mostly idle, side by side they fill it.
//
// TF's allocator orders the reuse of freed memory on the compute stream (the
// home stream) only, so work on a side stream keeps to three rules:
//   - it starts after the home stream's work queued so far (the fork);
//   - memory it gets is used only after the home stream's work queued at the
//     time (gpu::order_after_home), and is released only after the home
//     stream has been made to wait for the side stream (the join);
//   - the home stream waits for every side stream before the op returns, so
//     whatever TF queues next, and whoever takes a table's lock next, comes
//     after.
// Included by device_core_gpu.h only, in GOOGLE_CUDA builds.
#ifndef SOK_EV_CC_KERNELS_SIDE_STREAMS_GPU_H_
#define SOK_EV_CC_KERNELS_SIDE_STREAMS_GPU_H_

#if GOOGLE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/status_gpu.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/lib/core/errors.h"

namespace sok_ev {

// Side streams a multi-table op spreads its tables over:
// SOK_EV_GPU_TABLE_STREAMS, read at each op (1: every table on TF's own
// stream, as before side streams existed). Returns 1..kMaxSideStreams.
constexpr int kDefaultSideStreams = 4;
constexpr int kMaxSideStreams = 16;
inline int SideStreamCount() {
  const char* text = std::getenv("SOK_EV_GPU_TABLE_STREAMS");
  if (text == nullptr || *text == '\0') return kDefaultSideStreams;
  const int count = std::atoi(text);
  return std::clamp(count, 1, kMaxSideStreams);
}

// The first `count` side streams of the current CUDA device (the one TF's
// stream belongs to: our kernels already launch there), created on first use
// and kept for the process. Non-blocking, like TF's streams.
inline absl::Status SideStreams(int count, std::vector<cudaStream_t>* streams) {
  static std::mutex mutex;
  static std::map<int, std::vector<cudaStream_t>> pools;
  int device = 0;
  TF_RETURN_IF_ERROR(ToTfStatus(gpu::cuda_status(cudaGetDevice(&device), "cudaGetDevice")));
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<cudaStream_t>& pool = pools[device];
  while (static_cast<int>(pool.size()) < count) {
    cudaStream_t stream;
    TF_RETURN_IF_ERROR(ToTfStatus(gpu::cuda_status(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a side stream")));
    pool.push_back(stream);
  }
  streams->assign(pool.begin(), pool.begin() + count);
  return absl::OkStatus();
}

// `to` waits for the work queued on `from` so far.
inline absl::Status StreamWaits(cudaStream_t to, cudaStream_t from) {
  GpuContext waiting;
  waiting.stream = to;
  waiting.home_stream = from;
  return ToTfStatus(gpu::order_after_home(waiting));
}

// The scratch memory of one side stream's work: bumped out of chunks of TF's
// allocator, each ordered after the home stream when it is taken, all given
// back at once by the destructor, which runs after the join. Frees are
// no-ops: a buffer's bytes stay reserved until then, so no two tables'
// buffers share memory while either's work may still run.
class SideStreamArena : public DeviceAllocator {
 public:
  SideStreamArena(tensorflow::Allocator* allocator, const GpuContext& side)
      : allocator_(allocator), side_(side) {}
  SideStreamArena(const SideStreamArena&) = delete;
  SideStreamArena& operator=(const SideStreamArena&) = delete;
  ~SideStreamArena() override {
    for (void* chunk : chunks_) allocator_->DeallocateRaw(chunk);
  }

  // Null when out of memory (the core turns that into an error) or when the
  // side stream cannot be ordered after the home stream.
  void* allocate(size_t bytes) override {
    bytes = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    if (used_ + bytes > capacity_) {
      const size_t size = std::max({bytes, kMinChunk, 2 * capacity_});
      void* chunk = allocator_->AllocateRaw(kAlignment, size);
      if (chunk == nullptr) return nullptr;
      chunks_.push_back(chunk);
      if (!gpu::order_after_home(side_).ok()) return nullptr;
      base_ = static_cast<char*>(chunk);
      capacity_ = size;
      used_ = 0;
    }
    void* pointer = base_ + used_;
    used_ += bytes;
    return pointer;
  }
  void deallocate(void*) override {}

 private:
  static constexpr size_t kAlignment = 256;
  static constexpr size_t kMinChunk = size_t{16} << 20;
  tensorflow::Allocator* allocator_;
  GpuContext side_;
  std::vector<void*> chunks_;
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

// Spreads tables over `streams` side streams, heaviest first onto the least
// loaded stream; tables with the same non-null key (their Embedding
// Variable) share one stream, so their work stays in op order.
//   costs, same_stream: (n,) host, same_stream may be null
//   returns (n,) the stream index of each table
inline std::vector<int> AssignSideStreams(int n, const int64_t* costs,
                                          const void* const* same_stream, int streams) {
  std::vector<int> order(n);
  for (int t = 0; t < n; ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(),
                   [costs](int a, int b) { return costs[a] > costs[b]; });
  std::vector<int64_t> load(streams, 0);
  std::map<const void*, int> stream_of_key;
  std::vector<int> assigned(n, 0);
  for (int t : order) {
    const void* key = same_stream != nullptr ? same_stream[t] : nullptr;
    auto found = key != nullptr ? stream_of_key.find(key) : stream_of_key.end();
    int s = 0;
    if (found != stream_of_key.end()) {
      s = found->second;
    } else {
      s = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      if (key != nullptr) stream_of_key[key] = s;
    }
    assigned[t] = s;
    load[s] += std::max<int64_t>(costs[t], 1);
  }
  return assigned;
}

}  // namespace sok_ev

#endif  // GOOGLE_CUDA
#endif  // SOK_EV_CC_KERNELS_SIDE_STREAMS_GPU_H_
