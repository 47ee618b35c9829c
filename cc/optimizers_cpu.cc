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

void prefetch_floats(const float* p, int64_t count) {
  for (int64_t c = 0; c < count; c += kFloatsPerLine) __builtin_prefetch(p + c);
  __builtin_prefetch(p + count - 1);  // the last line when p is not line-aligned
}

void prefetch_row(const OptimizerSpec& spec, float* row, int64_t dim) {
  const int slots = num_slots(spec.kind, spec.centered);
  for (int64_t c = 0; c < dim; c += kFloatsPerLine) {
    __builtin_prefetch(row + c, 1);
    for (int s = 0; s < slots; ++s) __builtin_prefetch(slot_of(spec, row, s, dim) + c, 1);
  }
}

// apply_optimizer on rows [begin, end).
SOK_EV_ROW_LOOPS void apply_to_rows(const OptimizerSpec& spec, float* const* rows,
                                    const float* grads, const int64_t* grad_rows, int64_t begin,
                                    int64_t end, int64_t dim) {
  // grad_rows, when given, come in the table's shard order, so the gradients
  // are read at random too: they are asked for ahead with the rows.
  auto grad = [&](int64_t i) { return grads + (grad_rows ? grad_rows[i] : i) * dim; };
  auto prefetch = [&](int64_t i) {
    prefetch_row(spec, rows[i], dim);
    if (grad_rows) prefetch_floats(grad(i), dim);
  };
  for (int64_t i = begin; i < std::min(end, begin + kPrefetchDistance); ++i) prefetch(i);
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchDistance < end) prefetch(i + kPrefetchDistance);
    update_row(spec, rows[i], grad(i), dim);
  }
}

}  // namespace

void apply_optimizer(const CpuContext& context, const OptimizerSpec& spec, float* const* rows,
                     const float* grads, const int64_t* grad_rows, int64_t n, int64_t dim) {
  context.parallel_for(n, 8 * dim, [&](int64_t begin, int64_t end) {
    apply_to_rows(spec, rows, grads, grad_rows, begin, end, dim);
  });
}

}  // namespace cpu
}  // namespace sok_ev
