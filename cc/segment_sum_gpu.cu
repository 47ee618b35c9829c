// SegmentGradientSums::prepare: see cc/segment_sum_gpu.h.
#include <algorithm>

#include "cc/lower_bound_gpu.h"
#include "cc/segment_sum_gpu.h"
#include "cc/warp_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Each entry's sample, and each sample's denominator (1, sum w, or
// sqrt(sum w^2)), as combine_forward divides.
//   entry_bag: (nnz,) out   bag_scale: (batch,) out
__global__ void bag_scale_kernel(const float* weights, const int64_t* row_offsets, int64_t batch,
                                 Combiner combiner, int64_t* entry_bag, float* bag_scale) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < batch;
       b += int64_t(gridDim.x) * blockDim.x) {
    float weight_sum = 0.0f, weight_square_sum = 0.0f;
    for (int64_t j = row_offsets[b]; j < row_offsets[b + 1]; ++j) {
      const float w = weights != nullptr ? weights[j] : 1.0f;
      weight_sum += w;
      weight_square_sum += w * w;
      entry_bag[j] = b;
    }
    float denominator = 1.0f;
    if (combiner == Combiner::kMean) denominator = weight_sum;
    if (combiner == Combiner::kSqrtn) denominator = sqrtf(weight_square_sum);
    bag_scale[b] = denominator;
  }
}

// Each grouped entry's sample and weight (one dependent load fewer in the
// sums: segments -> sorted_bag -> gradient row).
__global__ void sorted_entries_kernel(const int64_t* order, const int64_t* entry_bag,
                                      const float* weights, int64_t nnz, int64_t* sorted_bag,
                                      float* sorted_weight) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < nnz;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = order[k];
    sorted_bag[k] = entry_bag[j];
    sorted_weight[k] = weights != nullptr ? weights[j] : 1.0f;
  }
}

// sorted_entries_kernel for a sum of unweighted entries, which reads no
// denominator and no weight: each grouped entry's sample found in the row
// offsets, in one pass (bag_scale_kernel's pass is not needed).
//   row_offsets: (batch + 1,)  sorted_bag: (nnz,) out
__global__ void sorted_samples_kernel(const int64_t* order, const int64_t* row_offsets,
                                      int64_t batch, int64_t nnz, int64_t* sorted_bag) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < nnz;
       k += int64_t(gridDim.x) * blockDim.x) {
    // The last sample b whose entries start at or before entry order[k].
    sorted_bag[k] = lower_bound(row_offsets, batch + 1, order[k] + 1) - 1;
  }
}

// kWidth consecutive floats at p: one 16-byte access for 4 (p aligned).
template <int kWidth>
__device__ __forceinline__ void load_columns(const float* p, float (&out)[kWidth]) {
  if constexpr (kWidth == 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    out[0] = __ldg(p);
  }
}

template <int kWidth>
__device__ __forceinline__ void store_columns(float* p, const float (&in)[kWidth]) {
  if constexpr (kWidth == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
    p[0] = in[0];
  }
}

// Where key u's gradient goes: sums + u * dim, or rows[u].
struct SumDestination {
  float* sums;
  float* const* rows;  // null: sums
  int64_t dim;
  __device__ __forceinline__ float* row(int64_t u) const {
    return rows != nullptr ? rows[u] : sums + u * dim;
  }
};

