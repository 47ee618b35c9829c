// The gather + combine kernel shared by gpu::combine_forward (rows from a
// unique-values matrix) and gpu::lookup_combine_tables (rows of hash
// tables), each sample's vector written to an output matrix or through its
// own address (a row message's layout); one launch serves many tables.
// CUDA only. (The backward's sums are in cc/segment_sum_gpu.h.)
//
// One warp serves 32 consecutive samples. Its lanes first resolve the rows of
// 32 entries at once (32 independent lookups in flight), then the warp walks
// the entries in order, loading kUnroll rows before accumulating them so the
// row loads overlap, and writes each sample's vector when its entries end.
#ifndef SOK_EV_CC_COMBINE_KERNELS_GPU_H_
#define SOK_EV_CC_COMBINE_KERNELS_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/status_gpu.h"
#include "cc/table_launch_gpu.h"
#include "cc/warp_gpu.h"

namespace sok_ev {
namespace gpu {

// Columns of one lane: kCount vectors of kWidth floats, vector v at column
// (v * 32 + lane) * kWidth.
template <int kWidth>
struct Vec;
template <>
struct Vec<1> {
  float x[1];
  __device__ __forceinline__ void load(const float* p) { x[0] = __ldg(p); }
  __device__ __forceinline__ void store(float* p) const { p[0] = x[0]; }
};
template <>
struct Vec<4> {
  float x[4];
  __device__ __forceinline__ void load(const float* p) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
  }
  __device__ __forceinline__ void store(float* p) const {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  }
};

// Where sample b's vector goes: row b of a (batch, dim) matrix.
struct SampleMatrix {
  float* out;
  int64_t dim;
  __device__ __forceinline__ float* row(int64_t b) const { return out + b * dim; }
};

// ... or the dim floats at rows[b] (rows where a row message wants them).
struct SampleRows {
  float* const* rows;  // (batch,)
  __device__ __forceinline__ float* row(int64_t b) const { return rows[b]; }
};

// One table of a combine_rows_kernel launch. Source: int64_t
// resolve(int64_t entry) -> row handle (-1: missing, reads as zeros); const
// float* row(int64_t handle). Destination: SampleMatrix or SampleRows (the
// outputs must not overlap the rows read).
template <class Source, class Destination>
struct CombineRowsTable {
  Source source;
  const float* weights;        // (nnz,) or null
  const int64_t* row_offsets;  // (batch + 1,)
  int64_t batch;
  int64_t dim;  // [1, 1024]
  Destination out;
  Combiner combiner;
  // Every row the source gives, and every output row, 16-byte aligned (rows
  // then load as float4s when dim % 4 == 0). Read on the host.
  bool rows_aligned;
};

// blockIdx.y picks the table (cc/table_launch_gpu.h).
template <class Source, class Destination, int kWidth, int kCount>
__global__ void __launch_bounds__(256)
    combine_rows_kernel(LaunchTables<CombineRowsTable<Source, Destination>> tables) {
  const CombineRowsTable<Source, Destination>& table = tables.at[blockIdx.y];
  const Source source = table.source;
  const float* __restrict__ weights = table.weights;
  const int64_t* __restrict__ row_offsets = table.row_offsets;
  const int64_t batch = table.batch;
  const int64_t dim = table.dim;
  const Combiner combiner = table.combiner;
  const Destination out = table.out;
  constexpr int kUnroll = kCount >= 4 ? 1 : 4 / kCount;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int64_t first_bag = warp * 32;
  if (first_bag >= batch) return;
  const int bags = static_cast<int>((batch - first_bag < 32 ? batch - first_bag : 32));
  // Lane k holds sample first_bag + k's entry range.
  const int64_t my_begin = lane < bags ? row_offsets[first_bag + lane] : 0;
  const int64_t my_end = lane < bags ? row_offsets[first_bag + lane + 1] : 0;
  // Resolved with the lane's other loads, not when the sample ends.
  float* const my_destination = lane < bags ? out.row(first_bag + lane) : nullptr;
  const int64_t entries_begin = __shfl_sync(0xffffffff, my_begin, 0);
  const int64_t entries_end = __shfl_sync(0xffffffff, my_end, bags - 1);

  // Window of 32 resolved entries: lane l holds entry window_begin + l.
  int64_t window_begin = entries_begin;
  int64_t window_row = -1;
  float window_weight = 1.0f;
  auto fill_window = [&](int64_t begin) {
    window_begin = begin;
    const int64_t entry = begin + lane;
    if (entry < entries_end) {
      window_row = source.resolve(entry);
      window_weight = weights != nullptr ? weights[entry] : 1.0f;
    }
  };
  if (entries_begin < entries_end) fill_window(entries_begin);

  Vec<kWidth> sum[kCount];
  float weight_sum = 0.0f, weight_square_sum = 0.0f;
  auto reset = [&]() {
#pragma unroll
    for (int v = 0; v < kCount; ++v)
#pragma unroll
      for (int e = 0; e < kWidth; ++e) sum[v].x[e] = 0.0f;
    weight_sum = 0.0f;
    weight_square_sum = 0.0f;
  };
  reset();
  int bag = 0;
  int64_t bag_end = __shfl_sync(0xffffffff, my_end, 0);
  auto finish_bag = [&]() {
    float denominator = 1.0f;
    if (combiner == Combiner::kMean) denominator = weight_sum;
    if (combiner == Combiner::kSqrtn) denominator = sqrtf(weight_square_sum);
    const bool empty = __shfl_sync(0xffffffff, my_begin, bag) == bag_end;
    float* const destination = shfl_pointer(my_destination, bag);
#pragma unroll
    for (int v = 0; v < kCount; ++v) {
      const int64_t c = (v * 32 + lane) * int64_t(kWidth);
      if (c < dim) {
        Vec<kWidth> result;
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          result.x[e] = empty ? 0.0f
                              : (combiner == Combiner::kSum ? sum[v].x[e]
                                                            : div_no_nan(sum[v].x[e], denominator));
        }
        result.store(destination + c);
      }
    }
    reset();
    ++bag;
    bag_end = __shfl_sync(0xffffffff, my_end, bag < bags ? bag : bags - 1);
  };

