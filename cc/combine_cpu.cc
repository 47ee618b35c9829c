// CPU twin of the per-sample combine and its gradient. See cc/combine.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/combine.h"
#include "cc/unique.h"

namespace sok_ev {
namespace cpu {
namespace {

// What sample [begin, end)'s weighted sum is divided by: 1 for 'sum', the
// weight sum for 'mean', the root of the sum of squared weights for 'sqrtn'
// (tf.nn.embedding_lookup_sparse's denominators).
float combine_denominator(Combiner combiner, const float* weights, int64_t begin, int64_t end) {
  if (combiner == Combiner::kSum) return 1.0f;
  float total = 0.0f;
  for (int64_t j = begin; j < end; ++j) {
    const float w = weights ? weights[j] : 1.0f;
    total += combiner == Combiner::kMean ? w : w * w;
  }
  return combiner == Combiner::kSqrtn ? std::sqrt(total) : total;
}

}  // namespace

int64_t row_offsets_from_sample_ids(const int64_t* sample_ids, int64_t stride, int64_t nnz,
                                    int64_t batch, int64_t* row_offsets) {
  // row_offsets[s] is the first entry whose sample is s or later; samples up
  // to `written` have theirs. A valid id is never below `written`.
  int64_t written = 0;
  row_offsets[0] = 0;
  for (int64_t j = 0; j < nnz; ++j) {
    const int64_t id = sample_ids[j * stride];
    if (id < written || id >= batch) return j;
    while (written < id) row_offsets[++written] = j;
  }
  while (written < batch) row_offsets[++written] = nnz;
  return nnz;
}

int64_t first_invalid_row_split(const int64_t* row_splits, int64_t first_entry, int64_t nnz,
                                int64_t batch) {
  if (row_splits[0] != first_entry) return 0;
  for (int64_t b = 1; b <= batch; ++b) {
    if (row_splits[b] < row_splits[b - 1]) return b;
  }
  return row_splits[batch] == first_entry + nnz ? batch + 1 : batch;
}

void row_offsets_from_row_splits(const int64_t* row_splits, int64_t first_entry, int64_t batch,
                                 int64_t* row_offsets) {
  for (int64_t b = 0; b <= batch; ++b) row_offsets[b] = row_splits[b] - first_entry;
}

namespace {

// combine_forward on samples [first, last), unique row u at row_of(u),
// sample b's vector at out_of(b). Inlined into each of its callers, so that
// it is built for each of their target clones.
template <typename RowOf, typename OutOf>
inline __attribute__((always_inline)) void combine_samples_of(
    RowOf row_of, OutOf out_of, const int64_t* unique_index, const float* weights,
    const int64_t* row_offsets, int64_t first, int64_t last, int64_t dim, Combiner combiner) {
  for (int64_t b = first; b < last; ++b) {
    // The output never overlaps the table rows: restrict lets it vectorise.
    float* __restrict__ sample = out_of(b);
    const int64_t begin = row_offsets[b], end = row_offsets[b + 1];
    if (begin == end) {
      std::fill(sample, sample + dim, 0.0f);
      continue;
    }
    // The first entry starts the sum as 0 + w * v, the bits a zeroed sum
    // gets, without a memset call per sample (one a sample, 64 bytes each,
    // was 5% of the one-hot step).
    const float w0 = weights ? weights[begin] : 1.0f;
    const float* __restrict__ row0 = row_of(unique_index[begin]);
    for (int64_t c = 0; c < dim; ++c) sample[c] = 0.0f + w0 * row0[c];
    for (int64_t j = begin + 1; j < end; ++j) {
      const float w = weights ? weights[j] : 1.0f;
      const float* __restrict__ row = row_of(unique_index[j]);
      for (int64_t c = 0; c < dim; ++c) sample[c] += w * row[c];
    }
    if (combiner != Combiner::kSum) {
      const float denominator = combine_denominator(combiner, weights, begin, end);
      for (int64_t c = 0; c < dim; ++c) sample[c] = div_no_nan(sample[c], denominator);
    }
  }
}

SOK_EV_ROW_LOOPS void combine_samples(const float* unique_values, const int64_t* unique_index,
                                      const float* weights, const int64_t* row_offsets,
                                      int64_t first, int64_t last, int64_t dim, Combiner combiner,
                                      float* out) {
  combine_samples_of([&](int64_t u) { return unique_values + u * dim; },
                     [&](int64_t b) { return out + b * dim; }, unique_index, weights, row_offsets,
                     first, last, dim, combiner);
}

SOK_EV_ROW_LOOPS void combine_samples_into_rows(const float* unique_values,
                                                const int64_t* unique_index, const float* weights,
                                                const int64_t* row_offsets, int64_t first,
                                                int64_t last, int64_t dim, Combiner combiner,
                                                float* const* out_rows) {
  combine_samples_of([&](int64_t u) { return unique_values + u * dim; },
                     [&](int64_t b) { return out_rows[b]; }, unique_index, weights, row_offsets,
                     first, last, dim, combiner);
}

SOK_EV_ROW_LOOPS void combine_sample_rows(const float* const* unique_rows,
                                          const int64_t* unique_index, const float* weights,
                                          const int64_t* row_offsets, int64_t first, int64_t last,
                                          int64_t dim, Combiner combiner, float* out) {
  combine_samples_of([&](int64_t u) { return unique_rows[u]; },
                     [&](int64_t b) { return out + b * dim; }, unique_index, weights, row_offsets,
                     first, last, dim, combiner);
}

// combine_backward on unique keys [first, last), key u's row at row_of(u),
// sample b's gradient at grad_of(b); entry_sample[j] is entry j's sample,
// denominator[b] sample b's combine_denominator.
template <typename RowOf, typename GradOf>
inline __attribute__((always_inline)) void combine_backward_keys_of(
    RowOf row_of, GradOf grad_of, const int64_t* order, const int64_t* segments,
    const float* weights, const int64_t* entry_sample, const float* denominator, int64_t first,
    int64_t last, int64_t dim, Combiner combiner) {
  for (int64_t u = first; u < last; ++u) {
    float* __restrict__ row = row_of(u);
    const int64_t begin = segments[u], end = segments[u + 1];
    if (begin == end) std::fill(row, row + dim, 0.0f);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t j = order[k];
      const int64_t b = entry_sample[j];
      const float w = weights ? weights[j] : 1.0f;
      const float* __restrict__ g = grad_of(b);
      const float d = combiner == Combiner::kSum ? 1.0f : denominator[b];
      // The first entry starts the sum as 0 + x (see combine_samples_of).
      if (k == begin && combiner == Combiner::kSum) {
        for (int64_t c = 0; c < dim; ++c) row[c] = 0.0f + w * g[c];
      } else if (k == begin) {
        for (int64_t c = 0; c < dim; ++c) row[c] = 0.0f + w * div_no_nan(g[c], d);
      } else if (combiner == Combiner::kSum) {
        for (int64_t c = 0; c < dim; ++c) row[c] += w * g[c];
      } else {
        for (int64_t c = 0; c < dim; ++c) row[c] += w * div_no_nan(g[c], d);
      }
    }
  }
}

SOK_EV_ROW_LOOPS void combine_backward_keys(const float* grad_out, const int64_t* order,
                                            const int64_t* segments, const float* weights,
                                            const int64_t* entry_sample, const float* denominator,
                                            int64_t first, int64_t last, int64_t dim,
                                            Combiner combiner, float* grad_unique) {
  combine_backward_keys_of([&](int64_t u) { return grad_unique + u * dim; },
                           [&](int64_t b) { return grad_out + b * dim; }, order, segments, weights,
                           entry_sample, denominator, first, last, dim, combiner);
}

SOK_EV_ROW_LOOPS void combine_backward_keys_from_rows(
    const float* const* grad_out_rows, const int64_t* order, const int64_t* segments,
    const float* weights, const int64_t* entry_sample, const float* denominator, int64_t first,
    int64_t last, int64_t dim, Combiner combiner, float* grad_unique) {
  combine_backward_keys_of([&](int64_t u) { return grad_unique + u * dim; },
                           [&](int64_t b) { return grad_out_rows[b]; }, order, segments, weights,
                           entry_sample, denominator, first, last, dim, combiner);
}

SOK_EV_ROW_LOOPS void combine_backward_key_rows(const float* grad_out, const int64_t* order,
                                                const int64_t* segments, const float* weights,
                                                const int64_t* entry_sample,
                                                const float* denominator, int64_t first,
                                                int64_t last, int64_t dim, Combiner combiner,
                                                float* const* grad_rows) {
  combine_backward_keys_of([&](int64_t u) { return grad_rows[u]; },
                           [&](int64_t b) { return grad_out + b * dim; }, order, segments, weights,
                           entry_sample, denominator, first, last, dim, combiner);
}

// combine_backward's grouping of the entries by key, each entry's sample and
// its sample's denominator, then keys(first, last, ...) on ranges of keys:
// one writer per unique row, no races, entries summed in grouped order.
template <typename Keys>
void combine_backward_grouped(const CpuContext& context, const int64_t* unique_index,
                              const int64_t* segments, int64_t num_unique, const float* weights,
                              const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                              Combiner combiner, Keys keys) {
  std::vector<int64_t> order(nnz);
  group_entries_by_key(unique_index, nnz, segments, num_unique, order.data());
  std::vector<int64_t> entry_sample(nnz);
  std::vector<float> denominator(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = row_offsets[b], end = row_offsets[b + 1];
    std::fill(entry_sample.begin() + begin, entry_sample.begin() + end, b);
    denominator[b] = combine_denominator(combiner, weights, begin, end);
  }
  const int64_t average_count = num_unique > 0 ? nnz / num_unique + 1 : 1;
  context.parallel_for(num_unique, average_count * dim, [&](int64_t first, int64_t last) {
    keys(order.data(), entry_sample.data(), denominator.data(), first, last);
  });
}

// combine_backward_serial with key u's row at row_of(u), zeroed first by
// zero_rows() (one call for a contiguous block, not a memset call per
// row), and sample b's gradient at grad_of(b).
template <typename RowOf, typename GradOf, typename ZeroRows>
inline __attribute__((always_inline)) void combine_backward_serial_of(
    RowOf row_of, GradOf grad_of, ZeroRows zero_rows, const int64_t* unique_index,
    int64_t num_unique, const float* weights, const int64_t* row_offsets, int64_t batch,
    int64_t dim, Combiner combiner) {
  zero_rows();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = row_offsets[b], end = row_offsets[b + 1];
    const float* __restrict__ g = grad_of(b);
    const float d = combine_denominator(combiner, weights, begin, end);
    for (int64_t j = begin; j < end; ++j) {
      const float w = weights ? weights[j] : 1.0f;
      float* __restrict__ row = row_of(unique_index[j]);
      if (combiner == Combiner::kSum) {
        for (int64_t c = 0; c < dim; ++c) row[c] += w * g[c];
      } else {
        for (int64_t c = 0; c < dim; ++c) row[c] += w * div_no_nan(g[c], d);
      }
    }
  }
}

}  // namespace

