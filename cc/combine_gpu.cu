// gpu::row_offsets_from_sample_ids, gpu::combine_forward_tables (from a
// matrix or rows, into a matrix or rows) and gpu::combine_backward_tables
// (each also for one table) (cc/combine.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/combine.h"
#include "cc/combine_kernels_gpu.h"
#include "cc/lower_bound_gpu.h"
#include "cc/segment_sum_gpu.h"
#include "cc/status_gpu.h"
#include "cc/table_launch_gpu.h"

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

// The handle is the row's address itself (positive: device addresses are
// below 2^63), so both loads happen when the warp resolves its window of 32
// entries, none in the loop that reads the rows.
struct UniqueRowsSource {
  const float* const* unique_rows;  // (num_unique,)
  const int64_t* unique_index;      // (nnz,)
  __device__ __forceinline__ int64_t resolve(int64_t entry) const {
    return reinterpret_cast<int64_t>(unique_rows[unique_index[entry]]);
  }
  __device__ __forceinline__ const float* row(int64_t handle) const {
    return reinterpret_cast<const float*>(handle);
  }
};

// blockIdx.y picks the table. Thread j checks entry j and writes row
// offset j. first_invalid[t] starts at nnz and takes the smallest bad entry
// (atomicMin: the answer does not depend on scheduling). Null sample ids:
// entry j is sample j, always valid, and the samples past the last entry are
// empty (an empty SparseTensor's indices are null too).
__global__ void row_offsets_kernel(LaunchTables<SampleIds> tables, int64_t* first_invalid) {
  const SampleIds table = tables.at[blockIdx.y];
  const int64_t stride = table.stride;
  const int64_t end = table.nnz > table.batch ? table.nnz : table.batch + 1;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < end;
       j += int64_t(gridDim.x) * blockDim.x) {
    if (table.row_splits != nullptr) {
      if (j > table.batch) continue;
      const int64_t split = table.row_splits[j];
      const bool bad = (j == 0 && split != table.first_entry) ||
                       (j > 0 && split < table.row_splits[j - 1]) ||
                       (j == table.batch && split != table.first_entry + table.nnz);
      // Every bad sample stores the same value: the race is benign.
      if (bad && first_invalid != nullptr) first_invalid[blockIdx.y] = table.nnz + 1;
      if (table.row_offsets != nullptr) table.row_offsets[j] = split - table.first_entry;
      continue;
    }
    if (table.sample_ids == nullptr) {
      if (table.row_offsets != nullptr && j <= table.batch) {
        table.row_offsets[j] = j < table.nnz ? j : table.nnz;
      }
      continue;
    }
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

__global__ void fill_kernel(int64_t* values, const LaunchTables<SampleIds> tables, int count) {
  for (int t = threadIdx.x; t < count; t += blockDim.x) values[t] = tables.at[t].nnz;
}

}  // namespace

void combine_forward(const GpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out) {
  CombineForwardTable table;
  table.unique_values = unique_values;
  table.unique_index = unique_index;
  table.weights = weights;
  table.row_offsets = row_offsets;
  table.batch = batch;
  table.dim = dim;
  table.combiner = combiner;
  table.out = out;
  combine_forward_tables(context, &table, 1);
}

// Tables whose rows come from a matrix and tables whose rows are read by
// address take different kernels; each kind launches once a destination
// and variant.
void combine_forward_tables(const GpuContext& context, const CombineForwardTable* tables,
                            int num_tables) {
  CombineLaunches<UniqueValuesSource> from_matrix;
  CombineLaunches<UniqueRowsSource> from_rows;
  for (int t = 0; t < num_tables; ++t) {
    const CombineForwardTable& table = tables[t];
    if (table.dim < 1 || table.dim > 1024) {
      record_error(Status::InvalidArgument("combine_forward: dim must be in [1, 1024]"));
      return;
    }
    if (table.unique_values != nullptr) {
      from_matrix.add(table, UniqueValuesSource{table.unique_values, table.unique_index, table.dim},
                      /*source_by_address=*/false);
    } else {
      from_rows.add(table, UniqueRowsSource{table.unique_rows, table.unique_index},
                    /*source_by_address=*/true);
    }
  }
  cudaStream_t stream = stream_of(context);
  const Status status = from_matrix.launch(stream, "combine_forward");
  record_error(status.ok() ? from_rows.launch(stream, "combine_forward_rows") : status);
}

void row_offsets_from_sample_ids(const GpuContext& context, const SampleIds* tables, int num_tables,
                                 int64_t* first_invalid) {
  cudaStream_t stream = stream_of(context);
  record_error(launch_by_table(
      tables, num_tables,
      [](const SampleIds& table) {
        return std::max<int64_t>({1, table.nnz, table.batch + 1});
      },
      [&](const LaunchTables<SampleIds>& batch, int first, int count, int64_t longest) {
        int64_t* answers = first_invalid == nullptr ? nullptr : first_invalid + first;
        if (answers != nullptr) fill_kernel<<<1, kThreads, 0, stream>>>(answers, batch, count);
        row_offsets_kernel<<<dim3(grid_for(longest, kThreads, 4096), count), kThreads, 0, stream>>>(
            batch, answers);
      },
      "row_offsets_from_sample_ids"));
}

void combine_backward(const GpuContext& context, const float* grad_out, const int64_t* order,
                      const int64_t* segments, int64_t num_unique, const float* weights,
                      const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                      Combiner combiner, float* grad_unique) {
  CombineBackwardTable table;
  table.grad_out = grad_out;
  table.order = order;
  table.segments = segments;
  table.num_unique = num_unique;
  table.weights = weights;
  table.row_offsets = row_offsets;
  table.batch = batch;
  table.nnz = nnz;
  table.dim = dim;
  table.combiner = combiner;
  table.grad_unique = grad_unique;
  combine_backward_tables(context, &table, 1);
}

// Each unique key's gradient written straight into grad_unique, or at
// grad_rows[u], by the segment sums (cc/segment_sum_gpu.h); sample b's
// gradient read at grad_out + b * dim, or at grad_out_rows[b].
void combine_backward_tables(const GpuContext& context, const CombineBackwardTable* tables,
                             int num_tables) {
  std::vector<SegmentSumTable> sums;
  for (int t = 0; t < num_tables; ++t) {
    const CombineBackwardTable& table = tables[t];
    if (table.num_unique <= 0) continue;
    if (table.dim < 1) {
      record_error(Status::InvalidArgument("combine_backward: dim must be >= 1"));
      return;
    }
    SegmentSumTable sum;
    sum.grad_out = table.grad_out;
    sum.weights = table.weights;
    sum.row_offsets = table.row_offsets;
    sum.batch = table.batch;
    sum.nnz = table.nnz;
    sum.combiner = table.combiner;
    sum.order = table.order;
    sum.segments = table.segments;
    sum.max_unique = table.num_unique;  // exact: num_unique stays null
    sum.max_key_entries = table.nnz;
    sum.dim = table.dim;
    sum.sums = table.grad_unique;
    if (table.grad_rows != nullptr) sum.sum_rows = {table.grad_rows, table.rows_aligned};
    if (table.grad_out_rows != nullptr) {
      sum.grad_out_rows = {table.grad_out_rows, table.rows_aligned};
    }
    sums.push_back(sum);
  }
  if (sums.empty()) return;
  SegmentGradientSums gradients;
  record_error(gradients.prepare(context, sums));
}

}  // namespace gpu
}  // namespace sok_ev
