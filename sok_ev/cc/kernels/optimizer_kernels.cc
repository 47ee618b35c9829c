// Kernel of the fused optimizer update on an Embedding Variable, for CPU and
// (GOOGLE_CUDA builds) GPU: sums the gradients of duplicate keys (unless the
// keys are known to be distinct), then updates each key's row and slots in
// place with cc/optimizers.h, through Core<Device>::ApplyOptimizer (with a
// feature filter, only the admitted keys: variable_lookup.h). Op definition:
// sok_ev/cc/ops/optimizer_ops.cc.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <map>
#include <string>
#include <vector>

#include "cc/optimizers.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/variable_lookup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

using tensorflow::DataType;
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
      {"sgd", {OptimizerKind::kSgd, 1}},           {"adagrad", {OptimizerKind::kAdagrad, 1}},
      {"adam", {OptimizerKind::kAdam, 6}},         {"ftrl", {OptimizerKind::kFtrl, 5}},
      {"momentum", {OptimizerKind::kMomentum, 2}}, {"rmsprop", {OptimizerKind::kRmsProp, 4}},
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
    default:
      break;
  }
}

}  // namespace

template <typename Device>
class SparseApplyOptimizerOp : public EmbeddingVariableOpKernel<Device> {
 public:
  explicit SparseApplyOptimizerOp(OpKernelConstruction* context)
      : EmbeddingVariableOpKernel<Device>(context) {
    std::string optimizer;
    OP_REQUIRES_OK(context, context->GetAttr("optimizer", &optimizer));
    info_ = Optimizers().at(optimizer);  // the op's attr enum admits only these
    spec_.kind = info_.kind;
    OP_REQUIRES_OK(context, context->GetAttr("use_nesterov", &spec_.use_nesterov));
    OP_REQUIRES_OK(context, context->GetAttr("centered", &spec_.centered));
    OP_REQUIRES_OK(context, context->GetAttr("keys_are_unique", &keys_are_unique_));
    OP_REQUIRES_OK(context, context->GetAttr("slot_names", &slot_names_));
    OP_REQUIRES_OK(context, context->GetAttr("slot_initial_values", &slot_initial_values_));
    const int expected = num_slots(spec_.kind, spec_.centered);
    OP_REQUIRES(context,
                static_cast<int>(slot_names_.size()) == expected &&
                    slot_initial_values_.size() == slot_names_.size(),
                errors::InvalidArgument(optimizer, " keeps ", expected, " slots, but got ",
                                        slot_names_.size(), " slot names and ",
                                        slot_initial_values_.size(), " initial values"));
  }

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, this->LookupVariable(context, &variable));
    const Tensor& keys = context->input(1);
    const Tensor& grads = context->input(2);
    const Tensor& hyperparameters = context->input(3);  // host
    const Tensor& global_step = context->input(4);      // host
    const int64_t dim = variable->embedding_dim();
    OP_REQUIRES(
        context, keys.dims() == 1,
        errors::InvalidArgument("keys must be a vector, got shape ", keys.shape().DebugString()));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES(context, grads.dims() == 2 && grads.dim_size(0) == n && grads.dim_size(1) == dim,
                errors::InvalidArgument("gradient of Embedding Variable '", variable->name(),
                                        "' must have shape [", n, ", ", dim, "], got ",
                                        grads.shape().DebugString()));
    OP_REQUIRES(context, hyperparameters.NumElements() == info_.num_hyperparameters,
                errors::InvalidArgument("hyperparameters must have ", info_.num_hyperparameters,
                                        " values, got ", hyperparameters.NumElements()));
    OP_REQUIRES(context, global_step.NumElements() == 1,
                errors::InvalidArgument("global_step must be a scalar, got shape ",
                                        global_step.shape().DebugString()));
    OptimizerSpec spec = spec_;
    SetHyperparameters(hyperparameters.flat<float>().data(), &spec);
    Core<Device> core(context);
    OP_REQUIRES(context, variable->mode() == TableMode::kTraining,
                errors::FailedPrecondition(
                    "Embedding Variable '", variable->name(),
                    "' was loaded from a SavedModel for serving and cannot be trained (the "
                    "export has no optimizer slots); train from a checkpoint instead"));
    OP_REQUIRES_OK(
        context, DispatchKeyType(this->key_dtype_, "keys", [&](auto key) {
          using Key = decltype(key);
          auto table = variable->template table<Key>();
          auto lock = variable->lock_table();
          // Slots are created on first use; the table places them.
          for (size_t s = 0; s < slot_names_.size(); ++s) {
            TF_RETURN_IF_ERROR(
                core.AddSlot(*table, slot_names_[s], slot_initial_values_[s], &spec.slot_index[s]));
          }
          const Key* data = keys.flat<Key>().data();
          const int64_t step = global_step.flat<int64_t>()(0);
          if (auto filter = variable->template filter<Key>()) {
            TF_RETURN_IF_ERROR(ApplyToAdmitted<Device, Key>(core, *table, *filter, spec, data, n,
                                                            grads.flat<float>().data(), dim, step,
                                                            keys_are_unique_));
          } else {
            TF_RETURN_IF_ERROR(core.ApplyOptimizer(
                *table, spec, data, n, grads.flat<float>().data(), dim, step, keys_are_unique_));
          }
          return RecordChangedKeys(core, *variable, data, n);
        }));
  }

 private:
  OptimizerInfo info_;
  OptimizerSpec spec_;
  std::vector<std::string> slot_names_;
  std::vector<float> slot_initial_values_;
  bool keys_are_unique_ = false;
};

REGISTER_KERNEL_BUILDER(Name("SokEv>SparseApplyOptimizer").Device(tensorflow::DEVICE_CPU),
                        SparseApplyOptimizerOp<CPUDevice>);

#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("SokEv>SparseApplyOptimizer")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("hyperparameters")
                            .HostMemory("global_step"),
                        SparseApplyOptimizerOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace sok_ev
