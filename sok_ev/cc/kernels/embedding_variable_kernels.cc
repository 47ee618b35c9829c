// Kernels that create, initialize, size and checkpoint Embedding Variables,
// for CPU and (GOOGLE_CUDA builds) GPU. Op definitions:
// sok_ev/cc/ops/embedding_variable_ops.cc.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <mutex>
#include <vector>

#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/embedding_variable_setup.h"
#include "sok_ev/cc/kernels/eviction.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/variable_lookup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;
namespace errors = tensorflow::errors;

// Derives from EmbeddingVariableOpKernel for key_dtype_ only: its variable
// may not exist yet, so it is looked up or created here.
template <typename Device>
class InitializeEmbeddingVariableOp : public EmbeddingVariableOpKernel<Device> {
 public:
  explicit InitializeEmbeddingVariableOp(OpKernelConstruction* context)
      : EmbeddingVariableOpKernel<Device>(context) {
    OP_REQUIRES_OK(context, context->GetAttr("embedding_dim", &embedding_dim_));
    int kind;
    float param_a, param_b;
    int64_t seed;
    OP_REQUIRES_OK(context, context->GetAttr("initializer_kind", &kind));
    OP_REQUIRES_OK(context, context->GetAttr("param_a", &param_a));
    OP_REQUIRES_OK(context, context->GetAttr("param_b", &param_b));
    OP_REQUIRES_OK(context, context->GetAttr("seed", &seed));
    OP_REQUIRES_OK(context, MakeInitializerSpec(kind, param_a, param_b, seed, &spec_));
    int64_t filter_freq, num_counters, num_hashes, counter_bytes;
    float no_permission_value;
    OP_REQUIRES_OK(context, context->GetAttr("filter_freq", &filter_freq));
    OP_REQUIRES_OK(context, context->GetAttr("filter_counters", &num_counters));
    OP_REQUIRES_OK(context, context->GetAttr("filter_hashes", &num_hashes));
    OP_REQUIRES_OK(context, context->GetAttr("filter_counter_bytes", &counter_bytes));
    OP_REQUIRES_OK(context, context->GetAttr("no_permission_value", &no_permission_value));
    OP_REQUIRES_OK(context, MakeFeatureFilterSpec(filter_freq, num_counters, num_hashes,
                                                  counter_bytes, no_permission_value, &filter_));
    OP_REQUIRES_OK(context, context->GetAttr("hbm_bytes", &hbm_bytes_));
    OP_REQUIRES_OK(context, context->GetAttr("cache_strategy", &cache_strategy_));
  }

  void Compute(OpKernelContext* context) override {
    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, 0);
    InitializerSpec spec = spec_;
    Tensor matrix;
    OP_REQUIRES_OK(context,
                   CopyDefaultValues<Device>(context, DisplayName(handle.name()), embedding_dim_,
                                             context->input(1), &spec, &matrix));
    StorageSpec storage;
    OP_REQUIRES_OK(context, ToTfStatus(MakeStorageSpec(hbm_bytes_, cache_strategy_, embedding_dim_,
                                                       DisplayName(handle.name()), &storage)));
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, LookupOrCreateVariable<Device>(context, handle, this->key_dtype_,
                                                           embedding_dim_, &variable));
    OP_REQUIRES_OK(context,
                   variable->initialize(context, spec, std::move(matrix), filter_, storage));
  }

 private:
  int64_t embedding_dim_;
  InitializerSpec spec_;
  FeatureFilterSpec filter_;
  int64_t hbm_bytes_;
  int64_t cache_strategy_;
};

// An op reading one scalar of the variable behind input 0, which may not
// exist yet: Read::Of(variable), or Read::kAbsent.
template <typename Device, typename Read>
class VariableScalarOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    const bool found =
        tensorflow::LookupResource(context, tensorflow::HandleFromInput(context, 0), &variable)
            .ok();
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<typename Read::Type>()() = found ? Read::Of(*variable) : Read::kAbsent;
  }
};

struct IsInitialized {
  using Type = bool;
  static constexpr bool kAbsent = false;
  template <typename Device>
  static bool Of(const EmbeddingVariable<Device>& variable) {
    return variable.is_initialized();
  }
};

struct RestoreStamp {
  using Type = int64_t;
  static constexpr int64_t kAbsent = 0;
  template <typename Device>
  static int64_t Of(const EmbeddingVariable<Device>& variable) {
    return static_cast<int64_t>(variable.restore_stamp());
  }
};

template <typename Device>
using EmbeddingVariableIsInitializedOp = VariableScalarOp<Device, IsInitialized>;
template <typename Device>
using EmbeddingVariableRestoreStampOp = VariableScalarOp<Device, RestoreStamp>;

