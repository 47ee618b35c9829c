// Kernels of the grouped sparse-lookup pipeline, for CPU and (GOOGLE_CUDA
// builds) GPU. Each adapts TF tensors to one core stage (cc/unique.h,
// cc/partition.h, the hash table, cc/combine.h) through Core<Device>, for
// every table of the call. Op definitions: sok_ev/cc/ops/lookup_ops.cc.
//
// Every check of the user's batch happens in UniqueKeys, the first op of a
// lookup, so a malformed batch is rejected before any table changes.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/combine.h"
#include "sok_ev/cc/kernels/combine_attributes.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/row_message.h"
#include "sok_ev/cc/kernels/unique_buffers.h"
#include "sok_ev/cc/kernels/variable_lookup.h"
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

// Checks every table's batch, then deduplicates and indexes it. Tables are
// grouped by key dtype: one core call (one grouped sort and one host sync on
// the GPU) per dtype present. One kernel serves three ops:
//   SokEv>UniqueKeys        a batch's SparseTensors (indices, dense_shapes,
//                           weights), checked first;
//   SokEv>UniquePackedKeys  one RaggedTensor packing every table: table t is
//                           a slice of its values and row splits, checked
//                           first;
//   SokEv>UniqueOwnedKeys   the keys an owner received from every worker:
//                           entry j is sample j, and stands for
//                           occurrences[j] occurrences of its key.
template <typename Device>
class UniqueKeysOp : public OpKernel {
 public:
  explicit UniqueKeysOp(OpKernelConstruction* context)
      : OpKernel(context),
        attributes_(context),
        form_(context->def().op() == "SokEv>UniqueOwnedKeys"    ? Form::kOwned
              : context->def().op() == "SokEv>UniquePackedKeys" ? Form::kPacked
                                                                : Form::kSparse) {}

  void Compute(OpKernelContext* context) override {
    std::vector<TableInput> inputs;
    OP_REQUIRES_OK(context, form_ == Form::kPacked ? ReadPacked(context, &inputs)
                                                   : ReadLists(context, &inputs));
    const int num_tables = inputs.size();
    OpOutputList unique_keys, counts, unique_index, order, segments, row_offsets;
    OP_REQUIRES_OK(context, context->output_list("unique_keys", &unique_keys));
    OP_REQUIRES_OK(context, context->output_list("counts", &counts));
    OP_REQUIRES_OK(context, context->output_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->output_list("order", &order));
    OP_REQUIRES_OK(context, context->output_list("segments", &segments));
    OP_REQUIRES_OK(context, context->output_list("row_offsets", &row_offsets));
    // The outputs sized by the batch; order only where the backward reads it.
    const bool write_order = Core<Device>::kBackwardReadsOrder;
    for (int t = 0; t < num_tables; ++t) {
      Tensor* unused;
      OP_REQUIRES_OK(context, unique_index.allocate(t, TensorShape({inputs[t].nnz}), &unused));
      OP_REQUIRES_OK(context,
                     order.allocate(t, TensorShape({write_order ? inputs[t].nnz : 0}), &unused));
      OP_REQUIRES_OK(context, row_offsets.allocate(t, TensorShape({inputs[t].batch + 1}), &unused));
    }
    Core<Device> core(context);
    for (tensorflow::DataType dtype : {tensorflow::DT_INT32, tensorflow::DT_INT64}) {
      std::vector<int> group;  // the tables of this key dtype
      for (int t = 0; t < num_tables; ++t) {
        if (inputs[t].dtype == dtype) group.push_back(t);
      }
      if (group.empty()) continue;
      OP_REQUIRES_OK(
          context, DispatchKeyType(dtype, "keys", [&](auto key) {
            using Key = decltype(key);
            std::vector<TableBatch<Key>> tables;
            for (int t : group) {
              const TableInput& input = inputs[t];
              TableBatch<Key> table;
              table.keys = static_cast<const Key*>(input.keys);
              table.sample_ids = input.sample_ids;
              table.sample_id_stride = input.sample_id_stride;
              table.row_splits = input.row_splits;
              table.first_entry = input.first_entry;
              table.occurrences = input.occurrences;
              table.run_lengths = input.run_lengths;
              table.num_runs = input.num_runs;
              table.nnz = input.nnz;
              table.batch = input.batch;
              table.unique_index = unique_index[t]->flat<int64_t>().data();
              table.order = write_order ? order[t]->flat<int64_t>().data() : nullptr;
              table.row_offsets = row_offsets[t]->flat<int64_t>().data();
              tables.push_back(table);
            }
            UniqueAllocator<Key> allocate = [&](int g, int64_t num_unique,
                                                UniqueBuffers<Key>* out) {
              const int t = group[g];
              Tensor *unique_out, *counts_out, *segments_out;
              TF_RETURN_IF_ERROR(unique_keys.allocate(t, TensorShape({num_unique}), &unique_out));
              TF_RETURN_IF_ERROR(counts.allocate(t, TensorShape({num_unique}), &counts_out));
              TF_RETURN_IF_ERROR(
                  segments.allocate(t, TensorShape({num_unique + 1}), &segments_out));
              out->unique_keys = unique_out->flat<Key>().data();
              out->counts = counts_out->flat<int64_t>().data();
              out->segments = segments_out->flat<int64_t>().data();
              return absl::OkStatus();
            };
            std::vector<int64_t> first_invalid(tables.size());
            TF_RETURN_IF_ERROR(core.UniqueKeys(tables, allocate, &first_invalid));
            for (size_t g = 0; g < tables.size(); ++g) {
              if (first_invalid[g] != tables[g].nnz) {
                return tables[g].row_splits != nullptr
                           ? InvalidRowSplits(core, group[g], tables[g])
                           : InvalidSampleId(core, group[g], tables[g], first_invalid[g]);
              }
            }
            return absl::OkStatus();
          }));
    }
    if (form_ == Form::kPacked) OP_REQUIRES_OK(context, SliceWeights(context, core, inputs));
  }

