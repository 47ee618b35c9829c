// The gather + combine kernel shared by gpu::combine_forward (rows from a
// unique-values matrix) and gpu::lookup_combine_rows (rows of a hash table),
// each sample's vector written to an output matrix or through its own
// address (a row message's layout). CUDA only. (The backward's sums are in
// cc/segment_sum_gpu.h.)
//
// One warp serves 32 consecutive samples. Its lanes first resolve the rows of
// 32 entries at once (32 independent lookups in flight), then the warp walks
// the entries in order, loading kUnroll rows before accumulating them so the
// row loads overlap, and writes each sample's vector when its entries end.
#ifndef SOK_EV_CC_COMBINE_KERNELS_GPU_H_
#define SOK_EV_CC_COMBINE_KERNELS_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/combine.h"
#include "cc/common.h"
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

// Source: int64_t resolve(int64_t entry) -> row handle (-1: missing, reads
// as zeros); const float* row(int64_t handle). Destination: SampleMatrix or
// SampleRows (the outputs must not overlap the rows read).
//   weights: (nnz,) or null   row_offsets: (batch + 1,)
template <class Source, class Destination, int kWidth, int kCount>
__global__ void __launch_bounds__(256)
    combine_rows_kernel(Source source, const float* __restrict__ weights,
                        const int64_t* __restrict__ row_offsets, int64_t batch, int64_t dim,
                        Combiner combiner, Destination out) {
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

// Launches combine_rows_kernel with the narrowest register footprint that
// covers dim (<= 1024). Rows load as float4s when dim % 4 == 0 and
// rows_aligned: every row Source gives, and every output row, 16-byte
// aligned.
template <class Source, class Destination>
cudaError_t launch_combine_rows(const Source& source, const float* weights,
                                const int64_t* row_offsets, int64_t batch, int64_t dim,
                                Combiner combiner, const Destination& out, cudaStream_t stream,
                                bool rows_aligned = true) {
  if (batch <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t warps = (batch + 31) / 32;
  const unsigned blocks = static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads);
#define SOK_EV_COMBINE_LAUNCH(width, count)              \
  combine_rows_kernel<Source, Destination, width, count> \
      <<<blocks, kThreads, 0, stream>>>(source, weights, row_offsets, batch, dim, combiner, out)
  if (dim % 4 == 0 && rows_aligned) {
    if (dim <= 128)
      SOK_EV_COMBINE_LAUNCH(4, 1);
    else if (dim <= 256)
      SOK_EV_COMBINE_LAUNCH(4, 2);
    else if (dim <= 512)
      SOK_EV_COMBINE_LAUNCH(4, 4);
    else
      SOK_EV_COMBINE_LAUNCH(4, 8);
  } else {
    if (dim <= 32)
      SOK_EV_COMBINE_LAUNCH(1, 1);
    else if (dim <= 64)
      SOK_EV_COMBINE_LAUNCH(1, 2);
    else if (dim <= 128)
      SOK_EV_COMBINE_LAUNCH(1, 4);
    else if (dim <= 256)
      SOK_EV_COMBINE_LAUNCH(1, 8);
    else if (dim <= 512)
      SOK_EV_COMBINE_LAUNCH(1, 16);
    else
      SOK_EV_COMBINE_LAUNCH(1, 32);
  }
#undef SOK_EV_COMBINE_LAUNCH
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_COMBINE_KERNELS_GPU_H_
