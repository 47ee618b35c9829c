// C ABI over the GPU core for ctypes: device pointers arrive as integers
// (torch.Tensor.data_ptr(), cupy's .data.ptr) and the stream as a
// cudaStream_t integer. Every function returns 0 on success, else 1 with the
// message in sokev_last_error(). Scratch memory is stream-ordered
// cudaMallocAsync from the device's default pool.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cc/backward_apply_gpu.h"
#include "cc/combine.h"
#include "cc/exchange_message.h"
#include "cc/fused_lookup_gpu.h"
#include "cc/hash_table_gpu.h"
#include "cc/optimizers.h"
#include "cc/partition.h"
#include "cc/status_gpu.h"
#include "cc/tiered_table_gpu.h"
#include "cc/unique.h"
#include "cc/unique_partition_gpu.h"

using sok_ev::Combiner;
using sok_ev::GpuContext;
using sok_ev::Status;
namespace gpu = sok_ev::gpu;

namespace {

thread_local std::string last_error;

int report(const Status& status) {
  if (status.ok()) return 0;
  last_error = status.message;
  return 1;
}

// Errors of the void core functions, plus any asynchronous fault so far.
int report_pending() { return report(gpu::take_last_error()); }

GpuContext context_for(uint64_t stream) {
  static bool pool_configured = [] {
    // Keep freed scratch in the pool: returning it to the driver after
    // every call would synchronise.
    int device = 0;
    cudaGetDevice(&device);
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t threshold = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    return true;
  }();
  (void)pool_configured;
  GpuContext context;
  context.stream = reinterpret_cast<void*>(stream);
  context.allocator = nullptr;
  return context;
}

struct TableHandle {
  int key_bits;
  void* table;
  template <typename Key>
  gpu::HashTable<Key>* as() {
    return static_cast<gpu::HashTable<Key>*>(table);
  }
};

template <typename F>
int with_table(void* handle, F&& f) {
  TableHandle* h = static_cast<TableHandle*>(handle);
  if (h->key_bits == 32) return report(f(h->as<int32_t>(), (int32_t*)nullptr));
  return report(f(h->as<int64_t>(), (int64_t*)nullptr));
}

template <typename T>
T* ptr(uint64_t address) {
  return reinterpret_cast<T*>(address);
}

// hyper: learning_rate, beta1, beta2, epsilon, beta1_power, beta2_power,
// momentum, l1, l2, l2_shrinkage, learning_rate_power, decay (12 floats,
// host); flags: use_nesterov, centered, slot_index[0..2] (5 ints, host).
sok_ev::OptimizerSpec optimizer_spec(int kind, const float* hyper, const int* flags) {
  sok_ev::OptimizerSpec spec;
  spec.kind = static_cast<sok_ev::OptimizerKind>(kind);
  spec.learning_rate = hyper[0];
  spec.beta1 = hyper[1];
  spec.beta2 = hyper[2];
  spec.epsilon = hyper[3];
  spec.beta1_power = hyper[4];
  spec.beta2_power = hyper[5];
  spec.momentum = hyper[6];
  spec.l1 = hyper[7];
  spec.l2 = hyper[8];
  spec.l2_shrinkage = hyper[9];
  spec.learning_rate_power = hyper[10];
  spec.decay = hyper[11];
  spec.use_nesterov = flags[0] != 0;
  spec.centered = flags[1] != 0;
  for (int s = 0; s < 3; ++s) spec.slot_index[s] = flags[2 + s];
  return spec;
}

// A CpuContext that splits a range evenly over `threads` std::threads
// started for the call (1 or less: the calling thread alone).
sok_ev::CpuContext threads_context(int threads) {
  if (threads <= 1) return sok_ev::CpuContext::Serial();
  sok_ev::CpuContext context;
  context.parallelism = threads;
  context.parallel_for = [threads](int64_t total, int64_t, const sok_ev::CpuContext::Work& work) {
    if (total <= 0) return;
    const int64_t used = std::min<int64_t>(threads, total);
    std::vector<std::thread> helpers;
    for (int64_t t = 1; t < used; ++t) {
      helpers.emplace_back(
          [&work, total, used, t] { work(total * t / used, total * (t + 1) / used); });
    }
    work(0, total / used);
    for (std::thread& helper : helpers) helper.join();
  };
  return context;
}

// A tiered table of int64 keys and a table handle of its HBM tier (not
// owned) for the sokev_table_* calls.
struct TieredHandle {
  gpu::TieredTable<int64_t>* table;
  TableHandle hbm;
};

}  // namespace

