// The gradient of each unique key's row, shared by gpu::combine_backward and
// gpu::combine_backward_apply so that both give the same bits: the sum,
// over the key's entries, of w_j * div_no_nan(grad_out[sample of j],
// denominator of that sample) ('sum': w_j * grad_out[sample of j]).
//
// Unique u's entries are order[segments[u] .. segments[u + 1]) and are
// summed in that order. A key with more than kChunkEntries entries (a
// Zipf-hot key has thousands in a Criteo batch) is summed in two passes:
// its entries in chunks of chunk_length(entries), every chunk of the batch
// in parallel, then its chunks' partial sums in order. Otherwise one group
// of lanes walks the hottest key's entries alone while the GPU waits: on the
// Criteo shape that was 95% of the step (327 ms, H200, 2026-11-22). The
// kernels are latency bound (each group waits on its loads), so the longest
// walk sets their time: chunks of about sqrt(entries) make the chunk walk
// and the partials walk equally short.
// CUDA only.
#ifndef SOK_EV_CC_SEGMENT_SUM_GPU_H_
#define SOK_EV_CC_SEGMENT_SUM_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {

constexpr int64_t kChunkEntries = 32;

// Entries per chunk of a key with `entries` > kChunkEntries: the least
// kChunkEntries + 16 i whose square reaches `entries` (integer arithmetic,
// so every kernel splits a key the same way).
__host__ __device__ __forceinline__ int64_t chunk_length(int64_t entries) {
  int64_t length = kChunkEntries;
  while (length * length < entries) length += 16;
  return length;
}

// What the kernels read, by value.
struct SegmentGradients {
  const float* grad_out = nullptr;         // (batch, dim)
  const int64_t* segments = nullptr;       // (num_unique + 1,)
  const int64_t* sorted_bag = nullptr;     // (nnz,) the sample of grouped entry k
  const float* sorted_weight = nullptr;    // (nnz,) its weight; null: all 1
  const float* bag_scale = nullptr;        // (batch,) each sample's denominator
  const int64_t* chunk_offsets = nullptr;  // (num_unique + 1,): u's chunks are
                                           // [chunk_offsets[u], chunk_offsets[u + 1])
  const float* partials = nullptr;         // (chunks, dim) each chunk's sum
  Combiner combiner = Combiner::kSum;
  int64_t dim = 0;
};

// Builds SegmentGradients and owns its scratch: one pass over the samples
// (denominators), one over the entries (their samples and weights in
// grouped order), and the chunk sums of the long keys. A sum of unweighted
// entries skips the samples' pass: it finds each entry's sample in the row
// offsets.
class SegmentGradientSums {
 public:
  //   grad_out: (batch, dim)  weights: (nnz,) or null  row_offsets: (batch + 1,)
  //   order: (nnz,)  segments: (max_unique + 1,)
  //   num_unique: device, or null when max_unique is the exact count
  //   max_key_entries: a bound on any key's entries (nnz when unknown); keys
  //     that cannot be long skip the chunk pass and its launches
  Status prepare(const GpuContext& context, const float* grad_out, const float* weights,
                 const int64_t* row_offsets, int64_t batch, int64_t nnz, Combiner combiner,
                 const int64_t* order, const int64_t* segments, const int64_t* num_unique,
                 int64_t max_unique, int64_t max_key_entries, int64_t dim);
  const SegmentGradients& view() const { return view_; }

 private:
  std::unique_ptr<ScratchBuffer> entry_bag_, bag_scale_, sorted_bag_, sorted_weight_, counts_,
      chunk_offsets_, scan_temp_, partials_;
  SegmentGradients view_;
};

__device__ __forceinline__ float entry_gradient(float g, float w, float denominator,
                                                Combiner combiner) {
  return combiner == Combiner::kSum ? w * g : w * div_no_nan(g, denominator);
}

