// Core<CPUDevice>: the CPU twin of device_core_gpu.h. Core work runs on TF's
// intra-op thread pool, like TF's own kernels; "device" memory is host
// memory. Included by device_core.h only.
#ifndef SOK_EV_CC_KERNELS_DEVICE_CORE_CPU_H_
#define SOK_EV_CC_KERNELS_DEVICE_CORE_CPU_H_

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/exchange_message.h"
#include "cc/hash_table_cpu.h"
#include "cc/initializer.h"
#include "cc/optimizers.h"
#include "cc/partition.h"
#include "cc/storage_spec.h"
#include "cc/unique.h"
#include "sok_ev/cc/kernels/claiming_parallel_for.h"
#include "sok_ev/cc/kernels/export_buffers.h"
#include "sok_ev/cc/kernels/scratch_vector.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "sok_ev/cc/kernels/unique_buffers.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/threadpool.h"

namespace sok_ev {

template <>
class Core<CPUDevice> {
 public:
  template <typename Key>
  using Table = cpu::HashTable<Key>;
  // The CPU table locks its own shards, so concurrent ops may share it.
  static constexpr bool kTableIsThreadSafe = true;
  // The backward pass adds each entry into its key's row through
  // unique_index, in sample order: UniqueKeys writes no order.
  static constexpr bool kBackwardReadsOrder = false;

  explicit Core(tensorflow::OpKernelContext* context) : op_(context) {
    context_ = PoolContext(context->device()->tensorflow_cpu_worker_threads()->workers);
    num_threads_ = context_.parallelism;
  }

  // As below, but tables with the same non-null same_stream entry (one
  // variable listed twice) must see each other's updates in list order:
  // then the tables run one after another.
  //   same_stream: (n,) host or null
  template <typename Work>
  absl::Status ForEachTable(int n, const int64_t* costs, const void* const* same_stream,
                            const Work& work) {
    if (same_stream != nullptr) {
      std::vector<const void*> sorted(same_stream, same_stream + n);
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        for (int t = 0; t < n; ++t) TF_RETURN_IF_ERROR(work(t, *this));
        return absl::OkStatus();
      }
    }
    return ForEachTable(n, costs, work);
  }

  // Tables side by side when there are enough of them: each table's stages
  // then run whole on one thread, on a Core without a pool (one task per
  // table instead of a pool round trip per stage and table), the largest
  // tables first. With fewer tables than threads, or one table holding more
  // than a thread's share of the work, or little work in all, the tables run
  // one after another with each stage spread over the pool.
  //   costs: (n,) host
  template <typename Work>
  absl::Status ForEachTable(int n, const int64_t* costs, const Work& work) {
    int64_t total = 0, largest = 0;
    for (int t = 0; t < n; ++t) {
      total += costs[t];
      largest = std::max(largest, costs[t]);
    }
    if (total < kMinEntriesToSpread || n < num_threads_ || num_threads_ < 2 ||
        largest * num_threads_ > total) {
      Core serial = serial_core();
      Core& core = total < kMinEntriesToSpread ? serial : *this;
      for (int t = 0; t < n; ++t) TF_RETURN_IF_ERROR(work(t, core));
      return absl::OkStatus();
    }
    std::vector<int> order(n);
    for (int t = 0; t < n; ++t) order[t] = t;
    std::stable_sort(order.begin(), order.end(),
                     [costs](int a, int b) { return costs[a] > costs[b]; });
    std::vector<absl::Status> statuses(n);
    std::atomic<int> next{0};
    // One unit per thread, each taking the next table until none is left.
    // Its cost is given in cycles, or the pool's cost model would run a
    // few thousand entries' worth (a one-hot optimizer update) on one thread.
    context_.parallel_for(num_threads_, total / num_threads_ * kCyclesPerEntry,
                          [&](int64_t first, int64_t last) {
                            Core core = serial_core();
                            for (int64_t lane = first; lane < last; ++lane) {
                              for (int i = next++; i < n; i = next++)
                                statuses[order[i]] = work(order[i], core);
                            }
                          });
    for (const absl::Status& status : statuses) TF_RETURN_IF_ERROR(status);
    return absl::OkStatus();
  }

