// Kernels of the grouped sparse-lookup pipeline, for CPU and (GOOGLE_CUDA
// builds) GPU. Each adapts TF tensors to one core stage (cc/unique.h,
// cc/partition.h, the hash table, cc/combine.h) through Core<Device>, for
// every table of the call. Op definitions: sok_ev/cc/ops/lookup_ops.cc.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <string>
#include <vector>

#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::OpOutputList;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;
namespace errors = tensorflow::errors;

// Every table's unique keys go to scratch first; their counts are read back
// at once (one stream sync on GPU) to size the outputs, then copied there.
template <typename Device>
class UniqueKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    OpInputList keys;
    OP_REQUIRES_OK(context, context->input_list("keys", &keys));
    OpOutputList unique_keys, unique_index, counts;
    OP_REQUIRES_OK(context, context->output_list("unique_keys", &unique_keys));
    OP_REQUIRES_OK(context, context->output_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->output_list("counts", &counts));
    Core<Device> core(context);
    const int num_tables = keys.size();
    std::vector<Tensor> found(num_tables), occurrences(num_tables);
    Tensor num_unique_device;
    OP_REQUIRES_OK(context, AllocateVector<int64_t>(context, num_tables, &num_unique_device));
    int64_t* num_unique_of = num_unique_device.flat<int64_t>().data();  // (num_tables,)
    for (int t = 0; t < num_tables; ++t) {
      const Tensor& table_keys = keys[t];
      OP_REQUIRES(context, table_keys.dims() == 1,
                  errors::InvalidArgument("keys[", t, "] must be a vector, got shape ",
                                          table_keys.shape().DebugString()));
      const int64_t n = table_keys.dim_size(0);
      Tensor* inverse;
      OP_REQUIRES_OK(context, unique_index.allocate(t, TensorShape({n}), &inverse));
      OP_REQUIRES_OK(context, DispatchKeyType(table_keys.dtype(), "keys", [&](auto key) {
                       using Key = decltype(key);
                       TF_RETURN_IF_ERROR(AllocateVector<Key>(context, n, &found[t]));
                       TF_RETURN_IF_ERROR(AllocateVector<int64_t>(context, n, &occurrences[t]));
                       return core.UniqueKeys(
                           table_keys.flat<Key>().data(), n, found[t].flat<Key>().data(),
                           inverse->flat<int64_t>().data(), occurrences[t].flat<int64_t>().data(),
                           num_unique_of + t);
                     }));
    }
    std::vector<int64_t> num_unique(num_tables);
    OP_REQUIRES_OK(context, core.CopyToHost(num_unique_of, num_tables, num_unique.data()));
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(
          context, DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
            using Key = decltype(key);
            Tensor *unique_out, *counts_out;
            TF_RETURN_IF_ERROR(unique_keys.allocate(t, TensorShape({num_unique[t]}), &unique_out));
            TF_RETURN_IF_ERROR(counts.allocate(t, TensorShape({num_unique[t]}), &counts_out));
            TF_RETURN_IF_ERROR(core.Copy(unique_out->flat<Key>().data(),
                                         found[t].flat<Key>().data(), num_unique[t]));
            return core.Copy(counts_out->flat<int64_t>().data(),
                             occurrences[t].flat<int64_t>().data(), num_unique[t]);
          }));
    }
  }
};

