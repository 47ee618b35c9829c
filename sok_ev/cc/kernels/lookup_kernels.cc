// Kernels of the grouped sparse-lookup pipeline. Each adapts TF tensors to
// one core stage (cc/unique.h, cc/partition.h, cc/hash_table_cpu.h,
// cc/combine.h) for every table of the call.
// Op definitions: sok_ev/cc/ops/lookup_ops.cc.
#include <string>
#include <vector>

#include "cc/combine.h"
#include "cc/partition.h"
#include "cc/unique.h"
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
    const CpuContext cpu = MakeCpuContext(context);
    for (int t = 0; t < keys.size(); ++t) {
      const Tensor& table_keys = keys[t];
      OP_REQUIRES(context, table_keys.dims() == 1,
                  errors::InvalidArgument("keys[", t, "] must be a vector, got shape ",
                                          table_keys.shape().DebugString()));
      const int64_t n = table_keys.dim_size(0);
      Tensor* inverse;
      OP_REQUIRES_OK(context, unique_index.allocate(t, TensorShape({n}), &inverse));
      OP_REQUIRES_OK(context, DispatchKeyType(table_keys.dtype(), "keys", [&](auto key) {
        using Key = decltype(key);
        std::vector<Key> found(n);
        std::vector<int64_t> occurrences(n);
        int64_t num_unique = 0;
        cpu::unique_keys(cpu, table_keys.flat<Key>().data(), n, found.data(),
                         inverse->flat<int64_t>().data(), occurrences.data(), &num_unique);
        Tensor *unique_out, *counts_out;
        OP_REQUIRES_OK(context, unique_keys.allocate(t, TensorShape({num_unique}), &unique_out));
        OP_REQUIRES_OK(context, counts.allocate(t, TensorShape({num_unique}), &counts_out));
        std::copy(found.begin(), found.begin() + num_unique, unique_out->flat<Key>().data());
        std::copy(occurrences.begin(), occurrences.begin() + num_unique,
                  counts_out->flat<int64_t>().data());
      }));
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("SokEv>UniqueKeys").Device(tensorflow::DEVICE_CPU), UniqueKeysOp);

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
    auto counts_matrix = counts->matrix<int64_t>();
    const CpuContext cpu = MakeCpuContext(context);
    for (int t = 0; t < keys.size(); ++t) {
      const int64_t n = keys[t].NumElements();
      Tensor *grouped, *order;
      OP_REQUIRES_OK(context, keys_by_owner.allocate(t, keys[t].shape(), &grouped));
      OP_REQUIRES_OK(context, positions.allocate(t, TensorShape({n}), &order));
      int64_t* table_counts = &counts_matrix(t, 0);
      OP_REQUIRES_OK(context, DispatchKeyType(keys[t].dtype(), "unique_keys", [&](auto key) {
        using Key = decltype(key);
        const Key* in = keys[t].flat<Key>().data();
        Key* out = grouped->flat<Key>().data();
        int64_t* where = order->flat<int64_t>().data();
        if (target_workers_[t] < 0) {
          cpu::partition_by_owner(cpu, in, n, num_workers_, out, where, table_counts);
          return;
        }
        // A table placed whole on one worker: every key goes there.
        for (int64_t i = 0; i < n; ++i) {
          out[i] = in[i];
          where[i] = i;
        }
        for (int w = 0; w < num_workers_; ++w) table_counts[w] = w == target_workers_[t] ? n : 0;
      }));
    }
  }

 private:
  std::vector<int> target_workers_;
  int num_workers_;
};
REGISTER_KERNEL_BUILDER(Name("SokEv>PartitionByOwner").Device(tensorflow::DEVICE_CPU),
                        PartitionByOwnerOp);

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
    const CpuContext cpu = MakeCpuContext(context);
    for (int t = 0; t < keys.size(); ++t) {
      RefCountPtr<EmbeddingVariable> variable;
      OP_REQUIRES_OK(context, LookupInitializedVariable(context, t, keys[t].dtype(), &variable));
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
        variable->table<Key>()->find_or_insert(cpu, keys[t].flat<Key>().data(), n,
                                               out->flat<float>().data(),
                                               counts[t].flat<int64_t>().data());
      }));
    }
  }

 private:
  std::vector<int64_t> embedding_dims_;
};
REGISTER_KERNEL_BUILDER(Name("SokEv>FindOrInsert").Device(tensorflow::DEVICE_CPU),
                        FindOrInsertOp);

