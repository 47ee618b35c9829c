// Kernels that save Embedding Variables into TensorFlow checkpoints and
// restore them, for CPU and (GOOGLE_CUDA builds) GPU. Op definitions:
// sok_ev/cc/ops/checkpoint_ops.cc; layout: checkpoint_format.h.
//
// Both stream: a save writes each table batch by batch straight from the
// table into the bundle, a restore reads one stored slice at a time, so
// neither holds a second copy of a table in host memory.
#define EIGEN_USE_THREADS
#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

template <typename Device>
class SaveEmbeddingVariablesOp : public OpKernel {
 public:
  explicit SaveEmbeddingVariablesOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(context, context->GetAttr("key_dtypes", &key_dtypes_));
    OP_REQUIRES_OK(context, context->GetAttr("target_workers", &target_workers_));
    OP_REQUIRES_OK(context, context->GetAttr("num_workers", &num_workers_));
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
    BundleWriter writer(context->env(), part);
    OP_REQUIRES_OK(context, writer.status());
    for (size_t t = 0; t < table_names_.size(); ++t) {
      RefCountPtr<EmbeddingVariable<Device>> variable;
      OP_REQUIRES_OK(context, LookupInitializedVariable<Device>(context, 1 + static_cast<int>(t),
                                                                key_dtypes_[t], &variable));
      OP_REQUIRES_OK(context, DispatchKeyType(key_dtypes_[t], "key_dtype", [&](auto key) {
                       return WriteShard<decltype(key)>(context, variable.get(), table_names_[t],
                                                        topology, &writer);
                     }));
      if (topology.worker == 0) {
        Tensor header(tensorflow::DT_INT64, TensorShape({checkpoint::kHeaderSize}));
        auto h = header.flat<int64_t>();
        h(checkpoint::kHeaderWorkers) = topology.num_workers;
        h(checkpoint::kHeaderTarget) = target_workers_[t];
        h(checkpoint::kHeaderVersion) = checkpoint::kFormatVersion;
        OP_REQUIRES_OK(context, writer.Add(checkpoint::HeaderKey(table_names_[t]), header));
      }
    }
    OP_REQUIRES_OK(context, writer.Finish());
    Tensor* output;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &output));
    output->scalar<tensorflow::tstring>()() = part;
  }

 private:
  template <typename Key>
  absl::Status WriteShard(OpKernelContext* context, EmbeddingVariable<Device>* variable,
                          const std::string& name, WorkerTopology topology, BundleWriter* writer) {
    const DataType key_dtype = tensorflow::DataTypeToEnum<Key>::value;
    const int64_t dim = variable->embedding_dim();
    auto table = variable->template table<Key>();
    auto lock = variable->lock_table();
    Core<Device> core(context);
    const std::vector<std::string> slot_names = table->slot_names();
    const std::vector<float> slot_values = table->slot_initial_values();
    const int64_t columns = 1 + static_cast<int64_t>(slot_names.size());
    auto key = [&](const std::string& field) {
      return checkpoint::ShardKey(name, topology.worker, topology.num_workers, field);
    };
    Tensor names(tensorflow::DT_STRING, TensorShape({columns - 1}));
    Tensor values(tensorflow::DT_FLOAT, TensorShape({columns - 1}));
    for (int64_t s = 0; s + 1 < columns; ++s) {
      names.flat<tensorflow::tstring>()(s) = slot_names[s];
      values.flat<float>()(s) = slot_values[s];
    }
    TF_RETURN_IF_ERROR(writer->Add(key("slot_names"), names));
    TF_RETURN_IF_ERROR(writer->Add(key("slot_initial_values"), values));

    int64_t total = 0, written = 0;
    auto begin = [&](int64_t n, int64_t row_width) -> absl::Status {
      if (row_width != columns * dim) {
        return errors::Aborted("the slots of Embedding Variable '", variable->name(),
                               "' changed while it was being saved; save again");
      }
      total = n;
      if (n > 0) return absl::OkStatus();
      // An empty shard: whole empty tensors, so the shapes still say the dim.
      TF_RETURN_IF_ERROR(writer->Add(key("keys"), Tensor(key_dtype, TensorShape({0}))));
      TF_RETURN_IF_ERROR(
          writer->Add(key("frequencies"), Tensor(tensorflow::DT_INT64, TensorShape({0}))));
      TF_RETURN_IF_ERROR(
          writer->Add(key("versions"), Tensor(tensorflow::DT_INT64, TensorShape({0}))));
      for (int64_t c = 0; c < columns; ++c) {
        TF_RETURN_IF_ERROR(
            writer->Add(key(ColumnField(c)), Tensor(tensorflow::DT_FLOAT, TensorShape({0, dim}))));
      }
      return absl::OkStatus();
    };
    auto emit = [&](const HostExportBatch<Key>& batch) -> absl::Status {
      const int64_t count = batch.count;
      const TensorSlice rows({{written, count}});
      const TensorSlice matrix({{written, count}, {0, dim}});
      Tensor keys(key_dtype, TensorShape({count}));
      std::copy(batch.keys, batch.keys + count, keys.flat<Key>().data());
      TF_RETURN_IF_ERROR(writer->AddSlice(key("keys"), TensorShape({total}), rows, keys));
      Tensor counters(tensorflow::DT_INT64, TensorShape({count}));
      std::copy(batch.frequencies, batch.frequencies + count, counters.flat<int64_t>().data());
      TF_RETURN_IF_ERROR(
          writer->AddSlice(key("frequencies"), TensorShape({total}), rows, counters));
      std::copy(batch.versions, batch.versions + count, counters.flat<int64_t>().data());
      TF_RETURN_IF_ERROR(writer->AddSlice(key("versions"), TensorShape({total}), rows, counters));
      Tensor column(tensorflow::DT_FLOAT, TensorShape({count, dim}));
      float* out = column.flat<float>().data();
      for (int64_t c = 0; c < columns; ++c) {
        for (int64_t i = 0; i < count; ++i) {
          std::memcpy(out + i * dim, batch.rows + (i * columns + c) * dim, dim * sizeof(float));
        }
        TF_RETURN_IF_ERROR(
            writer->AddSlice(key(ColumnField(c)), TensorShape({total, dim}), matrix, column));
      }
      written += count;
      return absl::OkStatus();
    };
    TF_RETURN_IF_ERROR(
        core.template ExportBatches<Key>(*table, ExportBatchKeys(columns * dim), begin, emit));
    if (written != total) {
      return errors::Internal("saving Embedding Variable '", variable->name(), "' wrote ", written,
                              " of its ", total, " keys");
    }
    return absl::OkStatus();
  }

  std::vector<std::string> table_names_;
  std::vector<DataType> key_dtypes_;
  std::vector<int64_t> target_workers_;
  int64_t num_workers_;
};