 private:
  enum class Form { kSparse, kPacked, kOwned };
  // UniquePackedKeys' outputs: UniqueKeys' six lists and table_weights, N each.
  static constexpr int kPackedOutputLists = 7;

  // One table's keys and what its entries are (TableBatch's input fields).
  struct TableInput {
    tensorflow::DataType dtype = tensorflow::DT_INVALID;
    const void* keys = nullptr;
    int64_t nnz = 0;
    int64_t batch = 0;
    const int64_t* sample_ids = nullptr;
    int64_t sample_id_stride = 1;
    const int64_t* row_splits = nullptr;
    int64_t first_entry = 0;
    const int64_t* occurrences = nullptr;
    const int64_t* run_lengths = nullptr;
    int num_runs = 0;
  };

  // UniqueKeys and UniqueOwnedKeys: one keys tensor per table.
  absl::Status ReadLists(OpKernelContext* context, std::vector<TableInput>* inputs) {
    OpInputList keys;
    TF_RETURN_IF_ERROR(context->input_list("keys", &keys));
    const bool owned = form_ == Form::kOwned;
    // UniqueOwnedKeys: how many keys of each table came from each worker.
    // ReadCounts checks them (its copy, `runs`, dies with this call); the
    // tables' run lengths point into the input tensor, which outlives it.
    const Tensor* sender_counts = nullptr;
    std::vector<int64_t> runs;
    int num_workers = 0;
    if (owned) {
      TF_RETURN_IF_ERROR(context->input("sender_counts", &sender_counts));
      TF_RETURN_IF_ERROR(
          ReadCounts(*sender_counts, keys.size(), &runs, &num_workers, "sender_counts"));
    }
    inputs->resize(keys.size());
    for (int t = 0; t < keys.size(); ++t) {
      if (keys[t].dims() != 1) {
        return errors::InvalidArgument(
            owned ? "keys[" : "indices[", t,
            owned ? "] must be a vector, got shape " : "] values must be a vector, got shape ",
            keys[t].shape().DebugString());
      }
      TableInput& input = (*inputs)[t];
      input.dtype = keys[t].dtype();
      input.keys = keys[t].data();
      input.nnz = keys[t].dim_size(0);
      TF_RETURN_IF_ERROR(
          owned
              ? ReadOccurrences(context, t, sender_counts->flat<int64_t>().data() + t * num_workers,
                                num_workers, &input)
              : ReadSampleIds(context, t, &input));
    }
    return absl::OkStatus();
  }

  // UniqueKeys: table t's SparseTensor indices and dense shape (host), and
  // its weights when weighted.
  absl::Status ReadSampleIds(OpKernelContext* context, int t, TableInput* out) {
    OpInputList indices, weights, dense_shapes;
    TF_RETURN_IF_ERROR(context->input_list("indices", &indices));
    TF_RETURN_IF_ERROR(context->input_list("weights", &weights));
    TF_RETURN_IF_ERROR(context->input_list("dense_shapes", &dense_shapes));  // host
    const int64_t nnz = out->nnz;
    if (indices[t].dims() != 2 || indices[t].dim_size(0) != nnz) {
      return errors::InvalidArgument("indices[", t, "] must have indices of shape [", nnz,
                                     ", 2] for its ", nnz, " values, got ",
                                     indices[t].shape().DebugString());
    }
    // Samples are the first index column: a SparseTensor of another rank
    // (fed where the rank was unknown when the lookup was built) would be
    // combined by it silently.
    if (indices[t].dim_size(1) != 2) {
      return errors::InvalidArgument(
          "indices[", t, "] must be a SparseTensor of rank 2 ([batch, max_hotness]), got rank ",
          indices[t].dim_size(1), " (indices of shape ", indices[t].shape().DebugString(), ")");
    }
    if (dense_shapes[t].dims() != 1 || dense_shapes[t].NumElements() != indices[t].dim_size(1)) {
      return errors::InvalidArgument("indices[", t, "] has indices of rank ",
                                     indices[t].dim_size(1), " but dense_shape of shape ",
                                     dense_shapes[t].shape().DebugString());
    }
    out->batch = dense_shapes[t].flat<int64_t>()(0);
    if (out->batch < 0) {
      return errors::InvalidArgument("indices[", t, "] has a negative batch size ", out->batch);
    }
    TF_RETURN_IF_ERROR(attributes_.CheckWeights(t, weights[t], nnz));
    out->sample_ids = indices[t].flat<int64_t>().data();
    out->sample_id_stride = indices[t].dim_size(1);
    return absl::OkStatus();
  }

