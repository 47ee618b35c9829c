// The backward pass of a combined lookup fused with the optimizer: each
// unique key's gradient is summed in registers / shared memory and applied
// to its row at once, so the (num_unique, dim) gradient matrix never goes
// through device memory and no second sort or probe is needed.
#ifndef SOK_EV_CC_BACKWARD_APPLY_GPU_H_
#define SOK_EV_CC_BACKWARD_APPLY_GPU_H_

#include <cstdint>

#include "cc/common.h"
#include "cc/hash_table_gpu.h"
#include "cc/optimizers.h"

namespace sok_ev {
namespace gpu {

// combine_backward's gradient of each unique key (same sums, same bits),
// applied at once to its row with update_element (cc/optimizers.h), and the
// row's version set to global_step: unique u's gradient sums its entries
// order[segments[u] .. segments[u + 1]) in that order.
//   grad_out: (batch, dim)  weights: (nnz,) or null  row_offsets: (batch + 1,)
//   order, segments, num_unique: from unique_keys_segmented (device); or,
//     for distinct keys one per gradient row (max_key_entries 1), order,
//     segments and row_offsets null: key u's gradient is row u
//   num_unique: device, or null: max_unique is the count
//   max_unique: host upper bound of *num_unique (sizes the launch)
//   max_key_entries: host bound on any key's entries (nnz when unknown; 1
//     when the keys are distinct: each key's one entry is read in place,
//     with no sums pass)
//   row_ids: (num_unique,) the unique keys' rows (find_or_insert)
template <typename Key>
Status combine_backward_apply(const GpuContext& context, HashTable<Key>& table,
                              const OptimizerSpec& spec, const float* grad_out,
                              const float* weights, const int64_t* row_offsets, int64_t batch,
                              int64_t nnz, Combiner combiner, const int64_t* order,
                              const int64_t* segments, const int64_t* num_unique,
                              int64_t max_unique, int64_t max_key_entries, const int64_t* row_ids,
                              int64_t global_step);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_BACKWARD_APPLY_GPU_H_
