// Kernels that create, initialize, size and checkpoint Embedding Variables.
// Op definitions: sok_ev/cc/ops/embedding_variable_ops.cc.
#include <algorithm>
#include <unordered_set>

#include "cc/unique.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;
namespace errors = tensorflow::errors;

REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableHandle").Device(tensorflow::DEVICE_CPU),
                        tensorflow::ResourceHandleOp<EmbeddingVariable>);

// Derives from EmbeddingVariableOpKernel for key_dtype_ only: its variable
// may not exist yet, so it is looked up or created here.
class InitializeEmbeddingVariableOp : public EmbeddingVariableOpKernel {
 public:
  explicit InitializeEmbeddingVariableOp(OpKernelConstruction* context)
      : EmbeddingVariableOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("embedding_dim", &embedding_dim_));
    int kind;
    OP_REQUIRES_OK(context, context->GetAttr("initializer_kind", &kind));
    OP_REQUIRES(context,
                kind >= 0 && kind <= static_cast<int>(InitializerSpec::Kind::kDefaultValueMatrix),
                errors::InvalidArgument("initializer_kind must be in [0, 4], got ", kind));
    spec_.kind = static_cast<InitializerSpec::Kind>(kind);
    OP_REQUIRES_OK(context, context->GetAttr("param_a", &spec_.param_a));
    OP_REQUIRES_OK(context, context->GetAttr("param_b", &spec_.param_b));
    int64_t seed;
    OP_REQUIRES_OK(context, context->GetAttr("seed", &seed));
    spec_.seed = static_cast<uint64_t>(seed);
  }

  void Compute(OpKernelContext* context) override {
    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, 0);
    const Tensor& default_values = context->input(1);
    OP_REQUIRES(context,
                default_values.dims() == 2 && default_values.dim_size(1) == embedding_dim_,
                errors::InvalidArgument(
                    "default_values of Embedding Variable '", handle.name(),
                    "' must have shape [N, ", embedding_dim_, "], got ",
                    default_values.shape().DebugString()));
    InitializerSpec spec = spec_;
    std::vector<float> matrix;
    if (spec.kind == InitializerSpec::Kind::kDefaultValueMatrix) {
      OP_REQUIRES(context, default_values.dim_size(0) > 0,
                  errors::InvalidArgument("default_value_dim of Embedding Variable '",
                                          handle.name(), "' must be positive, got 0"));
      auto flat = default_values.flat<float>();
      matrix.assign(flat.data(), flat.data() + flat.size());
      spec.default_value_dim = default_values.dim_size(0);
    }
    RefCountPtr<EmbeddingVariable> variable;
    OP_REQUIRES_OK(context, tensorflow::LookupOrCreateResource<EmbeddingVariable>(
                                context, handle, &variable,
                                [&](EmbeddingVariable** created) {
                                  *created = new EmbeddingVariable(handle.name(), key_dtype_,
                                                                   embedding_dim_);
                                  return absl::OkStatus();
                                }));
    OP_REQUIRES(context,
                variable->key_dtype() == key_dtype_ &&
                    variable->embedding_dim() == embedding_dim_,
                errors::InvalidArgument(
                    "Embedding Variable '", handle.name(), "' already exists with key_dtype ",
                    tensorflow::DataTypeString(variable->key_dtype()), " and embedding_dim ",
                    variable->embedding_dim(), "; cannot initialize it with key_dtype ",
                    tensorflow::DataTypeString(key_dtype_), " and embedding_dim ",
                    embedding_dim_));
    variable->initialize(spec, std::move(matrix));
  }

 private:
  int64_t embedding_dim_;
  InitializerSpec spec_;
};
REGISTER_KERNEL_BUILDER(Name("SokEv>InitializeEmbeddingVariable").Device(tensorflow::DEVICE_CPU),
                        InitializeEmbeddingVariableOp);

class EmbeddingVariableIsInitializedOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable> variable;
    const bool found =
        tensorflow::LookupResource(context, tensorflow::HandleFromInput(context, 0), &variable)
            .ok();
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<bool>()() = found && variable->is_initialized();
  }
};
REGISTER_KERNEL_BUILDER(
    Name("SokEv>EmbeddingVariableIsInitialized").Device(tensorflow::DEVICE_CPU),
    EmbeddingVariableIsInitializedOp);

class EmbeddingVariableSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable> variable;
    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, 0);
    OP_REQUIRES_OK(context, tensorflow::LookupResource(context, handle, &variable));
    int64_t size = 0;
    OP_REQUIRES_OK(context, DispatchKeyType(variable->key_dtype(), "key_dtype", [&](auto key) {
                     auto table = variable->table<decltype(key)>();
                     size = table ? table->size() : 0;
                   }));
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int64_t>()() = size;
  }
};
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableSize").Device(tensorflow::DEVICE_CPU),
                        EmbeddingVariableSizeOp);

class EmbeddingVariableExportOp : public EmbeddingVariableOpKernel {
 public:
  using EmbeddingVariableOpKernel::EmbeddingVariableOpKernel;

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable> variable;
    OP_REQUIRES_OK(context, LookupVariable(context, &variable));
    OP_REQUIRES_OK(context, DispatchKeyType(key_dtype_, "key_dtype", [&](auto key) {
                     using Key = decltype(key);
                     Export<Key>(context, *variable->table<Key>());
                   }));
  }

 private:
  template <typename Key>
  void Export(OpKernelContext* context, const cpu::HashTable<Key>& table) {
    const auto snapshot = table.export_all();
    const int64_t n = static_cast<int64_t>(snapshot.keys.size());
    const int64_t width = n > 0 ? static_cast<int64_t>(snapshot.rows.size()) / n
                                : table.row_width();
    Tensor *keys, *rows, *frequencies, *versions, *names, *initial_values;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({n, width}), &rows));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({n}), &frequencies));
    OP_REQUIRES_OK(context, context->allocate_output(3, TensorShape({n}), &versions));
    std::copy(snapshot.keys.begin(), snapshot.keys.end(), keys->flat<Key>().data());
    std::copy(snapshot.rows.begin(), snapshot.rows.end(), rows->flat<float>().data());
    std::copy(snapshot.frequencies.begin(), snapshot.frequencies.end(),
              frequencies->flat<int64_t>().data());
    std::copy(snapshot.versions.begin(), snapshot.versions.end(),
              versions->flat<int64_t>().data());
    const auto slot_names = table.slot_names();
    const auto slot_values = table.slot_initial_values();
    const int64_t num_slots = static_cast<int64_t>(slot_names.size());
    OP_REQUIRES_OK(context, context->allocate_output(4, TensorShape({num_slots}), &names));
    OP_REQUIRES_OK(context,
                   context->allocate_output(5, TensorShape({num_slots}), &initial_values));
    for (int64_t s = 0; s < num_slots; ++s) {
      names->flat<tensorflow::tstring>()(s) = slot_names[s];
      initial_values->flat<float>()(s) = slot_values[s];
    }
  }

};
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableExport").Device(tensorflow::DEVICE_CPU),
                        EmbeddingVariableExportOp);