  // UniqueOwnedKeys: one occurrence count per received key, and how many
  // keys came from each worker (runs, sender_counts[t], host, checked by
  // ReadCounts): they split keys[t] into one run per worker.
  static absl::Status ReadOccurrences(OpKernelContext* context, int t, const int64_t* runs,
                                      int num_workers, TableInput* out) {
    OpInputList occurrences;
    TF_RETURN_IF_ERROR(context->input_list("occurrences", &occurrences));
    if (occurrences[t].dims() != 1 || occurrences[t].dim_size(0) != out->nnz) {
      return errors::InvalidArgument("occurrences[", t, "] must have shape [", out->nnz,
                                     "], one count per key, got ",
                                     occurrences[t].shape().DebugString());
    }
    const int64_t total = std::accumulate(runs, runs + num_workers, int64_t{0});
    if (total != out->nnz) {
      return errors::InvalidArgument("sender_counts[", t, "] sums to ", total, " keys, but keys[",
                                     t, "] has ", out->nnz);
    }
    out->occurrences = occurrences[t].flat<int64_t>().data();
    out->run_lengths = runs;
    out->num_runs = num_workers;
    out->batch = out->nnz;
    return absl::OkStatus();
  }

  // UniquePackedKeys: every table's slice of the packed batch, from the
  // table and entry splits (host). The row splits inside each table are
  // device memory, checked by the core.
  absl::Status ReadPacked(OpKernelContext* context, std::vector<TableInput>* inputs) {
    const Tensor& keys = context->input(0);
    const Tensor& row_splits = context->input(1);
    const Tensor& table_splits = context->input(2);  // host
    const Tensor& entry_splits = context->input(3);  // host
    const Tensor& weights = context->input(4);
    const int num_tables = num_outputs() / kPackedOutputLists;
    if (keys.dims() != 1) {
      return errors::InvalidArgument("indices: flat_values must be a vector, got shape ",
                                     keys.shape().DebugString());
    }
    if (row_splits.dims() != 1 || row_splits.NumElements() < 1) {
      return errors::InvalidArgument(
          "indices: values.row_splits must be a non-empty vector, "
          "got shape ",
          row_splits.shape().DebugString());
    }
    const int64_t nnz = keys.NumElements(), num_samples = row_splits.NumElements() - 1;
    TF_RETURN_IF_ERROR(CheckSplits(table_splits, num_tables, num_samples, "indices.row_splits",
                                   "samples (indices.values.nrows())"));
    TF_RETURN_IF_ERROR(CheckSplits(entry_splits, num_tables, nnz,
                                   "indices.values.row_splits at indices.row_splits",
                                   "keys (indices.flat_values)"));
    for (int t = 0; t < num_tables; ++t) {
      // Every table's weights are the one packed tensor's.
      TF_RETURN_IF_ERROR(attributes_.CheckWeights(t, weights, weights.NumElements()));
      if (attributes_.WeightsOrNull(t, weights) != nullptr && weights.NumElements() != nnz) {
        return errors::InvalidArgument("sp_weights has ", weights.NumElements(),
                                       " values (flat_values), but indices has ", nnz);
      }
    }
    const auto tables = table_splits.flat<int64_t>();
    const auto entries = entry_splits.flat<int64_t>();
    const char* key_bytes = static_cast<const char*>(keys.data());
    inputs->resize(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      TableInput& input = (*inputs)[t];
      input.dtype = keys.dtype();
      input.keys = key_bytes + entries(t) * tensorflow::DataTypeSize(keys.dtype());
      input.nnz = entries(t + 1) - entries(t);
      input.batch = tables(t + 1) - tables(t);
      input.row_splits = row_splits.flat<int64_t>().data() + tables(t);
      input.first_entry = entries(t);
    }
    return absl::OkStatus();
  }