// The tier counters of HBM_DRAM storage (cc/storage_spec.h), in
// TierCounters' field order.
template <typename Device>
class EmbeddingVariableTierCountersOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, 0);
    OP_REQUIRES_OK(context, tensorflow::LookupResource(context, handle, &variable));
    Core<Device> core(context);
    TierCounters counters;
    OP_REQUIRES_OK(context, DispatchKeyType(variable->key_dtype(), "key_dtype", [&](auto key) {
                     auto table = variable->template table<decltype(key)>();
                     if (table == nullptr) return absl::OkStatus();
                     auto lock = variable->lock_table();
                     return core.TierCountersOf(*table, &counters);
                   }));
    Tensor* output;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({TierCounters::kFields}), &output));
    auto out = output->flat<int64_t>();
    counters.to_fields(out.data());
  }
};

template <typename Device>
class EmbeddingVariableSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, 0);
    OP_REQUIRES_OK(context, tensorflow::LookupResource(context, handle, &variable));
    Core<Device> core(context);
    int64_t size = 0;
    OP_REQUIRES_OK(context, DispatchKeyType(variable->key_dtype(), "key_dtype", [&](auto key) {
                     auto table = variable->template table<decltype(key)>();
                     if (table == nullptr) return absl::OkStatus();
                     auto lock = variable->lock_table();
                     return core.Size(*table, &size);
                   }));
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int64_t>()() = size;
  }
};

template <typename Device>
class EmbeddingVariableExportOp : public EmbeddingVariableOpKernel<Device> {
 public:
  using EmbeddingVariableOpKernel<Device>::EmbeddingVariableOpKernel;

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, this->LookupVariable(context, &variable));
    OP_REQUIRES_OK(context, DispatchKeyType(this->key_dtype_, "key_dtype", [&](auto key) {
                     using Key = decltype(key);
                     return Export<Key>(context, variable.get());
                   }));
  }

 private:
  template <typename Key>
  absl::Status Export(OpKernelContext* context, EmbeddingVariable<Device>* variable) {
    auto table = variable->template table<Key>();
    Core<Device> core(context);
    auto lock = variable->lock_table();
    TF_RETURN_IF_ERROR(
        core.ExportAll(*table, ExportAllocator<Key>([&](int64_t n, int64_t width,
                                                        ExportBuffers<Key>* out) -> absl::Status {
          Tensor *keys, *rows, *frequencies, *versions;
          TF_RETURN_IF_ERROR(context->allocate_output(0, TensorShape({n}), &keys));
          TF_RETURN_IF_ERROR(context->allocate_output(1, TensorShape({n, width}), &rows));
          TF_RETURN_IF_ERROR(context->allocate_output(2, TensorShape({n}), &frequencies));
          TF_RETURN_IF_ERROR(context->allocate_output(3, TensorShape({n}), &versions));
          out->keys = keys->flat<Key>().data();
          out->rows = rows->flat<float>().data();
          out->frequencies = frequencies->flat<int64_t>().data();
          out->versions = versions->flat<int64_t>().data();
          return absl::OkStatus();
        })));
    // Slot names and initial values: host outputs.
    const auto slot_names = table->slot_names();
    const auto slot_values = table->slot_initial_values();
    const int64_t num_slots = static_cast<int64_t>(slot_names.size());
    Tensor *names, *initial_values;
    TF_RETURN_IF_ERROR(context->allocate_output(4, TensorShape({num_slots}), &names));
    TF_RETURN_IF_ERROR(context->allocate_output(5, TensorShape({num_slots}), &initial_values));
    for (int64_t s = 0; s < num_slots; ++s) {
      names->flat<tensorflow::tstring>()(s) = slot_names[s];
      initial_values->flat<float>()(s) = slot_values[s];
    }
    return absl::OkStatus();
  }
};

