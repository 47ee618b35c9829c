// The forward lookup's gather + combine straight from the tables' rows: no
// (num_unique, dim) matrix of values in between. find_or_insert resolves the
// batch's unique keys to rows first.
#ifndef SOK_EV_CC_FUSED_LOOKUP_GPU_H_
#define SOK_EV_CC_FUSED_LOOKUP_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/hash_table_gpu.h"

namespace sok_ev {
namespace gpu {

// One table of lookup_combine_tables: sample b's vector is the combination
// of its entries' rows, as combine_forward, for keys whose rows are already
// resolved (find_or_insert gives the rows of the batch's unique keys), so
// the forward gathers straight from the table: entry j reads row
// row_ids[combine.unique_index[j]].
template <typename Key>
struct LookupCombineTable {
  const HashTable<Key>* table;
  const int64_t* row_ids;  // (num_unique,) from this table since its last insert
  // The samples and where their vectors go; its rows (unique_values,
  // unique_rows) and dim are the table's, read at the launch.
  CombineForwardTable combine;
};

// Every table's combine: one launch for all tables of a kernel variant (dim
// and alignment).
template <typename Key>
Status lookup_combine_tables(const GpuContext& context, const LookupCombineTable<Key>* tables,
                             size_t n);

// One table's, into a (batch, table.dim()) matrix.
template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_FUSED_LOOKUP_GPU_H_