extern "C" {

const char* sokev_last_error() { return last_error.c_str(); }

int sokev_table_create(int key_bits, int64_t dim, int init_kind, float param_a, float param_b,
                       uint64_t seed, uint64_t default_values, int64_t default_value_dim,
                       int64_t initial_capacity, float max_load_factor, uint64_t stream,
                       void** out) {
  sok_ev::InitializerSpec spec;
  spec.kind = static_cast<sok_ev::InitializerSpec::Kind>(init_kind);
  spec.param_a = param_a;
  spec.param_b = param_b;
  spec.seed = seed;
  spec.default_values = ptr<const float>(default_values);
  spec.default_value_dim = default_value_dim;
  gpu::HashTableOptions options;
  options.initial_capacity = initial_capacity;
  options.max_load_factor = max_load_factor;
  TableHandle* handle = new TableHandle{key_bits, nullptr};
  Status status;
  if (key_bits == 32) {
    gpu::HashTable<int32_t>* table = nullptr;
    status = gpu::HashTable<int32_t>::Create(context_for(stream), dim, spec, options, &table);
    handle->table = table;
  } else if (key_bits == 64) {
    gpu::HashTable<int64_t>* table = nullptr;
    status = gpu::HashTable<int64_t>::Create(context_for(stream), dim, spec, options, &table);
    handle->table = table;
  } else {
    status = Status::InvalidArgument("key_bits must be 32 or 64");
  }
  if (!status.ok()) {
    delete handle;
    *out = nullptr;
    return report(status);
  }
  *out = handle;
  return 0;
}

int sokev_table_destroy(void* handle) {
  TableHandle* h = static_cast<TableHandle*>(handle);
  if (h->key_bits == 32)
    delete h->as<int32_t>();
  else
    delete h->as<int64_t>();
  delete h;
  return 0;
}

int sokev_table_size(void* handle, uint64_t stream, int64_t* size) {
  return with_table(handle, [&](auto* t, auto*) { return t->size(context_for(stream), size); });
}

int sokev_table_info(void* handle, uint64_t* memory_bytes, int64_t* buckets, int64_t* row_capacity,
                     int64_t* row_width) {
  return with_table(handle, [&](auto* t, auto*) {
    *memory_bytes = t->memory_bytes();
    *buckets = t->bucket_count();
    *row_capacity = t->row_capacity();
    *row_width = t->row_width();
    return Status::Ok();
  });
}

int sokev_table_add_slot(void* handle, const char* name, float initial_value, uint64_t stream,
                         int* index) {
  return with_table(handle, [&](auto* t, auto*) {
    return t->add_slot(context_for(stream), name, initial_value, index);
  });
}

int sokev_table_reserve(void* handle, int64_t keys, uint64_t stream) {
  return with_table(handle, [&](auto* t, auto*) { return t->reserve(context_for(stream), keys); });
}

int sokev_table_find_or_insert(void* handle, uint64_t keys, int64_t n, uint64_t values,
                               uint64_t frequencies, uint64_t row_ids, uint64_t stream) {
  return with_table(handle, [&](auto* t, auto* key_type) {
    using Key = std::remove_pointer_t<decltype(key_type)>;
    return t->find_or_insert(context_for(stream), ptr<const Key>(keys), n, ptr<float>(values),
                             ptr<const int64_t>(frequencies), ptr<int64_t>(row_ids));
  });
}

int sokev_table_find(void* handle, uint64_t keys, int64_t n, uint64_t values, uint64_t found,
                     int initial_for_missing, uint64_t stream) {
  return with_table(handle, [&](auto* t, auto* key_type) {
    using Key = std::remove_pointer_t<decltype(key_type)>;
    return t->find(context_for(stream), ptr<const Key>(keys), n, ptr<float>(values),
                   ptr<bool>(found), initial_for_missing != 0);
  });
}

int sokev_table_insert_or_assign(void* handle, uint64_t keys, int64_t n, uint64_t rows,
                                 uint64_t frequencies, uint64_t versions, uint64_t stream) {
  return with_table(handle, [&](auto* t, auto* key_type) {
    using Key = std::remove_pointer_t<decltype(key_type)>;
    return t->insert_or_assign(context_for(stream), ptr<const Key>(keys), n, ptr<const float>(rows),
                               ptr<const int64_t>(frequencies), ptr<const int64_t>(versions));
  });
}

int sokev_table_erase(void* handle, uint64_t keys, int64_t n, uint64_t stream,
                      int64_t* num_erased) {
  return with_table(handle, [&](auto* t, auto* key_type) {
    using Key = std::remove_pointer_t<decltype(key_type)>;
    return t->erase(context_for(stream), ptr<const Key>(keys), n, num_erased);
  });
}

int sokev_table_find_or_insert_rows(void* handle, uint64_t keys, int64_t n, uint64_t count,
                                    uint64_t row_ids, uint64_t stream) {
  return with_table(handle, [&](auto* t, auto* key_type) {
    using Key = std::remove_pointer_t<decltype(key_type)>;
    return t->find_or_insert_rows(context_for(stream), ptr<const Key>(keys), n,
                                  ptr<const int64_t>(count), ptr<int64_t>(row_ids));
  });
}

int sokev_table_export(void* handle, uint64_t keys, uint64_t rows, uint64_t frequencies,
                       uint64_t versions, int64_t capacity, uint64_t stream, int64_t* count) {
  return with_table(handle, [&](auto* t, auto* key_type) {
    using Key = std::remove_pointer_t<decltype(key_type)>;
    return t->export_all(context_for(stream), ptr<Key>(keys), ptr<float>(rows),
                         ptr<int64_t>(frequencies), ptr<int64_t>(versions), capacity, count);
  });
}

int sokev_table_evict(void* handle, int64_t global_step, int64_t steps_to_live, uint64_t stream,
                      int64_t* evicted) {
  return with_table(handle, [&](auto* t, auto*) {
    return t->evict_stale(context_for(stream), global_step, steps_to_live, evicted);
  });
}

int sokev_unique(int key_bits, uint64_t keys, int64_t n, uint64_t unique_keys, uint64_t inverse,
                 uint64_t counts, uint64_t num_unique, uint64_t stream) {
  if (key_bits == 32) {
    gpu::unique_keys(context_for(stream), ptr<const int32_t>(keys), n, ptr<int32_t>(unique_keys),
                     ptr<int64_t>(inverse), ptr<int64_t>(counts), ptr<int64_t>(num_unique));
  } else {
    gpu::unique_keys(context_for(stream), ptr<const int64_t>(keys), n, ptr<int64_t>(unique_keys),
                     ptr<int64_t>(inverse), ptr<int64_t>(counts), ptr<int64_t>(num_unique));
  }
  return report_pending();
}

int sokev_partition(int key_bits, uint64_t keys, int64_t n, int num_workers, uint64_t keys_by_owner,
                    uint64_t positions, uint64_t counts, uint64_t stream) {
  if (key_bits == 32) {
    gpu::partition_by_owner(context_for(stream), ptr<const int32_t>(keys), n, num_workers,
                            ptr<int32_t>(keys_by_owner), ptr<int64_t>(positions),
                            ptr<int64_t>(counts));
  } else {
    gpu::partition_by_owner(context_for(stream), ptr<const int64_t>(keys), n, num_workers,
                            ptr<int64_t>(keys_by_owner), ptr<int64_t>(positions),
                            ptr<int64_t>(counts));
  }
  return report_pending();
}

// sample_ids: (nnz * stride,) device.
int sokev_row_offsets(uint64_t sample_ids, int64_t stride, int64_t nnz, int64_t batch,
                      uint64_t row_offsets, uint64_t stream) {
  const gpu::SampleIds table{ptr<const int64_t>(sample_ids), stride, nnz, batch,
                             ptr<int64_t>(row_offsets)};
  gpu::row_offsets_from_sample_ids(context_for(stream), &table, 1, /*first_invalid=*/nullptr);
  return report_pending();
}

int sokev_combine_forward(uint64_t unique_values, uint64_t unique_index, uint64_t weights,
                          uint64_t row_offsets, int64_t batch, int64_t dim, int combiner,
                          uint64_t out, uint64_t stream) {
  gpu::combine_forward(context_for(stream), ptr<const float>(unique_values),
                       ptr<const int64_t>(unique_index), ptr<const float>(weights),
                       ptr<const int64_t>(row_offsets), batch, dim, static_cast<Combiner>(combiner),
                       ptr<float>(out));
  return report_pending();
}

int sokev_combine_backward(uint64_t grad_out, uint64_t order, uint64_t segments, int64_t num_unique,
                           uint64_t weights, uint64_t row_offsets, int64_t batch, int64_t nnz,
                           int64_t dim, int combiner, uint64_t grad_unique, uint64_t stream) {
  gpu::combine_backward(context_for(stream), ptr<const float>(grad_out), ptr<const int64_t>(order),
                        ptr<const int64_t>(segments), num_unique, ptr<const float>(weights),
                        ptr<const int64_t>(row_offsets), batch, nnz, dim,
                        static_cast<Combiner>(combiner), ptr<float>(grad_unique));
  return report_pending();
}

// key_offsets: (num_tables + 1,) device.
int sokev_unique_grouped(int key_bits, uint64_t keys, int64_t n, uint64_t key_offsets,
                         int num_tables, uint64_t unique_keys, uint64_t counts, uint64_t inverse,
                         uint64_t order, uint64_t segments, uint64_t unique_offsets,
                         uint64_t stream) {
  if (key_bits == 32) {
    gpu::unique_keys_grouped(context_for(stream), ptr<const int32_t>(keys), n,
                             ptr<const int64_t>(key_offsets), num_tables, ptr<int32_t>(unique_keys),
                             ptr<int64_t>(counts), ptr<int64_t>(inverse), ptr<int64_t>(order),
                             ptr<int64_t>(segments), ptr<int64_t>(unique_offsets));
  } else {
    gpu::unique_keys_grouped(context_for(stream), ptr<const int64_t>(keys), n,
                             ptr<const int64_t>(key_offsets), num_tables, ptr<int64_t>(unique_keys),
                             ptr<int64_t>(counts), ptr<int64_t>(inverse), ptr<int64_t>(order),
                             ptr<int64_t>(segments), ptr<int64_t>(unique_offsets));
  }
  return report_pending();
}

// key_offsets: (num_tables + 1,), run_offsets: (num_tables * num_runs + 1,),
// unsorted: (1,); all device.
int sokev_unique_of_runs_grouped(int key_bits, uint64_t keys, int64_t n, uint64_t key_offsets,
                                 uint64_t run_offsets, int num_tables, int num_runs,
                                 uint64_t unique_keys, uint64_t counts, uint64_t inverse,
                                 uint64_t order, uint64_t segments, uint64_t unique_offsets,
                                 uint64_t unsorted, uint64_t stream) {
  if (key_bits == 32) {
    gpu::unique_keys_of_runs_grouped(
        context_for(stream), ptr<const int32_t>(keys), n, ptr<const int64_t>(key_offsets),
        ptr<const int64_t>(run_offsets), num_tables, num_runs, ptr<int32_t>(unique_keys),
        ptr<int64_t>(counts), ptr<int64_t>(inverse), ptr<int64_t>(order), ptr<int64_t>(segments),
        ptr<int64_t>(unique_offsets), ptr<int64_t>(unsorted));
  } else {
    gpu::unique_keys_of_runs_grouped(
        context_for(stream), ptr<const int64_t>(keys), n, ptr<const int64_t>(key_offsets),
        ptr<const int64_t>(run_offsets), num_tables, num_runs, ptr<int64_t>(unique_keys),
        ptr<int64_t>(counts), ptr<int64_t>(inverse), ptr<int64_t>(order), ptr<int64_t>(segments),
        ptr<int64_t>(unique_offsets), ptr<int64_t>(unsorted));
  }
  return report_pending();
}

// sample_ids: (num_tables,) host array of device addresses; nnz, batch:
// (num_tables,) host; first_invalid: (num_tables,) device.
int sokev_first_invalid_sample_ids(const uint64_t* sample_ids, const int64_t* nnz,
                                   const int64_t* batch, int num_tables, uint64_t first_invalid,
                                   uint64_t stream) {
  std::vector<gpu::SampleIds> tables(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    tables[t] = {ptr<const int64_t>(sample_ids[t]), 1, nnz[t], batch[t], /*row_offsets=*/nullptr};
  }
  gpu::row_offsets_from_sample_ids(context_for(stream), tables.data(), num_tables,
                                   ptr<int64_t>(first_invalid));
  return report_pending();
}

int sokev_unique_segmented(int key_bits, uint64_t keys, int64_t n, uint64_t unique_keys,
                           uint64_t inverse, uint64_t order, uint64_t segments, uint64_t num_unique,
                           uint64_t stream) {
  if (key_bits == 32) {
    gpu::unique_keys_segmented(context_for(stream), ptr<const int32_t>(keys), n,
                               ptr<int32_t>(unique_keys), ptr<int64_t>(inverse),
                               ptr<int64_t>(order), ptr<int64_t>(segments),
                               ptr<int64_t>(num_unique));
  } else {
    gpu::unique_keys_segmented(context_for(stream), ptr<const int64_t>(keys), n,
                               ptr<int64_t>(unique_keys), ptr<int64_t>(inverse),
                               ptr<int64_t>(order), ptr<int64_t>(segments),
                               ptr<int64_t>(num_unique));
  }
  return report_pending();
}

int sokev_table_rows_for_ids(void* handle, uint64_t row_ids, int64_t n, int64_t global_step,
                             uint64_t rows, uint64_t stream) {
  return with_table(handle, [&](auto* t, auto*) {
    return t->rows_for_ids(context_for(stream), ptr<const int64_t>(row_ids), n, global_step,
                           ptr<float*>(rows));
  });
}

int sokev_lookup_combine_rows(void* handle, uint64_t row_ids, uint64_t inverse, uint64_t weights,
                              uint64_t row_offsets, int64_t batch, int combiner, uint64_t out,
                              uint64_t stream) {
  return with_table(handle, [&](auto* t, auto*) {
    return gpu::lookup_combine_rows(context_for(stream), *t, ptr<const int64_t>(row_ids),
                                    ptr<const int64_t>(inverse), ptr<const float>(weights),
                                    ptr<const int64_t>(row_offsets), batch,
                                    static_cast<Combiner>(combiner), ptr<float>(out));
  });
}

int sokev_backward_apply(void* handle, int kind, const float* hyper, const int* flags,
                         uint64_t grad_out, uint64_t weights, uint64_t row_offsets, int64_t batch,
                         int64_t nnz, int combiner, uint64_t order, uint64_t segments,
                         uint64_t num_unique, int64_t max_unique, int64_t max_key_entries,
                         uint64_t row_ids, int64_t global_step, uint64_t stream) {
  const sok_ev::OptimizerSpec spec = optimizer_spec(kind, hyper, flags);
  return with_table(handle, [&](auto* t, auto*) {
    return gpu::combine_backward_apply(
        context_for(stream), *t, spec, ptr<const float>(grad_out), ptr<const float>(weights),
        ptr<const int64_t>(row_offsets), batch, nnz, static_cast<Combiner>(combiner),
        ptr<const int64_t>(order), ptr<const int64_t>(segments), ptr<const int64_t>(num_unique),
        max_unique, max_key_entries, ptr<const int64_t>(row_ids), global_step);
  });
}

// Waits for the stream and reports any asynchronous kernel fault.
// The compressed exchange's element conversion (gpu::copy_rows, one block of
// n elements). format: 0 bfloat16, 1 float16; narrow: float -> 16 bits,
// else 16 bits -> float.
int sokev_convert_16(int format, int narrow, uint64_t src, int64_t n, uint64_t dst,
                     uint64_t stream) {
  const GpuContext context = context_for(stream);
  auto run = [&](auto bits) {
    using Bits = decltype(bits);
    if (narrow) {
      gpu::copy_rows<float, Bits>(
          context, {{ptr<const float>(src), nullptr, 1, ptr<Bits>(dst), nullptr, 1, n, 1}});
    } else {
      gpu::copy_rows<Bits, float>(
          context, {{ptr<const Bits>(src), nullptr, 1, ptr<float>(dst), nullptr, 1, n, 1}});
    }
  };
  if (format == 0) {
    run(sok_ev::Bfloat16Bits());
  } else {
    run(sok_ev::Float16Bits());
  }
  return report_pending();
}

// A GPU table of int64 keys with HBM_DRAM storage (cc/tiered_table_gpu.h):
// hbm_bytes of HBM (0: all in HBM), cache_strategy 0 (LRU) or 1 (LFU),
// zero initial values. *hbm gets a handle of its HBM tier for the
// sokev_table_* calls (valid while the tiered table lives).
int sokev_tiered_create(int64_t dim, int64_t hbm_bytes, int cache_strategy, uint64_t stream,
                        void** out, void** hbm) {
  sok_ev::StorageSpec storage;
  storage.hbm_bytes = hbm_bytes;
  storage.cache_strategy = static_cast<sok_ev::CacheStrategy>(cache_strategy);
  gpu::TieredTable<int64_t>* table = nullptr;
  const Status status =
      gpu::TieredTable<int64_t>::Create(context_for(stream), dim, sok_ev::InitializerSpec(),
                                        gpu::HashTableOptions(), storage, "harness", &table);
  *out = *hbm = nullptr;
  if (!status.ok()) return report(status);
  TieredHandle* handle = new TieredHandle{table, TableHandle{64, &table->hbm()}};
  *out = handle;
  *hbm = &handle->hbm;
  return 0;
}

int sokev_tiered_destroy(void* handle) {
  TieredHandle* h = static_cast<TieredHandle*>(handle);
  delete h->table;
  delete h;
  return 0;
}

int sokev_tiered_add_slot(void* handle, const char* name, float initial_value, uint64_t stream,
                          int* index) {
  return report(static_cast<TieredHandle*>(handle)->table->add_slot(context_for(stream), name,
                                                                    initial_value, index));
}

int sokev_tiered_insert_or_assign(void* handle, uint64_t keys, int64_t n, uint64_t rows,
                                  uint64_t frequencies, uint64_t versions, int threads,
                                  uint64_t stream) {
  const sok_ev::CpuContext host = threads_context(threads);
  GpuContext context = context_for(stream);
  context.host = &host;
  return report(static_cast<TieredHandle*>(handle)->table->insert_or_assign(
      context, ptr<const int64_t>(keys), n, ptr<const float>(rows), ptr<const int64_t>(frequencies),
      ptr<const int64_t>(versions)));
}

// TieredTable::make_resident_together over `count` tables: table i's keys[i]
// (n[i] keys, device memory), the host tier's work on `threads` threads.
int sokev_tiered_make_resident(void* const* handles, const uint64_t* keys, const int64_t* n,
                               int count, int threads, uint64_t stream) {
  std::vector<gpu::TieredTable<int64_t>::Residency> tables;
  for (int i = 0; i < count; ++i) {
    tables.push_back({static_cast<TieredHandle*>(handles[i])->table,
                      {gpu::KeySpan<int64_t>{ptr<const int64_t>(keys[i]), n[i]}}});
  }
  const sok_ev::CpuContext host = threads_context(threads);
  GpuContext context = context_for(stream);
  context.host = &host;
  return report(gpu::TieredTable<int64_t>::make_resident_together(context, tables));
}

// The table's TierCounters, in the order of their fields (kFields int64).
int sokev_tiered_counters(void* handle, uint64_t stream, int64_t* out) {
  sok_ev::TierCounters counters;
  const Status status =
      static_cast<TieredHandle*>(handle)->table->counters(context_for(stream), &counters);
  if (!status.ok()) return report(status);
  counters.to_fields(out);
  return 0;
}

int sokev_sync(uint64_t stream) {
  return report(
      gpu::cuda_status(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "sync"));
}

}  // extern "C"
