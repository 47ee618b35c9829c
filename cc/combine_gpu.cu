// gpu::row_offsets_from_sample_ids, gpu::combine_forward and
// gpu::combine_backward (cc/combine.h).
#include <algorithm>
#include <cstdint>

#include "cc/combine.h"
#include "cc/combine_kernels_gpu.h"
#include "cc/lower_bound_gpu.h"
#include "cc/segment_sum_gpu.h"
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

// Sample ids of up to kTablesPerLaunch tables, by value (4 KB limit).
constexpr int kTablesPerLaunch = 64;
struct SampleIdTables {
  SampleIds tables[kTablesPerLaunch];
};

// blockIdx.y picks the table. Thread j checks entry j and writes row
// offset j. first_invalid[t] starts at nnz and takes the smallest bad entry
// (atomicMin: the answer does not depend on scheduling).
__global__ void row_offsets_kernel(SampleIdTables tables, int64_t* first_invalid) {
  const SampleIds table = tables.tables[blockIdx.y];
  const int64_t stride = table.stride;
  const int64_t end = table.nnz > table.batch ? table.nnz : table.batch + 1;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < end;
       j += int64_t(gridDim.x) * blockDim.x) {
    if (first_invalid != nullptr && j < table.nnz) {
      const int64_t id = table.sample_ids[j * stride];
      if (id < 0 || id >= table.batch || (j > 0 && id < table.sample_ids[(j - 1) * stride])) {
        atomicMin(reinterpret_cast<unsigned long long*>(first_invalid + blockIdx.y),
                  static_cast<unsigned long long>(j));
      }
    }
    if (table.row_offsets != nullptr && j <= table.batch) {
      table.row_offsets[j] = lower_bound(table.sample_ids, table.nnz, j, stride);
    }
  }
}

__global__ void fill_kernel(int64_t* values, const SampleIdTables tables, int count) {
  for (int t = threadIdx.x; t < count; t += blockDim.x) values[t] = tables.tables[t].nnz;
}

// kLanes lanes per unique key, 8 columns a lane per pass over the row.
//   grad_unique: (num_unique, dim) out
template <int kLanes>
__global__ void __launch_bounds__(kThreads)
    segment_sum_kernel(SegmentGradients s, int64_t num_unique, float* grad_unique) {
  const int rank = threadIdx.x % kLanes;
  for (int64_t u = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes; u < num_unique;
       u += (int64_t(gridDim.x) * blockDim.x) / kLanes) {
    float* destination = grad_unique + u * s.dim;
    for (int64_t c0 = 0; c0 < s.dim; c0 += kLanes * 8) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      accumulate_key<kLanes>(s, u, c0, rank, acc);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t c = c0 + e * kLanes + rank;
        if (c < s.dim) destination[c] = acc[e];
      }
    }
  }
}

// segment_sum_kernel with 16-byte loads and stores (dim % 4 == 0, dim <=
// 32 * kCount, aligned rows): 8 lanes a key.
template <int kCount>
__global__ void __launch_bounds__(kThreads)
    segment_sum_vec_kernel(SegmentGradients s, int64_t num_unique, float* grad_unique) {
  const int rank = threadIdx.x & 7;
  for (int64_t u = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 8; u < num_unique;
       u += (int64_t(gridDim.x) * blockDim.x) / 8) {
    float4 acc[kCount];
#pragma unroll
    for (int v = 0; v < kCount; ++v) acc[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    accumulate_key_vec<kCount>(s, u, rank, acc);
    float* destination = grad_unique + u * s.dim;
#pragma unroll
    for (int v = 0; v < kCount; ++v) {
      const int64_t c = (v * 8 + rank) * 4;
      if (c < s.dim) *reinterpret_cast<float4*>(destination + c) = acc[v];
    }
  }
}

Status combine_backward_impl(const GpuContext& context, const float* grad_out, const int64_t* order,
                             const int64_t* segments, int64_t num_unique, const float* weights,
                             const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                             Combiner combiner, float* grad_unique) {
  if (num_unique <= 0) return Status::Ok();
  if (dim < 1) return Status::InvalidArgument("combine_backward: dim must be >= 1");
  cudaStream_t stream = stream_of(context);
  SegmentGradientSums sums;
  SOK_EV_RETURN_IF_ERROR(sums.prepare(context, grad_out, weights, row_offsets, batch, nnz, combiner,
                                      order, segments, /*num_unique=*/nullptr, num_unique,
                                      /*max_key_entries=*/nnz, dim));
  const SegmentGradients& s = sums.view();
  const bool aligned = reinterpret_cast<uintptr_t>(grad_out) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(grad_unique) % 16 == 0;
  const unsigned blocks = grid_for(num_unique * 8, kThreads);
  if (dim % 4 == 0 && dim <= 256 && aligned) {
    if (dim <= 32) {
      segment_sum_vec_kernel<1><<<blocks, kThreads, 0, stream>>>(s, num_unique, grad_unique);
    } else if (dim <= 64) {
      segment_sum_vec_kernel<2><<<blocks, kThreads, 0, stream>>>(s, num_unique, grad_unique);
    } else if (dim <= 128) {
      segment_sum_vec_kernel<4><<<blocks, kThreads, 0, stream>>>(s, num_unique, grad_unique);
    } else {
      segment_sum_vec_kernel<8><<<blocks, kThreads, 0, stream>>>(s, num_unique, grad_unique);
    }
  } else {
    segment_sum_kernel<8><<<blocks, kThreads, 0, stream>>>(s, num_unique, grad_unique);
  }
  SOK_EV_LAUNCH_CHECK("segment_sum");
  return Status::Ok();
}

}  // namespace

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

void row_offsets_from_sample_ids(const GpuContext& context, const SampleIds* tables, int num_tables,
                                 int64_t* first_invalid) {
  cudaStream_t stream = stream_of(context);
  for (int first = 0; first < num_tables; first += kTablesPerLaunch) {
    const int count = std::min(kTablesPerLaunch, num_tables - first);
    SampleIdTables batch;
    int64_t longest = 1;
    for (int t = 0; t < count; ++t) {
      batch.tables[t] = tables[first + t];
      longest = std::max({longest, batch.tables[t].nnz, batch.tables[t].batch + 1});
    }
    int64_t* answers = first_invalid == nullptr ? nullptr : first_invalid + first;
    if (answers != nullptr) fill_kernel<<<1, kThreads, 0, stream>>>(answers, batch, count);
    row_offsets_kernel<<<dim3(grid_for(longest, kThreads, 4096), count), kThreads, 0, stream>>>(
        batch, answers);
    const Status status = cuda_status(cudaGetLastError(), "row_offsets_from_sample_ids");
    if (!status.ok()) {
      record_error(status);
      return;
    }
  }
}

void combine_backward(const GpuContext& context, const float* grad_out, const int64_t* order,
                      const int64_t* segments, int64_t num_unique, const float* weights,
                      const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                      Combiner combiner, float* grad_unique) {
  record_error(combine_backward_impl(context, grad_out, order, segments, num_unique, weights,
                                     row_offsets, batch, nnz, dim, combiner, grad_unique));
}

}  // namespace gpu
}  // namespace sok_ev