  // splits (host): num_tables + 1 values from 0 to `total`, none below the
  // one before it.
  static absl::Status CheckSplits(const Tensor& splits, int num_tables, int64_t total,
                                  const char* name, const char* what) {
    if (splits.dims() != 1 || splits.NumElements() != num_tables + 1) {
      return errors::InvalidArgument(name, " must have ", num_tables + 1,
                                     " values (one table per Embedding Variable, plus one), got "
                                     "shape ",
                                     splits.shape().DebugString());
    }
    // The same test as a table's row splits: from 0 to `total`, none decreasing.
    const int64_t* values = splits.flat<int64_t>().data();
    const int64_t t = cpu::first_invalid_row_split(values, 0, total, num_tables);
    if (t <= num_tables) {
      return errors::InvalidArgument(name, " must run from 0 to the ", total, " ", what,
                                     " without decreasing, got ", values[t], " at position ", t);
    }
    return absl::OkStatus();
  }

  // UniquePackedKeys' table_weights: each weighted table's slice of the
  // weights (the combining ops take one weights tensor per table).
  absl::Status SliceWeights(OpKernelContext* context, Core<Device>& core,
                            const std::vector<TableInput>& inputs) {
    const Tensor& weights = context->input(4);
    OpOutputList table_weights;
    TF_RETURN_IF_ERROR(context->output_list("table_weights", &table_weights));
    for (size_t t = 0; t < inputs.size(); ++t) {
      const float* source = attributes_.WeightsOrNull(t, weights);
      Tensor* out;
      TF_RETURN_IF_ERROR(
          table_weights.allocate(t, TensorShape({source ? inputs[t].nnz : 0}), &out));
      if (source != nullptr && inputs[t].nnz > 0) {
        TF_RETURN_IF_ERROR(
            core.Copy(out->flat<float>().data(), source + inputs[t].first_entry, inputs[t].nnz));
      }
    }
    return absl::OkStatus();
  }

  // The error for table t's first bad entry j, naming its row (and the one
  // before it), read back from the device.
  template <typename Key>
  static absl::Status InvalidSampleId(Core<Device>& core, int t, const TableBatch<Key>& table,
                                      int64_t j) {
    int64_t rows[2] = {0, 0};  // entry j - 1's row, entry j's row
    for (int64_t entry = j > 0 ? j - 1 : j; entry <= j; ++entry) {
      TF_RETURN_IF_ERROR(core.CopyToHost(table.sample_ids + entry * table.sample_id_stride, 1,
                                         &rows[entry - j + 1]));
    }
    const int64_t row = rows[1];
    if (row < 0 || row >= table.batch) {
      return errors::InvalidArgument("indices[", t, "]: row ", row, " of entry ", j,
                                     " is outside the batch [0, ", table.batch, ")");
    }
    return errors::InvalidArgument("indices[", t, "]: rows must be in order, but entry ", j,
                                   " has row ", row, " after row ", rows[0],
                                   "; reorder the SparseTensor with tf.sparse.reorder");
  }

  // The error for table t of a packed batch whose row splits are bad, naming
  // the first bad one, read back from the device.
  template <typename Key>
  static absl::Status InvalidRowSplits(Core<Device>& core, int t, const TableBatch<Key>& table) {
    std::vector<int64_t> splits(table.batch + 1);
    TF_RETURN_IF_ERROR(core.CopyToHost(table.row_splits, table.batch + 1, splits.data()));
    const int64_t b =
        cpu::first_invalid_row_split(splits.data(), table.first_entry, table.nnz, table.batch);
    return errors::InvalidArgument(
        "indices[", t, "]: the row splits of its ", table.batch, " samples must run from ",
        table.first_entry, " to ", table.first_entry + table.nnz,
        " (its keys in indices.flat_values) without decreasing, got ", splits[b], " at sample ", b,
        b > 0 ? " after " : "", b > 0 ? std::to_string(splits[b - 1]) : "");
  }

  CombineAttributes attributes_;
  const Form form_;
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
    const int num_tables = keys.size();
    std::vector<Tensor*> grouped(num_tables), order(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(context, keys_by_owner.allocate(t, keys[t].shape(), &grouped[t]));
      OP_REQUIRES_OK(context,
                     positions.allocate(t, TensorShape({keys[t].NumElements()}), &order[t]));
    }
    // Every table of a key dtype in one core call (one sort on the GPU).
    Core<Device> core(context);
    for (tensorflow::DataType dtype : {tensorflow::DT_INT32, tensorflow::DT_INT64}) {
      OP_REQUIRES_OK(context, DispatchKeyType(dtype, "unique_keys", [&](auto key) {
                       using Key = decltype(key);
                       std::vector<OwnerBatch<Key>> tables;
                       for (int t = 0; t < num_tables; ++t) {
                         if (keys[t].dtype() != dtype) continue;
                         OwnerBatch<Key> table;
                         table.keys = keys[t].flat<Key>().data();
                         table.n = keys[t].NumElements();
                         table.target_worker = target_workers_[t];
                         table.keys_by_owner = grouped[t]->flat<Key>().data();
                         table.positions = order[t]->flat<int64_t>().data();
                         table.counts = counts->flat<int64_t>().data() + t * num_workers_;
                         tables.push_back(table);
                       }
                       if (tables.empty()) return absl::OkStatus();
                       return core.PartitionByOwner(tables, num_workers_);
                     }));
    }
  }

 private:
  std::vector<int> target_workers_;
  int num_workers_;
};

