// Fused optimizer updates on Embedding Variable rows.
//
// A table row is [value | slot 0 | slot 1 | ...], each `dim` floats, so an
// update reads and writes one contiguous row. The per-row arithmetic below is
// shared by the CPU and GPU twins and follows TensorFlow's own sparse apply
// kernels (ResourceSparseApply*), so that an Embedding Variable trained with
// a stock tf.compat.v1.train optimizer matches a dense tf.Variable row for
// row. Adam is the exception by design: it is lazy, as in DeepRec (the
// moments of rows outside the batch do not decay).
#ifndef SOK_EV_CC_OPTIMIZERS_H_
#define SOK_EV_CC_OPTIMIZERS_H_

#include <cmath>
#include <cstdint>

#include "cc/common.h"

namespace sok_ev {

enum class OptimizerKind : int32_t {
  kSgd = 0,       // no slots
  kAdagrad = 1,   // slot 0: accumulator
  kAdam = 2,      // slot 0: m, slot 1: v
  kFtrl = 3,      // slot 0: accumulator, slot 1: linear
  kMomentum = 4,  // slot 0: momentum accumulator
  kRmsProp = 5,   // slot 0: rms, slot 1: momentum, slot 2: mean grad (centered)
  // DeepRec's AdagradDecay: slot 0: accumulator, slot 1: accumulator_decay_power
  kAdagradDecay = 6,
};

constexpr int kMaxOptimizerSlots = 3;

// Hyperparameters of one update. Fields an optimizer does not use are ignored.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  // Position of each of the optimizer's slots among the table's slots, so
  // one table can serve several optimizers.
  int32_t slot_index[kMaxOptimizerSlots] = {0, 1, 2};
  float learning_rate = 0.0f;
  // Adam: beta1_power = beta1^t and beta2_power = beta2^t at step t.
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  float beta1_power = 0.9f, beta2_power = 0.999f;
  // Momentum and RMSProp.
  float momentum = 0.0f;
  bool use_nesterov = false;
  // Ftrl.
  float l1 = 0.0f, l2 = 0.0f, l2_shrinkage = 0.0f, learning_rate_power = -0.5f;
  // RMSProp: decay is TF's rho.
  float decay = 0.9f;
  bool centered = false;
  // AdagradDecay: (global_step + 1) / accumulator_decay_step (integer
  // division, exact in a float below 2^24 decays), decay_rate and the floor
  // the decayed accumulator keeps (initial_accumulator_value).
  float decay_count = 0.0f, accumulator_decay_rate = 0.9f, accumulator_baseline = 0.1f;
};

// Number of slots `kind` keeps per row.
inline int num_slots(OptimizerKind kind, bool centered = false) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
    case OptimizerKind::kFtrl:
      return 2;
    case OptimizerKind::kMomentum:
      return 1;
    case OptimizerKind::kRmsProp:
      return centered ? 3 : 2;
    case OptimizerKind::kAdagradDecay:
      return 2;
  }
  return 0;
}

// Adam's bias-corrected learning rate for this step (TF's lr_t).
SOK_EV_HOST_DEVICE float adam_learning_rate(const OptimizerSpec& spec) {
  return spec.learning_rate * sqrtf(1.0f - spec.beta2_power) / (1.0f - spec.beta1_power);
}

