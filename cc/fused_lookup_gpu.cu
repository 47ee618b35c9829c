#include "cc/fused_lookup_gpu.h"

#include "cc/combine_kernels_gpu.h"
#include "cc/hash_table_probe_gpu.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

// Rows found by probing the table: each lane of the combine kernel probes
// one entry's key, so a warp has 32 probes in flight.
template <typename Key>
struct HashTableSource {
  TableView<Key> table;
  const Key* keys;  // (nnz,)
  __device__ __forceinline__ int64_t resolve(int64_t entry) const {
    return find_row(table, keys[entry]);
  }
  __device__ __forceinline__ const float* row(int64_t handle) const {
    return table.rows + handle * table.row_width;
  }
};

}  // namespace

template <typename Key>
Status lookup_combine(const GpuContext& context, const HashTable<Key>& table,
                      const Key* keys, const float* weights,
                      const int64_t* row_offsets, int64_t batch,
                      Combiner combiner, float* out) {
  HashTableSource<Key> source{table.view(), keys};
  return cuda_status(launch_combine_rows(source, weights, row_offsets, batch,
                                         table.dim(), combiner, out,
                                         stream_of(context)),
                     "lookup_combine");
}

template Status lookup_combine<int32_t>(const GpuContext&, const HashTable<int32_t>&,
                                        const int32_t*, const float*,
                                        const int64_t*, int64_t, Combiner, float*);
template Status lookup_combine<int64_t>(const GpuContext&, const HashTable<int64_t>&,
                                        const int64_t*, const float*,
                                        const int64_t*, int64_t, Combiner, float*);

}  // namespace gpu
}  // namespace sok_ev
