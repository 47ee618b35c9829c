// gpu::combine_backward_apply: see cc/backward_apply_gpu.h.
#include "cc/backward_apply_gpu.h"

#include <algorithm>

#include "cc/combine_kernels_gpu.h"
#include "cc/optimizers.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// A group of kLanes lanes per unique key (several keys per warp keep more
// independent loads in flight: each key is a chain of dependent reads). The
// sum is combine_backward's reduce_by_key (same expression, same entry
// order); the update is apply_optimizer's update_element, reading the summed
// gradient from this group's shared row.
//   shared memory: (kThreads / kLanes, dim) floats
template <int kLanes>
__global__ void __launch_bounds__(kThreads)
backward_apply_kernel(OptimizerSpec spec, float* rows, int64_t row_width,
                      int64_t* versions, const int64_t* row_ids,
                      const float* grad_out, const int64_t* order,
                      const int64_t* segments, const int64_t* num_unique,
                      const float* weights, const int64_t* entry_bag,
                      const float* bag_scale, Combiner combiner, int64_t dim,
                      int64_t global_step) {
  extern __shared__ float shared_grads[];
  const int lane = threadIdx.x & 31;
  const int rank = lane % kLanes;
  const unsigned mask = (kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1))
                        << (lane - rank);
  float* grad = shared_grads + (threadIdx.x / kLanes) * dim;
  const float adam_lr = adam_learning_rate(spec);
  const int64_t count = *num_unique;
  for (int64_t u = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes;
       u < count; u += (int64_t(gridDim.x) * blockDim.x) / kLanes) {
    const int64_t lo = segments[u], hi = segments[u + 1];
    const int64_t row_id = row_ids[u];
    for (int64_t c0 = 0; c0 < dim; c0 += kLanes * 8) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = lo; k < hi; ++k) {
        const int64_t j = order[k];
        const int64_t bag = entry_bag[j];
        const float w = weights != nullptr ? weights[j] : 1.0f;
        const float* g = grad_out + bag * dim;
        const float denominator = bag_scale[bag];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t c = c0 + e * kLanes + rank;
          if (c < dim) {
            acc[e] += combiner == Combiner::kSum ? w * g[c] : w * g[c] / denominator;
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t c = c0 + e * kLanes + rank;
        if (c < dim) grad[c] = acc[e];
      }
    }
    __syncwarp(mask);
    float* row = rows + row_id * row_width;
    for (int64_t c = rank; c < dim; c += kLanes) {
      update_element(spec, row, grad, c, dim, adam_lr);
    }
    if (rank == 0) versions[row_id] = global_step;
    __syncwarp(mask);  // the shared row is rewritten by the next key
  }
}

}  // namespace

template <typename Key>
Status combine_backward_apply(const GpuContext& context, HashTable<Key>& table,
                              const OptimizerSpec& spec, const float* grad_out,
                              const float* weights, const int64_t* row_offsets,
                              int64_t batch, int64_t nnz, Combiner combiner,
                              const int64_t* order, const int64_t* segments,
                              const int64_t* num_unique, int64_t max_unique,
                              const int64_t* row_ids, int64_t global_step) {
  if (max_unique <= 0 || batch <= 0) return Status::Ok();
  cudaStream_t stream = stream_of(context);
  ScratchBuffer entry_bag(context, std::max<int64_t>(nnz, 1) * sizeof(int64_t));
  ScratchBuffer bag_scale(context, batch * sizeof(float));
  if (!entry_bag.ok() || !bag_scale.ok()) {
    return Status::Internal("combine_backward_apply: out of device memory");
  }
  bag_scale_kernel<int64_t><<<grid_for(batch, kThreads), kThreads, 0, stream>>>(
      weights, row_offsets, batch, combiner, entry_bag.as<int64_t>(),
      bag_scale.as<float>());
  SOK_EV_LAUNCH_CHECK("bag_scale");
  const TableView<Key> view = table.view();
  // 8 lanes a key up to dim 256 (shared rows: 32 x 1 KB), a warp beyond.
  const bool narrow = view.dim <= 256;
  const int lanes = narrow ? 8 : 32;
  const size_t shared = (kThreads / lanes) * view.dim * sizeof(float);
  const unsigned blocks = grid_for(max_unique * lanes, kThreads);
#define SOK_EV_BACKWARD_APPLY(kLanes)                                          \
  backward_apply_kernel<kLanes><<<blocks, kThreads, shared, stream>>>(         \
      spec, view.rows, view.row_width, view.versions, row_ids, grad_out, order, \
      segments, num_unique, weights, entry_bag.as<int64_t>(),                  \
      bag_scale.as<float>(), combiner, view.dim, global_step)
  if (narrow) {
    SOK_EV_BACKWARD_APPLY(8);
  } else {
    SOK_EV_BACKWARD_APPLY(32);
  }
#undef SOK_EV_BACKWARD_APPLY
  SOK_EV_LAUNCH_CHECK("backward_apply");
  return Status::Ok();
}

template Status combine_backward_apply<int32_t>(
    const GpuContext&, HashTable<int32_t>&, const OptimizerSpec&, const float*,
    const float*, const int64_t*, int64_t, int64_t, Combiner, const int64_t*,
    const int64_t*, const int64_t*, int64_t, const int64_t*, int64_t);
template Status combine_backward_apply<int64_t>(
    const GpuContext&, HashTable<int64_t>&, const OptimizerSpec&, const float*,
    const float*, const int64_t*, int64_t, int64_t, Combiner, const int64_t*,
    const int64_t*, const int64_t*, int64_t, const int64_t*, int64_t);

}  // namespace gpu
}  // namespace sok_ev
