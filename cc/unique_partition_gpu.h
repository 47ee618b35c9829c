// GPU-only addition to cc/unique.h: unique_keys that also hands out the
// sort it is built on, so the backward pass needs no second sort.
#ifndef SOK_EV_CC_UNIQUE_PARTITION_GPU_H_
#define SOK_EV_CC_UNIQUE_PARTITION_GPU_H_

#include <cstdint>

#include "cc/common.h"

namespace sok_ev {
namespace gpu {

// gpu::unique_keys (unique keys in ascending order), plus the entries of
// each unique key: unique u occurs at keys[order[j]] for j in
// [segments[u], segments[u + 1]), order ascending within a segment (the
// sort is stable).
//   keys: (n,)  unique_keys, inverse, order: (n,) out
//   segments: (n + 1,) out, the first *num_unique + 1 written
//   num_unique: (1,) out, device
template <typename Key>
void unique_keys_segmented(const GpuContext& context, const Key* keys, int64_t n, Key* unique_keys,
                           int64_t* inverse, int64_t* order, int64_t* segments,
                           int64_t* num_unique);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_UNIQUE_PARTITION_GPU_H_