// Table t of a lookup: its initialized Embedding Variable, which must have
// the embedding_dim the lookup was built with.
template <typename Device>
absl::Status LookupTableVariable(OpKernelContext* context, int t, tensorflow::DataType key_dtype,
                                 int64_t expected_dim,
                                 RefCountPtr<EmbeddingVariable<Device>>* variable) {
  TF_RETURN_IF_ERROR(LookupInitializedVariable<Device>(context, t, key_dtype, variable));
  if ((*variable)->embedding_dim() != expected_dim) {
    return errors::InvalidArgument("Embedding Variable '", (*variable)->name(),
                                   "' has embedding_dim ", (*variable)->embedding_dim(),
                                   ", but the lookup expects ", expected_dim);
  }
  return absl::OkStatus();
}

// Runs find(t, table_core, variable, table, keys, n, counts) for every
// table t of a lookup op, typed by its key dtype, the tables side by side
// (ForEachTable) with every variable's table lock held throughout
// (TableLocks); then records each table's keys in its variable's change log.
template <typename Device, typename Find>
absl::Status ForEachLookupTable(
    OpKernelContext* context, const std::vector<RefCountPtr<EmbeddingVariable<Device>>>& variables,
    const OpInputList& keys, const OpInputList& counts, const std::vector<int64_t>& costs,
    const Find& find) {
  Core<Device> core(context);
  TableLocks<Device> locks(variables);
  return ForEachTable(core, keys.size(), costs.data(), locks.same_stream(),
                      [&](int t, Core<Device>& table_core) {
                        return DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
                          using Key = decltype(key);
                          EmbeddingVariable<Device>& variable = *variables[t];
                          auto table = variable.template table<Key>();
                          const Key* table_keys = keys[t].flat<Key>().data();
                          const int64_t n = keys[t].NumElements();
                          TF_RETURN_IF_ERROR(find(t, table_core, variable, *table, table_keys, n,
                                                  counts[t].flat<int64_t>().data()));
                          return RecordChangedKeys(table_core, variable, table_keys, n);
                        });
                      });
}

template <typename Device, typename Key>
using FindOrInsertCombineTableOf =
    FindOrInsertCombineTable<typename Core<Device>::template Table<Key>, Key>;

// Every table of a lookup op found or inserted and combined, by one
// Core::FindOrInsertCombineTables call a key dtype, with every variable's
// table lock held throughout (TableLocks); then each table's keys recorded
// in its variable's change log. fill(t, &table) sets table t's combine
// (all but its hash table, keys and counts).
template <typename Device, typename Fill>
absl::Status FindOrInsertCombineGrouped(
    OpKernelContext* context, const std::vector<RefCountPtr<EmbeddingVariable<Device>>>& variables,
    const OpInputList& keys, const OpInputList& counts, const Fill& fill) {
  Core<Device> core(context);
  TableLocks<Device> locks(variables);
  std::vector<std::shared_ptr<void>> held;  // each table, for the op's length
  std::vector<FindOrInsertCombineTableOf<Device, int32_t>> narrow;
  std::vector<FindOrInsertCombineTableOf<Device, int64_t>> wide;
  TF_RETURN_IF_ERROR(GroupByKeyType(keys, &narrow, &wide, [&](int t, auto key) {
    using Key = decltype(key);
    auto hash_table = variables[t]->template table<Key>();
    FindOrInsertCombineTableOf<Device, Key> table;
    table.table = hash_table.get();
    table.unique_keys = keys[t].flat<Key>().data();
    table.counts = counts[t].flat<int64_t>().data();
    table.num_unique = keys[t].NumElements();
    fill(t, &table);
    held.push_back(std::move(hash_table));
    return table;
  }));
  TF_RETURN_IF_ERROR(core.FindOrInsertCombineTables(narrow));
  TF_RETURN_IF_ERROR(core.FindOrInsertCombineTables(wide));
  return RecordChangedKeysOfTables(core, variables, keys);
}

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
    const int num_tables = keys.size();
    // Every check and allocation first, so that a bad table changes none.
    std::vector<RefCountPtr<EmbeddingVariable<Device>>> variables(num_tables);
    std::vector<Tensor*> outputs(num_tables);
    std::vector<int64_t> costs(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(context, LookupTableVariable<Device>(context, t, keys[t].dtype(),
                                                          embedding_dims_[t], &variables[t]));
      const int64_t n = keys[t].NumElements();
      OP_REQUIRES(context, counts[t].NumElements() == n,
                  errors::InvalidArgument("counts[", t, "] has ", counts[t].NumElements(),
                                          " entries for ", n, " keys"));
      OP_REQUIRES_OK(context,
                     values.allocate(t, TensorShape({n, embedding_dims_[t]}), &outputs[t]));
      costs[t] = n;
    }
    OP_REQUIRES_OK(
        context,
        ForEachLookupTable(
            context, variables, keys, counts, costs,
            [&](int t, Core<Device>& table_core, EmbeddingVariable<Device>& variable, auto& table,
                const auto* table_keys, int64_t n, const int64_t* table_counts) -> absl::Status {
              float* values = outputs[t]->flat<float>().data();
              if (variable.is_plain()) {
                return table_core.FindOrInsert(table, table_keys, n, values, table_counts);
              }
              return LookupRows(table_core, variable, table, table_keys, table_counts, n, values);
            }));
  }

 private:
  std::vector<int64_t> embedding_dims_;
};