void combine_forward(const CpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out) {
  const int64_t average_hotness = batch > 0 ? row_offsets[batch] / batch + 1 : 1;
  context.parallel_for(batch, average_hotness * dim, [&](int64_t first, int64_t last) {
    combine_samples(unique_values, unique_index, weights, row_offsets, first, last, dim, combiner,
                    out);
  });
}

void combine_forward_into_rows(const CpuContext& context, const float* unique_values,
                               const int64_t* unique_index, const float* weights,
                               const int64_t* row_offsets, int64_t batch, int64_t dim,
                               Combiner combiner, float* const* out_rows) {
  const int64_t average_hotness = batch > 0 ? row_offsets[batch] / batch + 1 : 1;
  context.parallel_for(batch, average_hotness * dim, [&](int64_t first, int64_t last) {
    combine_samples_into_rows(unique_values, unique_index, weights, row_offsets, first, last, dim,
                              combiner, out_rows);
  });
}

void combine_forward_rows(const CpuContext& context, const float* const* unique_rows,
                          const int64_t* unique_index, const float* weights,
                          const int64_t* row_offsets, int64_t batch, int64_t dim, Combiner combiner,
                          float* out) {
  const int64_t average_hotness = batch > 0 ? row_offsets[batch] / batch + 1 : 1;
  context.parallel_for(batch, average_hotness * dim, [&](int64_t first, int64_t last) {
    combine_sample_rows(unique_rows, unique_index, weights, row_offsets, first, last, dim, combiner,
                        out);
  });
}

