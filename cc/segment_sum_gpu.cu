// SegmentGradientSums::prepare: see cc/segment_sum_gpu.h.
#include <algorithm>
#include <vector>

#include "cc/lower_bound_gpu.h"
#include "cc/segment_sum_gpu.h"
#include "cc/table_launch_gpu.h"
#include "cc/warp_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// One table as the passes before the sums read it.
struct EntriesTable {
  const int64_t* order;        // (nnz,)
  const int64_t* row_offsets;  // (batch + 1,)
  const float* weights;        // (nnz,) or null
  int64_t* entry_bag;          // (nnz,) scratch; null: a sum of unweighted entries
  float* bag_scale;            // (batch,) out, with entry_bag
  int64_t* sorted_bag;         // (nnz,) out
  float* sorted_weight;        // (nnz,) out, with entry_bag
  int64_t batch;
  int64_t nnz;
  Combiner combiner;
};

// One table as the sums read it.
struct SumsTable {
  SegmentGradients s;
  const int64_t* num_unique;  // device, or null: max_unique is the count
  int64_t max_unique;
  int64_t nnz;
  float* sums;             // (max_unique, dim) out (s.sums, writable), or null
  float* const* sum_rows;  // (max_unique,) or null: key u's gradient at sums + u * dim
  float* partials;         // head (tiles, dim), then tail (tiles, dim)
};

// Each entry's sample, and each sample's denominator (1, sum w, or
// sqrt(sum w^2)), as combine_forward divides. Tables without entry_bag have
// nothing to do.
__global__ void bag_scale_kernel(LaunchTables<EntriesTable> tables) {
  const EntriesTable& table = tables.at[blockIdx.y];
  if (table.entry_bag == nullptr) return;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < table.batch;
       b += int64_t(gridDim.x) * blockDim.x) {
    float weight_sum = 0.0f, weight_square_sum = 0.0f;
    for (int64_t j = table.row_offsets[b]; j < table.row_offsets[b + 1]; ++j) {
      const float w = table.weights != nullptr ? table.weights[j] : 1.0f;
      weight_sum += w;
      weight_square_sum += w * w;
      table.entry_bag[j] = b;
    }
    float denominator = 1.0f;
    if (table.combiner == Combiner::kMean) denominator = weight_sum;
    if (table.combiner == Combiner::kSqrtn) denominator = sqrtf(weight_square_sum);
    table.bag_scale[b] = denominator;
  }
}