// Shared by CombineForward and CombineBackward: the attributes, and the
// checks that turn a table's SparseTensor pieces into row offsets.
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
  // Checks table t's entries and fills its row offsets (batch + 1).
  absl::Status RowOffsets(int t, const Tensor& unique_index, const Tensor& sample_ids,
                          const Tensor& weights, int64_t num_unique, int64_t batch,
                          std::vector<int64_t>* offsets) const {
    const int64_t nnz = sample_ids.NumElements();
    if (unique_index.NumElements() != nnz) {
      return errors::InvalidArgument("table ", t, ": unique_index has ",
                                     unique_index.NumElements(), " entries and sample_ids ", nnz);
    }
    if (weighted_[t] && weights.NumElements() != nnz) {
      return errors::InvalidArgument("sp_weights[", t, "] has ", weights.NumElements(),
                                     " values, but indices[", t, "] has ", nnz);
    }
    const int64_t* ids = sample_ids.flat<int64_t>().data();
    const int64_t* index = unique_index.flat<int64_t>().data();
    for (int64_t j = 0; j < nnz; ++j) {
      if (ids[j] < 0 || ids[j] >= batch) {
        return errors::InvalidArgument("indices[", t, "]: row ", ids[j], " of entry ", j,
                                       " is outside the batch [0, ", batch, ")");
      }
      if (j > 0 && ids[j] < ids[j - 1]) {
        return errors::InvalidArgument(
            "indices[", t, "]: rows must be in order, but entry ", j, " has row ", ids[j],
            " after row ", ids[j - 1], "; reorder the SparseTensor with tf.sparse.reorder");
      }
      if (index[j] < 0 || index[j] >= num_unique) {
        return errors::InvalidArgument("table ", t, ": unique_index ", index[j], " of entry ", j,
                                       " is outside [0, ", num_unique, ")");
      }
    }
    offsets->resize(batch + 1);
    cpu::row_offsets_from_sample_ids(ids, nnz, batch, offsets->data());
    return absl::OkStatus();
  }

  // The four per-table input lists every combine op takes, whose first is
  // named `first`, and the per-table sizes vector after them.
  struct Inputs {
    OpInputList first, unique_index, sample_ids, weights;
    const Tensor* sizes = nullptr;
  };
  static absl::Status ReadInputs(OpKernelContext* context, const char* first, Inputs* in) {
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

class CombineForwardOp : public CombineOpBase {
 public:
  using CombineOpBase::CombineOpBase;

  void Compute(OpKernelContext* context) override {
    Inputs in;
    OP_REQUIRES_OK(context, ReadInputs(context, "unique_values", &in));
    const OpInputList& unique_values = in.first;
    const auto batch_sizes = in.sizes->flat<int64_t>();
    OpOutputList embeddings;
    OP_REQUIRES_OK(context, context->output_list("embeddings", &embeddings));
    const CpuContext cpu = MakeCpuContext(context);
    for (int t = 0; t < unique_values.size(); ++t) {
      const int64_t num_unique = unique_values[t].dim_size(0);
      const int64_t dim = unique_values[t].dim_size(1);
      std::vector<int64_t> offsets;
      OP_REQUIRES_OK(context, RowOffsets(t, in.unique_index[t], in.sample_ids[t], in.weights[t],
                                         num_unique, batch_sizes(t), &offsets));
      Tensor* out;
      OP_REQUIRES_OK(context, embeddings.allocate(t, TensorShape({batch_sizes(t), dim}), &out));
      cpu::combine_forward(cpu, unique_values[t].flat<float>().data(),
                           in.unique_index[t].flat<int64_t>().data(), WeightsOrNull(t, in.weights[t]),
                           offsets.data(), batch_sizes(t), dim, combiners_[t],
                           out->flat<float>().data());
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineForward").Device(tensorflow::DEVICE_CPU),
                        CombineForwardOp);

class CombineBackwardOp : public CombineOpBase {
 public:
  using CombineOpBase::CombineOpBase;

  void Compute(OpKernelContext* context) override {
    Inputs in;
    OP_REQUIRES_OK(context, ReadInputs(context, "grads", &in));
    const OpInputList& grads = in.first;
    const auto num_unique = in.sizes->flat<int64_t>();
    OpOutputList grad_unique;
    OP_REQUIRES_OK(context, context->output_list("grad_unique", &grad_unique));
    const CpuContext cpu = MakeCpuContext(context);
    for (int t = 0; t < grads.size(); ++t) {
      const int64_t batch = grads[t].dim_size(0);
      const int64_t dim = grads[t].dim_size(1);
      std::vector<int64_t> offsets;
      OP_REQUIRES_OK(context, RowOffsets(t, in.unique_index[t], in.sample_ids[t], in.weights[t],
                                         num_unique(t), batch, &offsets));
      Tensor* out;
      OP_REQUIRES_OK(context, grad_unique.allocate(t, TensorShape({num_unique(t), dim}), &out));
      cpu::combine_backward(cpu, grads[t].flat<float>().data(),
                            in.unique_index[t].flat<int64_t>().data(), WeightsOrNull(t, in.weights[t]),
                            offsets.data(), batch, dim, combiners_[t], num_unique(t),
                            out->flat<float>().data());
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineBackward").Device(tensorflow::DEVICE_CPU),
                        CombineBackwardOp);

}  // namespace sok_ev