// The forward of every table: find or insert the unique keys, then combine
// each sample's rows. One kernel serves two ops:
//   SokEv>FindOrInsertCombine     one worker's lookup: each table's
//                                 [batch, dim] embeddings;
//   SokEv>FindOrInsertRowMessage  an owner's lookup of the keys it received
//                                 (one entry a sample, summed: each received
//                                 key gets its row), each row written where
//                                 the row message back to its requester
//                                 wants it (message, splits, local: as
//                                 PackRowMessage lays them out), with no
//                                 [rows, dim] matrix and no packing copy.
template <typename Device>
class FindOrInsertCombineOp : public OpKernel {
 public:
  explicit FindOrInsertCombineOp(OpKernelConstruction* context)
      : OpKernel(context),
        attributes_(context),
        row_message_(context->def().op() == "SokEv>FindOrInsertRowMessage") {
    OP_REQUIRES_OK(context, context->GetAttr("embedding_dims", &embedding_dims_));
    if (row_message_) OP_REQUIRES_OK(context, context->GetAttr("local_worker", &local_worker_));
  }

  void Compute(OpKernelContext* context) override {
    OpInputList keys, counts, unique_index, row_offsets, weights;
    OP_REQUIRES_OK(context, context->input_list("unique_keys", &keys));
    OP_REQUIRES_OK(context, context->input_list("counts", &counts));
    OP_REQUIRES_OK(context, context->input_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->input_list("row_offsets", &row_offsets));
    OpOutputList embeddings;
    RowMessageLayout layout;
    if (row_message_) {
      const Tensor* sender_counts;  // host
      OP_REQUIRES_OK(context, context->input("sender_counts", &sender_counts));
      OP_REQUIRES_OK(context,
                     layout.Plan(*sender_counts, OpInputList(), embedding_dims_, local_worker_));
    } else {
      OP_REQUIRES_OK(context, context->input_list("weights", &weights));
      OP_REQUIRES_OK(context, context->output_list("embeddings", &embeddings));
    }
    const int num_tables = keys.size();
    // Every check and allocation first, so that a bad table changes none.
    std::vector<RefCountPtr<EmbeddingVariable<Device>>> variables(num_tables);
    std::vector<Tensor*> outputs(num_tables);
    std::vector<int64_t> costs(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(context, LookupTableVariable<Device>(context, t, keys[t].dtype(),
                                                          embedding_dims_[t], &variables[t]));
      const int64_t dim = variables[t]->embedding_dim();
      const int64_t num_unique = keys[t].NumElements();
      const int64_t nnz = unique_index[t].NumElements();
      const int64_t batch = row_offsets[t].NumElements() - 1;
      OP_REQUIRES(context, counts[t].NumElements() == num_unique && batch >= 0,
                  errors::InvalidArgument("table ", t, ": ", counts[t].NumElements(),
                                          " counts for ", num_unique, " keys, ",
                                          row_offsets[t].NumElements(), " row offsets"));
      if (row_message_) {
        OP_REQUIRES(context, batch == layout.table_rows(t) && nnz == batch,
                    errors::InvalidArgument("table ", t, ": counts give ", layout.table_rows(t),
                                            " received keys, but ", nnz, " entries and ", batch,
                                            " samples (one entry a received key)"));
      } else {
        OP_REQUIRES_OK(context, attributes_.CheckWeights(t, weights[t], nnz));
        OP_REQUIRES_OK(context, embeddings.allocate(t, TensorShape({batch, dim}), &outputs[t]));
      }
      costs[t] = nnz + num_unique;
    }
    RowAddressTable addresses;
    if (row_message_) {
      Core<Device> core(context);
      OP_REQUIRES_OK(context,
                     AllocateRowMessage(context, core, layout, /*with_splits=*/true, &addresses));
    }
    // Plain tables (the usual case) in one grouped call a key dtype; tables
    // that filter keys or serve read their rows first, one by one.
    const bool plain = std::all_of(variables.begin(), variables.end(),
                                   [](const auto& variable) { return variable->is_plain(); });
    if (plain) {
      OP_REQUIRES_OK(
          context,
          FindOrInsertCombineGrouped(context, variables, keys, counts, [&](int t, auto* table) {
            Fill(t, unique_index, row_offsets, weights, outputs, addresses, &table->combine);
          }));
      return;
    }
    OP_REQUIRES_OK(
        context,
        ForEachLookupTable(
            context, variables, keys, counts, costs,
            [&](int t, Core<Device>& table_core, EmbeddingVariable<Device>& variable, auto& table,
                const auto* table_keys, int64_t num_unique,
                const int64_t* table_counts) -> absl::Status {
              CombineForwardTable combine;
              Fill(t, unique_index, row_offsets, weights, outputs, addresses, &combine);
              combine.dim = variable.embedding_dim();
              // The rows first (serving or admission decide them), then the combine.
              Tensor rows;
              TF_RETURN_IF_ERROR(table_core.template Scratch<float>(
                  std::max<int64_t>(1, num_unique * combine.dim), &rows));
              combine.unique_values = VectorData<float>(rows);
              TF_RETURN_IF_ERROR(LookupRows(table_core, variable, table, table_keys, table_counts,
                                            num_unique, VectorData<float>(rows)));
              return table_core.CombineForwardTables({combine});
            }));
  }

