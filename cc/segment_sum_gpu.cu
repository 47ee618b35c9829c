// SegmentGradientSums::prepare: see cc/segment_sum_gpu.h.
#include <cub/device/device_scan.cuh>

#include "cc/lower_bound_gpu.h"
#include "cc/segment_sum_gpu.h"

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

// counts[u]: key u's chunks of chunk_length entries, 0 unless it has more
// than kChunkEntries entries; counts[u] = 0 past the device count too.
//   counts: (max_unique + 1,) out
__global__ void chunk_counts_kernel(const int64_t* segments, const int64_t* num_unique,
                                    int64_t max_unique, int64_t* counts) {
  const int64_t count = num_unique != nullptr ? *num_unique : max_unique;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u <= max_unique;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t length = u < count ? segments[u + 1] - segments[u] : 0;
    const int64_t chunk = chunk_length(length);
    counts[u] = length > kChunkEntries ? (length + chunk - 1) / chunk : 0;
  }
}

// A warp per chunk: its entries' sum, row by row of 256 columns.
//   chunk_offsets: (max_unique + 1,), its last entry the number of chunks
//   partials: (chunks, dim) out
__global__ void chunk_sums_kernel(SegmentGradients s, int64_t max_unique, float* partials) {
  const int lane = threadIdx.x & 31;
  const int64_t chunks = s.chunk_offsets[max_unique];
  for (int64_t chunk = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; chunk < chunks;
       chunk += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    // The key owning the chunk: the last u with chunk_offsets[u] <= chunk.
    const int64_t u = lower_bound(s.chunk_offsets, max_unique + 1, chunk + 1) - 1;
    const int64_t length = chunk_length(s.segments[u + 1] - s.segments[u]);
    const int64_t lo = s.segments[u] + (chunk - s.chunk_offsets[u]) * length;
    const int64_t hi = lo + length < s.segments[u + 1] ? lo + length : s.segments[u + 1];
    float* destination = partials + chunk * s.dim;
    for (int64_t c0 = 0; c0 < s.dim; c0 += 32 * 8) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      accumulate_entries<32>(s, lo, hi, c0, lane, acc);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t c = c0 + e * 32 + lane;
        if (c < s.dim) destination[c] = acc[e];
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
                                    int64_t max_unique, int64_t max_key_entries, int64_t dim) {
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
  // No key can be long: every key sums its entries directly.
  if (max_unique <= 0 || nnz <= kChunkEntries || max_key_entries <= kChunkEntries) {
    return Status::Ok();
  }
  counts_ = scratch(context, (max_unique + 1) * sizeof(int64_t));
  chunk_offsets_ = scratch(context, (max_unique + 1) * sizeof(int64_t));
  if (!counts_->ok() || !chunk_offsets_->ok()) {
    return Status::Internal("segment gradients: out of device memory");
  }
  chunk_counts_kernel<<<grid_for(max_unique + 1, kThreads), kThreads, 0, stream>>>(
      segments, num_unique, max_unique, counts_->as<int64_t>());
  SOK_EV_LAUNCH_CHECK("chunk_counts");
  size_t scan_bytes = 0;
  SOK_EV_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts_->as<int64_t>(),
                                                   chunk_offsets_->as<int64_t>(), max_unique + 1,
                                                   stream));
  scan_temp_ = scratch(context, scan_bytes);
  if (!scan_temp_->ok()) return Status::Internal("segment gradients: out of device memory");
  SOK_EV_CUDA_RETURN(
      cub::DeviceScan::ExclusiveSum(scan_temp_->get(), scan_bytes, counts_->as<int64_t>(),
                                    chunk_offsets_->as<int64_t>(), max_unique + 1, stream));
  // A long key has length > kChunkEntries and chunks of at least that, so
  // ceil(length / chunk) < 2 * length / kChunkEntries: the chunks are fewer
  // than 2 nnz / kChunkEntries.
  const int64_t max_chunks = 2 * nnz / kChunkEntries + 1;
  partials_ = scratch(context, max_chunks * dim * sizeof(float));
  if (!partials_->ok()) return Status::Internal("segment gradients: out of device memory");
  view_.chunk_offsets = chunk_offsets_->as<int64_t>();
  view_.partials = partials_->as<float>();
  chunk_sums_kernel<<<grid_for(max_chunks * 32, kThreads), kThreads, 0, stream>>>(
      view_, max_unique, partials_->as<float>());
  SOK_EV_LAUNCH_CHECK("chunk_sums");
  return Status::Ok();
}

}  // namespace gpu
}  // namespace sok_ev
