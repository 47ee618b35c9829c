// Kernels that save Embedding Variables into TensorFlow checkpoints and
// restore them, for CPU and (GOOGLE_CUDA builds) GPU. Op definitions:
// sok_ev/cc/ops/checkpoint_ops.cc; layout: checkpoint_format.h.
//
// Both stream: a save writes each table batch by batch straight from the
// table into the bundle, a restore reads one stored slice at a time, so
// neither holds a second copy of a table in host memory. An incremental
// save holds the rows of the changed keys only; an incremental restore
// restores its base first, then replaces the keys that changed.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cc/feature_filter.h"
#include "cc/partition.h"
#include "sok_ev/cc/kernels/checkpoint_format.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/embedding_variable_setup.h"
#include "sok_ev/cc/kernels/export_buffers.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/worker_topology.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace sok_ev {
namespace {

using tensorflow::BundleReader;
using tensorflow::BundleWriter;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorSlice;
using tensorflow::core::RefCountPtr;
namespace errors = tensorflow::errors;

// The restore stamp of a checkpoint: FNV-1a of its path, never 0.
uint64_t PathStamp(const std::string& path) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : path) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash == 0 ? 1 : hash;
}

// The fields of a shard written per row, after the keys.
std::string ColumnField(int64_t column) {
  return column == 0 ? "values" : checkpoint::SlotField(column - 1);
}

// Writes one shard of one table: the rows of its keys as checkpoint_format.h
// lays them out, fed batch by batch (Begin once, then Emit).
template <typename Key>
class ShardWriter {
 public:
  // columns: the table's row width / dim (value and slots); written: how
  // many of them are saved (1 for a serving export: values only).
  ShardWriter(BundleWriter* writer, std::function<std::string(const std::string&)> key,
              std::string table, int64_t dim, int64_t columns, int64_t written)
      : writer_(writer),
        key_(std::move(key)),
        table_(std::move(table)),
        dim_(dim),
        columns_(columns),
        written_(written) {}

  absl::Status Begin(int64_t total, int64_t row_width) {
    if (row_width != columns_ * dim_) {
      return errors::Aborted("the slots of Embedding Variable '", table_,
                             "' changed while it was being saved; save again");
    }
    total_ = total;
    if (total > 0) return absl::OkStatus();
    // An empty shard: whole empty tensors, so the shapes still say the dim.
    const DataType key_dtype = tensorflow::DataTypeToEnum<Key>::value;
    TF_RETURN_IF_ERROR(writer_->Add(key_("keys"), Tensor(key_dtype, TensorShape({0}))));
    TF_RETURN_IF_ERROR(
        writer_->Add(key_("frequencies"), Tensor(tensorflow::DT_INT64, TensorShape({0}))));
    TF_RETURN_IF_ERROR(
        writer_->Add(key_("versions"), Tensor(tensorflow::DT_INT64, TensorShape({0}))));
    for (int64_t c = 0; c < written_; ++c) {
      TF_RETURN_IF_ERROR(
          writer_->Add(key_(ColumnField(c)), Tensor(tensorflow::DT_FLOAT, TensorShape({0, dim_}))));
    }
    return absl::OkStatus();
  }

  absl::Status Emit(const HostExportBatch<Key>& batch) {
    const int64_t count = batch.count;
    const DataType key_dtype = tensorflow::DataTypeToEnum<Key>::value;
    const TensorSlice rows({{done_, count}});
    const TensorSlice matrix({{done_, count}, {0, dim_}});
    Tensor keys(key_dtype, TensorShape({count}));
    std::copy(batch.keys, batch.keys + count, keys.flat<Key>().data());
    TF_RETURN_IF_ERROR(writer_->AddSlice(key_("keys"), TensorShape({total_}), rows, keys));
    Tensor counters(tensorflow::DT_INT64, TensorShape({count}));
    std::copy(batch.frequencies, batch.frequencies + count, counters.flat<int64_t>().data());
    TF_RETURN_IF_ERROR(
        writer_->AddSlice(key_("frequencies"), TensorShape({total_}), rows, counters));
    std::copy(batch.versions, batch.versions + count, counters.flat<int64_t>().data());
    TF_RETURN_IF_ERROR(writer_->AddSlice(key_("versions"), TensorShape({total_}), rows, counters));
    Tensor column(tensorflow::DT_FLOAT, TensorShape({count, dim_}));
    float* out = column.flat<float>().data();
    for (int64_t c = 0; c < written_; ++c) {
      for (int64_t i = 0; i < count; ++i) {
        std::memcpy(out + i * dim_, batch.rows + (i * columns_ + c) * dim_, dim_ * sizeof(float));
      }
      TF_RETURN_IF_ERROR(
          writer_->AddSlice(key_(ColumnField(c)), TensorShape({total_, dim_}), matrix, column));
    }
    done_ += count;
    return absl::OkStatus();
  }

  // Every key announced by Begin was emitted.
  absl::Status Finish() const {
    if (done_ != total_) {
      return errors::Internal("saving Embedding Variable '", table_, "' wrote ", done_, " of its ",
                              total_, " keys");
    }
    return absl::OkStatus();
  }

 private:
  BundleWriter* writer_;
  std::function<std::string(const std::string&)> key_;
  std::string table_;
  int64_t dim_, columns_, written_;
  int64_t total_ = 0, done_ = 0;
};

// A vector as a tensor of its length.
template <typename T>
Tensor VectorTensor(const std::vector<T>& values) {
  Tensor tensor(tensorflow::DataTypeToEnum<T>::value,
                TensorShape({static_cast<int64_t>(values.size())}));
  std::copy(values.begin(), values.end(), tensor.flat<T>().data());
  return tensor;
}

// The dtype the checkpoint stores Bloom filter counters of `bytes` in.
DataType CounterDtype(int64_t bytes) {
  switch (bytes) {
    case 1:
      return tensorflow::DT_UINT8;
    case 2:
      return tensorflow::DT_UINT16;
    case 4:
      return tensorflow::DT_UINT32;
    default:
      return tensorflow::DT_UINT64;
  }
}

// What a save writes: every key (full), the keys changed since the base
// (incremental), or every key's value without slots or filter state (an
// export for serving).
enum class SaveKind { kFull, kIncremental, kServing, kServingZeros };

