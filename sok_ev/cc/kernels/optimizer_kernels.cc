// Kernel of the fused optimizer update of Embedding Variables, for CPU and
// (GOOGLE_CUDA builds) GPU. Per table: sums the gradients of duplicate keys
// (unless the keys are known to be distinct), then updates each key's row
// and slots in place with cc/optimizers.h, through
// Core<Device>::ApplyOptimizerTables, every table at once (with a feature
// filter, only the admitted keys, table by table: variable_lookup.h, the
// tables side by side on CPU threads or GPU side streams), under every
// variable's lock. Op definition: sok_ev/cc/ops/optimizer_ops.cc.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/optimizers.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/variable_lookup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::core::RefCountPtr;
namespace errors = tensorflow::errors;

namespace {

struct OptimizerInfo {
  OptimizerKind kind;
  int num_hyperparameters;
};

const std::map<std::string, OptimizerInfo>& Optimizers() {
  static const auto* optimizers = new std::map<std::string, OptimizerInfo>{
      {"sgd", {OptimizerKind::kSgd, 1}},
      {"adagrad", {OptimizerKind::kAdagrad, 1}},
      {"adam", {OptimizerKind::kAdam, 6}},
      {"ftrl", {OptimizerKind::kFtrl, 5}},
      {"momentum", {OptimizerKind::kMomentum, 2}},
      {"rmsprop", {OptimizerKind::kRmsProp, 4}},
      {"adagrad_decay", {OptimizerKind::kAdagradDecay, 4}},
  };
  return *optimizers;
}

// Unpacks the hyperparameter vector in the order documented at the op.
void SetHyperparameters(const float* h, OptimizerSpec* spec) {
  spec->learning_rate = h[0];
  switch (spec->kind) {
    case OptimizerKind::kAdam:
      spec->beta1 = h[1];
      spec->beta2 = h[2];
      spec->epsilon = h[3];
      spec->beta1_power = h[4];
      spec->beta2_power = h[5];
      break;
    case OptimizerKind::kFtrl:
      spec->learning_rate_power = h[1];
      spec->l1 = h[2];
      spec->l2 = h[3];
      spec->l2_shrinkage = h[4];
      break;
    case OptimizerKind::kMomentum:
      spec->momentum = h[1];
      break;
    case OptimizerKind::kRmsProp:
      spec->decay = h[1];
      spec->momentum = h[2];
      spec->epsilon = h[3];
      break;
    case OptimizerKind::kAdagradDecay:
      spec->decay_count = h[1];
      spec->accumulator_decay_rate = h[2];
      spec->accumulator_baseline = h[3];
      break;
    default:
      break;
  }
}

// The hyperparameter ranges TF's own kernels refuse (ApplyFtrl's checks:
// FTRL divides by the learning rate), checked before any row changes.
absl::Status CheckHyperparameters(const OptimizerSpec& spec) {
  if (spec.kind != OptimizerKind::kFtrl) return absl::OkStatus();
  if (!(spec.learning_rate > 0.0f)) {
    return errors::InvalidArgument("Ftrl learning_rate must be positive, got ", spec.learning_rate);
  }
  if (!(spec.learning_rate_power <= 0.0f)) {
    return errors::InvalidArgument("Ftrl learning_rate_power must be <= 0, got ",
                                   spec.learning_rate_power);
  }
  const std::pair<const char*, float> non_negative[] = {
      {"l1_regularization_strength", spec.l1},
      {"l2_regularization_strength", spec.l2},
      {"l2_shrinkage_regularization_strength", spec.l2_shrinkage}};
  for (const auto& [name, value] : non_negative) {
    if (!(value >= 0.0f)) {
      return errors::InvalidArgument("Ftrl ", name, " must be >= 0, got ", value);
    }
  }
  return absl::OkStatus();
}

}  // namespace

