// Lookups and updates of an Embedding Variable that is not a plain trainable
// table: one loaded for serving, or one with a feature filter (DeepRec's
// admission, cc/feature_filter.h). The plain path stays in the kernels; these
// take over when EmbeddingVariable::is_plain() is false, and record changed
// keys for incremental checkpoints (change_log.h) on every path.
//
// Device-neutral: every step is a Core<Device> call, and which keys are
// admitted is decided on the host (for a GPU variable, keys, counts and the
// rows read cross to the host and back: filtered tables trade the fused GPU
// lookup for admission). No new device code.
//
// Admission follows DeepRec's own tests of both filters
// (embedding_variable_ops_test.py, testEmbeddingVariableForFeatureFilter*
// and testEmbeddingVariableForBloomFilter*):
//   * a lookup reads a key's row if the key had been seen filter_freq times
//     before this lookup (its row is created then if no update created it);
//     otherwise it reads no_permission_value. Either way the lookup counts
//     the key's occurrences;
//   * an update applies a key's gradient if the key has now been seen
//     filter_freq times, creating its row (initial value, frequency so far)
//     first; otherwise it drops the gradient and records the global step as
//     the key's version.
// So the step that sees a key for the filter_freq-th time reads the default
// value and trains the key's new row.
#ifndef SOK_EV_CC_KERNELS_VARIABLE_LOOKUP_H_
#define SOK_EV_CC_KERNELS_VARIABLE_LOOKUP_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cc/feature_filter.h"
#include "cc/optimizers.h"
#include "sok_ev/cc/kernels/device_core.h"
#include "sok_ev/cc/kernels/embedding_variable.h"
#include "sok_ev/cc/kernels/kernel_utils.h"
#include "sok_ev/cc/kernels/scratch_vector.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace sok_ev {

// Records keys a lookup or update changed, when an incremental saver
// watches the variable.
//   keys: (n,)
template <typename Device, typename Key>
absl::Status RecordChangedKeys(Core<Device>& core, EmbeddingVariable<Device>& variable,
                               const Key* keys, int64_t n) {
  if (!variable.change_log().active() || n == 0) return absl::OkStatus();
  std::vector<Key> host(n);
  TF_RETURN_IF_ERROR(core.CopyToHost(keys, n, host.data()));
  variable.change_log().Record(host.data(), n);
  return absl::OkStatus();
}

// RecordChangedKeys for every table of a multi-table op.
//   keys: one (n,) tensor a table
template <typename Device>
absl::Status RecordChangedKeysOfTables(
    Core<Device>& core,
    const std::vector<tensorflow::core::RefCountPtr<EmbeddingVariable<Device>>>& variables,
    const tensorflow::OpInputList& keys) {
  for (int t = 0; t < keys.size(); ++t) {
    TF_RETURN_IF_ERROR(DispatchKeyType(keys[t].dtype(), "keys", [&](auto key) {
      using Key = decltype(key);
      return RecordChangedKeys(core, *variables[t], keys[t].flat<Key>().data(),
                               keys[t].NumElements());
    }));
  }
  return absl::OkStatus();
}

namespace variable_lookup_internal {

// A device buffer of `count` T filled from host memory.
template <typename Device, typename T>
absl::Status Upload(Core<Device>& core, const std::vector<T>& host, tensorflow::Tensor* tensor) {
  TF_RETURN_IF_ERROR(
      core.template Scratch<T>(std::max<int64_t>(1, static_cast<int64_t>(host.size())), tensor));
  return core.CopyFromHost(host.data(), static_cast<int64_t>(host.size()), VectorData<T>(*tensor));
}

// Which keys the table holds, on the host.
//   keys: (n,)  found: (n,) host out
template <typename Device, typename Key>
absl::Status Contains(Core<Device>& core, const typename Core<Device>::template Table<Key>& table,
                      const Key* keys, int64_t n, std::unique_ptr<bool[]>* found) {
  found->reset(new bool[std::max<int64_t>(1, n)]);
  tensorflow::Tensor scratch;
  TF_RETURN_IF_ERROR(core.template Scratch<float>(std::max<int64_t>(1, n * table.dim()), &scratch));
  return core.FindPresent(table, keys, n, VectorData<float>(scratch), found->get(),
                          /*initial_for_missing=*/false);
}

// Inserts admitted keys with their initial rows and frequencies.
//   keys, frequencies: (m,) host
template <typename Device, typename Key>
absl::Status InsertAdmitted(Core<Device>& core, typename Core<Device>::template Table<Key>& table,
                            const std::vector<Key>& keys, const std::vector<int64_t>& frequencies,
                            tensorflow::Tensor* values) {
  const int64_t m = static_cast<int64_t>(keys.size());
  TF_RETURN_IF_ERROR(core.template Scratch<float>(std::max<int64_t>(1, m * table.dim()), values));
  if (m == 0) return absl::OkStatus();
  tensorflow::Tensor device_keys, device_frequencies;
  TF_RETURN_IF_ERROR(Upload(core, keys, &device_keys));
  TF_RETURN_IF_ERROR(Upload(core, frequencies, &device_frequencies));
  TF_RETURN_IF_ERROR(core.FindOrInsert(table, VectorData<Key>(device_keys), m,
                                       VectorData<float>(*values),
                                       VectorData<int64_t>(device_frequencies)));
  float unused;  // the host vectors outlive their copies: CopyToHost syncs
  return core.CopyToHost(VectorData<float>(*values), 1, &unused);
}

}  // namespace variable_lookup_internal

