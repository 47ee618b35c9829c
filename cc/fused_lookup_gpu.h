// Forward lookup fused end to end: hash find + gather + combine in one
// kernel, no unique-values matrix in between. For a table already holding
// the batch's keys (training inserts them with find_or_insert first).
#ifndef SOK_EV_CC_FUSED_LOOKUP_GPU_H_
#define SOK_EV_CC_FUSED_LOOKUP_GPU_H_

#include <cstdint>

#include "cc/common.h"
#include "cc/hash_table_gpu.h"

namespace sok_ev {
namespace gpu {

// out[b] = combination of the values of keys[row_offsets[b] ..
// row_offsets[b + 1]), as combine_forward. A key absent from the table
// contributes a zero vector (its weight still counts for kMean / kSqrtn).
//   keys:        (nnz,) device
//   weights:     (nnz,) or null
//   row_offsets: (batch + 1,)
//   out:         (batch, table.dim()) out, every element written
template <typename Key>
Status lookup_combine(const GpuContext& context, const HashTable<Key>& table, const Key* keys,
                      const float* weights, const int64_t* row_offsets, int64_t batch,
                      Combiner combiner, float* out);

// lookup_combine for keys whose rows are already resolved (training: the
// rows of the batch's unique keys come from find_or_insert), so the forward
// gathers without probing: entry j reads row row_ids[inverse[j]].
//   row_ids: (num_unique,) from this table since its last insert
//   inverse: (nnz,) unique index of each entry; the rest as lookup_combine
template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_FUSED_LOOKUP_GPU_H_
