// Per-sample combination of embedding rows (forward) and its gradient
// (backward), the arithmetic of tf.nn.embedding_lookup_sparse.
//
// Sample b owns the entries j in [row_offsets[b], row_offsets[b + 1]); entry
// j reads unique row unique_index[j] with weight weights[j] (1 when weights
// is null). An empty sample gives a zero vector.
#ifndef SOK_EV_CC_COMBINE_H_
#define SOK_EV_CC_COMBINE_H_

#include <cstdint>

#include "cc/common.h"

namespace sok_ev {
namespace cpu {

// Turns the (sorted) sample id of each entry into per-sample offsets.
//   sample_ids:  (nnz,) non-decreasing, each in [0, batch)
//   row_offsets: (batch + 1,) out
void row_offsets_from_sample_ids(const int64_t* sample_ids, int64_t nnz, int64_t batch,
                                 int64_t* row_offsets);

//   unique_values: (num_unique, dim)   unique_index: (nnz,)
//   weights:       (nnz,) or null      row_offsets:  (batch + 1,)
//   out:           (batch, dim) out, every element written
void combine_forward(const CpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out);

// Gradient of combine_forward with respect to unique_values, summed over
// every occurrence of each unique key.
//   grad_out:    (batch, dim)
//   grad_unique: (num_unique, dim) out, every element written
void combine_backward(const CpuContext& context, const float* grad_out, const int64_t* unique_index,
                      const float* weights, const int64_t* row_offsets, int64_t batch, int64_t dim,
                      Combiner combiner, int64_t num_unique, float* grad_unique);

}  // namespace cpu

namespace gpu {
// The same three functions and contracts with device pointers, work ordered
// on context.stream.
void row_offsets_from_sample_ids(const GpuContext& context, const int64_t* sample_ids, int64_t nnz,
                                 int64_t batch, int64_t* row_offsets);
void combine_forward(const GpuContext& context, const float* unique_values,
                     const int64_t* unique_index, const float* weights, const int64_t* row_offsets,
                     int64_t batch, int64_t dim, Combiner combiner, float* out);
void combine_backward(const GpuContext& context, const float* grad_out, const int64_t* unique_index,
                      const float* weights, const int64_t* row_offsets, int64_t batch, int64_t dim,
                      Combiner combiner, int64_t num_unique, float* grad_unique);
}  // namespace gpu

}  // namespace sok_ev

#endif  // SOK_EV_CC_COMBINE_H_
