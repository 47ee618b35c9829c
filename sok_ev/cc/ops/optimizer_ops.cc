// Op definition of the fused optimizer update of Embedding Variables: one op
// updates every Embedding Variable an optimizer applies gradients to.
// Kernel: sok_ev/cc/kernels/optimizer_kernels.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_ev {

// hyperparameters, by optimizer (the order sok_ev/optimizers.py packs):
//   sgd:      [learning_rate]
//   adagrad:  [learning_rate]
//   adam:     [learning_rate, beta1, beta2, epsilon, beta1_power, beta2_power]
//   ftrl:     [learning_rate, learning_rate_power, l1, l2, l2_shrinkage]
//   momentum: [learning_rate, momentum]
//   rmsprop:  [learning_rate, decay, momentum, epsilon]
//   adagrad_decay: [learning_rate, (global_step + 1) / accumulator_decay_step,
//                   accumulator_decay_rate, initial_accumulator_value]
REGISTER_OP("SokEv>SparseApplyOptimizer")
    .Input("resources: N * resource")
    .Input("keys: Tkeys")
    .Input("grads: N * float")
    .Input("hyperparameters: float")
    .Input("global_step: int64")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("N: int >= 1")
    .Attr("optimizer: {'sgd', 'adagrad', 'adam', 'ftrl', 'momentum', 'rmsprop', 'adagrad_decay'}")
    .Attr("slot_names: list(string) >= 0")
    .Attr("slot_initial_values: list(float) >= 0")
    .Attr("use_nesterov: bool = false")
    .Attr("centered: bool = false")
    .Attr("keys_are_unique: list(bool)")
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Applies one optimizer step to the rows of keys[t] in table t, for "
        "every t (duplicates are summed first; keys_are_unique[t] promises "
        "there are none, as when the gradient comes straight from one lookup, "
        "and skips that). Every input is checked before any table changes. "
        "Slots are created on first use with their initial values; each "
        "key's version becomes global_step. A variable listed twice is "
        "updated twice, in list order.");

}  // namespace sok_ev