 private:
  // Table t's combine: its entries, samples and weights, and where its
  // vectors go (the grouped call's, and the per-table path's too).
  void Fill(int t, const OpInputList& unique_index, const OpInputList& row_offsets,
            const OpInputList& weights, const std::vector<Tensor*>& outputs,
            const RowAddressTable& addresses, CombineForwardTable* table) const {
    const int64_t dim = embedding_dims_[t];
    table->unique_index = unique_index[t].flat<int64_t>().data();
    table->row_offsets = row_offsets[t].flat<int64_t>().data();
    table->batch = row_offsets[t].NumElements() - 1;
    if (row_message_) {
      // One entry a received key, summed: each key gets its row.
      table->weights = nullptr;
      table->combiner = Combiner::kSum;
      table->out = nullptr;
      table->out_rows = addresses.table(t);
      table->rows_aligned = addresses.aligned(t, dim);
    } else {
      table->weights = attributes_.WeightsOrNull(t, weights[t]);
      table->combiner = attributes_.combiner(t);
      table->out = outputs[t]->flat<float>().data();
      table->out_rows = nullptr;
      table->rows_aligned = false;
    }
  }

  CombineAttributes attributes_;
  const bool row_message_;
  std::vector<int64_t> embedding_dims_;
  int local_worker_ = -1;
};

template <typename Device>
class CombineForwardOp : public OpKernel {
 public:
  explicit CombineForwardOp(OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(OpKernelContext* context) override {
    OpInputList unique_values, unique_index, row_offsets, weights;
    OP_REQUIRES_OK(context, context->input_list("unique_values", &unique_values));
    OP_REQUIRES_OK(context, context->input_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->input_list("row_offsets", &row_offsets));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OpOutputList embeddings;
    OP_REQUIRES_OK(context, context->output_list("embeddings", &embeddings));
    const int num_tables = unique_values.size();
    std::vector<CombineForwardTable> tables(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES(context, unique_values[t].dims() == 2,
                  errors::InvalidArgument("unique_values[", t, "] must be a matrix"));
      const int64_t dim = unique_values[t].dim_size(1);
      const int64_t batch = row_offsets[t].NumElements() - 1;
      OP_REQUIRES(context, batch >= 0,
                  errors::InvalidArgument("row_offsets[", t, "] must not be empty"));
      OP_REQUIRES_OK(context,
                     attributes_.CheckWeights(t, weights[t], unique_index[t].NumElements()));
      Tensor* output = nullptr;
      OP_REQUIRES_OK(context, embeddings.allocate(t, TensorShape({batch, dim}), &output));
      CombineForwardTable& table = tables[t];
      table.unique_values = unique_values[t].flat<float>().data();
      table.unique_index = unique_index[t].flat<int64_t>().data();
      table.weights = attributes_.WeightsOrNull(t, weights[t]);
      table.row_offsets = row_offsets[t].flat<int64_t>().data();
      table.batch = batch;
      table.dim = dim;
      table.combiner = attributes_.combiner(t);
      table.out = output->flat<float>().data();
    }
    Core<Device> core(context);
    OP_REQUIRES_OK(context, core.CombineForwardTables(tables));
  }

 private:
  CombineAttributes attributes_;
};

template <typename Device>
class CombineBackwardOp : public OpKernel {
 public:
  explicit CombineBackwardOp(OpKernelConstruction* context)
      : OpKernel(context), attributes_(context) {}