  // The CPU table allocates its own rows.
  static std::unique_ptr<DeviceAllocator> NewTableAllocator(tensorflow::OpKernelContext*) {
    return nullptr;
  }

  // initializer.default_values: (default_value_dim, dim), copied by the table.
  // A CPU table holds every row in host memory: an HBM budget (storage) is
  // refused, naming the variable.
  template <typename Key>
  absl::Status NewTable(DeviceAllocator* /*table_allocator*/, int64_t dim,
                        const InitializerSpec& initializer, const StorageSpec& storage,
                        const std::string& name, std::shared_ptr<Table<Key>>* table) {
    if (storage.tiered()) return HbmStorageOnCpu(name);
    *table = std::make_shared<Table<Key>>(dim, initializer);
    return absl::OkStatus();
  }

  // The error for HBM_DRAM storage on a CPU table.
  static absl::Status HbmStorageOnCpu(const std::string& name) {
    return tensorflow::errors::InvalidArgument(
        "Embedding Variable '", name,
        "': storage_type HBM_DRAM keeps rows in a GPU's memory (HBM), but the variable is on "
        "the CPU; place it on a GPU or use StorageType.DRAM");
  }

  // A CPU table has no tiers: every counter is 0 but host_rows, its size.
  template <typename Key>
  absl::Status TierCountersOf(Table<Key>& table, TierCounters* counters) {
    *counters = TierCounters();
    counters->host_rows = table.size();
    return absl::OkStatus();
  }

  // size: host.
  template <typename Key>
  absl::Status Size(Table<Key>& table, int64_t* size) {
    *size = table.size();
    return absl::OkStatus();
  }

  template <typename Key>
  absl::Status AddSlot(Table<Key>& table, const std::string& name, float initial_value,
                       int* index) {
    return ToTfStatus(table.add_slot(name, initial_value, index));
  }

  //   keys: (n,)  values: (n, dim) out  frequencies: (n,)
  template <typename Key>
  absl::Status FindOrInsert(Table<Key>& table, const Key* keys, int64_t n, float* values,
                            const int64_t* frequencies) {
    return ToTfStatus(table.find_or_insert(context_, keys, n, values, frequencies));
  }

  // Absent keys read their initial value.
  //   keys: (n,)  values: (n, dim) out
  template <typename Key>
  absl::Status Find(const Table<Key>& table, const Key* keys, int64_t n, float* values) {
    table.find(context_, keys, n, values, /*found=*/nullptr, /*initial_for_missing=*/true);
    return absl::OkStatus();
  }

  // Values of present keys; an absent key reads its initial value
  // (initial_for_missing) or zeros, and found[i] = false.
  //   keys: (n,)  values: (n, dim) out  found: (n,) host out, or null
  template <typename Key>
  absl::Status FindPresent(const Table<Key>& table, const Key* keys, int64_t n, float* values,
                           bool* found, bool initial_for_missing) {
    table.find(context_, keys, n, values, found, initial_for_missing);
    return absl::OkStatus();
  }

  // Removes keys; *erased (host) gets how many were present.
  //   keys: (n,) host
  template <typename Key>
  absl::Status Erase(Table<Key>& table, const Key* keys, int64_t n, int64_t* erased) {
    *erased = n > 0 ? table.erase(context_, keys, n) : 0;
    return absl::OkStatus();
  }

  //   keys: (n,) distinct  rows: (n, row_width)  frequencies, versions: (n,)
  template <typename Key>
  absl::Status InsertOrAssign(Table<Key>& table, const Key* keys, int64_t n, const float* rows,
                              const int64_t* frequencies, const int64_t* versions) {
    return ToTfStatus(table.insert_or_assign(context_, keys, n, rows, frequencies, versions));
  }