template <typename Device>
class SaveEmbeddingVariablesOp : public OpKernel {
 public:
  explicit SaveEmbeddingVariablesOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(context, context->GetAttr("key_dtypes", &key_dtypes_));
    OP_REQUIRES_OK(context, context->GetAttr("target_workers", &target_workers_));
    OP_REQUIRES_OK(context, context->GetAttr("num_workers", &num_workers_));
    OP_REQUIRES_OK(context, context->GetAttr("record_changes", &record_changes_));
    std::string kind;
    OP_REQUIRES_OK(context, context->GetAttr("kind", &kind));
    kind_ = kind == "incremental"     ? SaveKind::kIncremental
            : kind == "serving"       ? SaveKind::kServing
            : kind == "serving_zeros" ? SaveKind::kServingZeros
                                      : SaveKind::kFull;
    const size_t n = table_names_.size();
    OP_REQUIRES(context,
                n == key_dtypes_.size() && n == target_workers_.size() &&
                    static_cast<int>(n) == context->num_inputs() - 1,
                errors::InvalidArgument("table_names, key_dtypes and target_workers must have one "
                                        "entry per resource"));
  }

  void Compute(OpKernelContext* context) override {
    const WorkerTopology topology = CurrentWorkerTopology();
    OP_REQUIRES(context, topology.num_workers == num_workers_,
                errors::FailedPrecondition("this save was built for ", num_workers_,
                                           " workers but runs on ", topology.num_workers,
                                           "; build the Saver after sok_ev.init() in this job"));
    const std::string prefix(context->input(0).scalar<tensorflow::tstring>()());
    const std::string part = checkpoint::PartPrefix(prefix, topology.worker, topology.num_workers);
    const int n = static_cast<int>(table_names_.size());
    std::vector<RefCountPtr<EmbeddingVariable<Device>>> variables(n);
    for (int t = 0; t < n; ++t) {
      OP_REQUIRES_OK(context, LookupInitializedVariable<Device>(context, 1 + t, key_dtypes_[t],
                                                                &variables[t]));
      // Incremental to what? Checked for every table before anything is written.
      OP_REQUIRES(
          context, kind_ != SaveKind::kIncremental || !variables[t]->change_log().base().empty(),
          errors::FailedPrecondition(
              "cannot save an incremental checkpoint of Embedding Variable '", table_names_[t],
              "': no checkpoint of it was saved or restored by a saver "
              "with incremental_save_restore=True since it was initialized; save a full "
              "checkpoint first"));
    }
    BundleWriter writer(context->env(), part);
    OP_REQUIRES_OK(context, writer.status());
    for (int t = 0; t < n; ++t) {
      EmbeddingVariable<Device>* variable = variables[t].get();
      std::string base;
      std::vector<int64_t> changed;
      if (kind_ == SaveKind::kIncremental || record_changes_ || variable->change_log().active()) {
        // Taken before the table is read: a change racing this save is
        // written again by the next one, never lost.
        if (!variable->change_log().active()) variable->change_log().Activate("");
        base = variable->change_log().base();
        changed = variable->change_log().TakeForSave();
      }
      OP_REQUIRES_OK(context, DispatchKeyType(key_dtypes_[t], "key_dtype", [&](auto key) {
                       return WriteShard<decltype(key)>(context, variable, table_names_[t],
                                                        topology, changed, &writer);
                     }));
      if (topology.worker == 0) {
        Tensor header(tensorflow::DT_INT64, TensorShape({checkpoint::kHeaderSize}));
        auto h = header.flat<int64_t>();
        h(checkpoint::kHeaderWorkers) = topology.num_workers;
        h(checkpoint::kHeaderTarget) = target_workers_[t];
        h(checkpoint::kHeaderVersion) = checkpoint::kFormatVersion;
        h(checkpoint::kHeaderKind) = HeaderKind();
        OP_REQUIRES_OK(context, writer.Add(checkpoint::HeaderKey(table_names_[t]), header));
        if (kind_ == SaveKind::kIncremental) {
          Tensor base_tensor(tensorflow::DT_STRING, TensorShape({}));
          base_tensor.scalar<tensorflow::tstring>()() = base;
          OP_REQUIRES_OK(context, writer.Add(checkpoint::BaseKey(table_names_[t]), base_tensor));
        }
      }
    }
    OP_REQUIRES_OK(context, writer.Finish());
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<tensorflow::tstring>()() = part;
  }

 private:
  // What the header says this checkpoint is.
  int64_t HeaderKind() const {
    switch (kind_) {
      case SaveKind::kIncremental:
        return checkpoint::kIncremental;
      case SaveKind::kServing:
        return checkpoint::kServingInitializer;
      case SaveKind::kServingZeros:
        return checkpoint::kServingZeros;
      default:
        return checkpoint::kFull;
    }
  }

  // changed: the keys changed since the base (incremental saves).
  template <typename Key>
  absl::Status WriteShard(OpKernelContext* context, EmbeddingVariable<Device>* variable,
                          const std::string& name, WorkerTopology topology,
                          const std::vector<int64_t>& changed, BundleWriter* writer) {
    const int64_t dim = variable->embedding_dim();
    auto table = variable->template table<Key>();
    auto lock = variable->lock_table();
    Core<Device> core(context);
    const bool serving = kind_ == SaveKind::kServing || kind_ == SaveKind::kServingZeros;
    std::vector<std::string> slot_names = table->slot_names();
    std::vector<float> slot_values = table->slot_initial_values();
    const int64_t columns = 1 + static_cast<int64_t>(slot_names.size());
    if (serving) {
      slot_names.clear();
      slot_values.clear();
    }
    auto key = [name, topology](const std::string& field) {
      return checkpoint::ShardKey(name, topology.worker, topology.num_workers, field);
    };
    TF_RETURN_IF_ERROR(writer->Add(key("slot_names"), VectorTensor(std::vector<tensorflow::tstring>(
                                                          slot_names.begin(), slot_names.end()))));
    TF_RETURN_IF_ERROR(writer->Add(key("slot_initial_values"), VectorTensor(slot_values)));
    ShardWriter<Key> rows(writer, key, variable->name(), dim, columns, serving ? 1 : columns);
    const int64_t batch_keys = ExportBatchKeys(columns * dim);
    auto begin = [&](int64_t total, int64_t width) { return rows.Begin(total, width); };
    // Keys changed since the base that the table no longer holds.
    std::unordered_set<Key> absent;
    if (kind_ != SaveKind::kIncremental) {
      TF_RETURN_IF_ERROR(core.template ExportBatches<Key>(
          *table, batch_keys, begin, [&](const HostExportBatch<Key>& b) { return rows.Emit(b); }));
    } else {
      // Only the changed keys' rows, gathered from one pass over the table.
      for (int64_t k : changed) absent.insert(static_cast<Key>(k));
      std::vector<Key> keys;
      std::vector<float> values;
      std::vector<int64_t> frequencies, versions;
      int64_t width = 0;
      TF_RETURN_IF_ERROR(core.template ExportBatches<Key>(
          *table, batch_keys,
          [&](int64_t, int64_t row_width) {
            width = row_width;
            return absl::OkStatus();
          },
          [&](const HostExportBatch<Key>& b) {
            for (int64_t i = 0; i < b.count; ++i) {
              if (absent.erase(b.keys[i]) == 0) continue;
              keys.push_back(b.keys[i]);
              values.insert(values.end(), b.rows + i * width, b.rows + (i + 1) * width);
              frequencies.push_back(b.frequencies[i]);
              versions.push_back(b.versions[i]);
            }
            return absl::OkStatus();
          }));
      const int64_t count = static_cast<int64_t>(keys.size());
      TF_RETURN_IF_ERROR(rows.Begin(count, width));
      if (count > 0) {
        TF_RETURN_IF_ERROR(rows.Emit(HostExportBatch<Key>{
            keys.data(), values.data(), frequencies.data(), versions.data(), count}));
      }
    }
    TF_RETURN_IF_ERROR(rows.Finish());
    if (!serving) TF_RETURN_IF_ERROR(WriteFilter<Key>(variable, key, &absent, writer));
    if (kind_ == SaveKind::kIncremental) {
      std::vector<Key> deleted(absent.begin(), absent.end());
      TF_RETURN_IF_ERROR(writer->Add(key("deleted_keys"), VectorTensor(deleted)));
    }
    return absl::OkStatus();
  }

  // What the variable's filter counted: every key not admitted yet (full), or
  // those among `absent` (incremental: they leave `absent`, which keeps the
  // keys gone altogether).
  template <typename Key>
  absl::Status WriteFilter(EmbeddingVariable<Device>* variable,
                           const std::function<std::string(const std::string&)>& key,
                           std::unordered_set<Key>* absent, BundleWriter* writer) {
    auto filter = variable->template filter<Key>();
    if (filter == nullptr) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(filter->mutex());
    const FeatureFilterSpec& spec = filter->spec();
    if (spec.bloom()) {
      const std::vector<uint8_t>& bytes = filter->counters();
      Tensor counters(CounterDtype(spec.counter_bytes), TensorShape({spec.num_counters}));
      std::memcpy(counters.data(), bytes.data(), bytes.size());
      TF_RETURN_IF_ERROR(writer->Add(key("bloom_counters"), counters));
      Tensor hashes(tensorflow::DT_INT64, TensorShape({}));
      hashes.scalar<int64_t>()() = spec.num_hashes;
      return writer->Add(key("bloom_hashes"), hashes);
    }
    std::vector<Key> keys;
    std::vector<int64_t> frequencies, versions;
    auto add = [&](Key k, const typename FeatureFilter<Key>::Entry& entry) {
      keys.push_back(k);
      frequencies.push_back(entry.frequency);
      versions.push_back(entry.version);
    };
    if (kind_ == SaveKind::kIncremental) {
      for (auto it = absent->begin(); it != absent->end();) {
        auto entry = filter->entries().find(*it);
        if (entry == filter->entries().end()) {
          ++it;
          continue;
        }
        add(entry->first, entry->second);
        it = absent->erase(it);
      }
    } else {
      for (const auto& [k, entry] : filter->entries()) add(k, entry);
    }
    TF_RETURN_IF_ERROR(writer->Add(key("keys_filtered"), VectorTensor(keys)));
    TF_RETURN_IF_ERROR(writer->Add(key("frequencies_filtered"), VectorTensor(frequencies)));
    return writer->Add(key("versions_filtered"), VectorTensor(versions));
  }

  std::vector<std::string> table_names_;
  std::vector<DataType> key_dtypes_;
  std::vector<int64_t> target_workers_;
  int64_t num_workers_;
  SaveKind kind_ = SaveKind::kFull;
  bool record_changes_ = false;
};