// One table of a restore: what it is restored into, built before any
// variable changes.
template <typename Device>
struct StagedTable {
  RefCountPtr<EmbeddingVariable<Device>> variable;
  InitializerSpec spec;
  Tensor default_values;
  std::shared_ptr<typename Core<Device>::template Table<int32_t>> table32;
  std::shared_ptr<typename Core<Device>::template Table<int64_t>> table64;
};

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
    const size_t n = table_names_.size();
    OP_REQUIRES(context,
                n == key_dtypes_.size() && n == dims_.size() && n == kinds_.size() &&
                    n == params_a_.size() && n == params_b_.size() && n == seeds_.size() &&
                    n == target_workers_.size(),
                errors::InvalidArgument("every per-table attribute needs one entry per table"));
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
      OP_REQUIRES_OK(context, CopyDefaultValues<Device>(context, handle.name(), dims_[t],
                                                        context->input(1 + n + t), &s.spec,
                                                        &s.default_values));
      OP_REQUIRES_OK(context, LookupOrCreateVariable<Device>(context, handle, key_dtypes_[t],
                                                             dims_[t], &s.variable));
      OP_REQUIRES_OK(
          context, DispatchKeyType(key_dtypes_[t], "key_dtype", [&](auto key) {
            using Key = decltype(key);
            std::shared_ptr<typename Core<Device>::template Table<Key>> table;
            TF_RETURN_IF_ERROR(ReadTable<Key>(context, &reader, prefix, t, topology, s, &table));
            if constexpr (std::is_same<Key, int32_t>::value) {
              s.table32 = std::move(table);
            } else {
              s.table64 = std::move(table);
            }
            return absl::OkStatus();
          }));
    }
    const uint64_t stamp = PathStamp(prefix);
    for (StagedTable<Device>& s : staged) {
      if (s.table32 != nullptr) {
        s.variable->template commit_restored<int32_t>(s.spec, s.default_values,
                                                      std::move(s.table32), stamp);
      } else {
        s.variable->template commit_restored<int64_t>(s.spec, s.default_values,
                                                      std::move(s.table64), stamp);
      }
    }
  }

 private:
  // The keys of table t this worker owns, from every shard that may hold some.
  template <typename Key>
  absl::Status ReadTable(OpKernelContext* context, BundleReader* reader, const std::string& prefix,
                         int t, WorkerTopology topology, StagedTable<Device>& staged,
                         std::shared_ptr<typename Core<Device>::template Table<Key>>* table) {
    const std::string& name = table_names_[t];
    const std::string where = "Embedding Variable '" + name + "' in checkpoint '" + prefix + "'";
    if (!reader->Contains(checkpoint::HeaderKey(name))) {
      return errors::NotFound("Embedding Variable '", name, "' is not in checkpoint '", prefix,
                              "' (saved under another name or variable scope?)");
    }
    Tensor header;
    TF_RETURN_IF_ERROR(ReadWhole(reader, checkpoint::HeaderKey(name), tensorflow::DT_INT64,
                                 TensorShape({checkpoint::kHeaderSize}), where, &header));
    const auto h = header.flat<int64_t>();
    if (h(checkpoint::kHeaderVersion) != checkpoint::kFormatVersion) {
      return errors::InvalidArgument(where, " has format version ", h(checkpoint::kHeaderVersion),
                                     "; this sok_ev reads version ", checkpoint::kFormatVersion);
    }
    const int64_t saved_workers = h(checkpoint::kHeaderWorkers);
    const int64_t saved_target = h(checkpoint::kHeaderTarget);
    if (saved_workers < 1) {
      return errors::InvalidArgument(where, " says it was saved by ", saved_workers, " workers");
    }
    Core<Device> core(context);
    TF_RETURN_IF_ERROR(staged.variable->template new_table<Key>(context, core, staged.spec, table));
    const int64_t target = target_workers_[t];
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
      const Tensor& names = layouts[shard].slot_names;
      const Tensor& values = layouts[shard].slot_values;
      for (int64_t s = 0; s < names.NumElements(); ++s) {
        int index;
        TF_RETURN_IF_ERROR(core.AddSlot(**table, names.flat<tensorflow::tstring>()(s),
                                        values.flat<float>()(s), &index));
      }
    }
    int64_t kept = 0;
    for (int64_t shard = 0; shard < saved_workers; ++shard) {
      if (same_sharding && shard != topology.worker) continue;
      if (target >= 0 && target != topology.worker) continue;
      TF_RETURN_IF_ERROR(LoadShard<Key>(reader, core, layouts[shard], t, topology, same_sharding,
                                        table->get(), &kept));
    }
    int64_t size = 0;
    TF_RETURN_IF_ERROR(core.Size(**table, &size));
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

  // Inserts the shard's keys this worker owns into `table`.
  template <typename Key>
  absl::Status LoadShard(BundleReader* reader, Core<Device>& core, const ShardLayout& layout, int t,
                         WorkerTopology topology, bool same_sharding,
                         typename Core<Device>::template Table<Key>* table, int64_t* kept) {
    const int64_t dim = dims_[t];
    const int64_t target = target_workers_[t];
    const DataType key_dtype = tensorflow::DataTypeToEnum<Key>::value;
    const std::string& shard_where = layout.where;
    const auto& key = layout.key;
    const int64_t n = layout.rows;
    const int64_t num_slots = layout.slot_names.NumElements();
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
};

REGISTER_KERNEL_BUILDER(Name("SokEv>SaveEmbeddingVariables").Device(tensorflow::DEVICE_CPU),
                        SaveEmbeddingVariablesOp<CPUDevice>);
REGISTER_KERNEL_BUILDER(Name("SokEv>RestoreEmbeddingVariables").Device(tensorflow::DEVICE_CPU),
                        RestoreEmbeddingVariablesOp<CPUDevice>);

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
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace sok_ev