template <typename Device>
class PartitionByOwnerOp : public OpKernel {
 public:
  explicit PartitionByOwnerOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("target_workers", &target_workers_));
    OP_REQUIRES_OK(context, context->GetAttr("num_workers", &num_workers_));
    for (size_t t = 0; t < target_workers_.size(); ++t) {
      OP_REQUIRES(context, target_workers_[t] >= -1 && target_workers_[t] < num_workers_,
                  errors::InvalidArgument("target_gpu of table ", t, " must be -1 or in [0, ",
                                          num_workers_, "), got ", target_workers_[t]));
    }
  }

  void Compute(OpKernelContext* context) override {
    OpInputList keys;
    OP_REQUIRES_OK(context, context->input_list("unique_keys", &keys));
    OP_REQUIRES(context, keys.size() == static_cast<int>(target_workers_.size()),
                errors::InvalidArgument("target_workers has ", target_workers_.size(),
                                        " entries for ", keys.size(), " tables"));
    OpOutputList keys_by_owner, positions;
    OP_REQUIRES_OK(context, context->output_list("keys_by_owner", &keys_by_owner));
    OP_REQUIRES_OK(context, context->output_list("positions", &positions));
    Tensor* counts;
    OP_REQUIRES_OK(context, context->allocate_output(
                                "counts", TensorShape({keys.size(), num_workers_}), &counts));
    Core<Device> core(context);
    for (int t = 0; t < keys.size(); ++t) {
      const int64_t n = keys[t].NumElements();
      Tensor *grouped, *order;
      OP_REQUIRES_OK(context, keys_by_owner.allocate(t, keys[t].shape(), &grouped));
      OP_REQUIRES_OK(context, positions.allocate(t, TensorShape({n}), &order));
      int64_t* table_counts = counts->flat<int64_t>().data() + t * num_workers_;  // (W,)
      OP_REQUIRES_OK(
          context, DispatchKeyType(keys[t].dtype(), "unique_keys", [&](auto key) {
            using Key = decltype(key);
            const Key* in = keys[t].flat<Key>().data();
            Key* out = grouped->flat<Key>().data();
            int64_t* where = order->flat<int64_t>().data();
            if (target_workers_[t] < 0) {
              return core.PartitionByOwner(in, n, num_workers_, out, where, table_counts);
            }
            // A table placed whole on one worker: every key goes there. A
            // partition over one worker is stable, so it copies the keys, counts
            // positions up from 0 and writes n into the target's count.
            TF_RETURN_IF_ERROR(core.SetZero(table_counts, num_workers_));
            return core.PartitionByOwner(in, n, 1, out, where, table_counts + target_workers_[t]);
          }));
    }
  }

 private:
  std::vector<int> target_workers_;
  int num_workers_;
};

template <typename Device>
class FindOrInsertOp : public OpKernel {
 public:
  explicit FindOrInsertOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("embedding_dims", &embedding_dims_));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList keys, counts;
    OP_REQUIRES_OK(context, context->input_list("keys", &keys));
    OP_REQUIRES_OK(context, context->input_list("counts", &counts));
    OpOutputList values;
    OP_REQUIRES_OK(context, context->output_list("values", &values));
    Core<Device> core(context);
    for (int t = 0; t < keys.size(); ++t) {
      RefCountPtr<EmbeddingVariable<Device>> variable;
      OP_REQUIRES_OK(context,
                     LookupInitializedVariable<Device>(context, t, keys[t].dtype(), &variable));
      OP_REQUIRES(context, variable->embedding_dim() == embedding_dims_[t],
                  errors::InvalidArgument("Embedding Variable '", variable->name(),
                                          "' has embedding_dim ", variable->embedding_dim(),
                                          ", but the lookup expects ", embedding_dims_[t]));
      const int64_t n = keys[t].NumElements();
      OP_REQUIRES(context, counts[t].NumElements() == n,
                  errors::InvalidArgument("counts[", t, "] has ", counts[t].NumElements(),
                                          " entries for ", n, " keys"));
      Tensor* out;
      OP_REQUIRES_OK(context, values.allocate(t, TensorShape({n, embedding_dims_[t]}), &out));
      OP_REQUIRES_OK(context, DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
                       using Key = decltype(key);
                       auto table = variable->template table<Key>();
                       auto lock = variable->lock_table();
                       return core.FindOrInsert(*table, keys[t].flat<Key>().data(), n,
                                                out->flat<float>().data(),
                                                counts[t].flat<int64_t>().data());
                     }));
    }
  }

 private:
  std::vector<int64_t> embedding_dims_;
};

