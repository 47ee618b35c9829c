// The TensorFlow resource behind an Embedding Variable: a thin owner of one
// core hash table of the variable's key dtype on one device
// (cc/hash_table_cpu.h or cc/hash_table_gpu.h, through Core<Device>), with
// what decides how lookups treat it: its feature filter (cc/feature_filter.h,
// host memory), whether it was loaded for serving, and the log of changed
// keys for incremental checkpoints (change_log.h). A variable lives in the
// resource manager of the device its handle op ran on; the CPU and GPU kinds
// are distinct resource types.
#ifndef SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_H_
#define SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/common.h"
#include "cc/feature_filter.h"
#include "cc/initializer.h"
#include "cc/storage_spec.h"
#include "sok_ev/cc/kernels/change_log.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace sok_ev {

// The largest embedding_dim a variable may have: a row of 256 KiB. Larger
// rows are no embedding anyone trains, and their size would only surface as
// an allocation failure at the first lookup.
constexpr int64_t kMaxEmbeddingDim = int64_t{1} << 16;

// How lookups treat a variable. A variable restored from a SavedModel export
// serves: lookups insert nothing and count nothing, and a key the table
// lacks reads its initial value or zeros.
enum class TableMode : int32_t {
  kTraining = 0,
  kServingInitializer = 1,
  kServingZeros = 2,
};

// The name errors give: the shared name without the "#<n>" that makes an
// eager variable's table private to its Python object (sok_ev's
// embedding_variable.py), so an error names the variable as the user did.
inline std::string DisplayName(const std::string& shared_name) {
  return shared_name.substr(0, shared_name.rfind('#'));
}

template <typename Device>
class EmbeddingVariable : public tensorflow::ResourceBase {
 public:
  template <typename Key>
  using Table = typename Core<Device>::template Table<Key>;

  EmbeddingVariable(std::string name, tensorflow::DataType key_dtype, int64_t embedding_dim)
      : name_(DisplayName(name)), key_dtype_(key_dtype), embedding_dim_(embedding_dim) {}

  const std::string& name() const { return name_; }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  int64_t embedding_dim() const { return embedding_dim_; }

  // Replaces the table with an empty one (TF semantics of re-running a
  // variable's initializer), and its filter with one that has counted
  // nothing; the variable trains and records no changes. Running ops keep
  // the table they started with. default_values: (default_value_dim, dim) on
  // the device, a copy this variable keeps for the tables it makes later
  // (checkpoint restore).
  // storage: where the rows live (an HBM budget for GPU tables), kept for
  // the tables it makes later (restore, import).
  absl::Status initialize(tensorflow::OpKernelContext* context, const InitializerSpec& initializer,
                          tensorflow::Tensor default_values, const FeatureFilterSpec& filter,
                          const StorageSpec& storage) {
    Core<Device> core(context);
    change_log_.Deactivate();
    if (key_dtype_ == tensorflow::DT_INT32) {
      return initialize_with<int32_t>(context, core, initializer, std::move(default_values), filter,
                                      storage);
    }
    return initialize_with<int64_t>(context, core, initializer, std::move(default_values), filter,
                                    storage);
  }

  // A filter that has counted nothing, or null when `spec` filters nothing.
  template <typename Key>
  static absl::Status NewFilter(const FeatureFilterSpec& spec,
                                std::shared_ptr<FeatureFilter<Key>>* filter) {
    filter->reset();
    if (!spec.enabled()) return absl::OkStatus();
    TF_RETURN_IF_ERROR(ToTfStatus(CheckFeatureFilterSpec(spec)));
    FeatureFilter<Key>* created = nullptr;
    TF_RETURN_IF_ERROR(ToTfStatus(FeatureFilter<Key>::Create(spec, &created)));
    filter->reset(created);
    return absl::OkStatus();
  }

  // An empty table made with `initializer` (whose default-value matrix, if
  // any, must stay valid until commit_restored) and `storage`, for a
  // restore to fill before anything stored changes.
  template <typename Key>
  absl::Status new_table(tensorflow::OpKernelContext* context, Core<Device>& core,
                         const InitializerSpec& initializer, const StorageSpec& storage,
                         std::shared_ptr<Table<Key>>* table) {
    std::lock_guard<std::mutex> lock(mutex_);
    return make_table_locked(context, core, initializer, storage, table);
  }

