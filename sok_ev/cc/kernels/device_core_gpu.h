// Core<GPUDevice>: the GPU twin of device_core_cpu.h. Core work is ordered on
// TF's compute stream for the op's GPU; scratch and table memory come from
// TF's allocator for that GPU, whose frees are safe for work queued on that
// one stream (TF's own GPU kernels rely on the same).
//
// Host synchronisations, each forced by a size TensorFlow must know: one per
// lookup in UniqueKeys (the unique counts size its outputs; the sample-id
// check rides along); Size, ExportAll and EvictStale (table sizes); and a
// table's growth check when its host-side bounds say it may be full (see
// cc/hash_table_gpu.h: amortised, not per step). Nothing else waits.
//
// A multi-table op's tables run side by side on side streams (ForEachTable,
// side_streams_gpu.h); each table's stages run on a Core of its stream.
// Included by device_core.h only, in GOOGLE_CUDA builds.
#ifndef SOK_EV_CC_KERNELS_DEVICE_CORE_GPU_H_
#define SOK_EV_CC_KERNELS_DEVICE_CORE_GPU_H_

#if GOOGLE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cc/backward_apply_gpu.h"
#include "cc/batched_copy_gpu.h"
#include "cc/combine.h"
#include "cc/common.h"
#include "cc/exchange_message.h"
#include "cc/fused_lookup_gpu.h"
#include "cc/hash_table_gpu.h"
#include "cc/initializer.h"
#include "cc/optimizers.h"
#include "cc/partition.h"
#include "cc/status_gpu.h"
#include "cc/storage_spec.h"
#include "cc/tiered_table_gpu.h"
#include "cc/unique.h"
#include "cc/unique_partition_gpu.h"
#include "sok_ev/cc/kernels/claiming_parallel_for.h"
#include "sok_ev/cc/kernels/export_buffers.h"
#include "sok_ev/cc/kernels/scratch_vector.h"
#include "sok_ev/cc/kernels/side_streams_gpu.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "sok_ev/cc/kernels/unique_buffers.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace sok_ev {

// The core's DeviceAllocator over TF's allocator of one GPU. TF's allocator
// lives as long as the process, so a table may keep this for its lifetime.
class TfGpuAllocator : public DeviceAllocator {
 public:
  explicit TfGpuAllocator(tensorflow::Allocator* allocator) : allocator_(allocator) {}
  // Null when out of memory; the core turns that into an error.
  void* allocate(size_t bytes) override {
    return allocator_->AllocateRaw(tensorflow::Allocator::kAllocatorAlignment, bytes);
  }
  void deallocate(void* pointer) override { allocator_->DeallocateRaw(pointer); }

 private:
  tensorflow::Allocator* allocator_;
};

template <>
class Core<GPUDevice> {
 public:
  // The HBM hash table, with host memory beyond an HBM budget when the
  // variable has HBM_DRAM storage (cc/tiered_table_gpu.h). Every method
  // below that reads or writes rows of given keys first makes them
  // resident in HBM (TieredTable::make_resident; nothing without a budget).
  template <typename Key>
  using Table = gpu::TieredTable<Key>;
  // The GPU table's host-side bounds and growth are not thread-safe.
  static constexpr bool kTableIsThreadSafe = false;
  // The backward pass sums each key's entries grouped by key (order), which
  // UniqueKeys' sort gives for free.
  static constexpr bool kBackwardReadsOrder = true;