class EmbeddingVariableImportOp : public EmbeddingVariableOpKernel {
 public:
  using EmbeddingVariableOpKernel::EmbeddingVariableOpKernel;

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable> variable;
    OP_REQUIRES_OK(context, LookupVariable(context, &variable));
    OP_REQUIRES_OK(context, DispatchKeyType(key_dtype_, "key_dtype", [&](auto key) {
                     Import<decltype(key)>(context, variable.get());
                   }));
  }

 private:
  // Every check runs before the table is touched, so a corrupt checkpoint
  // leaves the variable as it was.
  template <typename Key>
  void Import(OpKernelContext* context, EmbeddingVariable* variable) {
    const Tensor& keys = context->input(1);
    const Tensor& rows = context->input(2);
    const Tensor& frequencies = context->input(3);
    const Tensor& versions = context->input(4);
    const Tensor& slot_names = context->input(5);
    const Tensor& slot_initial_values = context->input(6);
    const std::string where = "checkpoint of Embedding Variable '" + variable->name() + "'";
    const int64_t dim = variable->embedding_dim();
    OP_REQUIRES(context, keys.dims() == 1,
                errors::InvalidArgument(where, ": keys must be a vector, got shape ",
                                        keys.shape().DebugString()));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES(context, slot_names.dims() == 1 && slot_initial_values.dims() == 1 &&
                             slot_names.dim_size(0) == slot_initial_values.dim_size(0),
                errors::InvalidArgument(where, ": slot_names ", slot_names.shape().DebugString(),
                                        " and slot_initial_values ",
                                        slot_initial_values.shape().DebugString(),
                                        " must be vectors of one length"));
    const int64_t width = (1 + slot_names.dim_size(0)) * dim;
    OP_REQUIRES(context, rows.dims() == 2 && rows.dim_size(0) == n && rows.dim_size(1) == width,
                errors::InvalidArgument(where, ": rows must have shape [", n, ", ", width,
                                        "] (value and ", slot_names.dim_size(0),
                                        " slots of dim ", dim, "), got ",
                                        rows.shape().DebugString()));
    OP_REQUIRES(context, frequencies.shape() == keys.shape() && versions.shape() == keys.shape(),
                errors::InvalidArgument(where, ": frequencies ",
                                        frequencies.shape().DebugString(), " and versions ",
                                        versions.shape().DebugString(),
                                        " must match keys ", keys.shape().DebugString()));
    const Key* key_data = keys.flat<Key>().data();
    std::unordered_set<Key> seen;
    seen.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(context, seen.insert(key_data[i]).second,
                  errors::InvalidArgument(where, ": key ", key_data[i],
                                          " appears more than once"));
    }
    auto table = variable->new_empty_table<Key>();
    for (int64_t s = 0; s < slot_names.dim_size(0); ++s) {
      table->add_slot(slot_names.flat<tensorflow::tstring>()(s),
                      slot_initial_values.flat<float>()(s));
    }
    table->insert_or_assign(MakeCpuContext(context), key_data, n, rows.flat<float>().data(),
                            frequencies.flat<int64_t>().data(),
                            versions.flat<int64_t>().data());
    variable->replace_table<Key>(std::move(table));
  }

};
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableImport").Device(tensorflow::DEVICE_CPU),
                        EmbeddingVariableImportOp);

class EmbeddingVariableFindOp : public EmbeddingVariableOpKernel {
 public:
  using EmbeddingVariableOpKernel::EmbeddingVariableOpKernel;

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable> variable;
    OP_REQUIRES_OK(context, LookupVariable(context, &variable));
    const Tensor& keys = context->input(1);
    OP_REQUIRES(context, keys.dims() == 1,
                errors::InvalidArgument("keys must be a vector, got shape ",
                                        keys.shape().DebugString()));
    Tensor* values;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({keys.dim_size(0), variable->embedding_dim()}),
                                &values));
    OP_REQUIRES_OK(context, DispatchKeyType(key_dtype_, "key_dtype", [&](auto key) {
                     using Key = decltype(key);
                     variable->table<Key>()->find(MakeCpuContext(context), keys.flat<Key>().data(),
                                                  keys.dim_size(0), values->flat<float>().data(),
                                                  /*found=*/nullptr, /*initial_for_missing=*/true);
                   }));
  }

};
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableFind").Device(tensorflow::DEVICE_CPU),
                        EmbeddingVariableFindOp);

class EmbeddingVariableEvictOp : public EmbeddingVariableOpKernel {
 public:
  explicit EmbeddingVariableEvictOp(OpKernelConstruction* context) : EmbeddingVariableOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("steps_to_live", &steps_to_live_));
  }

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable> variable;
    OP_REQUIRES_OK(context, LookupVariable(context, &variable));
    const int64_t global_step = context->input(1).scalar<int64_t>()();
    int64_t evicted = 0;
    OP_REQUIRES_OK(context, DispatchKeyType(key_dtype_, "key_dtype", [&](auto key) {
                     evicted = variable->table<decltype(key)>()->evict_stale(global_step,
                                                                             steps_to_live_);
                   }));
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int64_t>()() = evicted;
  }

 private:
  int64_t steps_to_live_;
};
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableEvict").Device(tensorflow::DEVICE_CPU),
                        EmbeddingVariableEvictOp);

}  // namespace sok_ev