  // InsertOrAssign with host buffers (the same on CPU).
  template <typename Key>
  absl::Status InsertOrAssignFromHost(Table<Key>& table, const Key* keys, int64_t n,
                                      const float* rows, const int64_t* frequencies,
                                      const int64_t* versions) {
    return InsertOrAssign(table, keys, n, rows, frequencies, versions);
  }

  // evicted: host.
  template <typename Key>
  absl::Status EvictStale(Table<Key>& table, int64_t global_step, int64_t steps_to_live,
                          int64_t* evicted) {
    *evicted = table.evict_stale(global_step, steps_to_live);
    return absl::OkStatus();
  }

  // A consistent copy of the table into buffers from `allocate`, written
  // straight from the table (no intermediate copy).
  template <typename Key>
  absl::Status ExportAll(const Table<Key>& table, const ExportAllocator<Key>& allocate) {
    ExportBuffers<Key> out;
    int64_t written = 0, width = 0;
    return ExportBatches<Key>(
        table, ExportBatchKeys(table.row_width()),
        [&](int64_t total, int64_t row_width) {
          width = row_width;
          return allocate(total, row_width, &out);
        },
        [&](const HostExportBatch<Key>& batch) {
          std::copy(batch.keys, batch.keys + batch.count, out.keys + written);
          std::copy(batch.rows, batch.rows + batch.count * width, out.rows + written * width);
          std::copy(batch.frequencies, batch.frequencies + batch.count, out.frequencies + written);
          std::copy(batch.versions, batch.versions + batch.count, out.versions + written);
          written += batch.count;
          return absl::OkStatus();
        });
  }

  // The whole table, consistent, in host batches of at most max_batch keys
  // (see cpu::HashTable::export_batches); no copy of the table is made.
  template <typename Key>
  absl::Status ExportBatches(const Table<Key>& table, int64_t max_batch, const ExportBegin& begin,
                             const ExportEmit<Key>& emit) {
    absl::Status failed;  // a callback's own error, kept with its code
    const Status status = table.export_batches(
        max_batch,
        [&](int64_t total, int64_t row_width) {
          failed = begin(total, row_width);
          return failed.ok() ? Status::Ok() : Status::Internal("export stopped");
        },
        [&](const typename Table<Key>::ExportBatch& batch) {
          failed = emit(HostExportBatch<Key>{batch.keys, batch.rows, batch.frequencies,
                                             batch.versions, batch.count});
          return failed.ok() ? Status::Ok() : Status::Internal("export stopped");
        });
    if (!failed.ok()) return failed;
    return ToTfStatus(status);
  }

  // One optimizer step on the rows of `keys`, duplicates summed first (a key
  // can arrive from several workers; TF's sparse apply sums them too) unless
  // keys_are_unique, each key's version set to global_step. spec.slot_index
  // must be set.
  //   keys: (n,)  grads: (n, dim)
  // Small updates stay on the calling thread: the per-variable update ops of
  // one step already run side by side on TF's inter-op threads.
  template <typename Key>
  absl::Status ApplyOptimizer(Table<Key>& table, const OptimizerSpec& spec, const Key* keys,
                              int64_t n, const float* grads, int64_t dim, int64_t global_step,
                              bool keys_are_unique) {
    const Key* unique = keys;
    const float* summed = grads;
    int64_t num_unique = n;
    std::vector<Key> unique_storage;
    std::vector<float> summed_storage;
    if (!keys_are_unique) {
      unique_storage.resize(n);
      std::vector<int64_t> inverse(n);
      cpu::unique_keys(context_, keys, n, unique_storage.data(), inverse.data(), nullptr,
                       &num_unique);
      summed_storage.assign(num_unique * dim, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        float* row = summed_storage.data() + inverse[i] * dim;
        for (int64_t c = 0; c < dim; ++c) row[c] += grads[i * dim + c];
      }
      unique = unique_storage.data();
      summed = summed_storage.data();
    }
    const bool spread = num_unique * table.row_width() >= kMinFloatsToSpread;
    return ToTfStatus(table.update_rows(
        spread ? context_ : serial_, unique, num_unique, global_step,
        [&](const int64_t* positions, float* const* rows, int64_t count) {
          // Already inside a task of a group of shards: no nested pool.
          cpu::apply_optimizer(serial_, spec, rows, summed, positions, count, dim);
        }));
  }

