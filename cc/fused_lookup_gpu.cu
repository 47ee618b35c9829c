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

// table's combine into `out`; the table's view is read now, after every
// insert before it.
template <typename Key, class Destination>
CombineRowsTable<RowIdSource, Destination> combine_of(const LookupCombineTable<Key>& table,
                                                      const Destination& out, bool rows_aligned) {
  const TableView<Key> view = table.table->view();
  return {RowIdSource{view.rows, view.row_width, table.row_ids, table.inverse},
          table.weights,
          table.row_offsets,
          table.batch,
          view.dim,
          out,
          table.combiner,
          rows_aligned};
}

}  // namespace

template <typename Key>
Status lookup_combine_tables(const GpuContext& context, const LookupCombineTable<Key>* tables,
                             size_t n) {
  std::vector<CombineRowsTable<RowIdSource, SampleMatrix>> into_matrix;
  std::vector<CombineRowsTable<RowIdSource, SampleRows>> into_rows;
  for (size_t t = 0; t < n; ++t) {
    const LookupCombineTable<Key>& table = tables[t];
    if (table.out != nullptr) {
      into_matrix.push_back(combine_of(table, SampleMatrix{table.out, table.table->dim()},
                                       /*rows_aligned=*/true));
    } else {
      into_rows.push_back(combine_of(table, SampleRows{table.out_rows}, table.rows_aligned));
    }
  }
  cudaStream_t stream = stream_of(context);
  SOK_EV_RETURN_IF_ERROR(
      launch_combine_rows(into_matrix.data(), into_matrix.size(), stream, "lookup_combine_rows"));
  return launch_combine_rows(into_rows.data(), into_rows.size(), stream,
                             "lookup_combine_into_rows");
}

template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out) {
  const LookupCombineTable<Key> one{&table, row_ids,  inverse, weights, row_offsets,
                                    batch,  combiner, out,     nullptr, false};
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