  // Makes a restored table and filter the variable's, with the initializer
  // and filter spec they were made with, in `mode`; stamp identifies the
  // checkpoint (see restore_stamp). Cannot fail, so a restore of many
  // variables commits all of them or none.
  template <typename Key>
  void commit_restored(const InitializerSpec& initializer, tensorflow::Tensor default_values,
                       const StorageSpec& storage, std::shared_ptr<Table<Key>> table,
                       const FeatureFilterSpec& filter_spec,
                       std::shared_ptr<FeatureFilter<Key>> filter, TableMode mode, uint64_t stamp) {
    std::lock_guard<std::mutex> lock(mutex_);
    set_initializer_locked(initializer, std::move(default_values));
    storage_ = storage;
    slot<Key>() = std::move(table);
    filter_slot<Key>() = std::move(filter);
    filter_spec_ = filter_spec;
    mode_ = mode;
    restore_stamp_ = stamp;
  }

  // An empty table with this variable's initializer, to be filled and then
  // swapped in with replace_table (import_full).
  template <typename Key>
  absl::Status new_empty_table(tensorflow::OpKernelContext* context, Core<Device>& core,
                               std::shared_ptr<Table<Key>>* table) {
    std::lock_guard<std::mutex> lock(mutex_);
    return make_table_locked(context, core, initializer_, storage_, table);
  }