// The four per-table input lists every combine op takes, whose first is
// named `first`, and the per-table sizes vector (host) after them.
struct CombineInputs {
  OpInputList first, unique_index, sample_ids, weights;
  const Tensor* sizes = nullptr;
};

// Shared by CombineForward and CombineBackward: the attributes, and the
// checks that turn a table's SparseTensor pieces into row offsets.
template <typename Device>
class CombineOpBase : public OpKernel {
 public:
  explicit CombineOpBase(OpKernelConstruction* context) : OpKernel(context) {
    std::vector<std::string> names;
    OP_REQUIRES_OK(context, context->GetAttr("combiners", &names));
    OP_REQUIRES_OK(context, context->GetAttr("weighted", &weighted_));
    for (size_t t = 0; t < names.size(); ++t) {
      if (names[t] == "sum") {
        combiners_.push_back(Combiner::kSum);
      } else if (names[t] == "mean") {
        combiners_.push_back(Combiner::kMean);
      } else if (names[t] == "sqrtn") {
        combiners_.push_back(Combiner::kSqrtn);
      } else {
        context->CtxFailure(errors::InvalidArgument(
            "combiners[", t, "] must be 'sum', 'mean' or 'sqrtn', got '", names[t], "'"));
        return;
      }
    }
  }

 protected:
  // Checks table t's entries and fills its row offsets, a (batch + 1,)
  // vector on the device.
  absl::Status RowOffsets(OpKernelContext* context, Core<Device>& core, int t,
                          const Tensor& unique_index, const Tensor& sample_ids,
                          const Tensor& weights, int64_t num_unique, int64_t batch,
                          Tensor* offsets) const {
    const int64_t nnz = sample_ids.NumElements();
    if (unique_index.NumElements() != nnz) {
      return errors::InvalidArgument("table ", t, ": unique_index has ", unique_index.NumElements(),
                                     " entries and sample_ids ", nnz);
    }
    if (weighted_[t] && weights.NumElements() != nnz) {
      return errors::InvalidArgument("sp_weights[", t, "] has ", weights.NumElements(),
                                     " values, but indices[", t, "] has ", nnz);
    }
    const int64_t* ids = sample_ids.flat<int64_t>().data();
    TF_RETURN_IF_ERROR(core.CheckCombineEntries(t, ids, unique_index.flat<int64_t>().data(), nnz,
                                                batch, num_unique));
    TF_RETURN_IF_ERROR(AllocateVector<int64_t>(context, batch + 1, offsets));
    return core.RowOffsets(ids, nnz, batch, offsets->flat<int64_t>().data());
  }

  static absl::Status ReadInputs(OpKernelContext* context, const char* first, CombineInputs* in) {
    TF_RETURN_IF_ERROR(context->input_list(first, &in->first));
    TF_RETURN_IF_ERROR(context->input_list("unique_index", &in->unique_index));
    TF_RETURN_IF_ERROR(context->input_list("sample_ids", &in->sample_ids));
    TF_RETURN_IF_ERROR(context->input_list("weights", &in->weights));
    in->sizes = &context->input(4 * in->first.size());
    if (in->sizes->NumElements() != in->first.size()) {
      return errors::InvalidArgument("expected ", in->first.size(), " per-table sizes, got ",
                                     in->sizes->NumElements());
    }
    return absl::OkStatus();
  }

  const float* WeightsOrNull(int t, const Tensor& weights) const {
    return weighted_[t] ? weights.flat<float>().data() : nullptr;
  }

  std::vector<Combiner> combiners_;
  std::vector<bool> weighted_;
};

template <typename Device>
class CombineForwardOp : public CombineOpBase<Device> {
 public:
  using CombineOpBase<Device>::CombineOpBase;

