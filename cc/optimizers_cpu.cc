// CPU twin of the fused optimizer update. See cc/optimizers.h.
#include "cc/optimizers.h"

namespace sok_ev {
namespace cpu {

void apply_optimizer(const CpuContext& context, const OptimizerSpec& spec, float* const* rows,
                     const float* grads, int64_t n, int64_t dim) {
  context.parallel_for(n, 8 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) update_row(spec, rows[i], grads + i * dim, dim);
  });
}

}  // namespace cpu
}  // namespace sok_ev