  // Every table's sample ids (or row splits) are checked first:
  // first_invalid[t] (host) is the first bad entry of table t (nnz + 1 for
  // bad row splits), or its nnz, and if any table has one nothing is
  // allocated. Then per table: row offsets, unique keys in
  // first-occurrence order (buffers from `allocate`) and their segments;
  // table.order is not written (kBackwardReadsOrder).
  // Tables run side by side (ForEachTable), so each one's passes stay on one
  // thread; only the allocations are serial.
  template <typename Key>
  absl::Status UniqueKeys(const std::vector<TableBatch<Key>>& tables,
                          const UniqueAllocator<Key>& allocate,
                          std::vector<int64_t>* first_invalid) {
    const int n = static_cast<int>(tables.size());
    std::vector<int64_t> costs(n);
    for (int t = 0; t < n; ++t) costs[t] = tables[t].nnz;
    // Sized by the entries, filled up to num_unique: no zero fill.
    std::vector<std::unique_ptr<Key[]>> unique(n);
    std::vector<std::unique_ptr<int64_t[]>> counts(n);
    std::vector<int64_t> num_unique(n, 0);
    TF_RETURN_IF_ERROR(ForEachTable(n, costs.data(), [&](int t, Core& core) {
      const TableBatch<Key>& table = tables[t];
      if (table.row_splits != nullptr) {
        const bool valid = cpu::first_invalid_row_split(table.row_splits, table.first_entry,
                                                        table.nnz, table.batch) > table.batch;
        (*first_invalid)[t] = valid ? table.nnz : table.nnz + 1;  // gpu::SampleIds' convention
        if (!valid) return absl::OkStatus();
        cpu::row_offsets_from_row_splits(table.row_splits, table.first_entry, table.batch,
                                         table.row_offsets);
      } else if (table.sample_ids == nullptr) {  // entry j is sample j
        (*first_invalid)[t] = table.nnz;
        for (int64_t b = 0; b <= table.batch; ++b) {
          table.row_offsets[b] = std::min(b, table.nnz);  // samples past the entries are empty
        }
      } else {
        (*first_invalid)[t] = cpu::row_offsets_from_sample_ids(
            table.sample_ids, table.sample_id_stride, table.nnz, table.batch, table.row_offsets);
        if ((*first_invalid)[t] != table.nnz) return absl::OkStatus();
      }
      unique[t].reset(new Key[table.nnz]);
      counts[t].reset(new int64_t[table.nnz]);
      cpu::unique_keys(core.context_, table.keys, table.nnz, unique[t].get(), table.unique_index,
                       counts[t].get(), &num_unique[t]);
      return absl::OkStatus();
    }));
    for (int t = 0; t < n; ++t) {
      if ((*first_invalid)[t] != tables[t].nnz) return absl::OkStatus();
    }
    std::vector<UniqueBuffers<Key>> out(n);
    for (int t = 0; t < n; ++t) TF_RETURN_IF_ERROR(allocate(t, num_unique[t], &out[t]));
    return ForEachTable(n, costs.data(), [&](int t, Core&) {
      std::copy(unique[t].get(), unique[t].get() + num_unique[t], out[t].unique_keys);
      std::copy(counts[t].get(), counts[t].get() + num_unique[t], out[t].counts);
      cpu::segments_from_counts(out[t].counts, num_unique[t], out[t].segments);
      if (tables[t].occurrences != nullptr) {
        cpu::sum_occurrences_by_key(tables[t].occurrences, tables[t].unique_index, tables[t].nnz,
                                    num_unique[t], out[t].counts);
      }
      return absl::OkStatus();
    });
  }