// After a save by a saver that also saves incrementally: the checkpoint at
// `prefix` is complete on every worker and becomes the base of the next
// incremental save.
template <typename Device>
class MarkEmbeddingVariablesSavedOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* context) override {
    const std::string prefix(context->input(0).scalar<tensorflow::tstring>()());
    for (int i = 1; i < context->num_inputs(); ++i) {
      RefCountPtr<EmbeddingVariable<Device>> variable;
      OP_REQUIRES_OK(context, tensorflow::LookupResource(
                                  context, tensorflow::HandleFromInput(context, i), &variable));
      variable->change_log().CommitSave(prefix);
    }
  }
};

// serving_modes' "as the checkpoint says" (the default, and a SavedModel's
// own tables); a table built for training passes 0 and keeps training.
constexpr int64_t kModeOfCheckpoint = -1;

// One table of a restore: what it is restored into, built before any
// variable changes.
template <typename Device>
struct StagedTable {
  RefCountPtr<EmbeddingVariable<Device>> variable;
  InitializerSpec spec;
  Tensor default_values;
  FeatureFilterSpec filter_spec;
  StorageSpec storage;  // the restored table's tiers (HBM_DRAM storage), as the variable's
  TableMode mode = TableMode::kTraining;
  // The mode is the checkpoint's: training, or serving for an export.
  bool mode_of_checkpoint = true;
  std::shared_ptr<typename Core<Device>::template Table<int32_t>> table32;
  std::shared_ptr<typename Core<Device>::template Table<int64_t>> table64;
  std::shared_ptr<FeatureFilter<int32_t>> filter32;
  std::shared_ptr<FeatureFilter<int64_t>> filter64;

  template <typename Key>
  std::shared_ptr<typename Core<Device>::template Table<Key>>& table() {
    if constexpr (std::is_same<Key, int32_t>::value) {
      return table32;
    } else {
      return table64;
    }
  }
  template <typename Key>
  std::shared_ptr<FeatureFilter<Key>>& filter() {
    if constexpr (std::is_same<Key, int32_t>::value) {
      return filter32;
    } else {
      return filter64;
    }
  }

