// gpu::lookup_combine_tables: see cc/fused_lookup_gpu.h.
#include <vector>

#include "cc/combine_kernels_gpu.h"
#include "cc/fused_lookup_gpu.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

// Rows already resolved: entry -> unique index -> arena row.
struct RowIdSource {
  const float* rows;
  int64_t row_width;
  const int64_t* row_ids;  // (num_unique,)
  const int64_t* inverse;  // (nnz,)
  __device__ __forceinline__ int64_t resolve(int64_t entry) const {
    return row_ids[inverse[entry]];
  }
  __device__ __forceinline__ const float* row(int64_t handle) const {
    return rows + handle * row_width;
  }
};

}  // namespace

// Each table's view is read at the launch, after every insert before it.
template <typename Key>
Status lookup_combine_tables(const GpuContext& context, const LookupCombineTable<Key>* tables,
                             size_t n) {
  CombineLaunches<RowIdSource> launches;
  for (size_t t = 0; t < n; ++t) {
    const TableView<Key> view = tables[t].table->view();
    CombineForwardTable combine = tables[t].combine;
    combine.dim = view.dim;
    launches.add(combine,
                 RowIdSource{view.rows, view.row_width, tables[t].row_ids, combine.unique_index},
                 /*source_by_address=*/false);
  }
  return launches.launch(stream_of(context), "lookup_combine_rows");
}

template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out) {
  LookupCombineTable<Key> one;
  one.table = &table;
  one.row_ids = row_ids;
  one.combine.unique_index = inverse;
  one.combine.weights = weights;
  one.combine.row_offsets = row_offsets;
  one.combine.batch = batch;
  one.combine.combiner = combiner;
  one.combine.out = out;
  return lookup_combine_tables(context, &one, 1);
}

#define SOK_EV_INSTANTIATE(Key)                                                                 \
  template Status lookup_combine_tables<Key>(const GpuContext&, const LookupCombineTable<Key>*, \
                                             size_t);                                           \
  template Status lookup_combine_rows<Key>(const GpuContext&, const HashTable<Key>&,            \
                                           const int64_t*, const int64_t*, const float*,        \
                                           const int64_t*, int64_t, Combiner, float*);
SOK_EV_INSTANTIATE(int32_t)
SOK_EV_INSTANTIATE(int64_t)
#undef SOK_EV_INSTANTIATE

}  // namespace gpu
}  // namespace sok_ev