template <typename Device>
class SparseApplyOptimizerOp : public OpKernel {
 public:
  explicit SparseApplyOptimizerOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string optimizer;
    OP_REQUIRES_OK(context, context->GetAttr("optimizer", &optimizer));
    info_ = Optimizers().at(optimizer);  // the op's attr enum admits only these
    spec_.kind = info_.kind;
    OP_REQUIRES_OK(context, context->GetAttr("use_nesterov", &spec_.use_nesterov));
    OP_REQUIRES_OK(context, context->GetAttr("centered", &spec_.centered));
    OP_REQUIRES_OK(context, context->GetAttr("keys_are_unique", &keys_are_unique_));
    OP_REQUIRES_OK(context, context->GetAttr("slot_names", &slot_names_));
    OP_REQUIRES_OK(context, context->GetAttr("slot_initial_values", &slot_initial_values_));
    int num_tables = 0;
    OP_REQUIRES_OK(context, context->GetAttr("N", &num_tables));
    OP_REQUIRES(context, static_cast<int>(keys_are_unique_.size()) == num_tables,
                errors::InvalidArgument("keys_are_unique has ", keys_are_unique_.size(),
                                        " entries for ", num_tables, " tables"));
    const int expected = num_slots(spec_.kind, spec_.centered);
    OP_REQUIRES(context,
                static_cast<int>(slot_names_.size()) == expected &&
                    slot_initial_values_.size() == slot_names_.size(),
                errors::InvalidArgument(optimizer, " keeps ", expected, " slots, but got ",
                                        slot_names_.size(), " slot names and ",
                                        slot_initial_values_.size(), " initial values"));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList keys, grads;
    OP_REQUIRES_OK(context, context->input_list("keys", &keys));
    OP_REQUIRES_OK(context, context->input_list("grads", &grads));
    const Tensor* hyperparameters_input;  // host
    const Tensor* global_step_input;      // host
    OP_REQUIRES_OK(context, context->input("hyperparameters", &hyperparameters_input));
    OP_REQUIRES_OK(context, context->input("global_step", &global_step_input));
    const Tensor& hyperparameters = *hyperparameters_input;
    const Tensor& global_step = *global_step_input;
    OP_REQUIRES(context, hyperparameters.NumElements() == info_.num_hyperparameters,
                errors::InvalidArgument("hyperparameters must have ", info_.num_hyperparameters,
                                        " values, got ", hyperparameters.NumElements()));
    OP_REQUIRES(context, global_step.NumElements() == 1,
                errors::InvalidArgument("global_step must be a scalar, got shape ",
                                        global_step.shape().DebugString()));
    OptimizerSpec spec = spec_;
    SetHyperparameters(hyperparameters.flat<float>().data(), &spec);
    OP_REQUIRES_OK(context, CheckHyperparameters(spec));
    const int64_t step = global_step.flat<int64_t>()(0);
    // Every table is checked before any changes.
    const int num_tables = keys.size();
    std::vector<RefCountPtr<EmbeddingVariable<Device>>> variables(num_tables);
    std::vector<int64_t> costs(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(context,
                     LookupInitializedVariable<Device>(context, t, keys[t].dtype(), &variables[t]));
      OP_REQUIRES_OK(context, CheckTable(*variables[t], keys[t], grads[t]));
      costs[t] = keys[t].NumElements();
    }
    Core<Device> core(context);
    TableLocks<Device> locks(variables);
    // Slots first (created on first use; the table places them), so that a
    // table that cannot take them fails before any row changes.
    std::vector<std::array<int, kMaxOptimizerSlots>> slot_index(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(context, DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
                       auto table = variables[t]->template table<decltype(key)>();
                       for (size_t s = 0; s < slot_names_.size(); ++s) {
                         TF_RETURN_IF_ERROR(core.AddSlot(
                             *table, slot_names_[s], slot_initial_values_[s], &slot_index[t][s]));
                       }
                       return absl::OkStatus();
                     }));
    }
    // Plain tables of distinct keys (no feature filter; a lookup's own
    // gradients: the usual case) in one grouped call a key dtype. Otherwise
    // table by table, side by side: filtered tables update their admitted
    // keys, and repeated keys are summed per table first.
    const bool plain = std::all_of(variables.begin(), variables.end(),
                                   [](const auto& variable) { return variable->is_plain(); });
    const bool distinct =
        std::all_of(keys_are_unique_.begin(), keys_are_unique_.end(), [](bool v) { return v; });
    if (plain && distinct) {
      OP_REQUIRES_OK(context,
                     ApplyGrouped(context, core, variables, keys, grads, spec, slot_index, step));
      return;
    }
    OP_REQUIRES_OK(context,
                   ForEachTable(core, num_tables, costs.data(), locks.same_stream(),
                                [&](int t, Core<Device>& table_core) {
                                  return DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
                                    using Key = decltype(key);
                                    EmbeddingVariable<Device>& variable = *variables[t];
                                    auto table = variable.template table<Key>();
                                    OptimizerSpec table_spec = spec;
                                    for (size_t s = 0; s < slot_names_.size(); ++s) {
                                      table_spec.slot_index[s] = slot_index[t][s];
                                    }
                                    const Key* data = keys[t].flat<Key>().data();
                                    const int64_t n = keys[t].NumElements();
                                    const float* table_grads = grads[t].flat<float>().data();
                                    const int64_t dim = variable.embedding_dim();
                                    if (auto filter = variable.template filter<Key>()) {
                                      TF_RETURN_IF_ERROR(ApplyToAdmitted<Device, Key>(
                                          table_core, *table, *filter, table_spec, data, n,
                                          table_grads, dim, step, keys_are_unique_[t]));
                                    } else {
                                      TF_RETURN_IF_ERROR(table_core.ApplyOptimizer(
                                          *table, table_spec, data, n, table_grads, dim, step,
                                          keys_are_unique_[t]));
                                    }
                                    return RecordChangedKeys(table_core, variable, data, n);
                                  });
                                }));
  }

 private:
  // Every table updated by one Core::ApplyOptimizerTables call a key dtype
  // (the caller holds the tables' locks); then each table's keys recorded
  // in its variable's change log.
  absl::Status ApplyGrouped(OpKernelContext* context, Core<Device>& core,
                            const std::vector<RefCountPtr<EmbeddingVariable<Device>>>& variables,
                            const OpInputList& keys, const OpInputList& grads,
                            const OptimizerSpec& spec,
                            const std::vector<std::array<int, kMaxOptimizerSlots>>& slot_index,
                            int64_t step) const {
    std::vector<std::shared_ptr<void>> held;  // each table, for the op's length
    std::vector<ApplyOptimizerTable<Table<int32_t>, int32_t>> narrow;
    std::vector<ApplyOptimizerTable<Table<int64_t>, int64_t>> wide;
    TF_RETURN_IF_ERROR(GroupByKeyType(keys, &narrow, &wide, [&](int t, auto key) {
      using Key = decltype(key);
      auto table = variables[t]->template table<Key>();
      ApplyOptimizerTable<Table<Key>, Key> update{table.get(),
                                                  spec,
                                                  keys[t].flat<Key>().data(),
                                                  keys[t].NumElements(),
                                                  grads[t].flat<float>().data(),
                                                  variables[t]->embedding_dim(),
                                                  keys_are_unique_[t]};
      for (size_t s = 0; s < slot_names_.size(); ++s) update.spec.slot_index[s] = slot_index[t][s];
      held.push_back(std::move(table));
      return update;
    }));
    TF_RETURN_IF_ERROR(core.ApplyOptimizerTables(narrow, step));
    TF_RETURN_IF_ERROR(core.ApplyOptimizerTables(wide, step));
    return RecordChangedKeysOfTables(core, variables, keys);
  }

  template <typename Key>
  using Table = typename Core<Device>::template Table<Key>;

  // Table t's inputs fit its variable, which must be trainable.
  static absl::Status CheckTable(EmbeddingVariable<Device>& variable, const Tensor& keys,
                                 const Tensor& grads) {
    if (keys.dims() != 1) {
      return errors::InvalidArgument("keys for Embedding Variable '", variable.name(),
                                     "' must be a vector, got shape ", keys.shape().DebugString());
    }
    const int64_t n = keys.dim_size(0);
    const int64_t dim = variable.embedding_dim();
    if (grads.dims() != 2 || grads.dim_size(0) != n || grads.dim_size(1) != dim) {
      return errors::InvalidArgument("gradient of Embedding Variable '", variable.name(),
                                     "' must have shape [", n, ", ", dim, "], got ",
                                     grads.shape().DebugString());
    }
    if (variable.mode() != TableMode::kTraining) {
      return errors::FailedPrecondition(
          "Embedding Variable '", variable.name(),
          "' was loaded from a SavedModel for serving and cannot be trained (the export has no "
          "optimizer slots); train from a checkpoint instead");
    }
    return absl::OkStatus();
  }

  OptimizerInfo info_;
  OptimizerSpec spec_;
  std::vector<std::string> slot_names_;
  std::vector<float> slot_initial_values_;
  std::vector<bool> keys_are_unique_;
};

REGISTER_KERNEL_BUILDER(Name("SokEv>SparseApplyOptimizer").Device(tensorflow::DEVICE_CPU),
                        SparseApplyOptimizerOp<CPUDevice>);

#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("SokEv>SparseApplyOptimizer")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("resources")
                            .HostMemory("hyperparameters")
                            .HostMemory("global_step"),
                        SparseApplyOptimizerOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace sok_ev
