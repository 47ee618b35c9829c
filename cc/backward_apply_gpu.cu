// gpu::combine_backward_apply: see cc/backward_apply_gpu.h.
#include <algorithm>
#include <cstdint>

#include "cc/backward_apply_gpu.h"
#include "cc/optimizers.h"
#include "cc/segment_sum_gpu.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// A group of kLanes lanes per unique key (several keys per warp keep more
// independent loads in flight). The gradient is combine_backward's
// (key_gradient: the same sums); the update is update_element
// (cc/optimizers.h), reading the gradient from this group's shared row.
//   shared memory: (kThreads / kLanes, dim) floats
template <int kLanes>
__global__ void __launch_bounds__(kThreads)
    backward_apply_kernel(OptimizerSpec spec, float* rows, int64_t row_width, int64_t* versions,
                          const int64_t* row_ids, SegmentGradients gradients,
                          const int64_t* num_unique, int64_t max_unique, int64_t global_step) {
  extern __shared__ float shared_grads[];
  const int lane = threadIdx.x & 31;
  const int rank = lane % kLanes;
  const unsigned mask = (kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1)) << (lane - rank);
  const int64_t dim = gradients.dim;
  float* grad = shared_grads + (threadIdx.x / kLanes) * dim;
  const float adam_lr = adam_learning_rate(spec);
  const int64_t count = num_unique != nullptr ? *num_unique : max_unique;
  for (int64_t u = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes; u < count;
       u += (int64_t(gridDim.x) * blockDim.x) / kLanes) {
    const int64_t row_id = row_ids[u];
    for (int64_t c0 = 0; c0 < dim; c0 += kLanes * 8) {
      float acc[8];
      key_gradient<kLanes>(gradients, u, c0, rank, acc);
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

// dim % 4 == 0, dim <= 32 * kCount (<= 256): 8 lanes a key, lane `rank`
// owns the float4 columns (v * 8 + rank) * 4, v < kCount. The row's value
// and its kSlots optimizer slots are loaded as soon as row_ids[u] is known,
// in parallel with the gradient's; the gradient stays in registers;
// the update is update_element itself on a 4-float register row (slots at
// 1, 2, 3), so the arithmetic and its bits are the generic kernel's.
template <int kCount, int kSlots, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    backward_apply_vec_kernel(OptimizerSpec spec, float* rows, int64_t row_width, int64_t* versions,
                              const int64_t* row_ids, SegmentGradients gradients,
                              const int64_t* num_unique, int64_t max_unique, int64_t global_step) {
  constexpr int kLanes = 8;
  const int64_t dim = gradients.dim;
  const int rank = threadIdx.x & (kLanes - 1);
  const float adam_lr = adam_learning_rate(spec);
  OptimizerSpec local = spec;  // a register row: value, then slots 0..2
  local.slot_index[0] = 0;
  local.slot_index[1] = 1;
  local.slot_index[2] = 2;
  int64_t slot_offset[kSlots > 0 ? kSlots : 1];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) slot_offset[s] = (1 + spec.slot_index[s]) * dim;
  const int64_t count = num_unique != nullptr ? *num_unique : max_unique;
  for (int64_t u = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes; u < count;
       u += (int64_t(gridDim.x) * blockDim.x) / kLanes) {
    const int64_t row_id = row_ids[u];
    float* row = rows + row_id * row_width;
    float4 value[kCount];
    float4 slot[kSlots > 0 ? kSlots : 1][kCount];
    float4 acc[kCount];
#pragma unroll
    for (int v = 0; v < kCount; ++v) {
      const int64_t c = (v * kLanes + rank) * 4;
      if (c < dim) {
        value[v] = *reinterpret_cast<const float4*>(row + c);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          slot[s][v] = *reinterpret_cast<const float4*>(row + slot_offset[s] + c);
        }
      }
    }
    key_gradient_vec<kCount>(gradients, u, rank, acc);
#pragma unroll
    for (int v = 0; v < kCount; ++v) {
      const int64_t c = (v * kLanes + rank) * 4;
      if (c < dim) {
        float* vp = &value[v].x;
        const float* ap = &acc[v].x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float r[4] = {vp[e], 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int s = 0; s < kSlots; ++s) r[1 + s] = (&slot[s][v].x)[e];
          const float g = ap[e];
          update_element(local, r, &g, 0, 1, adam_lr);
          vp[e] = r[0];
#pragma unroll
          for (int s = 0; s < kSlots; ++s) (&slot[s][v].x)[e] = r[1 + s];
        }
        *reinterpret_cast<float4*>(row + c) = value[v];
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          *reinterpret_cast<float4*>(row + slot_offset[s] + c) = slot[s][v];
        }
      }
    }
    if (rank == 0) versions[row_id] = global_step;
  }
}

}  // namespace

