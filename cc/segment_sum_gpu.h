// The gradient of each unique key's row, shared by gpu::combine_backward and
// gpu::combine_backward_apply so that both give the same bits: the sum, over
// the key's entries, of w_j * div_no_nan(grad_out[sample of j], denominator
// of that sample) ('sum': w_j * grad_out[sample of j]).
//
// Unique u's entries are order[segments[u] .. segments[u + 1]), the
// "grouped entries" segments[u] .. segments[u + 1] - 1. They are summed in
// tiles of kTileEntries grouped entries, a warp a tile, whatever the keys:
// each warp walks its tile in order with several rows' loads in flight, so the
// work is even however Zipf-hot a key is, and the kernel runs at the rate of
// the memory, not of one key's chain of dependent loads. (Summing key by
// key was latency bound: 25% occupancy and about 1 TB/s on the Criteo
// shape, 47-65 us a table, H200, 2026-11-23.) A key inside one tile is the
// sum of its entries in order, as on the CPU; a key that crosses tiles is
// the sum, in tile order, of its parts' sums. The bits depend only on the
// grouped order, never on scheduling.
// CUDA only.
#ifndef SOK_EV_CC_SEGMENT_SUM_GPU_H_
#define SOK_EV_CC_SEGMENT_SUM_GPU_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {

constexpr int64_t kTileEntries = 32;  // a warp's tile: a grouped entry a lane

// Rows addressed one by one, where a row message keeps them: row i is the
// dim floats at at[i]; aligned: every one starts 16-byte aligned. Null
// `at`: not used.
template <typename T>
struct AddressedRows {
  T* const* at = nullptr;
  bool aligned = false;
};

// What the consumers of the sums read, by value.
struct SegmentGradients {
  const float* grad_out = nullptr;              // (batch, dim)
  const float* const* grad_out_rows = nullptr;  // (batch,) or null: sample b's
                                                // gradient at grad_out_rows[b]
                                                // instead of grad_out + b * dim
  const int64_t* segments = nullptr;            // (num_unique + 1,); null: key u's one
                                                // entry is entry u (distinct keys)
  const int64_t* sorted_bag = nullptr;          // (nnz,) the sample of grouped entry k;
                                                // null: entry k is sample k's one entry
  const float* sorted_weight = nullptr;         // (nnz,) its weight; null: all 1
  const float* bag_scale = nullptr;             // (batch,) each sample's denominator
  const float* sums = nullptr;                  // (num_unique, dim) each key's gradient;
                                                // null: every key has one entry, read in place
  Combiner combiner = Combiner::kSum;
  int64_t dim = 0;
};

// One table's part of SegmentGradientSums::prepare: its arguments, as there.
struct SegmentSumTable {
  const float* grad_out = nullptr;
  const float* weights = nullptr;
  const int64_t* row_offsets = nullptr;
  int64_t batch = 0;
  int64_t nnz = 0;
  Combiner combiner = Combiner::kSum;
  const int64_t* order = nullptr;
  const int64_t* segments = nullptr;
  const int64_t* num_unique = nullptr;
  int64_t max_unique = 0;
  int64_t max_key_entries = 0;
  int64_t dim = 0;
  float* sums = nullptr;
  AddressedRows<float> sum_rows;
  AddressedRows<const float> grad_out_rows;
  // Distinct keys, one entry a sample, in order (an optimizer's gradient
  // rows): key u's gradient is sample u's, read in place; order, segments
  // and row_offsets are not read.
  bool distinct_rows = false;
};

// Computes SegmentGradients and owns its scratch: one pass over the samples
// (denominators) and one over the entries (their samples and weights in
// grouped order), then the tile sums and the sums of the keys that cross
// tiles. A sum of unweighted entries skips the samples' pass: it finds each
// entry's sample in the row offsets. Many tables go through each pass in one
// launch (blockIdx.y picks the table): a multi-table op's sums cost a few
// launches, not a few per table, and the bits of each table's sums are those
// of its sums alone.
class SegmentGradientSums {
 public:
  //   grad_out: (batch, dim)  weights: (nnz,) or null  row_offsets: (batch + 1,)
  //   order: (nnz,)  segments: (max_unique + 1,)
  //   num_unique: device, or null when max_unique is the exact count
  //   max_key_entries: a bound on any key's entries (nnz when unknown)
  //   sums: (max_unique, dim) where each key's gradient goes, or null: into
  //     scratch this object owns, or, with max_key_entries 1 (distinct
  //     keys), nowhere: each key's one entry is read in place
  //   sum_rows: (max_unique,) or none: key u's gradient goes to
  //     sum_rows.at[u] instead (sums is then ignored, and the view's sums is
  //     null: it is not for reading the keys' gradients back)
  //   grad_out_rows: (batch,) or none: sample b's gradient is read at
  //     grad_out_rows.at[b] instead (grad_out is then ignored)
  // A null order: SegmentSumTable::distinct_rows (an unweighted sum read in
  // place: max_key_entries 1, no sums or sum_rows).
  Status prepare(const GpuContext& context, const float* grad_out, const float* weights,
                 const int64_t* row_offsets, int64_t batch, int64_t nnz, Combiner combiner,
                 const int64_t* order, const int64_t* segments, const int64_t* num_unique,
                 int64_t max_unique, int64_t max_key_entries, int64_t dim, float* sums,
                 AddressedRows<float> sum_rows = {}, AddressedRows<const float> grad_out_rows = {});
  // The same for every table at once; table t's sums are view(t).
  Status prepare(const GpuContext& context, const std::vector<SegmentSumTable>& tables);
  const SegmentGradients& view(int t = 0) const { return views_[t]; }