  // Call once the mode is known, before the table is made. A table loaded
  // for serving keeps values only and filters nothing; a key a filtered
  // table lacks was never admitted in training, where it read the filter's
  // no_permission_value, so served "as training would" it reads that too.
  void drop_filter_if_serving() {
    if (mode == TableMode::kTraining) return;
    if (mode == TableMode::kServingInitializer && filter_spec.enabled()) {
      spec = InitializerSpec();  // kConstant
      spec.param_a = filter_spec.no_permission_value;
    }
    filter_spec = FeatureFilterSpec();
  }
};

// An incremental checkpoint names its base as it was written; a chain moved
// elsewhere still restores when the base lies next to it.
std::string ResolveBase(tensorflow::Env* env, const std::string& base, const std::string& prefix) {
  if (env->FileExists(base + ".index").ok()) return base;
  const size_t slash = prefix.rfind('/');
  const std::string directory = slash == std::string::npos ? "" : prefix.substr(0, slash + 1);
  const size_t base_slash = base.rfind('/');
  const std::string beside =
      directory + (base_slash == std::string::npos ? base : base.substr(base_slash + 1));
  return env->FileExists(beside + ".index").ok() ? beside : base;
}

// Longest chain of incremental checkpoints a restore follows.
constexpr int kMaxIncrementalChain = 10000;