template <typename Device>
class EmbeddingVariableImportOp : public EmbeddingVariableOpKernel<Device> {
 public:
  using EmbeddingVariableOpKernel<Device>::EmbeddingVariableOpKernel;

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, this->LookupVariable(context, &variable));
    OP_REQUIRES_OK(context, DispatchKeyType(this->key_dtype_, "key_dtype", [&](auto key) {
                     return Import<decltype(key)>(context, variable.get());
                   }));
  }

 private:
  // Every check runs before the table is touched, so a corrupt checkpoint
  // leaves the variable as it was.
  template <typename Key>
  absl::Status Import(OpKernelContext* context, EmbeddingVariable<Device>* variable) {
    const Tensor& keys = context->input(1);
    const Tensor& rows = context->input(2);
    const Tensor& frequencies = context->input(3);
    const Tensor& versions = context->input(4);
    const Tensor& slot_names = context->input(5);           // host
    const Tensor& slot_initial_values = context->input(6);  // host
    const std::string where = "checkpoint of Embedding Variable '" + variable->name() + "'";
    const int64_t dim = variable->embedding_dim();
    if (keys.dims() != 1) {
      return errors::InvalidArgument(where, ": keys must be a vector, got shape ",
                                     keys.shape().DebugString());
    }
    const int64_t n = keys.dim_size(0);
    if (!(slot_names.dims() == 1 && slot_initial_values.dims() == 1 &&
          slot_names.dim_size(0) == slot_initial_values.dim_size(0))) {
      return errors::InvalidArgument(
          where, ": slot_names ", slot_names.shape().DebugString(), " and slot_initial_values ",
          slot_initial_values.shape().DebugString(), " must be vectors of one length");
    }
    const int64_t width = (1 + slot_names.dim_size(0)) * dim;
    if (!(rows.dims() == 2 && rows.dim_size(0) == n && rows.dim_size(1) == width)) {
      return errors::InvalidArgument(where, ": rows must have shape [", n, ", ", width,
                                     "] (value and ", slot_names.dim_size(0), " slots of dim ", dim,
                                     "), got ", rows.shape().DebugString());
    }
    if (!(frequencies.shape() == keys.shape() && versions.shape() == keys.shape())) {
      return errors::InvalidArgument(where, ": frequencies ", frequencies.shape().DebugString(),
                                     " and versions ", versions.shape().DebugString(),
                                     " must match keys ", keys.shape().DebugString());
    }
    Core<Device> core(context);
    const Key* key_data = keys.flat<Key>().data();
    TF_RETURN_IF_ERROR(core.CheckDistinct(key_data, n, where));
    std::shared_ptr<typename EmbeddingVariable<Device>::template Table<Key>> table;
    TF_RETURN_IF_ERROR(variable->template new_empty_table<Key>(context, core, &table));
    for (int64_t s = 0; s < slot_names.dim_size(0); ++s) {
      int index;
      TF_RETURN_IF_ERROR(core.AddSlot(*table, slot_names.flat<tensorflow::tstring>()(s),
                                      slot_initial_values.flat<float>()(s), &index));
    }
    TF_RETURN_IF_ERROR(core.InsertOrAssign(*table, key_data, n, rows.flat<float>().data(),
                                           frequencies.flat<int64_t>().data(),
                                           versions.flat<int64_t>().data()));
    variable->template replace_table<Key>(std::move(table));
    return absl::OkStatus();
  }
};

template <typename Device>
class EmbeddingVariableFindOp : public EmbeddingVariableOpKernel<Device> {
 public:
  using EmbeddingVariableOpKernel<Device>::EmbeddingVariableOpKernel;

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, this->LookupVariable(context, &variable));
    const Tensor& keys = context->input(1);
    OP_REQUIRES(
        context, keys.dims() == 1,
        errors::InvalidArgument("keys must be a vector, got shape ", keys.shape().DebugString()));
    Tensor* values;
    OP_REQUIRES_OK(context,
                   context->allocate_output(
                       0, TensorShape({keys.dim_size(0), variable->embedding_dim()}), &values));
    Core<Device> core(context);
    OP_REQUIRES_OK(context, DispatchKeyType(this->key_dtype_, "key_dtype", [&](auto key) {
                     using Key = decltype(key);
                     auto table = variable->template table<Key>();
                     auto lock = variable->lock_table();
                     const Key* data = keys.flat<Key>().data();
                     float* out = values->flat<float>().data();
                     if (variable->is_plain()) {
                       return core.Find(*table, data, keys.dim_size(0), out);
                     }
                     return FindRows<Device, Key>(core, *variable, *table, data, keys.dim_size(0),
                                                  out);
                   }));
  }
};

template <typename Device>
class EmbeddingVariableEvictOp : public EmbeddingVariableOpKernel<Device> {
 public:
  explicit EmbeddingVariableEvictOp(OpKernelConstruction* context)
      : EmbeddingVariableOpKernel<Device>(context) {
    OP_REQUIRES_OK(context, context->GetAttr("steps_to_live", &steps_to_live_));
  }

  // Keys not updated in the last steps_to_live steps leave the table, and
  // the filter's counts of keys not admitted yet whose last dropped update
  // is as old; both are recorded for an incremental checkpoint.
  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, this->LookupVariable(context, &variable));
    const int64_t global_step = context->input(1).scalar<int64_t>()();  // host
    Core<Device> core(context);
    int64_t evicted = 0;
    OP_REQUIRES_OK(
        context, DispatchKeyType(this->key_dtype_, "key_dtype", [&](auto key) {
          using Key = decltype(key);
          auto table = variable->template table<Key>();
          auto lock = variable->lock_table();
          std::vector<Key> keys;
          if (variable->change_log().active()) {
            TF_RETURN_IF_ERROR(EvictWhere<Device, Key>(
                core, *table, StaleVersion(global_step, steps_to_live_), &keys));
            evicted = static_cast<int64_t>(keys.size());
          } else {
            TF_RETURN_IF_ERROR(core.EvictStale(*table, global_step, steps_to_live_, &evicted));
          }
          if (auto filter = variable->template filter<Key>()) {
            std::lock_guard<std::mutex> filter_lock(filter->mutex());
            filter->evict_stale(global_step, steps_to_live_, &keys);
          }
          variable->change_log().Record(keys.data(), static_cast<int64_t>(keys.size()));
          return absl::OkStatus();
        }));
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int64_t>()() = evicted;
  }

 private:
  int64_t steps_to_live_;
};

