// CPU twin of the fused optimizer update. See cc/optimizers.h.
#include <algorithm>

#include "cc/optimizers.h"

namespace sok_ev {
namespace cpu {

namespace {

// Rows lie at random places in the table: asking for the cache lines of the
// row a few updates ahead overlaps their misses with this row's arithmetic.
constexpr int64_t kPrefetchDistance = 8;
constexpr int64_t kFloatsPerLine = 16;

void prefetch_row(const OptimizerSpec& spec, float* row, int64_t dim) {
  const int slots = num_slots(spec.kind, spec.centered);
  for (int64_t c = 0; c < dim; c += kFloatsPerLine) {
    __builtin_prefetch(row + c, 1);
    for (int s = 0; s < slots; ++s) __builtin_prefetch(slot_of(spec, row, s, dim) + c, 1);
  }
}

}  // namespace

void apply_optimizer(const CpuContext& context, const OptimizerSpec& spec, float* const* rows,
                     const float* grads, const int64_t* grad_rows, int64_t n, int64_t dim) {
  context.parallel_for(n, 8 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < std::min(end, begin + kPrefetchDistance); ++i) {
      prefetch_row(spec, rows[i], dim);
    }
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) prefetch_row(spec, rows[i + kPrefetchDistance], dim);
      update_row(spec, rows[i], grads + (grad_rows ? grad_rows[i] : i) * dim, dim);
    }
  });
}

}  // namespace cpu
}  // namespace sok_ev
