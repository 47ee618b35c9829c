// CPU twin of partition_by_owner. See cc/partition.h.
#include <vector>

#include "cc/partition.h"

namespace sok_ev {
namespace cpu {

template <typename Key>
void partition_by_owner(const CpuContext& /*context*/, const Key* keys, int64_t n,
                        int32_t num_workers, Key* keys_by_owner, int64_t* positions,
                        int64_t* counts) {
  // Counting sort by owner: stable, two passes.
  std::vector<int32_t> owner(n);
  for (int32_t w = 0; w < num_workers; ++w) counts[w] = 0;
  for (int64_t i = 0; i < n; ++i) {
    owner[i] = owner_of(keys[i], num_workers);
    ++counts[owner[i]];
  }
  std::vector<int64_t> cursor(num_workers, 0);
  for (int32_t w = 1; w < num_workers; ++w) cursor[w] = cursor[w - 1] + counts[w - 1];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = cursor[owner[i]]++;
    keys_by_owner[j] = keys[i];
    positions[j] = i;
  }
}

template void partition_by_owner<int32_t>(const CpuContext&, const int32_t*, int64_t, int32_t,
                                          int32_t*, int64_t*, int64_t*);
template void partition_by_owner<int64_t>(const CpuContext&, const int64_t*, int64_t, int32_t,
                                          int64_t*, int64_t*, int64_t*);

}  // namespace cpu
}  // namespace sok_ev