// DeepRec's L2WeightEvict: keys whose value has half a squared L2 norm below
// the threshold leave the table (recorded for an incremental checkpoint).
template <typename Device>
class EmbeddingVariableEvictByL2WeightOp : public EmbeddingVariableOpKernel<Device> {
 public:
  explicit EmbeddingVariableEvictByL2WeightOp(OpKernelConstruction* context)
      : EmbeddingVariableOpKernel<Device>(context) {
    OP_REQUIRES_OK(context, context->GetAttr("l2_weight_threshold", &threshold_));
  }

  void Compute(OpKernelContext* context) override {
    RefCountPtr<EmbeddingVariable<Device>> variable;
    OP_REQUIRES_OK(context, this->LookupVariable(context, &variable));
    Core<Device> core(context);
    int64_t evicted = 0;
    OP_REQUIRES_OK(
        context, DispatchKeyType(this->key_dtype_, "key_dtype", [&](auto key) {
          using Key = decltype(key);
          auto table = variable->template table<Key>();
          auto lock = variable->lock_table();
          std::vector<Key> keys;
          TF_RETURN_IF_ERROR(EvictWhere<Device, Key>(
              core, *table, L2WeightBelow(threshold_, variable->embedding_dim()), &keys));
          evicted = static_cast<int64_t>(keys.size());
          variable->change_log().Record(keys.data(), evicted);
          return absl::OkStatus();
        }));
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<int64_t>()() = evicted;
  }

 private:
  float threshold_;
};

#define SOK_EV_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name("SokEv>" name).Device(tensorflow::DEVICE_CPU), kernel<CPUDevice>)
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableHandle").Device(tensorflow::DEVICE_CPU),
                        tensorflow::ResourceHandleOp<EmbeddingVariable<CPUDevice>>);
SOK_EV_REGISTER_CPU("InitializeEmbeddingVariable", InitializeEmbeddingVariableOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableIsInitialized", EmbeddingVariableIsInitializedOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableRestoreStamp", EmbeddingVariableRestoreStampOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableSize", EmbeddingVariableSizeOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableTierCounters", EmbeddingVariableTierCountersOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableExport", EmbeddingVariableExportOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableImport", EmbeddingVariableImportOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableFind", EmbeddingVariableFindOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableEvict", EmbeddingVariableEvictOp);
SOK_EV_REGISTER_CPU("EmbeddingVariableEvictByL2Weight", EmbeddingVariableEvictByL2WeightOp);
#undef SOK_EV_REGISTER_CPU

#if GOOGLE_CUDA
// Resource handles live in host memory, as for TF's own resource ops; so do
// scalars and attribute-like inputs the kernel reads on host.
using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(
    Name("SokEv>EmbeddingVariableHandle").Device(DEVICE_GPU).HostMemory("resource"),
    tensorflow::ResourceHandleOp<EmbeddingVariable<GPUDevice>>);
REGISTER_KERNEL_BUILDER(
    Name("SokEv>InitializeEmbeddingVariable").Device(DEVICE_GPU).HostMemory("resource"),
    InitializeEmbeddingVariableOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableIsInitialized")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("is_initialized"),
                        EmbeddingVariableIsInitializedOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableRestoreStamp")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("stamp"),
                        EmbeddingVariableRestoreStampOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableSize")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("size"),
                        EmbeddingVariableSizeOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableTierCounters")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("counters"),
                        EmbeddingVariableTierCountersOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableExport")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("slot_names")
                            .HostMemory("slot_initial_values"),
                        EmbeddingVariableExportOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableImport")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("slot_names")
                            .HostMemory("slot_initial_values"),
                        EmbeddingVariableImportOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(
    Name("SokEv>EmbeddingVariableFind").Device(DEVICE_GPU).HostMemory("resource"),
    EmbeddingVariableFindOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableEvict")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("global_step")
                            .HostMemory("evicted"),
                        EmbeddingVariableEvictOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>EmbeddingVariableEvictByL2Weight")
                            .Device(DEVICE_GPU)
                            .HostMemory("resource")
                            .HostMemory("evicted"),
                        EmbeddingVariableEvictByL2WeightOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace sok_ev