// The arithmetic of optimizer kKind on column c of one row, the only
// definition for both twins: the GPU runs it per column inside its fused
// backward + optimizer kernels, the CPU in a loop over the row's columns,
// and both produce the same bits (no FMA contraction). The row is [value | slots], each `dim`
// floats; the slot pointers are those of spec.slot_index (cc/optimizers.h, OptimizerSpec).
//   g:       the key's gradient at column c, summed over its occurrences
//   adam_lr: adam_learning_rate(spec), hoisted out of the column loop
template <OptimizerKind kKind>
SOK_EV_HOST_DEVICE void update_element_as(const OptimizerSpec& spec, float* value, float* slot0,
                                          float* slot1, float* slot2, float g, int64_t c,
                                          float adam_lr) {
  const float lr = spec.learning_rate;
  if constexpr (kKind == OptimizerKind::kSgd) {
    value[c] -= lr * g;
  } else if constexpr (kKind == OptimizerKind::kAdagrad) {
    slot0[c] += g * g;
    value[c] -= lr * g / sqrtf(slot0[c]);
  } else if constexpr (kKind == OptimizerKind::kAdam) {
    slot0[c] = spec.beta1 * slot0[c] + (1.0f - spec.beta1) * g;
    slot1[c] = spec.beta2 * slot1[c] + (1.0f - spec.beta2) * g * g;
    value[c] -= adam_lr * slot0[c] / (sqrtf(slot1[c]) + spec.epsilon);
  } else if constexpr (kKind == OptimizerKind::kFtrl) {
    // l2_shrinkage changes the gradient seen by `linear` only (FtrlV2).
    const float g_shrunk = g + 2.0f * spec.l2_shrinkage * value[c];
    const float accum = slot0[c];
    const float new_accum = accum + g * g;
    float new_root, old_root;
    if (spec.learning_rate_power == -0.5f) {
      new_root = sqrtf(new_accum);
      old_root = sqrtf(accum);
    } else {
      new_root = powf(new_accum, -spec.learning_rate_power);
      old_root = powf(accum, -spec.learning_rate_power);
    }
    slot1[c] += g_shrunk - (new_root - old_root) / lr * value[c];
    const float linear = slot1[c];
    const float quadratic = new_root / lr + 2.0f * spec.l2;
    value[c] = fabsf(linear) > spec.l1 ? ((linear > 0.0f ? spec.l1 : -spec.l1) - linear) / quadratic
                                       : 0.0f;
    slot0[c] = new_accum;
  } else if constexpr (kKind == OptimizerKind::kMomentum) {
    slot0[c] = slot0[c] * spec.momentum + g;
    value[c] -= spec.use_nesterov ? g * lr + slot0[c] * spec.momentum * lr : lr * slot0[c];
  } else if constexpr (kKind == OptimizerKind::kRmsProp) {
    slot0[c] += (g * g - slot0[c]) * (1.0f - spec.decay);
    float denominator = slot0[c] + spec.epsilon;
    if (spec.centered) {
      slot2[c] += (g - slot2[c]) * (1.0f - spec.decay);
      denominator -= slot2[c] * slot2[c];
    }
    slot1[c] = slot1[c] * spec.momentum + lr * g / sqrtf(denominator);
    value[c] -= slot1[c];
  } else if constexpr (kKind == OptimizerKind::kAdagradDecay) {
    // DeepRec keeps one decay count a row; here every column keeps its own
    // copy (all equal, as every column of a row is updated together), so a
    // GPU thread a column never reads a count another thread writes.
    if (spec.decay_count > slot1[c]) {
      slot0[c] = fmaxf(slot0[c] * spec.accumulator_decay_rate, spec.accumulator_baseline);
      slot1[c] += 1.0f;
    }
    slot0[c] += g * g;
    value[c] -= lr * g / sqrtf(slot0[c]);
  }
}

// The slot pointers of a full row, by the optimizer's slot positions.
SOK_EV_HOST_DEVICE float* slot_of(const OptimizerSpec& spec, float* row, int s, int64_t dim) {
  return row + (1 + spec.slot_index[s]) * dim;
}

