// Evictions, run when a variable is saved (as in DeepRec): which keys go,
// decided on the host from a streamed export of the table, then erased.
// Device-neutral (Core<Device>::ExportBatches and Erase), so L2-weight
// eviction and any eviction whose keys must be known (incremental
// checkpoints record them) need no device code.
#ifndef SOK_EV_CC_KERNELS_EVICTION_H_
#define SOK_EV_CC_KERNELS_EVICTION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/export_buffers.h"

namespace sok_ev {

// A key's exported record: its value (dim floats, slots not included) and
// its version.
using EvictionTest = std::function<bool(const float* value, int64_t version)>;

// Erases the keys whose record passes `evict`; appends them to *evicted.
template <typename Device, typename Key>
absl::Status EvictWhere(Core<Device>& core, typename Core<Device>::template Table<Key>& table,
                        const EvictionTest& evict, std::vector<Key>* evicted) {
  std::vector<Key> doomed;
  int64_t width = 0;
  TF_RETURN_IF_ERROR(core.template ExportBatches<Key>(
      table, ExportBatchKeys(table.row_width()),
      [&](int64_t, int64_t row_width) {
        width = row_width;
        return absl::OkStatus();
      },
      [&](const HostExportBatch<Key>& batch) {
        for (int64_t i = 0; i < batch.count; ++i) {
          if (evict(batch.rows + i * width, batch.versions[i])) doomed.push_back(batch.keys[i]);
        }
        return absl::OkStatus();
      }));
  int64_t erased = 0;
  TF_RETURN_IF_ERROR(
      core.Erase(table, doomed.data(), static_cast<int64_t>(doomed.size()), &erased));
  if (erased != static_cast<int64_t>(doomed.size())) {
    return tensorflow::errors::Internal("eviction erased ", erased, " of ", doomed.size(),
                                        " keys; the table changed while it was evicting");
  }
  evicted->insert(evicted->end(), doomed.begin(), doomed.end());
  return absl::OkStatus();
}

// DeepRec's L2WeightEvict: a key goes when half its value's squared L2 norm,
// summed in float in column order, is below the threshold.
inline EvictionTest L2WeightBelow(float threshold, int64_t dim) {
  return [threshold, dim](const float* value, int64_t) {
    float l2_weight = 0.0f;
    for (int64_t j = 0; j < dim; ++j) l2_weight += value[j] * value[j];
    return l2_weight * 0.5f < threshold;
  };
}

// DeepRec's steps_to_live: a key goes when its last update is older than
// global_step - steps_to_live.
inline EvictionTest StaleVersion(int64_t global_step, int64_t steps_to_live) {
  return [global_step, steps_to_live](const float*, int64_t version) {
    return version < global_step - steps_to_live;
  };
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_EVICTION_H_