void combine_backward(const CpuContext& context, const float* grad_out, const int64_t* unique_index,
                      const int64_t* segments, int64_t num_unique, const float* weights,
                      const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                      Combiner combiner, float* grad_unique) {
  combine_backward_grouped(
      context, unique_index, segments, num_unique, weights, row_offsets, batch, nnz, dim, combiner,
      [&](const int64_t* order, const int64_t* entry_sample, const float* denominator,
          int64_t first, int64_t last) {
        combine_backward_keys(grad_out, order, segments, weights, entry_sample, denominator, first,
                              last, dim, combiner, grad_unique);
      });
}

void combine_backward_rows(const CpuContext& context, const float* grad_out,
                           const int64_t* unique_index, const int64_t* segments, int64_t num_unique,
                           const float* weights, const int64_t* row_offsets, int64_t batch,
                           int64_t nnz, int64_t dim, Combiner combiner, float* const* grad_rows) {
  combine_backward_grouped(
      context, unique_index, segments, num_unique, weights, row_offsets, batch, nnz, dim, combiner,
      [&](const int64_t* order, const int64_t* entry_sample, const float* denominator,
          int64_t first, int64_t last) {
        combine_backward_key_rows(grad_out, order, segments, weights, entry_sample, denominator,
                                  first, last, dim, combiner, grad_rows);
      });
}