// The rows a lookup of a non-plain variable reads, with its side effects:
// for serving, none (absent keys read their initial value or zeros); with a
// filter, the admission described at the top of this file. The keys are
// unique.
//   keys, counts: (n,)  values: (n, dim) out
template <typename Device, typename Key>
absl::Status LookupRows(Core<Device>& core, EmbeddingVariable<Device>& variable,
                        typename Core<Device>::template Table<Key>& table, const Key* keys,
                        const int64_t* counts, int64_t n, float* values) {
  namespace internal = variable_lookup_internal;
  if (n == 0) return absl::OkStatus();
  const TableMode mode = variable.mode();
  if (mode != TableMode::kTraining) {
    return core.FindPresent(table, keys, n, values, /*found=*/nullptr,
                            mode == TableMode::kServingInitializer);
  }
  std::shared_ptr<FeatureFilter<Key>> filter = variable.template filter<Key>();
  if (filter == nullptr) {  // a table made before the filter was asked for
    return core.FindOrInsert(table, keys, n, values, counts);
  }
  const int64_t dim = table.dim();
  std::vector<Key> host_keys(n);
  std::vector<int64_t> host_counts(n);
  TF_RETURN_IF_ERROR(core.CopyToHost(keys, n, host_keys.data()));
  TF_RETURN_IF_ERROR(core.CopyToHost(counts, n, host_counts.data()));
  std::lock_guard<std::mutex> lock(filter->mutex());
  std::unique_ptr<bool[]> found;
  TF_RETURN_IF_ERROR(internal::Contains(core, table, keys, n, &found));
  // The keys that read a row: present ones, and those admitted now (their
  // frequency so far moves from the filter into the table).
  std::vector<int64_t> positions;
  std::vector<Key> read_keys;
  std::vector<int64_t> read_counts;
  const int64_t threshold = filter->spec().filter_freq;
  for (int64_t i = 0; i < n; ++i) {
    int64_t count = host_counts[i];
    if (!found[i]) {
      const int64_t seen = filter->frequency(host_keys[i]);
      if (seen < threshold) {
        filter->add(host_keys[i], count);
        continue;
      }
      filter->forget(host_keys[i]);
      count += seen;
    }
    positions.push_back(i);
    read_keys.push_back(host_keys[i]);
    read_counts.push_back(count);
  }
  tensorflow::Tensor rows;
  TF_RETURN_IF_ERROR(internal::InsertAdmitted(core, table, read_keys, read_counts, &rows));
  const int64_t m = static_cast<int64_t>(positions.size());
  std::vector<float> host_rows(m * dim);
  TF_RETURN_IF_ERROR(core.CopyToHost(VectorData<float>(rows), m * dim, host_rows.data()));
  std::vector<float> host_values(n * dim, filter->spec().no_permission_value);
  for (int64_t j = 0; j < m; ++j) {
    std::copy(host_rows.begin() + j * dim, host_rows.begin() + (j + 1) * dim,
              host_values.begin() + positions[j] * dim);
  }
  TF_RETURN_IF_ERROR(core.CopyFromHost(host_values.data(), n * dim, values));
  float unused;  // host_values outlives its copy: CopyToHost syncs
  return core.CopyToHost(values, 1, &unused);
}