  // The filter keeps what it counted; no checkpoint holds the new table, so
  // changes are no longer recorded.
  template <typename Key>
  void replace_table(std::shared_ptr<Table<Key>> table) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot<Key>() = std::move(table);
    restore_stamp_ = 0;
    change_log_.Deactivate();
  }

  // Which checkpoint the table was last restored from (a hash of its path),
  // 0 when it was initialized or replaced since. Workers compare stamps to
  // find a worker that did not restore what the others did.
  uint64_t restore_stamp() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return restore_stamp_;
  }

  bool is_initialized() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return table32_ != nullptr || table64_ != nullptr;
  }

  // The table for keys of type Key; null before initialization.
  template <typename Key>
  std::shared_ptr<Table<Key>> table() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return const_cast<EmbeddingVariable*>(this)->slot<Key>();
  }

  // The feature filter for keys of type Key; null without one.
  template <typename Key>
  std::shared_ptr<FeatureFilter<Key>> filter() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return const_cast<EmbeddingVariable*>(this)->filter_slot<Key>();
  }

  FeatureFilterSpec filter_spec() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return filter_spec_;
  }

  // Where the rows live: the HBM budget of HBM_DRAM storage, or none.
  StorageSpec storage() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return storage_;
  }

  TableMode mode() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mode_;
  }

  // A plain trainable table: lookups find or insert every key.
  bool is_plain() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mode_ == TableMode::kTraining && !filter_spec_.enabled();
  }

  ChangeLog& change_log() { return change_log_; }

  // Held around every use of a table whose methods must not overlap (the
  // GPU table); an unlocked lock for the CPU table, which locks itself.
  std::unique_lock<std::mutex> lock_table() const {
    if (Core<Device>::kTableIsThreadSafe) return std::unique_lock<std::mutex>();
    return std::unique_lock<std::mutex>(table_mutex_);
  }

  std::string DebugString() const override {
    return "sok_ev EmbeddingVariable '" + name_ + "' (key " +
           tensorflow::DataTypeString(key_dtype_) + ", dim " + std::to_string(embedding_dim_) + ")";
  }

 private:
  template <typename Key>
  absl::Status initialize_with(tensorflow::OpKernelContext* context, Core<Device>& core,
                               const InitializerSpec& initializer,
                               tensorflow::Tensor default_values,
                               const FeatureFilterSpec& filter_spec, const StorageSpec& storage) {
    std::shared_ptr<FeatureFilter<Key>> filter;
    TF_RETURN_IF_ERROR(NewFilter<Key>(filter_spec, &filter));
    std::lock_guard<std::mutex> lock(mutex_);
    // The table first: a storage it refuses changes nothing.
    std::shared_ptr<Table<Key>> table;
    TF_RETURN_IF_ERROR(make_table_locked(context, core, initializer, storage, &table));
    set_initializer_locked(initializer, std::move(default_values));
    storage_ = storage;
    restore_stamp_ = 0;
    filter_spec_ = filter_spec;
    filter_slot<Key>() = std::move(filter);
    mode_ = TableMode::kTraining;
    slot<Key>() = std::move(table);
    return absl::OkStatus();
  }

  void set_initializer_locked(const InitializerSpec& initializer,
                              tensorflow::Tensor default_values) {
    initializer_ = initializer;
    default_values_ = std::move(default_values);
    if (initializer_.kind == InitializerSpec::Kind::kDefaultValueMatrix) {
      initializer_.default_values = default_values_.flat<float>().data();
    }
  }

  template <typename Key>
  absl::Status make_table_locked(tensorflow::OpKernelContext* context, Core<Device>& core,
                                 const InitializerSpec& initializer, const StorageSpec& storage,
                                 std::shared_ptr<Table<Key>>* table) {
    if (table_allocator_ == nullptr) {
      table_allocator_ = Core<Device>::NewTableAllocator(context);
    }
    TF_RETURN_IF_ERROR(
        core.NewTable(table_allocator_.get(), embedding_dim_, initializer, storage, name_, table));
    if constexpr (std::is_same<Device, CPUDevice>::value) {
      (*table)->set_name(name_);  // named in its out-of-memory errors
    }
    return absl::OkStatus();
  }

  template <typename Key>
  std::shared_ptr<Table<Key>>& slot() {
    static_assert(std::is_same<Key, int32_t>::value || std::is_same<Key, int64_t>::value,
                  "keys are int32 or int64");
    if constexpr (std::is_same<Key, int32_t>::value) {
      return table32_;
    } else {
      return table64_;
    }
  }

  template <typename Key>
  std::shared_ptr<FeatureFilter<Key>>& filter_slot() {
    if constexpr (std::is_same<Key, int32_t>::value) {
      return filter32_;
    } else {
      return filter64_;
    }
  }

  const std::string name_;
  const tensorflow::DataType key_dtype_;
  const int64_t embedding_dim_;
  mutable std::mutex mutex_;        // guards the members below, not the tables
  mutable std::mutex table_mutex_;  // see lock_table()
  // Declared before the tables, so it is destroyed after them.
  std::unique_ptr<DeviceAllocator> table_allocator_;
  InitializerSpec initializer_;
  tensorflow::Tensor default_values_;  // backs initializer_.default_values
  std::shared_ptr<Table<int32_t>> table32_;
  std::shared_ptr<Table<int64_t>> table64_;
  FeatureFilterSpec filter_spec_;
  StorageSpec storage_;
  std::shared_ptr<FeatureFilter<int32_t>> filter32_;
  std::shared_ptr<FeatureFilter<int64_t>> filter64_;
  TableMode mode_ = TableMode::kTraining;
  uint64_t restore_stamp_ = 0;
  ChangeLog change_log_;
};

// The table locks of a multi-table op's variables, each taken once, in
// address order (two ops locking overlapping sets cannot deadlock), held
// while the object lives. A GPU op holds them past the join of its side
// streams (ForEachTable), so whoever locks a table next queues its work
// after this op's.
template <typename Device>
class TableLocks {
 public:
  //   variables: (n,) pointers, smart or not, to each table's variable
  template <typename Pointers>
  explicit TableLocks(const Pointers& variables) {
    std::vector<EmbeddingVariable<Device>*> distinct;
    for (const auto& variable : variables) {
      distinct.push_back(&*variable);
      variables_.push_back(&*variable);
    }
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    for (EmbeddingVariable<Device>* variable : distinct) locks_.push_back(variable->lock_table());
  }

  // (n,) each table's variable: ForEachTable's same_stream.
  const void* const* same_stream() const { return variables_.data(); }

 private:
  std::vector<const void*> variables_;
  std::vector<std::unique_lock<std::mutex>> locks_;
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_H_