// Updates column c of a full row (the GPU twin's unit of work).
//   row:  (1 + table_slots) * dim floats    grad: (dim,)
SOK_EV_HOST_DEVICE void update_element(const OptimizerSpec& spec, float* row, const float* grad,
                                       int64_t c, int64_t dim, float adam_lr) {
  float* s0 = slot_of(spec, row, 0, dim);
  float* s1 = slot_of(spec, row, 1, dim);
  float* s2 = slot_of(spec, row, 2, dim);
  switch (spec.kind) {
    case OptimizerKind::kSgd:
      return update_element_as<OptimizerKind::kSgd>(spec, row, s0, s1, s2, grad[c], c, adam_lr);
    case OptimizerKind::kAdagrad:
      return update_element_as<OptimizerKind::kAdagrad>(spec, row, s0, s1, s2, grad[c], c, adam_lr);
    case OptimizerKind::kAdam:
      return update_element_as<OptimizerKind::kAdam>(spec, row, s0, s1, s2, grad[c], c, adam_lr);
    case OptimizerKind::kFtrl:
      return update_element_as<OptimizerKind::kFtrl>(spec, row, s0, s1, s2, grad[c], c, adam_lr);
    case OptimizerKind::kMomentum:
      return update_element_as<OptimizerKind::kMomentum>(spec, row, s0, s1, s2, grad[c], c,
                                                         adam_lr);
    case OptimizerKind::kRmsProp:
      return update_element_as<OptimizerKind::kRmsProp>(spec, row, s0, s1, s2, grad[c], c, adam_lr);
    case OptimizerKind::kAdagradDecay:
      return update_element_as<OptimizerKind::kAdagradDecay>(spec, row, s0, s1, s2, grad[c], c,
                                                             adam_lr);
  }
}

// Updates a whole row with kKind: one dispatch, then a plain column loop.
template <OptimizerKind kKind>
SOK_EV_HOST_DEVICE void update_row_as(const OptimizerSpec& spec, float* row, const float* grad,
                                      int64_t dim) {
  // Value, slots and gradient never overlap: restrict lets the loop vectorise.
  float* __restrict__ value = row;
  float* __restrict__ s0 = slot_of(spec, row, 0, dim);
  float* __restrict__ s1 = slot_of(spec, row, 1, dim);
  float* __restrict__ s2 = slot_of(spec, row, 2, dim);
  const float* __restrict__ g = grad;
  const float adam_lr = adam_learning_rate(spec);
  for (int64_t c = 0; c < dim; ++c)
    update_element_as<kKind>(spec, value, s0, s1, s2, g[c], c, adam_lr);
}

// Applies one update to a whole row (the CPU twin's unit of work). Always
// inlined, so each clone of a SOK_EV_ROW_LOOPS caller compiles it for its ISA.
SOK_EV_HOST_DEVICE __attribute__((always_inline)) void update_row(const OptimizerSpec& spec,
                                                                  float* row, const float* grad,
                                                                  int64_t dim) {
  switch (spec.kind) {
    case OptimizerKind::kSgd:
      return update_row_as<OptimizerKind::kSgd>(spec, row, grad, dim);
    case OptimizerKind::kAdagrad:
      return update_row_as<OptimizerKind::kAdagrad>(spec, row, grad, dim);
    case OptimizerKind::kAdam:
      return update_row_as<OptimizerKind::kAdam>(spec, row, grad, dim);
    case OptimizerKind::kFtrl:
      return update_row_as<OptimizerKind::kFtrl>(spec, row, grad, dim);
    case OptimizerKind::kMomentum:
      return update_row_as<OptimizerKind::kMomentum>(spec, row, grad, dim);
    case OptimizerKind::kRmsProp:
      return update_row_as<OptimizerKind::kRmsProp>(spec, row, grad, dim);
    case OptimizerKind::kAdagradDecay:
      return update_row_as<OptimizerKind::kAdagradDecay>(spec, row, grad, dim);
  }
}

namespace cpu {
// Updates n rows in place, reading each row's gradient where it lies (no
// gathered copy).
//   rows:      (n,) pointers to full rows of the table, host memory, distinct
//   grads:     row i's gradient is the dim floats at grads + grad_rows[i] * dim
//   grad_rows: (n,), or null for grads + i * dim
void apply_optimizer(const CpuContext& context, const OptimizerSpec& spec, float* const* rows,
                     const float* grads, const int64_t* grad_rows, int64_t n, int64_t dim);
}  // namespace cpu

// The GPU applies the same arithmetic inside the fused backward + optimizer
// kernels of gpu::combine_backward_apply (cc/backward_apply_gpu.h).

}  // namespace sok_ev

#endif  // SOK_EV_CC_OPTIMIZERS_H_