template <typename Key>
Status combine_backward_apply(const GpuContext& context, HashTable<Key>& table,
                              const OptimizerSpec& spec, const float* grad_out,
                              const float* weights, const int64_t* row_offsets, int64_t batch,
                              int64_t nnz, Combiner combiner, const int64_t* order,
                              const int64_t* segments, const int64_t* num_unique,
                              int64_t max_unique, int64_t max_key_entries, const int64_t* row_ids,
                              int64_t global_step) {
  if (max_unique <= 0 || batch <= 0) return Status::Ok();
  cudaStream_t stream = stream_of(context);
  SegmentGradientSums sums;
  SOK_EV_RETURN_IF_ERROR(sums.prepare(context, grad_out, weights, row_offsets, batch, nnz, combiner,
                                      order, segments, num_unique, max_unique, max_key_entries,
                                      table.dim(), /*sums=*/nullptr));
  const SegmentGradients& gradients = sums.view();
  const TableView<Key> view = table.view();
  const int used_slots = num_slots(spec.kind, spec.centered);
  const bool aligned = reinterpret_cast<uintptr_t>(grad_out) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(view.rows) % 16 == 0 && view.row_width % 4 == 0;
  if (view.dim % 4 == 0 && view.dim <= 256 && aligned && used_slots <= 3) {
    const unsigned blocks = grid_for(max_unique * 8, kThreads);
    // Latency-bound: cap registers so that more keys are in flight (4 blocks
    // an SM = 64 registers where the row fits; 1.94 vs 2.33 ms at 92). Dim
    // 128 with one slot (Adagrad) spills at 64 registers (56 bytes) but
    // hardly at 80 (24 bytes; 108 uncapped, clang, 2026-11-23): 3 blocks;
    // wider rows: 2, or 1.
#define SOK_EV_BACKWARD_APPLY_VEC(kCount, kSlots)                                                \
  backward_apply_vec_kernel<kCount, kSlots,                                                      \
                            (kCount <= 2) ? ((kSlots >= 2) ? 2 : 4)                              \
                                          : ((4 * kCount * (kSlots + 2) <= 48)   ? 3             \
                                             : (4 * kCount * (kSlots + 2) <= 80) ? 2             \
                                                                                 : 1)>           \
      <<<blocks, kThreads, 0, stream>>>(spec, view.rows, view.row_width, view.versions, row_ids, \
                                        gradients, num_unique, max_unique, global_step)
#define SOK_EV_BACKWARD_APPLY_SLOTS(kCount) \
  switch (used_slots) {                     \
    case 0:                                 \
      SOK_EV_BACKWARD_APPLY_VEC(kCount, 0); \
      break;                                \
    case 1:                                 \
      SOK_EV_BACKWARD_APPLY_VEC(kCount, 1); \
      break;                                \
    case 2:                                 \
      SOK_EV_BACKWARD_APPLY_VEC(kCount, 2); \
      break;                                \
    default:                                \
      SOK_EV_BACKWARD_APPLY_VEC(kCount, 3); \
      break;                                \
  }
    if (view.dim <= 32) {
      SOK_EV_BACKWARD_APPLY_SLOTS(1);
    } else if (view.dim <= 64) {
      SOK_EV_BACKWARD_APPLY_SLOTS(2);
    } else if (view.dim <= 128) {
      SOK_EV_BACKWARD_APPLY_SLOTS(4);
    } else {
      SOK_EV_BACKWARD_APPLY_SLOTS(8);
    }
#undef SOK_EV_BACKWARD_APPLY_SLOTS
#undef SOK_EV_BACKWARD_APPLY_VEC
    SOK_EV_LAUNCH_CHECK("backward_apply_vec");
    return Status::Ok();
  }
  // 8 lanes a key up to dim 256 (shared rows: 32 x 1 KB), a warp beyond.
  const bool narrow = view.dim <= 256;
  const int lanes = narrow ? 8 : 32;
  const size_t shared = (kThreads / lanes) * view.dim * sizeof(float);
  const unsigned blocks = grid_for(max_unique * lanes, kThreads);
#define SOK_EV_BACKWARD_APPLY(kLanes)                                                             \
  backward_apply_kernel<kLanes><<<blocks, kThreads, shared, stream>>>(                            \
      spec, view.rows, view.row_width, view.versions, row_ids, gradients, num_unique, max_unique, \
      global_step)
  if (narrow) {
    SOK_EV_BACKWARD_APPLY(8);
  } else {
    SOK_EV_BACKWARD_APPLY(32);
  }
#undef SOK_EV_BACKWARD_APPLY
  SOK_EV_LAUNCH_CHECK("backward_apply");
  return Status::Ok();
}

template Status combine_backward_apply<int32_t>(const GpuContext&, HashTable<int32_t>&,
                                                const OptimizerSpec&, const float*, const float*,
                                                const int64_t*, int64_t, int64_t, Combiner,
                                                const int64_t*, const int64_t*, const int64_t*,
                                                int64_t, int64_t, const int64_t*, int64_t);
template Status combine_backward_apply<int64_t>(const GpuContext&, HashTable<int64_t>&,
                                                const OptimizerSpec&, const float*, const float*,
                                                const int64_t*, int64_t, int64_t, Combiner,
                                                const int64_t*, const int64_t*, const int64_t*,
                                                int64_t, int64_t, const int64_t*, int64_t);

}  // namespace gpu
}  // namespace sok_ev