// Adds grouped entries [lo, hi) to this lane's 8 columns c0 + e * kLanes +
// rank, in entry order; kAhead entries' loads are issued before their sums.
template <int kLanes>
__device__ __forceinline__ void accumulate_entries(const SegmentGradients& s, int64_t lo,
                                                   int64_t hi, int64_t c0, int rank,
                                                   float (&acc)[8]) {
  constexpr int kAhead = 4;
  for (int64_t k = lo; k < hi; k += kAhead) {
    int64_t bag[kAhead];
    float w[kAhead], denominator[kAhead], x[kAhead][8];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const bool valid = k + a < hi;
      bag[a] = valid ? s.sorted_bag[k + a] : 0;
      w[a] = !valid ? 0.0f : s.sorted_weight != nullptr ? s.sorted_weight[k + a] : 1.0f;
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      denominator[a] = s.combiner == Combiner::kSum ? 1.0f : s.bag_scale[bag[a]];
      const float* g = s.grad_out + bag[a] * s.dim;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t c = c0 + e * kLanes + rank;
        x[a][e] = (k + a < hi && c < s.dim) ? g[c] : 0.0f;
      }
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (k + a >= hi) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (c0 + e * kLanes + rank < s.dim) {
          acc[e] += entry_gradient(x[a][e], w[a], denominator[a], s.combiner);
        }
      }
    }
  }
}

// Key u's gradient at this lane's 8 columns, added to acc.
template <int kLanes>
__device__ __forceinline__ void accumulate_key(const SegmentGradients& s, int64_t u, int64_t c0,
                                               int rank, float (&acc)[8]) {
  const int64_t first = s.chunk_offsets != nullptr ? s.chunk_offsets[u] : 0;
  const int64_t last = s.chunk_offsets != nullptr ? s.chunk_offsets[u + 1] : 0;
  if (first == last) {
    accumulate_entries<kLanes>(s, s.segments[u], s.segments[u + 1], c0, rank, acc);
    return;
  }
#pragma unroll 4
  for (int64_t chunk = first; chunk < last; ++chunk) {
    const float* partial = s.partials + chunk * s.dim;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t c = c0 + e * kLanes + rank;
      if (c < s.dim) acc[e] += partial[c];
    }
  }
}

// accumulate_key with 16-byte loads: 8 lanes a key, lane `rank` owns the
// float4 columns (v * 8 + rank) * 4, v < kCount (dim % 4 == 0, grad_out
// 16-byte aligned). The same sums in the same order; kAhead entries' loads
// in flight (1 in kernels whose register cap cannot hold more).
template <int kCount, int kAhead = (kCount <= 4 ? 4 : 2)>
__device__ __forceinline__ void accumulate_key_vec(const SegmentGradients& s, int64_t u, int rank,
                                                   float4 (&acc)[kCount]) {
  const int64_t first = s.chunk_offsets != nullptr ? s.chunk_offsets[u] : 0;
  const int64_t last = s.chunk_offsets != nullptr ? s.chunk_offsets[u + 1] : 0;
  if (first != last) {
#pragma unroll 4
    for (int64_t chunk = first; chunk < last; ++chunk) {
      const float* partial = s.partials + chunk * s.dim;
#pragma unroll
      for (int v = 0; v < kCount; ++v) {
        const int64_t c = (v * 8 + rank) * 4;
        if (c < s.dim) {
          const float4 x = *reinterpret_cast<const float4*>(partial + c);
          acc[v].x += x.x;
          acc[v].y += x.y;
          acc[v].z += x.z;
          acc[v].w += x.w;
        }
      }
    }
    return;
  }
  const int64_t hi = s.segments[u + 1];
  for (int64_t k = s.segments[u]; k < hi; k += kAhead) {
    int64_t bag[kAhead];
    float w[kAhead], denominator[kAhead];
    float4 x[kAhead][kCount];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const bool valid = k + a < hi;
      bag[a] = valid ? s.sorted_bag[k + a] : 0;
      w[a] = !valid ? 0.0f : s.sorted_weight != nullptr ? s.sorted_weight[k + a] : 1.0f;
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      denominator[a] = s.combiner == Combiner::kSum ? 1.0f : s.bag_scale[bag[a]];
      const float* g = s.grad_out + bag[a] * s.dim;
#pragma unroll
      for (int v = 0; v < kCount; ++v) {
        const int64_t c = (v * 8 + rank) * 4;
        x[a][v] = (k + a < hi && c < s.dim) ? __ldg(reinterpret_cast<const float4*>(g + c))
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (k + a >= hi) break;
#pragma unroll
      for (int v = 0; v < kCount; ++v) {
        if ((v * 8 + rank) * 4 < s.dim) {
          acc[v].x += entry_gradient(x[a][v].x, w[a], denominator[a], s.combiner);
          acc[v].y += entry_gradient(x[a][v].y, w[a], denominator[a], s.combiner);
          acc[v].z += entry_gradient(x[a][v].z, w[a], denominator[a], s.combiner);
          acc[v].w += entry_gradient(x[a][v].w, w[a], denominator[a], s.combiner);
        }
      }
    }
  }
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_SEGMENT_SUM_GPU_H_