  // Every table's find-or-insert and combine (device_core.h), the tables
  // side by side (ForEachTable). rows_aligned is the GPU twin's.
  template <typename Key>
  absl::Status FindOrInsertCombineTables(
      const std::vector<FindOrInsertCombineTable<Table<Key>, Key>>& tables) {
    const int n = static_cast<int>(tables.size());
    std::vector<int64_t> costs(n);
    std::vector<const void*> same_table(n);
    for (int t = 0; t < n; ++t) {
      costs[t] = tables[t].num_unique + tables[t].combine.batch;
      same_table[t] = tables[t].table;
    }
    return ForEachTable(n, costs.data(), same_table.data(), [&](int t, Core& core) {
      const FindOrInsertCombineTable<Table<Key>, Key>& table = tables[t];
      std::unique_ptr<float[]> values;
      TF_RETURN_IF_ERROR(core.FindOrInsertValues(*table.table, table.unique_keys, table.counts,
                                                 table.num_unique, &values));
      sok_ev::CombineForwardTable combine = table.combine;
      combine.unique_values = values.get();
      combine.dim = table.table->dim();
      core.CombineForward(combine);
      return absl::OkStatus();
    });
  }

  // Every table's ApplyOptimizer (device_core.h), the tables side by side
  // (ForEachTable).
  template <typename Key>
  absl::Status ApplyOptimizerTables(const std::vector<ApplyOptimizerTable<Table<Key>, Key>>& tables,
                                    int64_t global_step) {
    const int n = static_cast<int>(tables.size());
    std::vector<int64_t> costs(n);
    std::vector<const void*> same_table(n);
    for (int t = 0; t < n; ++t) {
      costs[t] = tables[t].n;
      same_table[t] = tables[t].table;
    }
    return ForEachTable(n, costs.data(), same_table.data(), [&](int t, Core& core) {
      const ApplyOptimizerTable<Table<Key>, Key>& table = tables[t];
      return core.ApplyOptimizer(*table.table, table.spec, table.keys, table.n, table.grads,
                                 table.dim, global_step, table.keys_are_unique);
    });
  }

  // Fails, naming the first repeated key, unless keys are distinct.
  //   keys: (n,)
  template <typename Key>
  absl::Status CheckDistinct(const Key* keys, int64_t n, const std::string& where) {
    return CheckDistinctOnHost(keys, n, where);
  }

  // Every table's unique keys grouped by the worker they go to, tables side
  // by side (ForEachTable). A partition over one worker is stable, so a
  // table placed whole on its target copies its keys, counts positions up
  // from 0 and writes n into the target's count.
  template <typename Key>
  absl::Status PartitionByOwner(const std::vector<OwnerBatch<Key>>& tables, int32_t num_workers) {
    const int n = static_cast<int>(tables.size());
    std::vector<int64_t> costs(n);
    for (int t = 0; t < n; ++t) costs[t] = tables[t].n;
    return ForEachTable(n, costs.data(), [&](int t, Core& core) {
      const OwnerBatch<Key>& table = tables[t];
      if (table.target_worker < 0) {
        cpu::partition_by_owner(core.context_, table.keys, table.n, num_workers,
                                table.keys_by_owner, table.positions, table.counts);
      } else {
        std::fill(table.counts, table.counts + num_workers, 0);
        cpu::partition_by_owner(core.context_, table.keys, table.n, 1, table.keys_by_owner,
                                table.positions, table.counts + table.target_worker);
      }
      return absl::OkStatus();
    });
  }