// A warp per tile of kTileEntries grouped entries, in order: lane l holds
// entry k0 + l's key, sample, weight and denominator; the warp walks the
// entries with kAhead rows' loads in flight and writes each key whose entries
// all lie in the tile to sums, and the part of a key that crosses the
// tile's edge to the tile's partial rows: head (the key began in an earlier
// tile) or tail (it began here and goes on). kVec: float4 columns
// 4 * lane + 128 j (dim % 4 == 0, aligned rows); else columns lane + 32 j.
//   sums: (count, dim) out  partials: head (tiles, dim), then tail (tiles, dim)
template <bool kVec>
__global__ void __launch_bounds__(kThreads, 3)
    tile_sums_kernel(SegmentGradients s, const int64_t* num_unique, int64_t max_unique, int64_t nnz,
                     SumDestination sums, float* partials) {
  constexpr int kWidth = kVec ? 4 : 1;
  // 3 blocks an SM: 80 registers (104 uncapped, 4 bytes spilled; with 8
  // float4 rows ahead 72 bytes spill; clang, 2026-11-23).
  constexpr int kAhead = kVec ? 4 : 8;
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int64_t dim = s.dim;
  const int64_t tiles = (nnz + kTileEntries - 1) / kTileEntries;
  const int64_t count = num_unique != nullptr ? *num_unique : max_unique;
  for (int64_t tile = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; tile < tiles;
       tile += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t k0 = tile * kTileEntries;
    const int n = static_cast<int>(nnz - k0 < kTileEntries ? nnz - k0 : kTileEntries);
    int64_t key = 0;
    const float* source = nullptr;  // the entry's sample's gradient row
    float w = 0.0f, denominator = 1.0f;
    if (lane < n) {
      // The last key whose entries start at or before k0 + lane (keys
      // without entries have equal segments and are skipped).
      key = lower_bound(s.segments, count + 1, k0 + lane + 1) - 1;
      const int64_t bag = s.sorted_bag[k0 + lane];
      source = sample_gradient(s, bag);
      w = s.sorted_weight != nullptr ? s.sorted_weight[k0 + lane] : 1.0f;
      if (s.combiner != Combiner::kSum) denominator = s.bag_scale[bag];
    }
    // Where each lane's entry ends a key's part: the key's row, or the
    // tile's head row (the key began before the tile) or its tail row (it
    // goes on after). Resolved here, with the lane's other loads.
    const int64_t first_key = __shfl_sync(all, key, 0);
    const int64_t last_key = __shfl_sync(all, key, n - 1);
    const bool first_began_before = s.segments[first_key] < k0;
    const bool last_goes_on = s.segments[last_key + 1] > k0 + n;
    const int64_t next_key = __shfl_down_sync(all, key, 1);
    const bool lane_ends = lane < n && (lane == n - 1 || next_key != key);
    const unsigned ends = __ballot_sync(all, lane_ends);
    float* destination = nullptr;
    if (key == first_key && first_began_before) {
      destination = partials + tile * dim;
    } else if (key == last_key && last_goes_on) {
      destination = partials + (tiles + tile) * dim;
    } else if (lane_ends) {
      destination = sums.row(key);
    }
    for (int64_t c0 = 0; c0 < dim; c0 += 32 * kWidth) {
      const int64_t c = c0 + kWidth * lane;
      const bool active = c < dim;
      float acc[kWidth] = {};
      for (int a0 = 0; a0 < n; a0 += kAhead) {
        float x[kAhead][kWidth];
#pragma unroll
        for (int a = 0; a < kAhead; ++a) {
          const float* row = shfl_pointer(source, (a0 + a) & 31);
          if (a0 + a < n && active) load_columns<kWidth>(row + c, x[a]);
        }
#pragma unroll
        for (int a = 0; a < kAhead; ++a) {
          const int at = a0 + a;  // the same in every lane
          if (at >= n) break;
          const float wa = __shfl_sync(all, w, at);
          const float da = __shfl_sync(all, denominator, at);
          if (active) {
#pragma unroll
            for (int e = 0; e < kWidth; ++e) acc[e] += entry_gradient(x[a][e], wa, da, s.combiner);
          }
          if (ends & (1u << at)) {
            float* out = shfl_pointer(destination, at);
            if (active) store_columns<kWidth>(out + c, acc);
#pragma unroll
            for (int e = 0; e < kWidth; ++e) acc[e] = 0.0f;
          }
        }
      }
    }
  }
}