void combine_backward_from_rows(const CpuContext& context, const float* const* grad_out_rows,
                                const int64_t* unique_index, const int64_t* segments,
                                int64_t num_unique, const float* weights,
                                const int64_t* row_offsets, int64_t batch, int64_t nnz, int64_t dim,
                                Combiner combiner, float* grad_unique) {
  combine_backward_grouped(
      context, unique_index, segments, num_unique, weights, row_offsets, batch, nnz, dim, combiner,
      [&](const int64_t* order, const int64_t* entry_sample, const float* denominator,
          int64_t first, int64_t last) {
        combine_backward_keys_from_rows(grad_out_rows, order, segments, weights, entry_sample,
                                        denominator, first, last, dim, combiner, grad_unique);
      });
}

SOK_EV_ROW_LOOPS void combine_backward_serial(const float* grad_out, const int64_t* unique_index,
                                              int64_t num_unique, const float* weights,
                                              const int64_t* row_offsets, int64_t batch,
                                              int64_t dim, Combiner combiner, float* grad_unique) {
  combine_backward_serial_of([&](int64_t u) { return grad_unique + u * dim; },
                             [&](int64_t b) { return grad_out + b * dim; },
                             [&] { std::fill(grad_unique, grad_unique + num_unique * dim, 0.0f); },
                             unique_index, num_unique, weights, row_offsets, batch, dim, combiner);
}

SOK_EV_ROW_LOOPS void combine_backward_from_rows_serial(const float* const* grad_out_rows,
                                                        const int64_t* unique_index,
                                                        int64_t num_unique, const float* weights,
                                                        const int64_t* row_offsets, int64_t batch,
                                                        int64_t dim, Combiner combiner,
                                                        float* grad_unique) {
  combine_backward_serial_of([&](int64_t u) { return grad_unique + u * dim; },
                             [&](int64_t b) { return grad_out_rows[b]; },
                             [&] { std::fill(grad_unique, grad_unique + num_unique * dim, 0.0f); },
                             unique_index, num_unique, weights, row_offsets, batch, dim, combiner);
}

SOK_EV_ROW_LOOPS void combine_backward_rows_serial(const float* grad_out,
                                                   const int64_t* unique_index, int64_t num_unique,
                                                   const float* weights, const int64_t* row_offsets,
                                                   int64_t batch, int64_t dim, Combiner combiner,
                                                   float* const* grad_rows) {
  combine_backward_serial_of([&](int64_t u) { return grad_rows[u]; },
                             [&](int64_t b) { return grad_out + b * dim; },
                             [&] {
                               for (int64_t u = 0; u < num_unique; ++u)
                                 std::fill(grad_rows[u], grad_rows[u] + dim, 0.0f);
                             },
                             unique_index, num_unique, weights, row_offsets, batch, dim, combiner);
}

}  // namespace cpu
}  // namespace sok_ev