// Rows without inserting or counting anything (var.sparse_read): a key the
// table lacks reads its initial value, or, for a variable loaded for serving
// with zeros, zeros; with a filter, a key not admitted yet reads
// no_permission_value unless it has been seen often enough to be admitted
// at its next lookup.
//   keys: (n,)  values: (n, dim) out
template <typename Device, typename Key>
absl::Status FindRows(Core<Device>& core, EmbeddingVariable<Device>& variable,
                      const typename Core<Device>::template Table<Key>& table, const Key* keys,
                      int64_t n, float* values) {
  if (n == 0) return absl::OkStatus();
  const TableMode mode = variable.mode();
  std::shared_ptr<FeatureFilter<Key>> filter = variable.template filter<Key>();
  if (mode != TableMode::kTraining || filter == nullptr) {
    return core.FindPresent(table, keys, n, values, /*found=*/nullptr,
                            mode != TableMode::kServingZeros);
  }
  const int64_t dim = table.dim();
  std::unique_ptr<bool[]> found(new bool[n]);
  TF_RETURN_IF_ERROR(core.FindPresent(table, keys, n, values, found.get(), true));
  std::vector<Key> host_keys(n);
  TF_RETURN_IF_ERROR(core.CopyToHost(keys, n, host_keys.data()));
  std::vector<float> host_values(n * dim);
  TF_RETURN_IF_ERROR(core.CopyToHost(values, n * dim, host_values.data()));
  {
    std::lock_guard<std::mutex> lock(filter->mutex());
    for (int64_t i = 0; i < n; ++i) {
      if (found[i] || filter->frequency(host_keys[i]) >= filter->spec().filter_freq) continue;
      std::fill(host_values.begin() + i * dim, host_values.begin() + (i + 1) * dim,
                filter->spec().no_permission_value);
    }
  }
  TF_RETURN_IF_ERROR(core.CopyFromHost(host_values.data(), n * dim, values));
  float unused;  // host_values outlives its copy: CopyToHost syncs
  return core.CopyToHost(values, 1, &unused);
}

// One optimizer step on the admitted keys of a filtered variable (see the
// top of this file); the other keys' gradients are dropped.
//   keys: (n,)  grads: (n, dim)
template <typename Device, typename Key>
absl::Status ApplyToAdmitted(Core<Device>& core, typename Core<Device>::template Table<Key>& table,
                             FeatureFilter<Key>& filter, const OptimizerSpec& spec, const Key* keys,
                             int64_t n, const float* grads, int64_t dim, int64_t global_step,
                             bool keys_are_unique) {
  namespace internal = variable_lookup_internal;
  if (n == 0) return absl::OkStatus();
  std::vector<Key> host_keys(n);
  TF_RETURN_IF_ERROR(core.CopyToHost(keys, n, host_keys.data()));
  std::lock_guard<std::mutex> lock(filter.mutex());
  std::unique_ptr<bool[]> found;
  TF_RETURN_IF_ERROR(internal::Contains(core, table, keys, n, &found));
  std::vector<int64_t> kept;
  std::vector<Key> admitted;
  std::vector<int64_t> admitted_frequencies;
  std::unordered_map<Key, bool> decided;  // absent keys: admitted or not
  for (int64_t i = 0; i < n; ++i) {
    if (found[i]) {
      kept.push_back(i);
      continue;
    }
    const Key key = host_keys[i];
    auto it = decided.find(key);
    if (it == decided.end()) {
      const int64_t seen = filter.frequency(key);
      const bool admit = seen >= filter.spec().filter_freq;
      if (admit) {
        filter.forget(key);
        admitted.push_back(key);
        admitted_frequencies.push_back(seen);
      } else {
        filter.set_version(key, global_step);
      }
      it = decided.emplace(key, admit).first;
    }
    if (it->second) kept.push_back(i);
  }
  if (!admitted.empty()) {
    tensorflow::Tensor rows;
    TF_RETURN_IF_ERROR(
        internal::InsertAdmitted(core, table, admitted, admitted_frequencies, &rows));
  }
  const int64_t m = static_cast<int64_t>(kept.size());
  if (m == n) {
    return core.ApplyOptimizer(table, spec, keys, n, grads, dim, global_step, keys_are_unique);
  }
  if (m == 0) return absl::OkStatus();
  std::vector<float> host_grads(n * dim);
  TF_RETURN_IF_ERROR(core.CopyToHost(grads, n * dim, host_grads.data()));
  std::vector<Key> kept_keys(m);
  std::vector<float> kept_grads(m * dim);
  for (int64_t j = 0; j < m; ++j) {
    kept_keys[j] = host_keys[kept[j]];
    std::copy(host_grads.begin() + kept[j] * dim, host_grads.begin() + (kept[j] + 1) * dim,
              kept_grads.begin() + j * dim);
  }
  tensorflow::Tensor device_keys, device_grads;
  TF_RETURN_IF_ERROR(internal::Upload(core, kept_keys, &device_keys));
  TF_RETURN_IF_ERROR(internal::Upload(core, kept_grads, &device_grads));
  TF_RETURN_IF_ERROR(core.ApplyOptimizer(table, spec, VectorData<Key>(device_keys), m,
                                         VectorData<float>(device_grads), dim, global_step,
                                         keys_are_unique));
  float unused;  // the host vectors outlive their copies: CopyToHost syncs
  return core.CopyToHost(VectorData<float>(device_grads), 1, &unused);
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_VARIABLE_LOOKUP_H_