  // Every table's combine forward (cc/combine.h), the tables side by side
  // (ForEachTable). rows_aligned is the GPU twin's.
  absl::Status CombineForwardTables(const std::vector<CombineForwardTable>& tables) {
    const int n = static_cast<int>(tables.size());
    std::vector<int64_t> costs(n);
    for (int t = 0; t < n; ++t) {
      costs[t] = tables[t].row_offsets[tables[t].batch] + tables[t].batch;
      // An empty output's data pointer may be null: only a table with
      // samples has a form.
      if (tables[t].batch > 0 && tables[t].unique_values == nullptr && tables[t].out == nullptr) {
        return tensorflow::errors::Unimplemented("CombineForwardTables: table ", t,
                                                 " reads rows by address into rows by address");
      }
    }
    return ForEachTable(n, costs.data(), [&](int t, Core& core) {
      core.CombineForward(tables[t]);
      return absl::OkStatus();
    });
  }

  // Every table's combine backward (cc/combine.h), the tables side by side
  // (ForEachTable). The CPU reads unique_index; order (null when UniqueKeys
  // ran on the CPU) and rows_aligned are the GPU twin's.
  absl::Status CombineBackwardTables(const std::vector<CombineBackwardTable>& tables) {
    const int n = static_cast<int>(tables.size());
    std::vector<int64_t> costs(n);
    for (int t = 0; t < n; ++t) costs[t] = tables[t].nnz + tables[t].batch;
    return ForEachTable(n, costs.data(), [&](int t, Core& core) {
      core.CombineBackwardTable(tables[t]);
      return absl::OkStatus();
    });
  }

  // Copies blocks of rows between tables and a message (cc/exchange_message.h).
  template <typename Src, typename Dst>
  absl::Status CopyRows(const std::vector<RowCopy<Src, Dst>>& blocks) {
    cpu::copy_rows(context_, blocks);
    return absl::OkStatus();
  }

  // Writes where blocks of rows are (cc/exchange_message.h).
  absl::Status WriteRowAddresses(const std::vector<sok_ev::RowAddresses>& blocks) {
    cpu::row_addresses(context_, blocks);
    return absl::OkStatus();
  }

  //   values: host  dst: (values.size(),)
  absl::Status Upload(const std::vector<int64_t>& values, int64_t* dst) {
    std::copy(values.begin(), values.end(), dst);
    return absl::OkStatus();
  }

  //   dst, src: (count,)
  template <typename T>
  absl::Status Copy(T* dst, const T* src, int64_t count) {
    std::copy(src, src + count, dst);
    return absl::OkStatus();
  }

  //   dst: (count,)
  template <typename T>
  absl::Status SetZero(T* dst, int64_t count) {
    std::fill(dst, dst + count, T{});
    return absl::OkStatus();
  }

  //   src: (count,)  dst: (count,) host
  template <typename T>
  absl::Status CopyToHost(const T* src, int64_t count, T* dst) {
    return Copy(dst, src, count);
  }

  //   src: (count,) host  dst: (count,)
  template <typename T>
  absl::Status CopyFromHost(const T* src, int64_t count, T* dst) {
    return Copy(dst, src, count);
  }

  // Scratch memory for a table's work inside ForEachTable.
  //   tensor: (count,) out
  template <typename T>
  absl::Status Scratch(int64_t count, tensorflow::Tensor* tensor) {
    return AllocateVector<T>(op_, count, tensor);
  }

 private:
  // One table's combine forward, in its form (cc/combine.h); never
  // unique_rows into out_rows (CombineForwardTables refuses it).
  void CombineForward(const sok_ev::CombineForwardTable& t) {
    if (t.unique_values == nullptr) {
      cpu::combine_forward_rows(context_, t.unique_rows, t.unique_index, t.weights, t.row_offsets,
                                t.batch, t.dim, t.combiner, t.out);
    } else if (t.out != nullptr) {
      cpu::combine_forward(context_, t.unique_values, t.unique_index, t.weights, t.row_offsets,
                           t.batch, t.dim, t.combiner, t.out);
    } else {
      cpu::combine_forward_into_rows(context_, t.unique_values, t.unique_index, t.weights,
                                     t.row_offsets, t.batch, t.dim, t.combiner, t.out_rows);
    }
  }