  void Compute(OpKernelContext* context) override {
    OpInputList grads, unique_index, order, segments, row_offsets, weights;
    OP_REQUIRES_OK(context, context->input_list("grads", &grads));
    OP_REQUIRES_OK(context, context->input_list("unique_index", &unique_index));
    OP_REQUIRES_OK(context, context->input_list("order", &order));
    OP_REQUIRES_OK(context, context->input_list("segments", &segments));
    OP_REQUIRES_OK(context, context->input_list("row_offsets", &row_offsets));
    OP_REQUIRES_OK(context, context->input_list("weights", &weights));
    OpOutputList grad_unique;
    OP_REQUIRES_OK(context, context->output_list("grad_unique", &grad_unique));
    const int num_tables = grads.size();
    std::vector<CombineBackwardTable> tables(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES(context, grads[t].dims() == 2,
                  errors::InvalidArgument("grads[", t, "] must be a matrix"));
      const int64_t batch = grads[t].dim_size(0);
      const int64_t dim = grads[t].dim_size(1);
      const int64_t num_unique = segments[t].NumElements() - 1;
      const int64_t nnz = unique_index[t].NumElements();
      // order is empty where UniqueKeys ran on the CPU.
      OP_REQUIRES(context,
                  row_offsets[t].NumElements() == batch + 1 && num_unique >= 0 &&
                      (order[t].NumElements() == nnz || order[t].NumElements() == 0),
                  errors::InvalidArgument(
                      "table ", t, ": ", row_offsets[t].NumElements(), " row offsets for ", batch,
                      " samples, ", segments[t].NumElements(), " segments, ", nnz, " entries and ",
                      order[t].NumElements(), " in their order"));
      OP_REQUIRES_OK(context, attributes_.CheckWeights(t, weights[t], nnz));
      Tensor* output;
      OP_REQUIRES_OK(context, grad_unique.allocate(t, TensorShape({num_unique, dim}), &output));
      tables[t] =
          CombineBackwardTableOf(unique_index[t], order[t], segments[t], row_offsets[t], dim);
      tables[t].grad_out = grads[t].flat<float>().data();
      tables[t].weights = attributes_.WeightsOrNull(t, weights[t]);
      tables[t].combiner = attributes_.combiner(t);
      tables[t].grad_unique = output->flat<float>().data();
    }
    Core<Device> core(context);
    OP_REQUIRES_OK(context, core.CombineBackwardTables(tables));
  }

 private:
  CombineAttributes attributes_;
};

#define SOK_EV_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name("SokEv>" name).Device(tensorflow::DEVICE_CPU), kernel<CPUDevice>)
SOK_EV_REGISTER_CPU("UniqueKeys", UniqueKeysOp);
SOK_EV_REGISTER_CPU("UniqueOwnedKeys", UniqueKeysOp);
SOK_EV_REGISTER_CPU("UniquePackedKeys", UniqueKeysOp);
SOK_EV_REGISTER_CPU("PartitionByOwner", PartitionByOwnerOp);
SOK_EV_REGISTER_CPU("FindOrInsert", FindOrInsertOp);
SOK_EV_REGISTER_CPU("FindOrInsertCombine", FindOrInsertCombineOp);
SOK_EV_REGISTER_CPU("FindOrInsertRowMessage", FindOrInsertCombineOp);
SOK_EV_REGISTER_CPU("CombineForward", CombineForwardOp);
SOK_EV_REGISTER_CPU("CombineBackward", CombineBackwardOp);
#undef SOK_EV_REGISTER_CPU

#if GOOGLE_CUDA
// Key, index and value tensors stay on the GPU; resource handles and the
// per-table batch sizes that shape the outputs are host memory.
using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("SokEv>UniqueKeys").Device(DEVICE_GPU).HostMemory("dense_shapes"),
                        UniqueKeysOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(
    Name("SokEv>UniqueOwnedKeys").Device(DEVICE_GPU).HostMemory("sender_counts"),
    UniqueKeysOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>UniquePackedKeys")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_splits")
                            .HostMemory("entry_splits"),
                        UniqueKeysOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>PartitionByOwner").Device(DEVICE_GPU),
                        PartitionByOwnerOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>FindOrInsert").Device(DEVICE_GPU).HostMemory("resources"),
                        FindOrInsertOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(
    Name("SokEv>FindOrInsertCombine").Device(DEVICE_GPU).HostMemory("resources"),
    FindOrInsertCombineOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>FindOrInsertRowMessage")
                            .Device(DEVICE_GPU)
                            .HostMemory("resources")
                            .HostMemory("sender_counts")
                            .HostMemory("splits"),
                        FindOrInsertCombineOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineForward").Device(DEVICE_GPU),
                        CombineForwardOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>CombineBackward").Device(DEVICE_GPU),
                        CombineBackwardOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace sok_ev