// Each grouped entry's sample and weight (one dependent load fewer in the
// sums: segments -> sorted_bag -> gradient row). A sum of unweighted entries
// reads no denominator and no weight: its entry's sample is found in the row
// offsets, in one pass (bag_scale_kernel's is not needed).
__global__ void sorted_entries_kernel(LaunchTables<EntriesTable> tables) {
  const EntriesTable& table = tables.at[blockIdx.y];
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < table.nnz;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = table.order[k];
    if (table.entry_bag == nullptr) {
      // The last sample b whose entries start at or before entry j.
      table.sorted_bag[k] = lower_bound(table.row_offsets, table.batch + 1, j + 1) - 1;
    } else {
      table.sorted_bag[k] = table.entry_bag[j];
      table.sorted_weight[k] = table.weights != nullptr ? table.weights[j] : 1.0f;
    }
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
__global__ void __launch_bounds__(kThreads, 3) tile_sums_kernel(LaunchTables<SumsTable> tables) {
  const SumsTable& table = tables.at[blockIdx.y];
  const SegmentGradients& s = table.s;
  const int64_t nnz = table.nnz;
  const SumDestination sums{table.sums, table.sum_rows, s.dim};
  float* const partials = table.partials;
  constexpr int kWidth = kVec ? 4 : 1;
  // 3 blocks an SM: 80 registers (104 uncapped, 4 bytes spilled; with 8
  // float4 rows ahead 72 bytes spill; clang, 2026-11-23).
  constexpr int kAhead = kVec ? 4 : 8;
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int64_t dim = s.dim;
  const int64_t tiles = (nnz + kTileEntries - 1) / kTileEntries;
  const int64_t count = table.num_unique != nullptr ? *table.num_unique : table.max_unique;
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
__global__ void __launch_bounds__(kThreads) crossing_sums_kernel(LaunchTables<SumsTable> tables) {
  const SumsTable& table = tables.at[blockIdx.y];
  const SegmentGradients& s = table.s;
  const int64_t nnz = table.nnz;
  const SumDestination sums{table.sums, table.sum_rows, s.dim};
  const float* const partials = table.partials;
  constexpr int kWidth = kVec ? 4 : 1;
  // A hot key's parts form one serial chain (about 190 for the hottest
  // Zipf key of a one-hot 65536 batch): its time is parts / kAhead loads'
  // latency, so many loads fly at once. The sum's order is unchanged.
  constexpr int kAhead = kVec ? 8 : 16;
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int64_t dim = s.dim;
  const int64_t tiles = (nnz + kTileEntries - 1) / kTileEntries;
  const int64_t count = table.num_unique != nullptr ? *table.num_unique : table.max_unique;
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

int64_t round_up_to_4(int64_t n) { return (n + 3) / 4 * 4; }

}  // namespace

Status SegmentGradientSums::prepare(const GpuContext& context, const float* grad_out,
                                    const float* weights, const int64_t* row_offsets, int64_t batch,
                                    int64_t nnz, Combiner combiner, const int64_t* order,
                                    const int64_t* segments, const int64_t* num_unique,
                                    int64_t max_unique, int64_t max_key_entries, int64_t dim,
                                    float* sums, AddressedRows<float> sum_rows,
                                    AddressedRows<const float> grad_out_rows) {
  return prepare(context, {{grad_out, weights, row_offsets, batch, nnz, combiner, order, segments,
                            num_unique, max_unique, max_key_entries, dim, sums, sum_rows,
                            grad_out_rows, /*distinct_rows=*/order == nullptr}});
}

Status SegmentGradientSums::prepare(const GpuContext& context,
                                    const std::vector<SegmentSumTable>& tables) {
  const int n = static_cast<int>(tables.size());
  // Each table's share of the scratch buffers (offsets in elements; sums
  // and partials in whole float4s, so that each table's rows stay aligned).
  std::vector<int64_t> entry_at(n), weighted_at(n, -1), bag_at(n), sums_at(n, -1),
      partials_at(n, -1);
  int64_t entries = 0, weighted_entries = 0, bags = 0, sum_floats = 0, partial_floats = 0;
  for (int t = 0; t < n; ++t) {
    const SegmentSumTable& table = tables[t];
    if (table.distinct_rows &&
        (table.weights != nullptr || table.combiner != Combiner::kSum ||
         table.max_key_entries > 1 || table.sums != nullptr || table.sum_rows.at != nullptr)) {
      return Status::InvalidArgument(
          "segment gradients: distinct rows are summed unweighted and read in place");
    }
    entry_at[t] = entries;
    if (!table.distinct_rows) entries += table.nnz;
    // A sum of unweighted entries reads no denominator and no weight.
    if (table.combiner != Combiner::kSum || table.weights != nullptr) {
      weighted_at[t] = weighted_entries;
      weighted_entries += table.nnz;
      bag_at[t] = bags;
      bags += table.batch;
    }
    // Distinct keys with nowhere asked to write: each key's one entry is
    // read in place, with no sums.
    const bool in_place =
        table.sum_rows.at == nullptr && table.sums == nullptr && table.max_key_entries <= 1;
    if (table.max_unique <= 0 || in_place) continue;
    if (table.sum_rows.at == nullptr && table.sums == nullptr) {
      sums_at[t] = sum_floats;
      sum_floats += round_up_to_4(table.max_unique * table.dim);
    }
    partials_at[t] = partial_floats;
    const int64_t tiles = (table.nnz + kTileEntries - 1) / kTileEntries;
    partial_floats += round_up_to_4(2 * tiles * table.dim);
  }
  const Status out_of_memory = Status::Internal("segment gradients: out of device memory");
  sorted_bag_ = scratch(context, std::max<int64_t>(entries, 1) * sizeof(int64_t));
  if (!sorted_bag_->ok()) return out_of_memory;
  if (weighted_entries > 0 || bags > 0) {
    entry_bag_ = scratch(context, std::max<int64_t>(weighted_entries, 1) * sizeof(int64_t));
    sorted_weight_ = scratch(context, std::max<int64_t>(weighted_entries, 1) * sizeof(float));
    bag_scale_ = scratch(context, std::max<int64_t>(bags, 1) * sizeof(float));
    if (!entry_bag_->ok() || !sorted_weight_->ok() || !bag_scale_->ok()) return out_of_memory;
  }
  if (sum_floats > 0) {
    sums_ = scratch(context, sum_floats * sizeof(float));
    if (!sums_->ok()) return out_of_memory;
  }
  // Summed tables whose keys have no entries (no tiles) still point here.
  if (std::any_of(partials_at.begin(), partials_at.end(), [](int64_t at) { return at >= 0; })) {
    partials_ = scratch(context, std::max<int64_t>(partial_floats, 1) * sizeof(float));
    if (!partials_->ok()) return out_of_memory;
  }

  views_.assign(n, SegmentGradients());
  std::vector<EntriesTable> entry_passes;
  std::vector<SumsTable> sums_passes[2];  // [vec]: float4 rows or not
  for (int t = 0; t < n; ++t) {
    const SegmentSumTable& table = tables[t];
    SegmentGradients& view = views_[t];
    view.grad_out = table.grad_out;
    view.grad_out_rows = table.grad_out_rows.at;
    view.segments = table.segments;
    view.combiner = table.combiner;
    view.dim = table.dim;
    if (table.distinct_rows) continue;  // nothing to sort
    view.sorted_bag = sorted_bag_->as<int64_t>() + entry_at[t];
    EntriesTable entry_pass{table.order,   table.row_offsets,
                            table.weights, nullptr,
                            nullptr,       sorted_bag_->as<int64_t>() + entry_at[t],
                            nullptr,       table.batch,
                            table.nnz,     table.combiner};
    if (weighted_at[t] >= 0) {
      entry_pass.entry_bag = entry_bag_->as<int64_t>() + weighted_at[t];
      entry_pass.bag_scale = bag_scale_->as<float>() + bag_at[t];
      entry_pass.sorted_weight = sorted_weight_->as<float>() + weighted_at[t];
      view.sorted_weight = entry_pass.sorted_weight;
      view.bag_scale = entry_pass.bag_scale;
    }
    entry_passes.push_back(entry_pass);
    if (partials_at[t] < 0) continue;
    bool destination_aligned = table.sum_rows.aligned;
    float* sums = nullptr;
    if (table.sum_rows.at == nullptr) {
      sums = sums_at[t] >= 0 ? sums_->as<float>() + sums_at[t] : table.sums;
      view.sums = sums;
      destination_aligned = reinterpret_cast<uintptr_t>(sums) % 16 == 0;
    }
    const bool source_aligned = table.grad_out_rows.at != nullptr
                                    ? table.grad_out_rows.aligned
                                    : reinterpret_cast<uintptr_t>(table.grad_out) % 16 == 0;
    const bool vec = table.dim % 4 == 0 && source_aligned && destination_aligned;
    sums_passes[vec].push_back({view, table.num_unique, table.max_unique, table.nnz, sums,
                                table.sum_rows.at, partials_->as<float>() + partials_at[t]});
  }

  cudaStream_t stream = stream_of(context);
  SOK_EV_RETURN_IF_ERROR(launch_by_table(
      entry_passes.data(), entry_passes.size(),
      [](const EntriesTable& table) { return table.entry_bag != nullptr ? table.batch : 0; },
      [&](const LaunchTables<EntriesTable>& batch, int /*first*/, int count, int64_t longest) {
        bag_scale_kernel<<<dim3(grid_for(longest, kThreads), count), kThreads, 0, stream>>>(batch);
      },
      "bag_scale"));
  SOK_EV_RETURN_IF_ERROR(launch_by_table(
      entry_passes.data(), entry_passes.size(), [](const EntriesTable& table) { return table.nnz; },
      [&](const LaunchTables<EntriesTable>& batch, int /*first*/, int count, int64_t longest) {
        sorted_entries_kernel<<<dim3(grid_for(longest, kThreads), count), kThreads, 0, stream>>>(
            batch);
      },
      "sorted_entries"));
  for (const bool vec : {false, true}) {
    const std::vector<SumsTable>& passes = sums_passes[vec];
    // A warp a tile of kTileEntries grouped entries.
    auto tile_threads = [](const SumsTable& table) {
      return (table.nnz + kTileEntries - 1) / kTileEntries * 32;
    };
    SOK_EV_RETURN_IF_ERROR(launch_by_table(
        passes.data(), passes.size(), tile_threads,
        [&](const LaunchTables<SumsTable>& batch, int /*first*/, int count, int64_t longest) {
          const dim3 grid(grid_for(longest, kThreads), count);
          if (vec) {
            tile_sums_kernel<true><<<grid, kThreads, 0, stream>>>(batch);
          } else {
            tile_sums_kernel<false><<<grid, kThreads, 0, stream>>>(batch);
          }
        },
        "tile_sums"));
    // The crossing keys' pass runs even without tiles: a key without
    // entries gets zeros.
    SOK_EV_RETURN_IF_ERROR(launch_by_table(
        passes.data(), passes.size(), [](const SumsTable& table) { return table.max_unique; },
        [&](const LaunchTables<SumsTable>& batch, int /*first*/, int count, int64_t longest) {
          const dim3 grid(grid_for(longest, kThreads), count);
          if (vec) {
            crossing_sums_kernel<true><<<grid, kThreads, 0, stream>>>(batch);
          } else {
            crossing_sums_kernel<false><<<grid, kThreads, 0, stream>>>(batch);
          }
        },
        "crossing_sums"));
  }
  return Status::Ok();
}

}  // namespace gpu
}  // namespace sok_ev
