// GPU-only additions to cc/optimizers.h.
#ifndef SOK_EV_CC_OPTIMIZERS_GPU_H_
#define SOK_EV_CC_OPTIMIZERS_GPU_H_

#include <cstdint>

#include "cc/common.h"
#include "cc/optimizers.h"

namespace sok_ev {
namespace gpu {

// gpu::apply_optimizer computed by calling the shared update_row() once per
// row (one thread a row). Slow; kept so tests can check that the fast,
// element-parallel apply_optimizer gives the same bits as the shared math.
void apply_optimizer_reference(const GpuContext& context, const OptimizerSpec& spec,
                               float* const* rows, const float* grads, int64_t n, int64_t dim);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_OPTIMIZERS_GPU_H_