  for (int64_t j = entries_begin; j < entries_end; j += kUnroll) {
    if ((j + kUnroll < entries_end ? j + kUnroll : entries_end) > window_begin + 32) fill_window(j);
    Vec<kWidth> rows[kUnroll][kCount];
    float entry_weight[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t entry = j + u;
      const int offset = static_cast<int>(entry - window_begin) & 31;
      const int64_t handle = __shfl_sync(0xffffffff, window_row, offset);
      entry_weight[u] = __shfl_sync(0xffffffff, window_weight, offset);
      const float* row = (entry < entries_end && handle >= 0) ? source.row(handle) : nullptr;
#pragma unroll
      for (int v = 0; v < kCount; ++v) {
        const int64_t c = (v * 32 + lane) * int64_t(kWidth);
        if (row != nullptr && c < dim) {
          rows[u][v].load(row + c);
        } else {
#pragma unroll
          for (int e = 0; e < kWidth; ++e) rows[u][v].x[e] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t entry = j + u;
      if (entry >= entries_end) break;
      while (entry >= bag_end) finish_bag();
      const float w = entry_weight[u];
#pragma unroll
      for (int v = 0; v < kCount; ++v)
#pragma unroll
        for (int e = 0; e < kWidth; ++e) sum[v].x[e] += w * rows[u][v].x[e];
      weight_sum += w;
      weight_square_sum += w * w;
    }
  }
  while (bag < bags) finish_bag();
}

// Launches one kernel variant for its tables.
template <class Source, class Destination, int kWidth, int kCount>
Status launch_combine_variant(const std::vector<CombineRowsTable<Source, Destination>>& tables,
                              cudaStream_t stream, const char* what) {
  using Table = CombineRowsTable<Source, Destination>;
  constexpr int kThreads = 256;
  return launch_by_table(
      tables.data(), tables.size(),
      // A warp a run of 32 samples.
      [](const Table& table) { return (table.batch + 31) / 32 * 32; },
      [&](const LaunchTables<Table>& batch, int /*first*/, int count, int64_t longest) {
        const unsigned blocks = static_cast<unsigned>((longest + kThreads - 1) / kThreads);
        combine_rows_kernel<Source, Destination, kWidth, kCount>
            <<<dim3(blocks, count), kThreads, 0, stream>>>(batch);
      },
      what);
}

// Launches combine_rows_kernel for every table, each in the variant with
// the narrowest register footprint that covers its dim (<= 1024): one
// launch for all tables of a variant. Rows load as float4s when
// dim % 4 == 0 and rows_aligned.
template <class Source, class Destination>
Status launch_combine_rows(const CombineRowsTable<Source, Destination>* tables, size_t n,
                           cudaStream_t stream, const char* what) {
  // Variants (kWidth, kCount): float4 columns up to 128, 256, 512, 1024;
  // scalar columns up to 32, 64, ..., 1024.
  std::vector<CombineRowsTable<Source, Destination>> variant[10];
  for (size_t t = 0; t < n; ++t) {
    const CombineRowsTable<Source, Destination>& table = tables[t];
    if (table.batch <= 0) continue;
    int v = 0;
    if (table.dim % 4 == 0 && table.rows_aligned) {
      v = table.dim <= 128 ? 0 : table.dim <= 256 ? 1 : table.dim <= 512 ? 2 : 3;
    } else {
      v = table.dim <= 32    ? 4
          : table.dim <= 64  ? 5
          : table.dim <= 128 ? 6
          : table.dim <= 256 ? 7
          : table.dim <= 512 ? 8
                             : 9;
    }
    variant[v].push_back(table);
  }
#define SOK_EV_COMBINE_VARIANT(v, width, count)                                                 \
  if (!variant[v].empty()) {                                                                    \
    SOK_EV_RETURN_IF_ERROR(                                                                     \
        (launch_combine_variant<Source, Destination, width, count>(variant[v], stream, what))); \
  }
  SOK_EV_COMBINE_VARIANT(0, 4, 1)
  SOK_EV_COMBINE_VARIANT(1, 4, 2)
  SOK_EV_COMBINE_VARIANT(2, 4, 4)
  SOK_EV_COMBINE_VARIANT(3, 4, 8)
  SOK_EV_COMBINE_VARIANT(4, 1, 1)
  SOK_EV_COMBINE_VARIANT(5, 1, 2)
  SOK_EV_COMBINE_VARIANT(6, 1, 4)
  SOK_EV_COMBINE_VARIANT(7, 1, 8)
  SOK_EV_COMBINE_VARIANT(8, 1, 16)
  SOK_EV_COMBINE_VARIANT(9, 1, 32)
#undef SOK_EV_COMBINE_VARIANT
  return Status::Ok();
}

// The tables of one combine whose rows come from one kind of Source, by
// destination (a matrix or rows take different kernels), for
// launch_combine_rows.
template <class Source>
struct CombineLaunches {
  std::vector<CombineRowsTable<Source, SampleMatrix>> into_matrix;
  std::vector<CombineRowsTable<Source, SampleRows>> into_rows;

  // table's samples (weights, offsets, combiner, destination, dim) with
  // rows from source. A matrix's rows are aligned (TensorFlow's buffers and
  // a table's arena are); rows read or written by address are as
  // table.rows_aligned says.
  void add(const CombineForwardTable& table, const Source& source, bool source_by_address) {
    const bool rows_aligned = table.rows_aligned || (!source_by_address && table.out != nullptr);
    if (table.out != nullptr) {
      into_matrix.push_back({source, table.weights, table.row_offsets, table.batch, table.dim,
                             SampleMatrix{table.out, table.dim}, table.combiner, rows_aligned});
    } else {
      into_rows.push_back({source, table.weights, table.row_offsets, table.batch, table.dim,
                           SampleRows{table.out_rows}, table.combiner, rows_aligned});
    }
  }

  Status launch(cudaStream_t stream, const char* what) const {
    SOK_EV_RETURN_IF_ERROR(
        launch_combine_rows(into_matrix.data(), into_matrix.size(), stream, what));
    return launch_combine_rows(into_rows.data(), into_rows.size(), stream, what);
  }
};

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_COMBINE_KERNELS_GPU_H_