 private:
  std::unique_ptr<ScratchBuffer> entry_bag_, bag_scale_, sorted_bag_, sorted_weight_, sums_,
      partials_;
  std::vector<SegmentGradients> views_;
};

// Sample b's upstream gradient row.
__device__ __forceinline__ const float* sample_gradient(const SegmentGradients& s, int64_t bag) {
  return s.grad_out_rows != nullptr ? s.grad_out_rows[bag] : s.grad_out + bag * s.dim;
}

__device__ __forceinline__ float entry_gradient(float g, float w, float denominator,
                                                Combiner combiner) {
  return combiner == Combiner::kSum ? w * g : w * div_no_nan(g, denominator);
}

// Key u's one entry, when view.sums is null, and that entry's sample.
__device__ __forceinline__ int64_t single_entry(const SegmentGradients& s, int64_t u) {
  return s.segments != nullptr ? s.segments[u] : u;
}
__device__ __forceinline__ int64_t entry_sample(const SegmentGradients& s, int64_t k) {
  return s.sorted_bag != nullptr ? s.sorted_bag[k] : k;
}

// Key u's one entry, when view.sums is null: its gradient at column c.
__device__ __forceinline__ float single_entry_gradient(const SegmentGradients& s, int64_t u,
                                                       int64_t c) {
  const int64_t k = single_entry(s, u);
  const int64_t bag = entry_sample(s, k);
  const float w = s.sorted_weight != nullptr ? s.sorted_weight[k] : 1.0f;
  const float denominator = s.combiner == Combiner::kSum ? 1.0f : s.bag_scale[bag];
  return 0.0f + entry_gradient(sample_gradient(s, bag)[c], w, denominator, s.combiner);
}

// Key u's gradient at this lane's 8 columns c0 + e * kLanes + rank.
template <int kLanes>
__device__ __forceinline__ void key_gradient(const SegmentGradients& s, int64_t u, int64_t c0,
                                             int rank, float (&grad)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int64_t c = c0 + e * kLanes + rank;
    grad[e] = c >= s.dim          ? 0.0f
              : s.sums != nullptr ? s.sums[u * s.dim + c]
                                  : single_entry_gradient(s, u, c);
  }
}

// key_gradient with 16-byte loads: lane `rank` of 8 owns the float4 columns
// (v * 8 + rank) * 4, v < kCount (dim % 4 == 0, rows 16-byte aligned).
template <int kCount>
__device__ __forceinline__ void key_gradient_vec(const SegmentGradients& s, int64_t u, int rank,
                                                 float4 (&grad)[kCount]) {
  int64_t bag = 0;
  float w = 1.0f, denominator = 1.0f;
  if (s.sums == nullptr) {
    const int64_t k = single_entry(s, u);
    bag = entry_sample(s, k);
    if (s.sorted_weight != nullptr) w = s.sorted_weight[k];
    if (s.combiner != Combiner::kSum) denominator = s.bag_scale[bag];
  }
  const float* row = s.sums != nullptr ? s.sums + u * s.dim : sample_gradient(s, bag);
#pragma unroll
  for (int v = 0; v < kCount; ++v) {
    const int64_t c = (v * 8 + rank) * 4;
    grad[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c >= s.dim) continue;
    const float4 x = __ldg(reinterpret_cast<const float4*>(row + c));
    if (s.sums != nullptr) {
      grad[v] = x;
    } else {
      grad[v].x += entry_gradient(x.x, w, denominator, s.combiner);
      grad[v].y += entry_gradient(x.y, w, denominator, s.combiner);
      grad[v].z += entry_gradient(x.z, w, denominator, s.combiner);
      grad[v].w += entry_gradient(x.w, w, denominator, s.combiner);
    }
  }
}

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_SEGMENT_SUM_GPU_H_