  // On TF's compute stream of the op's GPU.
  explicit Core(tensorflow::OpKernelContext* context)
      : op_(context),
        allocator_(DeviceAllocatorOf(context)),
        host_(PoolContext(context->device()->tensorflow_cpu_worker_threads()->workers)) {
    context_.stream = context->eigen_device<GPUDevice>().stream();
    context_.allocator = &allocator_;
    context_.host = &host_;
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Runs work(t, table_core) for every table t < n of a multi-table op, the
  // tables spread over side streams (SideStreamCount(); with 1, or one
  // table, all on this Core's stream), and returns the first failure; the
  // tables after a failure are not started. Every side stream is joined back
  // before it returns, failure or not. work must touch only table t's
  // buffers, and must take scratch memory from table_core (Scratch, or the
  // core's own functions), never from the op's context: that memory could
  // be reused while the side stream still runs.
  //   costs: (n,) host, each table's share of the work
  //   same_stream: (n,) host or null; tables with the same non-null entry
  //     (their Embedding Variable, whose lock the caller holds throughout)
  //     run in order on one stream
  template <typename Work>
  absl::Status ForEachTable(int n, const int64_t* costs, const void* const* same_stream,
                            const Work& work) {
    const int count = std::min(n, SideStreamCount());
    if (count <= 1 || home_ != nullptr) {
      for (int t = 0; t < n; ++t) TF_RETURN_IF_ERROR(work(t, *this));
      return absl::OkStatus();
    }
    std::vector<cudaStream_t> streams;
    TF_RETURN_IF_ERROR(SideStreams(count, &streams));
    const std::vector<int> stream_of_table = AssignSideStreams(n, costs, same_stream, count);
    std::vector<std::unique_ptr<Core>> cores;
    for (cudaStream_t side : streams) {
      TF_RETURN_IF_ERROR(StreamWaits(side, stream()));  // the fork
      cores.emplace_back(new Core(op_, side, stream()));
    }
    absl::Status status;
    for (int t = 0; t < n && status.ok(); ++t) status = work(t, *cores[stream_of_table[t]]);
    for (cudaStream_t side : streams) {
      absl::Status joined = StreamWaits(stream(), side);  // the join
      if (!joined.ok()) {
        // The side work cannot be ordered before what TF queues next: wait
        // for it here, so its memory is free to reuse.
        (void)gpu::synchronize(side);
        if (status.ok()) status = joined;
      }
    }
    return status;  // cores, their arenas and kept tensors released after the join
  }

  static std::unique_ptr<DeviceAllocator> NewTableAllocator(tensorflow::OpKernelContext* context) {
    return std::make_unique<TfGpuAllocator>(DeviceAllocatorOf(context));
  }

  // table_allocator: kept by the table for its lifetime, so it must outlive it.
  // initializer.default_values: (default_value_dim, dim) device, copied.
  // storage: the HBM budget, if any; name: the variable's, for errors.
  template <typename Key>
  absl::Status NewTable(DeviceAllocator* table_allocator, int64_t dim,
                        const InitializerSpec& initializer, const StorageSpec& storage,
                        const std::string& name, std::shared_ptr<Table<Key>>* table) {
    GpuContext create = context_;
    create.allocator = table_allocator;
    Table<Key>* created = nullptr;
    TF_RETURN_IF_ERROR(ToTfStatus(Table<Key>::Create(
        create, dim, initializer, gpu::HashTableOptions(), storage, name, &created)));
    table->reset(created);
    return absl::OkStatus();
  }

  // size: host; syncs the stream.
  template <typename Key>
  absl::Status Size(Table<Key>& table, int64_t* size) {
    return ToTfStatus(table.size(context_, size));
  }

  template <typename Key>
  absl::Status AddSlot(Table<Key>& table, const std::string& name, float initial_value,
                       int* index) {
    return ToTfStatus(table.add_slot(context_, name, initial_value, index));
  }

  //   keys: (n,)  values: (n, dim) out  frequencies: (n,)
  template <typename Key>
  absl::Status FindOrInsert(Table<Key>& table, const Key* keys, int64_t n, float* values,
                            const int64_t* frequencies) {
    TF_RETURN_IF_ERROR(Resident(table, keys, n));
    return ToTfStatus(
        table.hbm().find_or_insert(context_, keys, n, values, frequencies, /*row_ids=*/nullptr));
  }

  //   keys: (n,)  values: (n, dim) out
  template <typename Key>
  absl::Status Find(const Table<Key>& table, const Key* keys, int64_t n, float* values) {
    TF_RETURN_IF_ERROR(Resident(table, keys, n));
    return ToTfStatus(table.hbm().find(context_, keys, n, values, /*found=*/nullptr,
                                       /*initial_for_missing=*/true));
  }

  // Values of present keys; an absent key reads its initial value
  // (initial_for_missing) or zeros, and found[i] = false. Syncs the stream
  // when `found` is wanted.
  //   keys: (n,)  values: (n, dim) out  found: (n,) host out, or null
  template <typename Key>
  absl::Status FindPresent(const Table<Key>& table, const Key* keys, int64_t n, float* values,
                           bool* found, bool initial_for_missing) {
    if (n == 0) return absl::OkStatus();
    tensorflow::Tensor found_tensor;
    bool* found_on_device = nullptr;
    if (found != nullptr) {
      TF_RETURN_IF_ERROR(Scratch<bool>(n, &found_tensor));
      found_on_device = VectorData<bool>(found_tensor);
    }
    TF_RETURN_IF_ERROR(Resident(table, keys, n));
    TF_RETURN_IF_ERROR(ToTfStatus(
        table.hbm().find(context_, keys, n, values, found_on_device, initial_for_missing)));
    if (found == nullptr) return Pending();
    return CopyToHost(found_on_device, n, found);
  }

  // Removes keys; *erased (host) gets how many were present. Syncs the
  // stream.
  //   keys: (n,) host
  template <typename Key>
  absl::Status Erase(Table<Key>& table, const Key* keys, int64_t n, int64_t* erased) {
    *erased = 0;
    if (n == 0) return absl::OkStatus();
    tensorflow::Tensor device_keys;
    TF_RETURN_IF_ERROR(Scratch<Key>(n, &device_keys));
    TF_RETURN_IF_ERROR(CopyFromHost(keys, n, VectorData<Key>(device_keys)));
    return ToTfStatus(table.erase(context_, VectorData<Key>(device_keys), n, erased));
  }

  //   keys: (n,) distinct  rows: (n, row_width)  frequencies, versions: (n,)
  template <typename Key>
  absl::Status InsertOrAssign(Table<Key>& table, const Key* keys, int64_t n, const float* rows,
                              const int64_t* frequencies, const int64_t* versions) {
    return ToTfStatus(table.insert_or_assign(context_, keys, n, rows, frequencies, versions));
  }

  // InsertOrAssign with host buffers: copied to device temporaries first.
  // Syncs the stream.
  //   keys: (n,) host  rows: (n, row_width) host  frequencies, versions:
  //   (n,) host or null
  template <typename Key>
  absl::Status InsertOrAssignFromHost(Table<Key>& table, const Key* keys, int64_t n,
                                      const float* rows, const int64_t* frequencies,
                                      const int64_t* versions) {
    if (n == 0) return absl::OkStatus();
    const int64_t width = table.row_width();
    tensorflow::Tensor device_keys, device_rows, device_frequencies, device_versions;
    TF_RETURN_IF_ERROR(Scratch<Key>(n, &device_keys));
    TF_RETURN_IF_ERROR(Scratch<float>(n * width, &device_rows));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &device_frequencies));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &device_versions));
    TF_RETURN_IF_ERROR(CopyFromHost(keys, n, VectorData<Key>(device_keys)));
    TF_RETURN_IF_ERROR(CopyFromHost(rows, n * width, VectorData<float>(device_rows)));
    int64_t* frequencies_on_device = nullptr;
    int64_t* versions_on_device = nullptr;
    if (frequencies != nullptr) {
      frequencies_on_device = VectorData<int64_t>(device_frequencies);
      TF_RETURN_IF_ERROR(CopyFromHost(frequencies, n, frequencies_on_device));
    }
    if (versions != nullptr) {
      versions_on_device = VectorData<int64_t>(device_versions);
      TF_RETURN_IF_ERROR(CopyFromHost(versions, n, versions_on_device));
    }
    TF_RETURN_IF_ERROR(InsertOrAssign(table, VectorData<Key>(device_keys), n,
                                      VectorData<float>(device_rows), frequencies_on_device,
                                      versions_on_device));
    return Cuda(cudaStreamSynchronize(stream()), "stream sync after a restore batch");
  }

  // evicted: host; syncs the stream.
  template <typename Key>
  absl::Status EvictStale(Table<Key>& table, int64_t global_step, int64_t steps_to_live,
                          int64_t* evicted) {
    return ToTfStatus(table.evict_stale(context_, global_step, steps_to_live, evicted));
  }

  // The table's size is read back first to size the outputs; the caller
  // holds the variable's table lock, so the export finds exactly that many.
  template <typename Key>
  absl::Status ExportAll(Table<Key>& table, const ExportAllocator<Key>& allocate) {
    int64_t n = 0;
    TF_RETURN_IF_ERROR(Size(table, &n));
    ExportBuffers<Key> out;
    TF_RETURN_IF_ERROR(allocate(n, table.row_width(), &out));
    int64_t written = 0;
    TF_RETURN_IF_ERROR(ToTfStatus(table.export_all(context_, out.keys, out.rows, out.frequencies,
                                                   out.versions, n, &written)));
    if (written != n) {
      return tensorflow::errors::Internal("export wrote ", written, " keys, size was ", n);
    }
    return absl::OkStatus();
  }

  // The whole table in host batches (checkpoints). The GPU table exports in
  // one piece, so the table is first copied whole into device temporaries
  // (a second copy on the GPU), then to host one batch at a time.
  template <typename Key>
  absl::Status ExportBatches(Table<Key>& table, int64_t max_batch, const ExportBegin& begin,
                             const ExportEmit<Key>& emit) {
    int64_t n = 0;
    TF_RETURN_IF_ERROR(ToTfStatus(table.hbm().size(context_, &n)));
    const int64_t width = table.row_width();
    TF_RETURN_IF_ERROR(begin(n + table.host_size(), width));
    // The host tier's rows (HBM_DRAM storage) straight from host memory.
    absl::Status emitted;
    const Status host = table.export_host_batches(
        max_batch, [&](const typename Table<Key>::HostBatch& batch) -> Status {
          emitted = emit(HostExportBatch<Key>{batch.keys, batch.rows, batch.frequencies,
                                              batch.versions, batch.count});
          return emitted.ok() ? Status::Ok() : Status::Internal("export stopped");
        });
    TF_RETURN_IF_ERROR(emitted);
    TF_RETURN_IF_ERROR(ToTfStatus(host));
    if (n == 0) return absl::OkStatus();
    tensorflow::Tensor keys, rows, frequencies, versions;
    TF_RETURN_IF_ERROR(Scratch<Key>(n, &keys));
    TF_RETURN_IF_ERROR(Scratch<float>(n * width, &rows));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &frequencies));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &versions));
    int64_t written = 0;
    TF_RETURN_IF_ERROR(ToTfStatus(table.hbm().export_all(
        context_, VectorData<Key>(keys), VectorData<float>(rows), VectorData<int64_t>(frequencies),
        VectorData<int64_t>(versions), n, &written)));
    if (written != n) {
      return tensorflow::errors::Internal("export wrote ", written, " keys, size was ", n);
    }
    const int64_t batch = std::max<int64_t>(1, std::min(max_batch, n));
    std::vector<Key> host_keys(batch);
    std::vector<float> host_rows(batch * width);
    std::vector<int64_t> host_frequencies(batch), host_versions(batch);
    for (int64_t start = 0; start < n; start += batch) {
      const int64_t count = std::min(batch, n - start);
      TF_RETURN_IF_ERROR(CopyToHost(VectorData<Key>(keys) + start, count, host_keys.data()));
      TF_RETURN_IF_ERROR(
          CopyToHost(VectorData<float>(rows) + start * width, count * width, host_rows.data()));
      TF_RETURN_IF_ERROR(
          CopyToHost(VectorData<int64_t>(frequencies) + start, count, host_frequencies.data()));
      TF_RETURN_IF_ERROR(
          CopyToHost(VectorData<int64_t>(versions) + start, count, host_versions.data()));
      TF_RETURN_IF_ERROR(
          emit(HostExportBatch<Key>{host_keys.data(), host_rows.data(), host_frequencies.data(),
                                    host_versions.data(), count}));
    }
    return absl::OkStatus();
  }

  // As Core<CPUDevice>::ApplyOptimizer, fused: gpu::combine_backward_apply
  // with one entry per key sums duplicates (in entry order, as the CPU twin,
  // so both give the same bits) and updates each row at once. Distinct keys
  // skip the sort; otherwise their count stays on the device (no sync).
  //   keys: (n,)  grads: (n, dim)
  template <typename Key>
  absl::Status ApplyOptimizer(Table<Key>& table, const OptimizerSpec& spec, const Key* keys,
                              int64_t n, const float* grads, int64_t dim, int64_t global_step,
                              bool keys_are_unique) {
    if (n <= 0) return absl::OkStatus();
    TF_RETURN_IF_ERROR(Resident(table, keys, n));
    tensorflow::Tensor row_ids_tensor;
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &row_ids_tensor));
    int64_t* row_ids = VectorData<int64_t>(row_ids_tensor);
    if (keys_are_unique) {
      TF_RETURN_IF_ERROR(ToTfStatus(
          table.hbm().find_or_insert_rows(context_, keys, n, /*count=*/nullptr, row_ids)));
      return ApplyDistinctRows(table, spec, n, grads, row_ids, global_step);
    }
    // Each unique key once, its gradient the sum of its rows': row offsets
    // 0, 1, ..., n (one entry a "sample").
    tensorflow::Tensor identity_tensor;
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n + 1, &identity_tensor));
    int64_t* identity = VectorData<int64_t>(identity_tensor);
    gpu::fill_iota(context_, identity, n + 1);
    Segmented sorted;
    TF_RETURN_IF_ERROR(UniqueKeysSegmented<Key>(keys, n, &sorted));
    const int64_t* num_unique = VectorData<int64_t>(sorted.num_unique);
    TF_RETURN_IF_ERROR(Pending());
    TF_RETURN_IF_ERROR(ToTfStatus(table.hbm().find_or_insert_rows(
        context_, VectorData<Key>(sorted.unique_keys), n, num_unique, row_ids)));
    TF_RETURN_IF_ERROR(ToTfStatus(gpu::combine_backward_apply(
        context_, table.hbm(), spec, grads, /*weights=*/nullptr, /*row_offsets=*/identity,
        /*batch=*/n,
        /*nnz=*/n, Combiner::kSum, VectorData<int64_t>(sorted.order),
        VectorData<int64_t>(sorted.segments), num_unique, /*max_unique=*/n,
        /*max_key_entries=*/n, row_ids, global_step)));
    return Pending();
  }

  // Every table's keys deduplicated in one grouped sort, or, for an owner's
  // received keys that come as sorted runs (TableBatch::run_lengths), one
  // merge; see Core<CPUDevice>::UniqueKeys for the contract. The one host
  // sync of a lookup reads back the unique counts and the sample-id check
  // together (and whether the runs were sorted: if not, a second sync after
  // the sort).
  template <typename Key>
  absl::Status UniqueKeys(const std::vector<TableBatch<Key>>& tables,
                          const UniqueAllocator<Key>& allocate,
                          std::vector<int64_t>* first_invalid) {
    const int num_tables = static_cast<int>(tables.size());
    std::vector<int64_t> key_offsets(num_tables + 1, 0);
    std::vector<gpu::SampleIds> sample_ids(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      key_offsets[t + 1] = key_offsets[t] + tables[t].nnz;
      sample_ids[t] = {tables[t].sample_ids, tables[t].sample_id_stride, tables[t].nnz,
                       tables[t].batch,      tables[t].row_offsets,      tables[t].row_splits,
                       tables[t].first_entry};
    }
    const int64_t n = key_offsets[num_tables];
    const std::vector<int64_t> run_offsets = RunOffsets(tables);
    const bool runs = !run_offsets.empty();
    // first_invalid (num_tables), unique_offsets (num_tables + 1), then
    // whether a run was out of order (runs only).
    const int readback_size = 2 * num_tables + 1 + (runs ? 1 : 0);
    tensorflow::Tensor readback_tensor, offsets_tensor, run_offsets_tensor;
    TF_RETURN_IF_ERROR(Scratch<int64_t>(readback_size, &readback_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(num_tables + 1, &offsets_tensor));
    if (runs) TF_RETURN_IF_ERROR(Scratch<int64_t>(run_offsets.size(), &run_offsets_tensor));
    int64_t* readback = VectorData<int64_t>(readback_tensor);
    int64_t* key_offsets_device = VectorData<int64_t>(offsets_tensor);
    gpu::row_offsets_from_sample_ids(context_, sample_ids.data(), num_tables, readback);
    gpu::upload_values(context_, key_offsets, key_offsets_device);
    if (runs) gpu::upload_values(context_, run_offsets, VectorData<int64_t>(run_offsets_tensor));
    // All tables' keys side by side, then one sort.
    const int64_t size = std::max<int64_t>(n, 1);
    tensorflow::Tensor keys_tensor, unique_tensor, counts_tensor, inverse_tensor, order_tensor,
        segments_tensor;
    TF_RETURN_IF_ERROR(Scratch<Key>(size, &unique_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(size, &counts_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(size, &inverse_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(size, &order_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n + 1, &segments_tensor));
    // Tables packed side by side already (a RaggedTensor's) need no gather.
    bool packed = true;
    for (int t = 1; t < num_tables; ++t) {
      packed = packed && tables[t].keys == tables[0].keys + key_offsets[t];
    }
    const Key* keys = packed ? tables[0].keys : nullptr;
    if (!packed) {
      TF_RETURN_IF_ERROR(Scratch<Key>(size, &keys_tensor));
      std::vector<gpu::CopyJob<Key>> gather;
      for (int t = 0; t < num_tables; ++t) {
        gather.push_back(
            {tables[t].keys, VectorData<Key>(keys_tensor) + key_offsets[t], tables[t].nnz, Key{0}});
      }
      gpu::batched_copy(context_, gather);
      keys = VectorData<Key>(keys_tensor);
    }
    const Key* unique = VectorData<Key>(unique_tensor);
    const int64_t* counts = VectorData<int64_t>(counts_tensor);
    const int64_t* inverse = VectorData<int64_t>(inverse_tensor);
    const int64_t* order = VectorData<int64_t>(order_tensor);
    const int64_t* segments = VectorData<int64_t>(segments_tensor);
    // Every table's occurrences, or none (the op's); an empty table's
    // pointer may be null whichever the op, so any table decides.
    const bool owned = std::any_of(tables.begin(), tables.end(), [](const TableBatch<Key>& t) {
      return t.occurrences != nullptr;
    });
    tensorflow::Tensor occurrences_tensor;
    if (owned) {
      TF_RETURN_IF_ERROR(Scratch<int64_t>(size, &occurrences_tensor));
      std::vector<gpu::CopyJob<int64_t>> gather;
      for (int t = 0; t < num_tables; ++t) {
        if (tables[t].nnz == 0) continue;
        gather.push_back({tables[t].occurrences,
                          VectorData<int64_t>(occurrences_tensor) + key_offsets[t], tables[t].nnz,
                          0});
      }
      gpu::batched_copy(context_, gather);
    }
    std::vector<int64_t> host(readback_size);
    // The runs merged (merge) or every key sorted, then read back.
    auto deduplicate = [&](bool merge) -> absl::Status {
      if (merge) {
        gpu::unique_keys_of_runs_grouped(
            context_, keys, n, key_offsets_device, VectorData<int64_t>(run_offsets_tensor),
            num_tables, tables[0].num_runs, VectorData<Key>(unique_tensor),
            VectorData<int64_t>(counts_tensor), VectorData<int64_t>(inverse_tensor),
            VectorData<int64_t>(order_tensor), VectorData<int64_t>(segments_tensor),
            readback + num_tables, readback + 2 * num_tables + 1);
      } else {
        gpu::unique_keys_grouped(context_, keys, n, key_offsets_device, num_tables,
                                 VectorData<Key>(unique_tensor), VectorData<int64_t>(counts_tensor),
                                 VectorData<int64_t>(inverse_tensor),
                                 VectorData<int64_t>(order_tensor),
                                 VectorData<int64_t>(segments_tensor), readback + num_tables);
      }
      if (owned) {
        gpu::sum_occurrences_by_key(context_, VectorData<int64_t>(occurrences_tensor), order,
                                    segments, readback + 2 * num_tables, n,
                                    VectorData<int64_t>(counts_tensor));
      }
      TF_RETURN_IF_ERROR(Pending());
      return CopyToHost(readback, merge ? readback_size : 2 * num_tables + 1, host.data());
    };
    TF_RETURN_IF_ERROR(deduplicate(runs));
    if (runs && host[2 * num_tables + 1] != 0) TF_RETURN_IF_ERROR(deduplicate(false));
    bool valid = true;
    for (int t = 0; t < num_tables; ++t) {
      (*first_invalid)[t] = host[t];
      valid = valid && host[t] == tables[t].nnz;
    }
    if (!valid) return absl::OkStatus();
    const int64_t* unique_offsets = host.data() + num_tables;
    // Each table's slice of the grouped outputs into its own tensors, with
    // indices made the table's own.
    std::vector<gpu::CopyJob<Key>> key_jobs;
    std::vector<gpu::CopyJob<int64_t>> index_jobs;
    for (int t = 0; t < num_tables; ++t) {
      const int64_t first_unique = unique_offsets[t];
      const int64_t num_unique = unique_offsets[t + 1] - first_unique;
      const int64_t first_entry = key_offsets[t];
      UniqueBuffers<Key> out;
      TF_RETURN_IF_ERROR(allocate(t, num_unique, &out));
      key_jobs.push_back({unique + first_unique, out.unique_keys, num_unique, Key{0}});
      index_jobs.push_back({counts + first_unique, out.counts, num_unique, 0});
      index_jobs.push_back({segments + first_unique, out.segments, num_unique + 1, first_entry});
      index_jobs.push_back(
          {inverse + first_entry, tables[t].unique_index, tables[t].nnz, first_unique});
      index_jobs.push_back({order + first_entry, tables[t].order, tables[t].nnz, first_entry});
    }
    gpu::batched_copy(context_, key_jobs);
    gpu::batched_copy(context_, index_jobs);
    return Pending();
  }

  // Every table's find-or-insert and combine (device_core.h): one insert
  // launch for all tables (HashTable::find_or_insert_tables), then the
  // samples' rows combined straight from the tables, one launch a kernel
  // variant (gpu::lookup_combine_tables): no (num_unique, dim) matrix in
  // between, and no launch per table.
  template <typename Key>
  absl::Status FindOrInsertCombineTables(
      const std::vector<FindOrInsertCombineTable<Table<Key>, Key>>& tables) {
    const size_t n = tables.size();
    if (n == 0) return absl::OkStatus();
    std::vector<int64_t> first_id(n + 1, 0);
    for (size_t t = 0; t < n; ++t) first_id[t + 1] = first_id[t] + tables[t].num_unique;
    tensorflow::Tensor row_ids_tensor;
    TF_RETURN_IF_ERROR(Scratch<int64_t>(std::max<int64_t>(first_id[n], 1), &row_ids_tensor));
    std::vector<gpu::FindOrInsertJob<Key>> inserts(n);
    std::vector<gpu::LookupCombineTable<Key>> combines(n);
    std::vector<std::pair<Table<Key>*, gpu::KeySpan<Key>>> spans(n);
    for (size_t t = 0; t < n; ++t) {
      const FindOrInsertCombineTable<Table<Key>, Key>& table = tables[t];
      int64_t* row_ids = VectorData<int64_t>(row_ids_tensor) + first_id[t];
      gpu::HashTable<Key>* hbm = &table.table->hbm();
      inserts[t] = {hbm,          table.unique_keys,        table.num_unique, /*count=*/nullptr,
                    table.counts, /*count_frequency=*/true, row_ids};
      combines[t] = {hbm, row_ids, table.combine};
      spans[t] = {table.table, {table.unique_keys, table.num_unique}};
    }
    TF_RETURN_IF_ERROR(ResidentTables(spans));
    TF_RETURN_IF_ERROR(
        ToTfStatus(gpu::HashTable<Key>::find_or_insert_tables(context_, inserts.data(), n)));
    return ToTfStatus(gpu::lookup_combine_tables(context_, combines.data(), n));
  }

  // Every table's ApplyOptimizer (device_core.h) on this stream, in list
  // order. When every table's keys are distinct (the lookup's own gradient),
  // one insert launch resolves every table's rows first
  // (HashTable::find_or_insert_tables; a table listed twice gets its rows
  // in order, and row ids survive growth), then each table's update.
  template <typename Key>
  absl::Status ApplyOptimizerTables(const std::vector<ApplyOptimizerTable<Table<Key>, Key>>& tables,
                                    int64_t global_step) {
    const size_t n = tables.size();
    const bool distinct = std::all_of(tables.begin(), tables.end(),
                                      [](const auto& table) { return table.keys_are_unique; });
    if (!distinct) {
      for (const ApplyOptimizerTable<Table<Key>, Key>& table : tables) {
        TF_RETURN_IF_ERROR(ApplyOptimizer(*table.table, table.spec, table.keys, table.n,
                                          table.grads, table.dim, global_step,
                                          table.keys_are_unique));
      }
      return absl::OkStatus();
    }
    std::vector<int64_t> first_id(n + 1, 0);
    for (size_t t = 0; t < n; ++t) first_id[t + 1] = first_id[t] + tables[t].n;
    if (first_id[n] == 0) return absl::OkStatus();
    tensorflow::Tensor row_ids_tensor;
    TF_RETURN_IF_ERROR(Scratch<int64_t>(first_id[n], &row_ids_tensor));
    int64_t* row_ids = VectorData<int64_t>(row_ids_tensor);
    std::vector<gpu::FindOrInsertJob<Key>> inserts(n);
    std::vector<std::pair<Table<Key>*, gpu::KeySpan<Key>>> spans(n);
    for (size_t t = 0; t < n; ++t) spans[t] = {tables[t].table, {tables[t].keys, tables[t].n}};
    TF_RETURN_IF_ERROR(ResidentTables(spans));
    for (size_t t = 0; t < n; ++t) {
      gpu::FindOrInsertJob<Key>& insert = inserts[t];
      insert.table = &tables[t].table->hbm();
      insert.keys = tables[t].keys;
      insert.n = tables[t].n;
      insert.count_frequency = false;  // the lookup counted the keys
      insert.row_ids = row_ids + first_id[t];
    }
    TF_RETURN_IF_ERROR(
        ToTfStatus(gpu::HashTable<Key>::find_or_insert_tables(context_, inserts.data(), n)));
    for (size_t t = 0; t < n; ++t) {
      TF_RETURN_IF_ERROR(ApplyDistinctRows(*tables[t].table, tables[t].spec, tables[t].n,
                                           tables[t].grads, row_ids + first_id[t], global_step));
    }
    return absl::OkStatus();
  }

  // The tier counters of a table (cc/storage_spec.h); syncs the stream.
  template <typename Key>
  absl::Status TierCountersOf(Table<Key>& table, TierCounters* counters) {
    return ToTfStatus(table.counters(context_, counters));
  }

  // Scratch memory for a table's work inside ForEachTable (safe on a side
  // stream, unlike the op context's allocate_temp): on a side stream the
  // tensor is kept until the Core goes (after the join), and its first use
  // is ordered after the home stream.
  //   tensor: (count,) out
  template <typename T>
  absl::Status Scratch(int64_t count, tensorflow::Tensor* tensor) {
    TF_RETURN_IF_ERROR(AllocateVector<T>(op_, count, tensor));
    if (home_ == nullptr) return absl::OkStatus();
    kept_.push_back(*tensor);
    return ToTfStatus(gpu::order_after_home(context_));
  }

  // The keys come from a checkpoint: they are copied to the host, so the
  // error names the repeated key as on the CPU.
  //   keys: (n,)
  template <typename Key>
  absl::Status CheckDistinct(const Key* keys, int64_t n, const std::string& where) {
    std::vector<Key> host(n);
    TF_RETURN_IF_ERROR(CopyToHost(keys, n, host.data()));
    return CheckDistinctOnHost(host.data(), n, where);
  }

  // Core<CPUDevice>::PartitionByOwner's contract, every table in one sort
  // (gpu::partition_by_owner_grouped): the per-table buffers are gathered
  // into one and scattered back by batched copies, a few launches in all.
  template <typename Key>
  absl::Status PartitionByOwner(const std::vector<OwnerBatch<Key>>& tables, int32_t num_workers) {
    const int num_tables = static_cast<int>(tables.size());
    // key_offsets (num_tables + 1), then target_workers (num_tables).
    std::vector<int64_t> parameters(2 * num_tables + 1, 0);
    for (int t = 0; t < num_tables; ++t) {
      parameters[t + 1] = parameters[t] + tables[t].n;
      parameters[num_tables + 1 + t] = tables[t].target_worker;
    }
    const int64_t n = parameters[num_tables];
    const int64_t size = std::max<int64_t>(n, 1);
    tensorflow::Tensor parameters_tensor, keys_tensor, grouped_tensor, positions_tensor,
        counts_tensor;
    TF_RETURN_IF_ERROR(Scratch<int64_t>(2 * num_tables + 1, &parameters_tensor));
    TF_RETURN_IF_ERROR(Scratch<Key>(size, &keys_tensor));
    TF_RETURN_IF_ERROR(Scratch<Key>(size, &grouped_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(size, &positions_tensor));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(int64_t{num_tables} * num_workers, &counts_tensor));
    int64_t* device_parameters = VectorData<int64_t>(parameters_tensor);
    gpu::upload_values(context_, parameters, device_parameters);
    Key* keys = VectorData<Key>(keys_tensor);
    Key* grouped = VectorData<Key>(grouped_tensor);
    int64_t* positions = VectorData<int64_t>(positions_tensor);
    int64_t* counts = VectorData<int64_t>(counts_tensor);
    std::vector<gpu::CopyJob<Key>> gather, key_jobs;
    std::vector<gpu::CopyJob<int64_t>> index_jobs;
    for (int t = 0; t < num_tables; ++t) {
      const int64_t first = parameters[t];
      gather.push_back({tables[t].keys, keys + first, tables[t].n, Key{0}});
      key_jobs.push_back({grouped + first, tables[t].keys_by_owner, tables[t].n, Key{0}});
      index_jobs.push_back({positions + first, tables[t].positions, tables[t].n, first});
      index_jobs.push_back({counts + int64_t{t} * num_workers, tables[t].counts, num_workers, 0});
    }
    gpu::batched_copy(context_, gather);
    gpu::partition_by_owner_grouped(context_, keys, n, device_parameters,
                                    device_parameters + num_tables + 1, num_tables, num_workers,
                                    grouped, positions, counts);
    gpu::batched_copy(context_, key_jobs);
    gpu::batched_copy(context_, index_jobs);
    return Pending();
  }

  // Every table's combine forward (cc/combine.h), one launch for all tables
  // of a kernel variant (gpu::combine_forward_tables).
  absl::Status CombineForwardTables(const std::vector<CombineForwardTable>& tables) {
    gpu::combine_forward_tables(context_, tables.data(), static_cast<int>(tables.size()));
    return Pending();
  }

  // Every table's combine backward (cc/combine.h), each stage one launch
  // for all tables (gpu::combine_backward_tables). The GPU sums each key's
  // entries through order and segments. A null order (the lookup's
  // UniqueKeys ran on the CPU, which writes none) is rebuilt here from
  // unique_index: its stable sort groups the entries by key, keys 0 ..
  // num_unique - 1 in turn, as UniqueKeys' order would.
  absl::Status CombineBackwardTables(std::vector<CombineBackwardTable> tables) {
    std::vector<Segmented> grouped(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      TF_RETURN_IF_ERROR(
          OrderOrGroup(tables[t].unique_index, tables[t].nnz, &tables[t].order, &grouped[t]));
    }
    gpu::combine_backward_tables(context_, tables.data(), static_cast<int>(tables.size()));
    return Pending();
  }

  // gpu::unique_keys_segmented's outputs, in scratch memory.
  struct Segmented {
    tensorflow::Tensor unique_keys, inverse, order, segments, num_unique;
  };

  // *order as given, or, when null (UniqueKeys ran on the CPU), the stable
  // grouping of the entries by key, kept in *grouped.
  absl::Status OrderOrGroup(const int64_t* unique_index, int64_t nnz, const int64_t** order,
                            Segmented* grouped) {
    if (*order != nullptr || nnz == 0) return absl::OkStatus();
    TF_RETURN_IF_ERROR(UniqueKeysSegmented<int64_t>(unique_index, nnz, grouped));
    *order = VectorData<int64_t>(grouped->order);
    return absl::OkStatus();
  }

  //   keys: (n,), n > 0
  template <typename Key>
  absl::Status UniqueKeysSegmented(const Key* keys, int64_t n, Segmented* out) {
    TF_RETURN_IF_ERROR(Scratch<Key>(n, &out->unique_keys));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &out->inverse));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n, &out->order));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(n + 1, &out->segments));
    TF_RETURN_IF_ERROR(Scratch<int64_t>(1, &out->num_unique));
    gpu::unique_keys_segmented(context_, keys, n, VectorData<Key>(out->unique_keys),
                               VectorData<int64_t>(out->inverse), VectorData<int64_t>(out->order),
                               VectorData<int64_t>(out->segments),
                               VectorData<int64_t>(out->num_unique));
    return absl::OkStatus();
  }

  // Copies blocks of rows between tables and a message (cc/exchange_message.h).
  template <typename Src, typename Dst>
  absl::Status CopyRows(const std::vector<RowCopy<Src, Dst>>& blocks) {
    gpu::copy_rows(context_, blocks);
    return Pending();
  }

  // Writes where blocks of rows are (cc/exchange_message.h).
  absl::Status WriteRowAddresses(const std::vector<sok_ev::RowAddresses>& blocks) {
    gpu::row_addresses(context_, blocks);
    return Pending();
  }

  // Through kernel parameters: no wait for the stream, unlike CopyFromHost.
  //   values: host  dst: (values.size(),) device
  absl::Status Upload(const std::vector<int64_t>& values, int64_t* dst) {
    if (values.empty()) return absl::OkStatus();
    gpu::upload_values(context_, values, dst);
    return Pending();
  }

  //   dst, src: (count,) device
  template <typename T>
  absl::Status Copy(T* dst, const T* src, int64_t count) {
    if (count == 0) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, stream()),
                "device-to-device copy");
  }

  //   dst: (count,) device
  template <typename T>
  absl::Status SetZero(T* dst, int64_t count) {
    if (count == 0) return absl::OkStatus();
    return Cuda(cudaMemsetAsync(dst, 0, count * sizeof(T), stream()), "zero fill");
  }

  // Queued on the stream: the host buffer must stay valid until the stream
  // reaches the copy (a later CopyToHost or sync).
  //   src: (count,) host  dst: (count,) device
  template <typename T>
  absl::Status CopyFromHost(const T* src, int64_t count, T* dst) {
    if (count == 0) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream()),
                "host-to-device copy");
  }

  // Syncs the stream, which also surfaces faults of work queued before.
  //   src: (count,) device  dst: (count,) host
  template <typename T>
  absl::Status CopyToHost(const T* src, int64_t count, T* dst) {
    if (count > 0) {
      TF_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost, stream()),
               "device-to-host copy"));
    }
    return ToTfStatus(gpu::synchronize(stream()));
  }

 private:
  static tensorflow::Allocator* DeviceAllocatorOf(tensorflow::OpKernelContext* context) {
    return context->device()->GetAllocator(tensorflow::AllocatorAttributes());
  }

  cudaStream_t stream() const { return gpu::stream_of(context_); }

  static absl::Status Cuda(cudaError_t error, const char* what) {
    return ToTfStatus(gpu::cuda_status(error, what));
  }

  // The gpu:: free functions record errors per host thread instead of
  // returning them.
  static absl::Status Pending() { return ToTfStatus(gpu::take_last_error()); }

  // Where each run of an owner's received keys starts (TableBatch::
  // run_lengths), table after table, then the end: what
  // gpu::unique_keys_of_runs_grouped reads. Empty, so the keys are sorted
  // instead, unless every table has the same number of runs covering its
  // keys.
  template <typename Key>
  static std::vector<int64_t> RunOffsets(const std::vector<TableBatch<Key>>& tables) {
    if (tables.empty() || tables[0].num_runs < 1) return {};
    const int num_runs = tables[0].num_runs;
    std::vector<int64_t> offsets = {0};
    for (const TableBatch<Key>& table : tables) {
      if (table.run_lengths == nullptr || table.num_runs != num_runs) return {};
      const int64_t first = offsets.back();
      for (int r = 0; r < num_runs; ++r) offsets.push_back(offsets.back() + table.run_lengths[r]);
      if (offsets.back() - first != table.nnz) return {};
    }
    return offsets;
  }

  // Makes the rows of keys resident in the table's HBM tier (see Table).
  //   keys: (n,)
  template <typename Key>
  absl::Status Resident(const Table<Key>& table, const Key* keys, int64_t n) {
    if (!table.tiered()) return absl::OkStatus();
    return ToTfStatus(table.make_resident(context_, {gpu::KeySpan<Key>{keys, n}}));
  }

  // Resident for the tables of a multi-table op: a table listed several
  // times makes all of its spans resident at once, so that no span's rows
  // are written back to make room for another's, and all tables move their
  // rows stage by stage together (TieredTable::make_resident_together).
  template <typename Key>
  absl::Status ResidentTables(const std::vector<std::pair<Table<Key>*, gpu::KeySpan<Key>>>& spans) {
    std::vector<typename Table<Key>::Residency> tables;
    for (size_t t = 0; t < spans.size(); ++t) {
      const Table<Key>* table = spans[t].first;
      if (!table->tiered()) continue;
      auto listed = std::find_if(tables.begin(), tables.end(),
                                 [&](const auto& residency) { return residency.table == table; });
      if (listed == tables.end()) {
        tables.push_back({table, {}});
        listed = tables.end() - 1;
      }
      listed->spans.push_back(spans[t].second);
    }
    if (tables.empty()) return absl::OkStatus();
    return ToTfStatus(Table<Key>::make_resident_together(context_, tables));
  }

  // The update of n distinct keys whose rows are resolved: key i's gradient
  // is row i, nothing to group (null order, segments and row offsets).
  //   grads: (n, dim)  row_ids: (n,)
  template <typename Key>
  absl::Status ApplyDistinctRows(Table<Key>& table, const OptimizerSpec& spec, int64_t n,
                                 const float* grads, const int64_t* row_ids, int64_t global_step) {
    TF_RETURN_IF_ERROR(ToTfStatus(gpu::combine_backward_apply(
        context_, table.hbm(), spec, grads, /*weights=*/nullptr, /*row_offsets=*/nullptr,
        /*batch=*/n,
        /*nnz=*/n, Combiner::kSum, /*order=*/nullptr, /*segments=*/nullptr,
        /*num_unique=*/nullptr, /*max_unique=*/n, /*max_key_entries=*/1, row_ids, global_step)));
    return Pending();
  }

  // On a side stream `side` whose home is `home` (ForEachTable).
  Core(tensorflow::OpKernelContext* context, cudaStream_t side, cudaStream_t home)
      : op_(context),
        allocator_(DeviceAllocatorOf(context)),
        host_(PoolContext(context->device()->tensorflow_cpu_worker_threads()->workers)),
        home_(home) {
    context_.stream = side;
    context_.host = &host_;
    context_.home_stream = home;
    arena_ = std::make_unique<SideStreamArena>(DeviceAllocatorOf(context), context_);
    context_.allocator = arena_.get();
  }

  tensorflow::OpKernelContext* op_;
  TfGpuAllocator allocator_;  // the core's scratch memory on TF's stream
  CpuContext host_;           // TF's CPU worker threads, for host-side work
  GpuContext context_;
  cudaStream_t home_ = nullptr;             // set on a side stream
  std::unique_ptr<SideStreamArena> arena_;  // a side stream's scratch memory
  std::vector<tensorflow::Tensor> kept_;    // a side stream's Scratch tensors
};

// Tables side by side on side streams; see Core<GPUDevice>::ForEachTable.
template <typename Work>
absl::Status ForEachTable(Core<GPUDevice>& core, int n, const int64_t* costs,
                          const void* const* same_stream, const Work& work) {
  return core.ForEachTable(n, costs, same_stream, work);
}

}  // namespace sok_ev

#endif  // GOOGLE_CUDA
#endif  // SOK_EV_CC_KERNELS_DEVICE_CORE_GPU_H_