// A lane per key finds the keys whose entries cross tiles; the warp then
// sums each such key's parts, its tail part (the tile it began in) and the
// head parts of the tiles after, in order. A key without entries gets
// zeros. Keys inside one tile are done.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    crossing_sums_kernel(SegmentGradients s, const int64_t* num_unique, int64_t max_unique,
                         int64_t nnz, SumDestination sums, const float* partials) {
  constexpr int kWidth = kVec ? 4 : 1;
  // A hot key's parts form one serial chain (about 190 for the hottest
  // Zipf key of a one-hot 65536 batch): its time is parts / kAhead loads'
  // latency, so many loads fly at once. The sum's order is unchanged.
  constexpr int kAhead = kVec ? 8 : 16;
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int64_t dim = s.dim;
  const int64_t tiles = (nnz + kTileEntries - 1) / kTileEntries;
  const int64_t count = num_unique != nullptr ? *num_unique : max_unique;
  for (int64_t base = ((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5) * 32; base < count;
       base += ((int64_t(gridDim.x) * blockDim.x) >> 5) * 32) {
    int64_t begin = 0, end = 0;
    bool crossing = false;
    float* destination = nullptr;
    if (base + lane < count) {
      begin = s.segments[base + lane];
      end = s.segments[base + lane + 1];
      crossing = begin == end || begin / kTileEntries != (end - 1) / kTileEntries;
      if (crossing) destination = sums.row(base + lane);
    }
    for (unsigned todo = __ballot_sync(all, crossing); todo != 0; todo &= todo - 1) {
      const int source = __ffs(todo) - 1;
      float* const out = shfl_pointer(destination, source);
      const int64_t key_begin = __shfl_sync(all, begin, source);
      const int64_t key_end = __shfl_sync(all, end, source);
      const int64_t first = key_begin / kTileEntries, last = (key_end - 1) / kTileEntries;
      for (int64_t c0 = 0; c0 < dim; c0 += 32 * kWidth) {
        const int64_t c = c0 + kWidth * lane;
        if (c >= dim) continue;
        float acc[kWidth] = {};
        if (key_begin < key_end) {
          load_columns<kWidth>(partials + (tiles + first) * dim + c, acc);
          for (int64_t t0 = first + 1; t0 <= last; t0 += kAhead) {
            float x[kAhead][kWidth];
#pragma unroll
            for (int a = 0; a < kAhead; ++a) {
              if (t0 + a <= last) load_columns<kWidth>(partials + (t0 + a) * dim + c, x[a]);
            }
#pragma unroll
            for (int a = 0; a < kAhead; ++a) {
              if (t0 + a > last) break;
#pragma unroll
              for (int e = 0; e < kWidth; ++e) acc[e] += x[a][e];
            }
          }
        }
        store_columns<kWidth>(out + c, acc);
      }
    }
  }
}

std::unique_ptr<ScratchBuffer> scratch(const GpuContext& context, size_t bytes) {
  return std::make_unique<ScratchBuffer>(context, bytes);
}

}  // namespace

