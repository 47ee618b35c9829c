// gpu::apply_optimizer: one thread per (row, column) element, so a warp
// reads and writes contiguous columns of a row.
//
// The arithmetic is update_element() of cc/optimizers.h, shared with the CPU
// twin (the core is built with -fmad=false, so both give identical bits);
// tests/gpu checks the element-parallel kernel against
// apply_optimizer_reference, which runs update_row() one row per thread.
#include "cc/optimizers.h"
#include "cc/optimizers_gpu.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

//   rows: (n,) row pointers  grads: (n, dim)
__global__ void apply_optimizer_kernel(OptimizerSpec spec, float* const* rows, const float* grads,
                                       int64_t n, int64_t dim) {
  const float adam_lr = adam_learning_rate(spec);
  const int64_t total = n * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / dim;
    const int64_t c = e - i * dim;
    update_element(spec, rows[i], grads + i * dim, c, dim, adam_lr);
  }
}

__global__ void apply_optimizer_reference_kernel(OptimizerSpec spec, float* const* rows,
                                                 const float* grads, int64_t n, int64_t dim) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    update_row(spec, rows[i], grads + i * dim, dim);
  }
}

}  // namespace

void apply_optimizer(const GpuContext& context, const OptimizerSpec& spec, float* const* rows,
                     const float* grads, int64_t n, int64_t dim) {
  if (n <= 0) return;
  apply_optimizer_kernel<<<grid_for(n * dim, kThreads), kThreads, 0, stream_of(context)>>>(
      spec, rows, grads, n, dim);
  record_error(cuda_status(cudaGetLastError(), "apply_optimizer"));
}

void apply_optimizer_reference(const GpuContext& context, const OptimizerSpec& spec,
                               float* const* rows, const float* grads, int64_t n, int64_t dim) {
  if (n <= 0) return;
  apply_optimizer_reference_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(context)>>>(
      spec, rows, grads, n, dim);
  record_error(cuda_status(cudaGetLastError(), "apply_optimizer_reference"));
}

}  // namespace gpu
}  // namespace sok_ev
