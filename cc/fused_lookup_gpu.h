// The forward lookup's gather + combine straight from the table's rows: no
// (num_unique, dim) matrix of values in between. find_or_insert resolves the
// batch's unique keys to rows first.
#ifndef SOK_EV_CC_FUSED_LOOKUP_GPU_H_
#define SOK_EV_CC_FUSED_LOOKUP_GPU_H_

#include <cstdint>

#include "cc/common.h"
#include "cc/hash_table_gpu.h"

namespace sok_ev {
namespace gpu {

// out[b] = combination of the rows of sample b's entries, as
// combine_forward, for keys whose rows are already resolved (the rows of the
// batch's unique keys come from find_or_insert), so the forward gathers
// straight from the table: entry j reads row row_ids[inverse[j]].
//   row_ids:     (num_unique,) from this table since its last insert
//   inverse:     (nnz,) unique index of each entry
//   weights:     (nnz,) or null
//   row_offsets: (batch + 1,)
//   out:         (batch, table.dim()) out, every element written
template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out);

// The same, sample b's vector written at out_rows[b] (rows where a row
// message wants them: FindOrInsertRowMessage); rows_aligned: every one
// starts 16-byte aligned. The rows must not overlap.
//   out_rows: (batch,)
template <typename Key>
Status lookup_combine_into_rows(const GpuContext& context, const HashTable<Key>& table,
                                const int64_t* row_ids, const int64_t* inverse,
                                const float* weights, const int64_t* row_offsets, int64_t batch,
                                Combiner combiner, float* const* out_rows, bool rows_aligned);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_FUSED_LOOKUP_GPU_H_
