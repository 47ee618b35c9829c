// CPU twin of the per-sample combine and its gradient. See cc/combine.h.
#include <algorithm>
#include <cmath>

#include "cc/combine.h"

namespace sok_ev {
namespace cpu {
namespace {

// The factor that turns sample b's weighted sum into the combined vector.
float combine_scale(Combiner combiner, const float* weights, int64_t begin, int64_t end) {
  if (combiner == Combiner::kSum || begin == end) return 1.0f;
  float total = 0.0f;
  for (int64_t j = begin; j < end; ++j) {
    const float w = weights ? weights[j] : 1.0f;
    total += combiner == Combiner::kMean ? w : w * w;
  }
  if (combiner == Combiner::kSqrtn) total = std::sqrt(total);
  // tf.nn.embedding_lookup_sparse divides without a guard too: a sample
  // whose weights sum to zero gives inf/nan there as here.
  return 1.0f / total;
}

}  // namespace

void row_offsets_from_sample_ids(const int64_t* sample_ids, int64_t nnz, int64_t batch,
                                 int64_t* row_offsets) {
  std::fill(row_offsets, row_offsets + batch + 1, 0);
  for (int64_t j = 0; j < nnz; ++j) ++row_offsets[sample_ids[j] + 1];
  for (int64_t b = 0; b < batch; ++b) row_offsets[b + 1] += row_offsets[b];
}

void combine_forward(const CpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out) {
  const int64_t average_hotness = batch > 0 ? row_offsets[batch] / batch + 1 : 1;
  context.parallel_for(batch, average_hotness * dim, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      // The output never overlaps the table rows: restrict lets it vectorise.
      float* __restrict__ sample = out + b * dim;
      std::fill(sample, sample + dim, 0.0f);
      const int64_t begin = row_offsets[b], end = row_offsets[b + 1];
      for (int64_t j = begin; j < end; ++j) {
        const float w = weights ? weights[j] : 1.0f;
        const float* __restrict__ row = unique_values + unique_index[j] * dim;
        for (int64_t c = 0; c < dim; ++c) sample[c] += w * row[c];
      }
      const float scale = combine_scale(combiner, weights, begin, end);
      if (scale != 1.0f) {
        for (int64_t c = 0; c < dim; ++c) sample[c] *= scale;
      }
    }
  });
}

void combine_backward(const CpuContext& /*context*/, const float* grad_out,
                      const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                      int64_t batch, int64_t dim, Combiner combiner, int64_t num_unique,
                      float* grad_unique) {
  // Serial scatter-add: samples sharing a key write the same row, and a
  // single pass over the batch is memory-bound anyway.
  std::fill(grad_unique, grad_unique + num_unique * dim, 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = row_offsets[b], end = row_offsets[b + 1];
    const float scale = combine_scale(combiner, weights, begin, end);
    const float* __restrict__ g = grad_out + b * dim;
    for (int64_t j = begin; j < end; ++j) {
      const float w = (weights ? weights[j] : 1.0f) * scale;
      float* __restrict__ row = grad_unique + unique_index[j] * dim;
      for (int64_t c = 0; c < dim; ++c) row[c] += w * g[c];
    }
  }
}

}  // namespace cpu
}  // namespace sok_ev
