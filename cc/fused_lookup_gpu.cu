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

template <typename Key>
Status lookup_combine_rows(const GpuContext& context, const HashTable<Key>& table,
                           const int64_t* row_ids, const int64_t* inverse, const float* weights,
                           const int64_t* row_offsets, int64_t batch, Combiner combiner,
                           float* out) {
  const TableView<Key> view = table.view();
  RowIdSource source{view.rows, view.row_width, row_ids, inverse};
  return cuda_status(launch_combine_rows(source, weights, row_offsets, batch, table.dim(), combiner,
                                         out, stream_of(context)),
                     "lookup_combine_rows");
}

template Status lookup_combine_rows<int32_t>(const GpuContext&, const HashTable<int32_t>&,
                                             const int64_t*, const int64_t*, const float*,
                                             const int64_t*, int64_t, Combiner, float*);
template Status lookup_combine_rows<int64_t>(const GpuContext&, const HashTable<int64_t>&,
                                             const int64_t*, const int64_t*, const float*,
                                             const int64_t*, int64_t, Combiner, float*);

}  // namespace gpu
}  // namespace sok_ev