  void Compute(OpKernelContext* context) override {
    CombineInputs in;
    OP_REQUIRES_OK(context, this->ReadInputs(context, "unique_values", &in));
    const OpInputList& unique_values = in.first;
    const auto batch_sizes = in.sizes->flat<int64_t>();  // host
    OpOutputList embeddings;
    OP_REQUIRES_OK(context, context->output_list("embeddings", &embeddings));
    Core<Device> core(context);
    for (int t = 0; t < unique_values.size(); ++t) {
      const int64_t num_unique = unique_values[t].dim_size(0);
      const int64_t dim = unique_values[t].dim_size(1);
      Tensor offsets;
      OP_REQUIRES_OK(context,
                     this->RowOffsets(context, core, t, in.unique_index[t], in.sample_ids[t],
                                      in.weights[t], num_unique, batch_sizes(t), &offsets));
      Tensor* out;
      OP_REQUIRES_OK(context, embeddings.allocate(t, TensorShape({batch_sizes(t), dim}), &out));
      OP_REQUIRES_OK(
          context,
          core.CombineForward(unique_values[t].flat<float>().data(),
                              in.unique_index[t].flat<int64_t>().data(),
                              this->WeightsOrNull(t, in.weights[t]), offsets.flat<int64_t>().data(),
                              batch_sizes(t), dim, this->combiners_[t], out->flat<float>().data()));
    }
  }
};

template <typename Device>
class CombineBackwardOp : public CombineOpBase<Device> {
 public:
  using CombineOpBase<Device>::CombineOpBase;

  void Compute(OpKernelContext* context) override {
    CombineInputs in;
    OP_REQUIRES_OK(context, this->ReadInputs(context, "grads", &in));
    const OpInputList& grads = in.first;
    const auto num_unique = in.sizes->flat<int64_t>();  // host
    OpOutputList grad_unique;
    OP_REQUIRES_OK(context, context->output_list("grad_unique", &grad_unique));
    Core<Device> core(context);
    for (int t = 0; t < grads.size(); ++t) {
      const int64_t batch = grads[t].dim_size(0);
      const int64_t dim = grads[t].dim_size(1);
      Tensor offsets;
      OP_REQUIRES_OK(context,
                     this->RowOffsets(context, core, t, in.unique_index[t], in.sample_ids[t],
                                      in.weights[t], num_unique(t), batch, &offsets));
      Tensor* out;
      OP_REQUIRES_OK(context, grad_unique.allocate(t, TensorShape({num_unique(t), dim}), &out));
      OP_REQUIRES_OK(
          context, core.CombineBackward(
                       grads[t].flat<float>().data(), in.unique_index[t].flat<int64_t>().data(),
                       this->WeightsOrNull(t, in.weights[t]), offsets.flat<int64_t>().data(), batch,
                       dim, this->combiners_[t], num_unique(t), out->flat<float>().data()));
    }
  }
};

#define SOK_EV_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name("SokEv>" name).Device(tensorflow::DEVICE_CPU), kernel<CPUDevice>)
SOK_EV_REGISTER_CPU("UniqueKeys", UniqueKeysOp);
SOK_EV_REGISTER_CPU("PartitionByOwner", PartitionByOwnerOp);
SOK_EV_REGISTER_CPU("FindOrInsert", FindOrInsertOp);
SOK_EV_REGISTER_CPU("CombineForward", CombineForwardOp);
SOK_EV_REGISTER_CPU("CombineBackward", CombineBackwardOp);
#undef SOK_EV_REGISTER_CPU

#if GOOGLE_CUDA
// Key, index and value tensors stay on the GPU; resource handles and the
// per-table sizes that shape the outputs are host memory.
using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("SokEv>UniqueKeys").Device(DEVICE_GPU), UniqueKeysOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>PartitionByOwner").Device(DEVICE_GPU),
                        PartitionByOwnerOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>FindOrInsert").Device(DEVICE_GPU).HostMemory("resources"),
                        FindOrInsertOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineForward").Device(DEVICE_GPU).HostMemory("batch_sizes"),
                        CombineForwardOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineBackward").Device(DEVICE_GPU).HostMemory("num_unique"),
                        CombineBackwardOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace sok_ev