template <typename Device>
class RestoreEmbeddingVariablesOp : public OpKernel {
 public:
  explicit RestoreEmbeddingVariablesOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(context, context->GetAttr("key_dtypes", &key_dtypes_));
    OP_REQUIRES_OK(context, context->GetAttr("embedding_dims", &dims_));
    OP_REQUIRES_OK(context, context->GetAttr("initializer_kinds", &kinds_));
    OP_REQUIRES_OK(context, context->GetAttr("initializer_params_a", &params_a_));
    OP_REQUIRES_OK(context, context->GetAttr("initializer_params_b", &params_b_));
    OP_REQUIRES_OK(context, context->GetAttr("initializer_seeds", &seeds_));
    OP_REQUIRES_OK(context, context->GetAttr("target_workers", &target_workers_));
    OP_REQUIRES_OK(context, context->GetAttr("filter_specs", &filter_specs_));
    OP_REQUIRES_OK(context, context->GetAttr("no_permission_values", &no_permission_values_));
    OP_REQUIRES_OK(context, context->GetAttr("serving_modes", &serving_modes_));
    OP_REQUIRES_OK(context, context->GetAttr("storage_specs", &storage_specs_));
    OP_REQUIRES_OK(context, context->GetAttr("record_changes", &record_changes_));
    const size_t n = table_names_.size();
    OP_REQUIRES(context, storage_specs_.empty() || storage_specs_.size() == 2 * n,
                errors::InvalidArgument("storage_specs needs 2 entries per table, got ",
                                        storage_specs_.size(), " for ", n, " tables"));
    OP_REQUIRES(context,
                n == key_dtypes_.size() && n == dims_.size() && n == kinds_.size() &&
                    n == params_a_.size() && n == params_b_.size() && n == seeds_.size() &&
                    n == target_workers_.size(),
                errors::InvalidArgument("every per-table attribute needs one entry per table"));
    // Attributes added after version 1 may be empty: no filter, training.
    OP_REQUIRES(context,
                (filter_specs_.empty() || filter_specs_.size() == 4 * n) &&
                    (no_permission_values_.empty() || no_permission_values_.size() == n) &&
                    (serving_modes_.empty() || serving_modes_.size() == n),
                errors::InvalidArgument("filter_specs needs 4 entries per table, "
                                        "no_permission_values and serving_modes one"));
    for (int64_t mode : serving_modes_) {
      OP_REQUIRES(context, mode >= kModeOfCheckpoint && mode <= 2,
                  errors::InvalidArgument("serving_modes must be -1, 0, 1 or 2, got ", mode));
    }
  }

  void Compute(OpKernelContext* context) override {
    const WorkerTopology topology = CurrentWorkerTopology();
    const std::string prefix(context->input(0).scalar<tensorflow::tstring>()());
    BundleReader reader(context->env(), prefix);
    OP_REQUIRES(context, reader.status().ok(),
                errors::NotFound("cannot read checkpoint '", prefix,
                                 "' to restore Embedding Variables: ", reader.status().message()));
    const int n = static_cast<int>(table_names_.size());
    // Read and check every table before any variable changes.
    std::vector<StagedTable<Device>> staged(n);
    for (int t = 0; t < n; ++t) {
      StagedTable<Device>& s = staged[t];
      const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(context, 1 + t);
      OP_REQUIRES_OK(
          context, MakeInitializerSpec(kinds_[t], params_a_[t], params_b_[t], seeds_[t], &s.spec));
      if (!filter_specs_.empty()) {
        OP_REQUIRES_OK(context, MakeFeatureFilterSpec(
                                    filter_specs_[4 * t], filter_specs_[4 * t + 1],
                                    filter_specs_[4 * t + 2], filter_specs_[4 * t + 3],
                                    no_permission_values_.empty() ? 0.0f : no_permission_values_[t],
                                    &s.filter_spec));
      }
      const int64_t asked = serving_modes_.empty() ? kModeOfCheckpoint : serving_modes_[t];
      s.mode_of_checkpoint = asked == kModeOfCheckpoint;
      if (!s.mode_of_checkpoint) s.mode = static_cast<TableMode>(asked);
      s.drop_filter_if_serving();
      if (!storage_specs_.empty()) {
        OP_REQUIRES_OK(
            context, ToTfStatus(MakeStorageSpec(storage_specs_[2 * t], storage_specs_[2 * t + 1],
                                                dims_[t], DisplayName(handle.name()), &s.storage)));
      }
      OP_REQUIRES_OK(context, CopyDefaultValues<Device>(context, DisplayName(handle.name()),
                                                        dims_[t], context->input(1 + n + t),
                                                        &s.spec, &s.default_values));
      OP_REQUIRES_OK(context, LookupOrCreateVariable<Device>(context, handle, key_dtypes_[t],
                                                             dims_[t], &s.variable));
      // A graph without storage_specs restores into the variable's own tiers.
      if (storage_specs_.empty()) s.storage = s.variable->storage();
      OP_REQUIRES_OK(context, DispatchKeyType(key_dtypes_[t], "key_dtype", [&](auto key) {
                       return ReadTable<decltype(key)>(context, &reader, prefix, t, topology, s,
                                                       /*depth=*/0);
                     }));
    }
    const uint64_t stamp = PathStamp(prefix);
    for (StagedTable<Device>& s : staged) {
      if (s.table32 != nullptr) {
        s.variable->template commit_restored<int32_t>(s.spec, s.default_values, s.storage,
                                                      std::move(s.table32), s.filter_spec,
                                                      std::move(s.filter32), s.mode, stamp);
      } else {
        s.variable->template commit_restored<int64_t>(s.spec, s.default_values, s.storage,
                                                      std::move(s.table64), s.filter_spec,
                                                      std::move(s.filter64), s.mode, stamp);
      }
      if (record_changes_ && s.mode == TableMode::kTraining) {
        s.variable->change_log().Activate(prefix);
      } else {
        s.variable->change_log().Deactivate();
      }
    }
  }

 private:
  // The keys of table t this worker owns, from every shard that may hold
  // some, into s's staged table and filter; an incremental checkpoint
  // restores its base first (depth: how many incremental checkpoints led
  // here).
  template <typename Key>
  absl::Status ReadTable(OpKernelContext* context, BundleReader* reader, const std::string& prefix,
                         int t, WorkerTopology topology, StagedTable<Device>& s, int depth) {
    const std::string& name = table_names_[t];
    const std::string where = "Embedding Variable '" + name + "' in checkpoint '" + prefix + "'";
    // A table on a worker this run does not have would restore on none of
    // them: refused, as a lookup of it is, before any table changes.
    const int64_t target = target_workers_[t];
    if (target < -1 || target >= topology.num_workers) {
      return errors::InvalidArgument(
          "cannot restore ", where, " into a variable whose target_gpu is ", target,
          ": this run has ", topology.num_workers,
          " worker(s), so target_gpu must be -1 or in [0, ", topology.num_workers, ")");
    }
    if (!reader->Contains(checkpoint::HeaderKey(name))) {
      return errors::NotFound("Embedding Variable '", name, "' is not in checkpoint '", prefix,
                              "' (saved under another name or variable scope?)");
    }
    DataType header_dtype;
    TensorShape header_shape;
    TF_RETURN_IF_ERROR(
        LookupShape(reader, checkpoint::HeaderKey(name), where, &header_dtype, &header_shape));
    const int64_t header_size =
        header_shape.dims() == 1 ? header_shape.dim_size(0) : checkpoint::kHeaderSize;
    Tensor header;
    TF_RETURN_IF_ERROR(
        ReadWhole(reader, checkpoint::HeaderKey(name), tensorflow::DT_INT64,
                  TensorShape({header_size == checkpoint::kHeaderSizeV1 ? checkpoint::kHeaderSizeV1
                                                                        : checkpoint::kHeaderSize}),
                  where, &header));
    const auto h = header.flat<int64_t>();
    const int64_t version = h(checkpoint::kHeaderVersion);
    if (!((version == 1 && header_size == checkpoint::kHeaderSizeV1) ||
          (version == checkpoint::kFormatVersion && header_size == checkpoint::kHeaderSize))) {
      return errors::InvalidArgument(where, " has format version ", version,
                                     "; this sok_ev reads versions 1 and ",
                                     checkpoint::kFormatVersion);
    }
    const int64_t kind = version == 1 ? checkpoint::kFull : h(checkpoint::kHeaderKind);
    const int64_t saved_workers = h(checkpoint::kHeaderWorkers);
    const int64_t saved_target = h(checkpoint::kHeaderTarget);
    if (saved_workers < 1) {
      return errors::InvalidArgument(where, " says it was saved by ", saved_workers, " workers");
    }
    if (kind < checkpoint::kFull || kind > checkpoint::kServingZeros) {
      return errors::InvalidArgument(where, " has an unknown kind ", kind);
    }
    const bool incremental = kind == checkpoint::kIncremental;
    if (kind == checkpoint::kServingInitializer || kind == checkpoint::kServingZeros) {
      if (depth > 0) {
        return errors::InvalidArgument(where,
                                       " is an export for serving; no incremental "
                                       "checkpoint builds on one");
      }
      // An export for serving loads for serving unless the op says otherwise.
      if (s.mode_of_checkpoint) {
        s.mode = kind == checkpoint::kServingZeros ? TableMode::kServingZeros
                                                   : TableMode::kServingInitializer;
      }
      s.drop_filter_if_serving();
    }
    Core<Device> core(context);
    auto& table = s.template table<Key>();
    auto& filter = s.template filter<Key>();
    if (incremental) {
      if (depth >= kMaxIncrementalChain) {
        return errors::InvalidArgument(where, " ends a chain of more than ", kMaxIncrementalChain,
                                       " incremental checkpoints; the chain loops");
      }
      Tensor base_tensor;
      TF_RETURN_IF_ERROR(ReadWhole(reader, checkpoint::BaseKey(name), tensorflow::DT_STRING,
                                   TensorShape({}), where, &base_tensor));
      const std::string base =
          ResolveBase(context->env(), base_tensor.scalar<tensorflow::tstring>()(), prefix);
      BundleReader base_reader(context->env(), base);
      if (!base_reader.status().ok()) {
        return errors::NotFound(where, " is incremental to checkpoint '", base,
                                "', which cannot be read: ", base_reader.status().message());
      }
      TF_RETURN_IF_ERROR(ReadTable<Key>(context, &base_reader, base, t, topology, s, depth + 1));
    } else {
      TF_RETURN_IF_ERROR(
          s.variable->template new_table<Key>(context, core, s.spec, s.storage, &table));
      TF_RETURN_IF_ERROR(
          EmbeddingVariable<Device>::template NewFilter<Key>(s.filter_spec, &filter));
    }
    const bool values_only = s.mode != TableMode::kTraining;
    // Sharded the same way on as many workers: shard w holds exactly the
    // keys worker w owns, so the other shards need not be read.
    const bool same_sharding =
        saved_target == -1 && target == -1 && saved_workers == topology.num_workers;
    // Every shard is checked, and the table gets every slot of any shard,
    // whatever keys it ends up holding; then the shards that may hold keys
    // of this worker are read (none of another worker's table).
    std::vector<ShardLayout> layouts(saved_workers);
    for (int64_t shard = 0; shard < saved_workers; ++shard) {
      TF_RETURN_IF_ERROR(CheckShard(reader, where, t, shard, saved_workers, &layouts[shard]));
      if (values_only) continue;
      const Tensor& names = layouts[shard].slot_names;
      const Tensor& values = layouts[shard].slot_values;
      for (int64_t i = 0; i < names.NumElements(); ++i) {
        int index;
        TF_RETURN_IF_ERROR(core.AddSlot(*table, names.flat<tensorflow::tstring>()(i),
                                        values.flat<float>()(i), &index));
      }
    }
    // An incremental checkpoint saves the Bloom filter whole.
    if (incremental && filter != nullptr && filter->spec().bloom()) {
      TF_RETURN_IF_ERROR(
          EmbeddingVariable<Device>::template NewFilter<Key>(s.filter_spec, &filter));
    }
    int64_t kept = 0;
    for (int64_t shard = 0; shard < saved_workers; ++shard) {
      if (same_sharding && shard != topology.worker) continue;
      if (target >= 0 && target != topology.worker) continue;
      const ShardLayout& layout = layouts[shard];
      auto owned = [&](Key k) {
        return target >= 0 || owner_of(k, topology.num_workers) == topology.worker;
      };
      if (incremental) {
        TF_RETURN_IF_ERROR(
            ForgetChangedKeys<Key>(reader, core, layout, owned, table.get(), filter.get()));
      }
      TF_RETURN_IF_ERROR(LoadShard<Key>(reader, core, layout, t, topology, same_sharding,
                                        values_only, table.get(), &kept));
      if (filter != nullptr)
        TF_RETURN_IF_ERROR(LoadFilter<Key>(reader, layout, owned, filter.get()));
    }
    if (incremental) return absl::OkStatus();
    int64_t size = 0;
    TF_RETURN_IF_ERROR(core.Size(*table, &size));
    if (size != kept) {
      return errors::InvalidArgument(where, " holds ", kept - size,
                                     " key(s) more than once; the checkpoint is corrupt");
    }
    return absl::OkStatus();
  }

  // What CheckShard found in one shard.
  struct ShardLayout {
    std::string where;                                   // names the shard in errors
    std::function<std::string(const std::string&)> key;  // its tensors' keys
    int64_t rows = 0;
    Tensor slot_names;   // [num_slots] string
    Tensor slot_values;  // [num_slots] float
  };

  // Checks the dtype and shape of every tensor of a shard, reading no rows.
  absl::Status CheckShard(BundleReader* reader, const std::string& where, int t, int64_t shard,
                          int64_t saved_workers, ShardLayout* layout) {
    const std::string name = table_names_[t];
    const int64_t dim = dims_[t];
    const DataType key_dtype = key_dtypes_[t];
    layout->where =
        where + " (shard " + std::to_string(shard) + " of " + std::to_string(saved_workers) + ")";
    layout->key = [name, shard, saved_workers](const std::string& field) {
      return checkpoint::ShardKey(name, shard, saved_workers, field);
    };
    const std::string& shard_where = layout->where;
    auto key = layout->key;
    DataType dtype;
    TensorShape shape;
    TF_RETURN_IF_ERROR(LookupShape(reader, key("keys"), shard_where, &dtype, &shape));
    if (dtype != key_dtype || shape.dims() != 1) {
      return errors::InvalidArgument(shard_where, " has ", tensorflow::DataTypeString(dtype),
                                     " keys of shape ", shape.DebugString(), "; the variable has ",
                                     tensorflow::DataTypeString(key_dtype), " keys");
    }
    const int64_t n = shape.dim_size(0);
    layout->rows = n;
    TF_RETURN_IF_ERROR(LookupShape(reader, key("slot_names"), shard_where, &dtype, &shape));
    if (shape.dims() != 1) {
      return errors::InvalidArgument(shard_where, ": slot_names must be a vector, got ",
                                     shape.DebugString());
    }
    const int64_t num_slots = shape.dim_size(0);
    TF_RETURN_IF_ERROR(ReadWhole(reader, key("slot_names"), tensorflow::DT_STRING,
                                 TensorShape({num_slots}), shard_where, &layout->slot_names));
    TF_RETURN_IF_ERROR(ReadWhole(reader, key("slot_initial_values"), tensorflow::DT_FLOAT,
                                 TensorShape({num_slots}), shard_where, &layout->slot_values));
    for (int64_t c = 0; c <= num_slots; ++c) {
      TF_RETURN_IF_ERROR(LookupShape(reader, key(ColumnField(c)), shard_where, &dtype, &shape));
      if (dtype != tensorflow::DT_FLOAT || shape != TensorShape({n, dim})) {
        if (shape.dims() == 2 && shape.dim_size(1) != dim) {
          return errors::InvalidArgument(shard_where, " has embedding_dim ", shape.dim_size(1),
                                         " (", ColumnField(c), " ", shape.DebugString(),
                                         "); the variable has embedding_dim ", dim);
        }
        return errors::InvalidArgument(shard_where, ": ", ColumnField(c), " must be float [", n,
                                       ", ", dim, "], got ", tensorflow::DataTypeString(dtype), " ",
                                       shape.DebugString());
      }
    }
    for (const char* field : {"frequencies", "versions"}) {
      TF_RETURN_IF_ERROR(LookupShape(reader, key(field), shard_where, &dtype, &shape));
      if (dtype != tensorflow::DT_INT64 || shape != TensorShape({n})) {
        return errors::InvalidArgument(shard_where, ": ", field, " must be int64 [", n, "], got ",
                                       tensorflow::DataTypeString(dtype), " ", shape.DebugString());
      }
    }
    return absl::OkStatus();
  }

  // The keys of an optional vector tensor of the shard (empty when absent).
  template <typename T>
  static absl::Status ReadOptionalVector(BundleReader* reader, const ShardLayout& layout,
                                         const std::string& field, std::vector<T>* out) {
    out->clear();
    if (!reader->Contains(layout.key(field))) return absl::OkStatus();
    DataType dtype;
    TensorShape shape;
    TF_RETURN_IF_ERROR(LookupShape(reader, layout.key(field), layout.where, &dtype, &shape));
    if (shape.dims() != 1) {
      return errors::InvalidArgument(layout.where, ": ", field, " must be a vector, got ",
                                     shape.DebugString());
    }
    Tensor tensor;
    TF_RETURN_IF_ERROR(ReadWhole(reader, layout.key(field), tensorflow::DataTypeToEnum<T>::value,
                                 shape, layout.where, &tensor));
    out->assign(tensor.flat<T>().data(), tensor.flat<T>().data() + shape.dim_size(0));
    return absl::OkStatus();
  }

  // Before an incremental shard's rows: every key it names leaves the
  // table and the filter, so each ends where the shard puts it (a row, a
  // filter count, or nowhere).
  template <typename Key, typename Owned>
  absl::Status ForgetChangedKeys(BundleReader* reader, Core<Device>& core,
                                 const ShardLayout& layout, const Owned& owned,
                                 typename Core<Device>::template Table<Key>* table,
                                 FeatureFilter<Key>* filter) {
    std::vector<Key> changed;
    for (const char* field : {"keys", "keys_filtered", "deleted_keys"}) {
      std::vector<Key> keys;
      TF_RETURN_IF_ERROR(ReadOptionalVector(reader, layout, field, &keys));
      for (Key k : keys) {
        if (owned(k)) changed.push_back(k);
      }
    }
    int64_t erased = 0;
    TF_RETURN_IF_ERROR(
        core.Erase(*table, changed.data(), static_cast<int64_t>(changed.size()), &erased));
    if (filter != nullptr) {
      for (Key k : changed) filter->forget(k);
    }
    return absl::OkStatus();
  }

  // What the shard's filter counted, for the keys this worker owns: exact
  // counts go to an exact filter (or are added to a Bloom filter's);
  // Bloom counters are added to a Bloom filter's (the shards of several
  // workers sum to the counts of every key). A filter of another kind than
  // the saved one starts from what can be carried over.
  template <typename Key, typename Owned>
  absl::Status LoadFilter(BundleReader* reader, const ShardLayout& layout, const Owned& owned,
                          FeatureFilter<Key>* filter) {
    std::vector<Key> keys;
    std::vector<int64_t> frequencies, versions;
    TF_RETURN_IF_ERROR(ReadOptionalVector(reader, layout, "keys_filtered", &keys));
    TF_RETURN_IF_ERROR(ReadOptionalVector(reader, layout, "frequencies_filtered", &frequencies));
    TF_RETURN_IF_ERROR(ReadOptionalVector(reader, layout, "versions_filtered", &versions));
    if (frequencies.size() != keys.size() || versions.size() != keys.size()) {
      return errors::InvalidArgument(layout.where,
                                     ": keys_filtered, frequencies_filtered and "
                                     "versions_filtered must have one length, got ",
                                     keys.size(), ", ", frequencies.size(), " and ",
                                     versions.size());
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!owned(keys[i])) continue;
      if (filter->spec().bloom()) {
        filter->add(keys[i], frequencies[i]);
      } else {
        filter->set_entry(keys[i], frequencies[i], versions[i]);
      }
    }
    if (!filter->spec().bloom() || !reader->Contains(layout.key("bloom_counters"))) {
      return absl::OkStatus();
    }
    DataType dtype;
    TensorShape shape;
    TF_RETURN_IF_ERROR(
        LookupShape(reader, layout.key("bloom_counters"), layout.where, &dtype, &shape));
    int64_t bytes = 0;
    for (int64_t b : {1, 2, 4, 8}) {
      if (dtype == CounterDtype(b)) bytes = b;
    }
    if (bytes == 0 || shape.dims() != 1) {
      return errors::InvalidArgument(layout.where,
                                     ": bloom_counters must be a vector of "
                                     "unsigned integers, got ",
                                     tensorflow::DataTypeString(dtype), " ", shape.DebugString());
    }
    Tensor counters, hashes;
    TF_RETURN_IF_ERROR(
        ReadWhole(reader, layout.key("bloom_counters"), dtype, shape, layout.where, &counters));
    TF_RETURN_IF_ERROR(ReadWhole(reader, layout.key("bloom_hashes"), tensorflow::DT_INT64,
                                 TensorShape({}), layout.where, &hashes));
    return ToTfStatus(filter->merge_counters(counters.data(), shape.dim_size(0), bytes,
                                             hashes.scalar<int64_t>()()));
  }

  // Inserts the shard's keys this worker owns into `table` (values_only:
  // without their slots, as a table loaded for serving keeps them).
  template <typename Key>
  absl::Status LoadShard(BundleReader* reader, Core<Device>& core, const ShardLayout& layout, int t,
                         WorkerTopology topology, bool same_sharding, bool values_only,
                         typename Core<Device>::template Table<Key>* table, int64_t* kept) {
    const int64_t dim = dims_[t];
    const int64_t target = target_workers_[t];
    const DataType key_dtype = tensorflow::DataTypeToEnum<Key>::value;
    const std::string& shard_where = layout.where;
    const auto& key = layout.key;
    const int64_t n = layout.rows;
    const int64_t num_slots = values_only ? 0 : layout.slot_names.NumElements();
    const int64_t columns = 1 + num_slots;
    const Tensor& slot_names = layout.slot_names;
    const Tensor& slot_values = layout.slot_values;
    // Column c of this shard goes to slot column[c] of the table (which has
    // every slot of every shard); rows lacking one of the table's slots get
    // that slot's initial value.
    std::vector<int64_t> table_column(columns, 0);
    for (int64_t s = 0; s < num_slots; ++s) {
      int index;
      TF_RETURN_IF_ERROR(core.AddSlot(*table, slot_names.flat<tensorflow::tstring>()(s),
                                      slot_values.flat<float>()(s), &index));
      table_column[1 + s] = 1 + index;
    }
    if (n == 0) return absl::OkStatus();
    const std::vector<float> table_slot_values = table->slot_initial_values();
    const int64_t width = (1 + static_cast<int64_t>(table_slot_values.size())) * dim;

    // Row ranges as stored, so that each stored slice is read once.
    std::vector<TensorSlice> slices;
    TF_RETURN_IF_ERROR(reader->LookupTensorSlices(key("keys"), &slices));
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const TensorSlice& slice : slices) {
      if (slice.IsFullAt(0)) {
        ranges.clear();
        break;
      }
      ranges.emplace_back(slice.start(0), slice.length(0));
    }
    if (ranges.empty()) ranges.emplace_back(0, n);
    std::sort(ranges.begin(), ranges.end());

    for (const auto& [start, count] : ranges) {
      if (start < 0 || count < 0 || start + count > n) {
        return errors::InvalidArgument(shard_where, " has a slice of rows [", start, ", ",
                                       start + count, ") outside [0, ", n, ")");
      }
      const TensorSlice rows({{start, count}});
      const TensorSlice matrix({{start, count}, {0, dim}});
      Tensor keys(key_dtype, TensorShape({count}));
      Tensor frequencies(tensorflow::DT_INT64, TensorShape({count}));
      Tensor versions(tensorflow::DT_INT64, TensorShape({count}));
      TF_RETURN_IF_ERROR(ReadSlice(reader, key("keys"), rows, shard_where, &keys));
      TF_RETURN_IF_ERROR(ReadSlice(reader, key("frequencies"), rows, shard_where, &frequencies));
      TF_RETURN_IF_ERROR(ReadSlice(reader, key("versions"), rows, shard_where, &versions));
      // The rows this worker keeps.
      const Key* k = keys.flat<Key>().data();
      std::vector<int64_t> mine;
      mine.reserve(count);
      for (int64_t i = 0; i < count; ++i) {
        const bool owned = target >= 0 || owner_of(k[i], topology.num_workers) == topology.worker;
        if (owned) {
          mine.push_back(i);
        } else if (same_sharding) {
          return errors::InvalidArgument(shard_where, " holds key ", k[i], " of worker ",
                                         owner_of(k[i], topology.num_workers),
                                         "; the checkpoint is corrupt");
        }
      }
      if (mine.empty()) continue;
      const int64_t m = static_cast<int64_t>(mine.size());
      std::vector<Key> kept_keys(m);
      std::vector<int64_t> kept_frequencies(m), kept_versions(m);
      std::vector<float> kept_rows(m * width);
      for (int64_t j = 0; j < m; ++j) {
        kept_keys[j] = k[mine[j]];
        kept_frequencies[j] = frequencies.flat<int64_t>()(mine[j]);
        kept_versions[j] = versions.flat<int64_t>()(mine[j]);
        // Slots this shard lacks start at their initial values.
        for (size_t s = 0; s < table_slot_values.size(); ++s) {
          float* out = kept_rows.data() + j * width + (1 + s) * dim;
          std::fill(out, out + dim, table_slot_values[s]);
        }
      }
      Tensor column(tensorflow::DT_FLOAT, TensorShape({count, dim}));
      for (int64_t c = 0; c < columns; ++c) {
        TF_RETURN_IF_ERROR(ReadSlice(reader, key(ColumnField(c)), matrix, shard_where, &column));
        const float* in = column.flat<float>().data();
        for (int64_t j = 0; j < m; ++j) {
          std::memcpy(kept_rows.data() + j * width + table_column[c] * dim, in + mine[j] * dim,
                      dim * sizeof(float));
        }
      }
      TF_RETURN_IF_ERROR(core.InsertOrAssignFromHost(*table, kept_keys.data(), m, kept_rows.data(),
                                                     kept_frequencies.data(),
                                                     kept_versions.data()));
      *kept += m;
    }
    return absl::OkStatus();
  }

  static absl::Status LookupShape(BundleReader* reader, const std::string& key,
                                  const std::string& where, DataType* dtype, TensorShape* shape) {
    absl::Status status = reader->LookupDtypeAndShape(key, dtype, shape);
    if (absl::IsNotFound(status)) {
      return errors::NotFound(where, " lacks tensor '", key, "'");
    }
    return status;
  }

  static absl::Status ReadWhole(BundleReader* reader, const std::string& key, DataType dtype,
                                const TensorShape& shape, const std::string& where, Tensor* out) {
    DataType stored;
    TensorShape stored_shape;
    absl::Status status = reader->LookupDtypeAndShape(key, &stored, &stored_shape);
    if (absl::IsNotFound(status)) {
      return errors::NotFound(where, " lacks tensor '", key, "'");
    }
    TF_RETURN_IF_ERROR(status);
    if (stored != dtype || stored_shape != shape) {
      return errors::InvalidArgument(where, ": '", key, "' must be ",
                                     tensorflow::DataTypeString(dtype), " ", shape.DebugString(),
                                     ", got ", tensorflow::DataTypeString(stored), " ",
                                     stored_shape.DebugString());
    }
    *out = Tensor(dtype, shape);
    return reader->Lookup(key, out);
  }

  static absl::Status ReadSlice(BundleReader* reader, const std::string& key,
                                const TensorSlice& slice, const std::string& where, Tensor* out) {
    absl::Status status = reader->LookupSlice(key, slice, out);
    if (!status.ok()) {
      return errors::InvalidArgument(where, ": cannot read rows ", slice.DebugString(), " of '",
                                     key, "': ", status.message());
    }
    return absl::OkStatus();
  }

  std::vector<std::string> table_names_;
  std::vector<DataType> key_dtypes_;
  std::vector<int64_t> dims_;
  std::vector<int64_t> kinds_;
  std::vector<float> params_a_;
  std::vector<float> params_b_;
  std::vector<int64_t> seeds_;
  std::vector<int64_t> target_workers_;
  std::vector<int64_t> filter_specs_;
  std::vector<float> no_permission_values_;
  std::vector<int64_t> serving_modes_;
  std::vector<int64_t> storage_specs_;  // [hbm_bytes, cache_strategy] per table, or empty
  bool record_changes_ = false;
};