  // One table's CombineBackwardTables, in its form; on one thread (a table
  // of ForEachTable) the entries go in sample order.
  void CombineBackwardTable(const CombineBackwardTable& t) {
    const bool serial = num_threads_ == 1;
    if (t.grad_out_rows != nullptr) {
      if (serial) {
        cpu::combine_backward_from_rows_serial(t.grad_out_rows, t.unique_index, t.num_unique,
                                               t.weights, t.row_offsets, t.batch, t.dim, t.combiner,
                                               t.grad_unique);
      } else {
        cpu::combine_backward_from_rows(context_, t.grad_out_rows, t.unique_index, t.segments,
                                        t.num_unique, t.weights, t.row_offsets, t.batch, t.nnz,
                                        t.dim, t.combiner, t.grad_unique);
      }
    } else if (t.grad_rows != nullptr) {
      if (serial) {
        cpu::combine_backward_rows_serial(t.grad_out, t.unique_index, t.num_unique, t.weights,
                                          t.row_offsets, t.batch, t.dim, t.combiner, t.grad_rows);
      } else {
        cpu::combine_backward_rows(context_, t.grad_out, t.unique_index, t.segments, t.num_unique,
                                   t.weights, t.row_offsets, t.batch, t.nnz, t.dim, t.combiner,
                                   t.grad_rows);
      }
    } else if (serial) {
      cpu::combine_backward_serial(t.grad_out, t.unique_index, t.num_unique, t.weights,
                                   t.row_offsets, t.batch, t.dim, t.combiner, t.grad_unique);
    } else {
      cpu::combine_backward(context_, t.grad_out, t.unique_index, t.segments, t.num_unique,
                            t.weights, t.row_offsets, t.batch, t.nnz, t.dim, t.combiner,
                            t.grad_unique);
    }
  }

  // Below this many entries in all, a multi-table stage is not worth a pool
  // round trip; below this many floats, neither is one optimizer update.
  static constexpr int64_t kMinEntriesToSpread = 4096;
  static constexpr int64_t kMinFloatsToSpread = int64_t{1} << 20;
  // What a table's stage costs an entry, at the least (ParallelFor's
  // cost_per_unit is in cycles): a hash probe, a row's worth of copying.
  static constexpr int64_t kCyclesPerEntry = 64;

  Core() { context_ = serial_; }

  // Finds or inserts the unique keys (their counts added to the
  // frequencies) into *values, (num_unique, dim), every element written by
  // find_or_insert: no zero fill. The table remembers the rows, which the
  // step's optimizer update of these keys reuses.
  template <typename Key>
  absl::Status FindOrInsertValues(Table<Key>& table, const Key* unique_keys, const int64_t* counts,
                                  int64_t num_unique, std::unique_ptr<float[]>* values) {
    values->reset(new float[num_unique * table.dim()]);
    return ToTfStatus(table.find_or_insert(context_, unique_keys, num_unique, values->get(), counts,
                                           /*remember_rows=*/true));
  }

  Core serial_core() const {
    Core core;
    core.op_ = op_;
    return core;
  }

  const CpuContext serial_ = CpuContext::Serial();
  CpuContext context_;
  int num_threads_ = 1;
  tensorflow::OpKernelContext* op_ = nullptr;
};

// Tables side by side; see Core<CPUDevice>::ForEachTable. The CPU table
// locks itself, but a variable listed twice (a repeated non-null
// same_stream entry) must see its updates in list order.
template <typename Work>
absl::Status ForEachTable(Core<CPUDevice>& core, int n, const int64_t* costs,
                          const void* const* same_stream, const Work& work) {
  return core.ForEachTable(n, costs, same_stream, work);
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_DEVICE_CORE_CPU_H_
