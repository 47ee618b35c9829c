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

// The table's rows feed one combine_rows_kernel launch into `out`.
template <typename Key, class Destination>
Status lookup_combine(const GpuContext& context, const HashTable<Key>& table,
                      const int64_t* row_ids, const int64_t* inverse, const float* weights,
                      const int64_t* row_offsets, int64_t batch, Combiner combiner,
                      const Destination& out, bool rows_aligned, const char* what) {
  const TableView<Key> view = table.view();
  RowIdSource source{view.rows, view.row_width, row_ids, inverse};
  return cuda_status(launch_combine_rows(source, weights, row_offsets, batch, table.dim(), combiner,
                                         out, stream_of(context), rows_aligned),
                     what);
}

}  // namespace

template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out) {
  return lookup_combine(context, table, row_ids, inverse, weights, row_offsets, batch, combiner,
                        SampleMatrix{out, table.dim()}, /*rows_aligned=*/true,
                        "lookup_combine_rows");
}

template <typename Key>
Status lookup_combine_into_rows(const GpuContext& context, const HashTable<Key>& table,
                                const int64_t* row_ids, const int64_t* inverse,
                                const float* weights, const int64_t* row_offsets, int64_t batch,
                                Combiner combiner, float* const* out_rows, bool rows_aligned) {
  return lookup_combine(context, table, row_ids, inverse, weights, row_offsets, batch, combiner,
                        SampleRows{out_rows}, rows_aligned, "lookup_combine_into_rows");
}

#define SOK_EV_INSTANTIATE(Key)                                                               \
  template Status lookup_combine_rows<Key>(const GpuContext&, const HashTable<Key>&,          \
                                           const int64_t*, const int64_t*, const float*,      \
                                           const int64_t*, int64_t, Combiner, float*);        \
  template Status lookup_combine_into_rows<Key>(                                              \
      const GpuContext&, const HashTable<Key>&, const int64_t*, const int64_t*, const float*, \
      const int64_t*, int64_t, Combiner, float* const*, bool);
SOK_EV_INSTANTIATE(int32_t)
SOK_EV_INSTANTIATE(int64_t)
#undef SOK_EV_INSTANTIATE

}  // namespace gpu
}  // namespace sok_ev
