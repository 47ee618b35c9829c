// gpu::batched_copy: see cc/batched_copy_gpu.h.
#include <algorithm>

#include "cc/batched_copy_gpu.h"
#include "cc/status_gpu.h"
#include "cc/table_launch_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// blockIdx.y picks the job; the x blocks stride over its elements.
template <typename T>
__global__ void batched_copy_kernel(LaunchTables<CopyJob<T>> jobs) {
  const CopyJob<T> job = jobs.at[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < job.count;
       i += int64_t(gridDim.x) * blockDim.x) {
    job.dst[i] = job.src[i] - job.shift;
  }
}

// Host values carried by a launch (4 KB parameter limit).
constexpr int kValuesPerLaunch = 256;
struct Values {
  int64_t values[kValuesPerLaunch];
};

__global__ void upload_values_kernel(Values values, int count, int64_t* dst) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) dst[i] = values.values[i];
}

}  // namespace

void upload_values(const GpuContext& context, const std::vector<int64_t>& values, int64_t* dst) {
  for (size_t first = 0; first < values.size(); first += kValuesPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kValuesPerLaunch, values.size() - first));
    Values batch;
    std::copy(values.begin() + first, values.begin() + first + count, batch.values);
    upload_values_kernel<<<1, kThreads, 0, stream_of(context)>>>(batch, count, dst + first);
    const Status status = cuda_status(cudaGetLastError(), "upload_values");
    if (!status.ok()) {
      record_error(status);
      return;
    }
  }
}

template <typename T>
void batched_copy(const GpuContext& context, const std::vector<CopyJob<T>>& jobs) {
  record_error(launch_by_table(
      jobs.data(), jobs.size(), [](const CopyJob<T>& job) { return job.count; },
      [&](const LaunchTables<CopyJob<T>>& batch, int /*first*/, int count, int64_t longest) {
        const dim3 grid(grid_for(longest, kThreads, 4096), count);
        batched_copy_kernel<T><<<grid, kThreads, 0, stream_of(context)>>>(batch);
      },
      "batched_copy"));
}

template void batched_copy<int32_t>(const GpuContext&, const std::vector<CopyJob<int32_t>>&);
template void batched_copy<int64_t>(const GpuContext&, const std::vector<CopyJob<int64_t>>&);

}  // namespace gpu
}  // namespace sok_ev