REGISTER_KERNEL_BUILDER(Name("SokEv>SaveEmbeddingVariables").Device(tensorflow::DEVICE_CPU),
                        SaveEmbeddingVariablesOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>RestoreEmbeddingVariables").Device(tensorflow::DEVICE_CPU),
                        RestoreEmbeddingVariablesOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>MarkEmbeddingVariablesSaved").Device(tensorflow::DEVICE_CPU),
                        MarkEmbeddingVariablesSavedOp<CPUDevice>);

#if GOOGLE_CUDA
// The bundle is read and written on host; the tables' data crosses in
// batches (Core<GPUDevice>::ExportBatches / InsertOrAssignFromHost).
using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("SokEv>SaveEmbeddingVariables")
                            .Device(DEVICE_GPU)
                            .HostMemory("prefix")
                            .HostMemory("resources")
                            .HostMemory("part"),
                        SaveEmbeddingVariablesOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>RestoreEmbeddingVariables")
                            .Device(DEVICE_GPU)
                            .HostMemory("prefix")
                            .HostMemory("resources"),
                        RestoreEmbeddingVariablesOp<GPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>MarkEmbeddingVariablesSaved")
                            .Device(DEVICE_GPU)
                            .HostMemory("prefix")
                            .HostMemory("resources"),
                        MarkEmbeddingVariablesSavedOp<GPUDevice>);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace sok_ev