Status SegmentGradientSums::prepare(const GpuContext& context, const float* grad_out,
                                    const float* weights, const int64_t* row_offsets, int64_t batch,
                                    int64_t nnz, Combiner combiner, const int64_t* order,
                                    const int64_t* segments, const int64_t* num_unique,
                                    int64_t max_unique, int64_t max_key_entries, int64_t dim,
                                    float* sums, AddressedRows<float> sum_rows,
                                    AddressedRows<const float> grad_out_rows) {
  cudaStream_t stream = stream_of(context);
  const int64_t entries = nnz > 0 ? nnz : 1;
  // A sum of unweighted entries reads no denominator and no weight.
  const bool plain_sum = combiner == Combiner::kSum && weights == nullptr;
  sorted_bag_ = scratch(context, entries * sizeof(int64_t));
  if (!sorted_bag_->ok()) return Status::Internal("segment gradients: out of device memory");
  if (!plain_sum) {
    entry_bag_ = scratch(context, entries * sizeof(int64_t));
    bag_scale_ = scratch(context, (batch > 0 ? batch : 1) * sizeof(float));
    sorted_weight_ = scratch(context, entries * sizeof(float));
    if (!entry_bag_->ok() || !bag_scale_->ok() || !sorted_weight_->ok()) {
      return Status::Internal("segment gradients: out of device memory");
    }
  }
  view_ = SegmentGradients();
  view_.grad_out = grad_out;
  view_.grad_out_rows = grad_out_rows.at;
  view_.segments = segments;
  view_.sorted_bag = sorted_bag_->as<int64_t>();
  view_.combiner = combiner;
  view_.dim = dim;
  if (plain_sum) {
    if (nnz > 0 && batch > 0) {
      sorted_samples_kernel<<<grid_for(nnz, kThreads), kThreads, 0, stream>>>(
          order, row_offsets, batch, nnz, sorted_bag_->as<int64_t>());
      SOK_EV_LAUNCH_CHECK("sorted_samples");
    }
  } else {
    view_.sorted_weight = sorted_weight_->as<float>();
    view_.bag_scale = bag_scale_->as<float>();
    if (batch > 0) {
      bag_scale_kernel<<<grid_for(batch, kThreads), kThreads, 0, stream>>>(
          weights, row_offsets, batch, combiner, entry_bag_->as<int64_t>(),
          bag_scale_->as<float>());
      SOK_EV_LAUNCH_CHECK("bag_scale");
    }
    if (nnz > 0) {
      sorted_entries_kernel<<<grid_for(nnz, kThreads), kThreads, 0, stream>>>(
          order, entry_bag_->as<int64_t>(), weights, nnz, sorted_bag_->as<int64_t>(),
          sorted_weight_->as<float>());
      SOK_EV_LAUNCH_CHECK("sorted_entries");
    }
  }
  if (max_unique <= 0) return Status::Ok();
  SumDestination destination{sums, sum_rows.at, dim};
  bool destination_aligned = sum_rows.aligned;
  if (sum_rows.at == nullptr) {
    // Distinct keys with nowhere asked to write: each key's one entry is
    // read in place.
    if (sums == nullptr && max_key_entries <= 1) return Status::Ok();
    if (sums == nullptr) {
      sums_ = scratch(context, max_unique * dim * sizeof(float));
      if (!sums_->ok()) return Status::Internal("segment gradients: out of device memory");
      sums = sums_->as<float>();
    }
    view_.sums = sums;
    destination.sums = sums;
    destination_aligned = reinterpret_cast<uintptr_t>(sums) % 16 == 0;
  }
  const int64_t tiles = (nnz + kTileEntries - 1) / kTileEntries;
  partials_ = scratch(context, std::max<int64_t>(2 * tiles * dim, 1) * sizeof(float));
  if (!partials_->ok()) return Status::Internal("segment gradients: out of device memory");
  const bool source_aligned = grad_out_rows.at != nullptr
                                  ? grad_out_rows.aligned
                                  : reinterpret_cast<uintptr_t>(grad_out) % 16 == 0;
  const bool vec = dim % 4 == 0 && source_aligned && destination_aligned;
  float* partials = partials_->as<float>();
  if (tiles > 0) {
    const unsigned blocks = grid_for(tiles * 32, kThreads);
    if (vec) {
      tile_sums_kernel<true><<<blocks, kThreads, 0, stream>>>(view_, num_unique, max_unique, nnz,
                                                              destination, partials);
    } else {
      tile_sums_kernel<false><<<blocks, kThreads, 0, stream>>>(view_, num_unique, max_unique, nnz,
                                                               destination, partials);
    }
    SOK_EV_LAUNCH_CHECK("tile_sums");
  }
  const unsigned blocks = grid_for(max_unique, kThreads);
  if (vec) {
    crossing_sums_kernel<true><<<blocks, kThreads, 0, stream>>>(view_, num_unique, max_unique, nnz,
                                                                destination, partials);
  } else {
    crossing_sums_kernel<false><<<blocks, kThreads, 0, stream>>>(view_, num_unique, max_unique, nnz,
                                                                 destination, partials);
  }
  SOK_EV_LAUNCH_CHECK("crossing_sums");
  return Status::Ok();
}

}  // namespace gpu
}  // namespace sok_ev
