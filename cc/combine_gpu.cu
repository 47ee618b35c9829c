// gpu::row_offsets_from_sample_ids, gpu::combine_forward and
// gpu::combine_backward (cc/combine.h).
#include <cub/device/device_radix_sort.cuh>

#include "cc/combine.h"
#include "cc/combine_kernels_gpu.h"
#include "cc/lower_bound_gpu.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Rows of a (num_unique, dim) matrix picked by unique_index.
struct UniqueValuesSource {
  const float* unique_values;   // (num_unique, dim)
  const int64_t* unique_index;  // (nnz,)
  int64_t dim;
  __device__ __forceinline__ int64_t resolve(int64_t entry) const { return unique_index[entry]; }
  __device__ __forceinline__ const float* row(int64_t handle) const {
    return unique_values + handle * dim;
  }
};

//   sample_ids: (nnz,) non-decreasing  row_offsets: (batch + 1,) out
__global__ void row_offsets_kernel(const int64_t* sample_ids, int64_t nnz, int64_t batch,
                                   int64_t* row_offsets) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b <= batch;
       b += int64_t(gridDim.x) * blockDim.x) {
    row_offsets[b] = lower_bound(sample_ids, nnz, b);
  }
}

__global__ void iota_kernel(int64_t* values, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    values[i] = i;
  }
}

// Warp per unique key: sums its entries' gradients in entry order (the sort
// is stable), so the result does not depend on scheduling.
//   sorted_index: (nnz,) unique ids, non-decreasing; entries: (nnz,)
//   grad_unique: (num_unique, dim) out
__global__ void reduce_by_key_kernel(const float* grad_out, const int64_t* sorted_index,
                                     const int64_t* entries, int64_t nnz, const float* weights,
                                     const int64_t* entry_bag, const float* bag_scale,
                                     Combiner combiner, int64_t dim, int64_t num_unique,
                                     float* grad_unique) {
  const int lane = threadIdx.x & 31;
  for (int64_t u = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; u < num_unique;
       u += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t lo = lower_bound(sorted_index, nnz, u);
    float* destination = grad_unique + u * dim;
    for (int64_t c0 = 0; c0 < dim; c0 += 32 * 8) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = lo; k < nnz && sorted_index[k] == u; ++k) {
        const int64_t j = entries[k];
        const int64_t bag = entry_bag[j];
        const float w = weights != nullptr ? weights[j] : 1.0f;
        const float* g = grad_out + bag * dim;
        const float denominator = bag_scale[bag];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t c = c0 + e * 32 + lane;
          if (c < dim) {
            acc[e] += combiner == Combiner::kSum ? w * g[c] : w * g[c] / denominator;
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t c = c0 + e * 32 + lane;
        if (c < dim) destination[c] = acc[e];
      }
    }
  }
}

int bits_for(int64_t values) {
  int bits = 1;
  while ((int64_t{1} << bits) < values) ++bits;
  return bits;
}

Status combine_backward_impl(const GpuContext& context, const float* grad_out,
                             const int64_t* unique_index, const float* weights,
                             const int64_t* row_offsets, int64_t batch, int64_t dim,
                             Combiner combiner, int64_t num_unique, float* grad_unique) {
  cudaStream_t stream = stream_of(context);
  if (num_unique <= 0) return Status::Ok();
  int64_t nnz = 0;
  // nnz = row_offsets[batch], read back: the scratch sizes depend on it.
  SOK_EV_CUDA_RETURN(
      cudaMemcpyAsync(&nnz, row_offsets + batch, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  SOK_EV_CUDA_RETURN(cudaStreamSynchronize(stream));
  const int64_t entries_n = std::max<int64_t>(nnz, 1);
  ScratchBuffer entry_bag(context, entries_n * sizeof(int64_t));
  ScratchBuffer bag_scale(context, std::max<int64_t>(batch, 1) * sizeof(float));
  ScratchBuffer entries_in(context, entries_n * sizeof(int64_t));
  ScratchBuffer entries(context, entries_n * sizeof(int64_t));
  ScratchBuffer sorted_index(context, entries_n * sizeof(int64_t));
  if (!entry_bag.ok() || !bag_scale.ok() || !entries_in.ok() || !entries.ok() ||
      !sorted_index.ok()) {
    return Status::Internal("combine_backward: out of device memory");
  }
  if (batch > 0) {
    bag_scale_kernel<int64_t><<<grid_for(batch, kThreads), kThreads, 0, stream>>>(
        weights, row_offsets, batch, combiner, entry_bag.as<int64_t>(), bag_scale.as<float>());
    SOK_EV_LAUNCH_CHECK("bag_scale");
  }
  if (nnz > 0) {
    iota_kernel<<<grid_for(nnz, kThreads), kThreads, 0, stream>>>(entries_in.as<int64_t>(), nnz);
    SOK_EV_LAUNCH_CHECK("iota");
    size_t sort_bytes = 0;
    const int end_bit = bits_for(num_unique);
    SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, unique_index, sorted_index.as<int64_t>(), entries_in.as<int64_t>(),
        entries.as<int64_t>(), nnz, 0, end_bit, stream));
    ScratchBuffer temp(context, sort_bytes);
    if (!temp.ok()) return Status::Internal("combine_backward: out of device memory");
    SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        temp.get(), sort_bytes, unique_index, sorted_index.as<int64_t>(), entries_in.as<int64_t>(),
        entries.as<int64_t>(), nnz, 0, end_bit, stream));
  }
  reduce_by_key_kernel<<<grid_for(num_unique * 32, kThreads), kThreads, 0, stream>>>(
      grad_out, sorted_index.as<int64_t>(), entries.as<int64_t>(), nnz, weights,
      entry_bag.as<int64_t>(), bag_scale.as<float>(), combiner, dim, num_unique, grad_unique);
  SOK_EV_LAUNCH_CHECK("reduce_by_key");
  return Status::Ok();
}

}  // namespace

void row_offsets_from_sample_ids(const GpuContext& context, const int64_t* sample_ids, int64_t nnz,
                                 int64_t batch, int64_t* row_offsets) {
  cudaStream_t stream = stream_of(context);
  row_offsets_kernel<<<grid_for(batch + 1, kThreads), kThreads, 0, stream>>>(sample_ids, nnz, batch,
                                                                             row_offsets);
  record_error(cuda_status(cudaGetLastError(), "row_offsets_from_sample_ids"));
}

void combine_forward(const GpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out) {
  if (dim < 1 || dim > 1024) {
    record_error(Status::InvalidArgument("combine_forward: dim must be in [1, 1024]"));
    return;
  }
  UniqueValuesSource source{unique_values, unique_index, dim};
  record_error(cuda_status(launch_combine_rows(source, weights, row_offsets, batch, dim, combiner,
                                               out, stream_of(context)),
                           "combine_forward"));
}

void combine_backward(const GpuContext& context, const float* grad_out, const int64_t* unique_index,
                      const float* weights, const int64_t* row_offsets, int64_t batch, int64_t dim,
                      Combiner combiner, int64_t num_unique, float* grad_unique) {
  record_error(combine_backward_impl(context, grad_out, unique_index, weights, row_offsets, batch,
                                     dim, combiner, num_unique, grad_unique));
}

}  // namespace gpu
}  // namespace sok_ev
