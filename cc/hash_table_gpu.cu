// gpu::HashTable: see cc/hash_table_gpu.h for the layout and the protocol.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "cc/hash_table_gpu.h"
#include "cc/hash_table_probe_gpu.h"
#include "cc/status_gpu.h"
#include "cc/table_launch_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Pops an erased row from the free stack, else takes a fresh arena row.
// Only pops run during an insert launch (erase and evict launches push), so
// a fetch-and-decrement hands each popper its own entry with one atomic; a
// popper that took the count below zero gives its decrement back. (A
// compare-and-swap loop cost O(poppers^2) attempts on one word: bringing
// 19,640 rows a table back from host memory took 40 ms a table, H200,
// 2026-11-29.) With the stack empty (no erase since the last pops, the
// usual case) it costs one load and no atomic on the count.
__device__ __forceinline__ int32_t allocate_row(TableCounters* counters, const int32_t* free_rows) {
  unsigned long long* count = reinterpret_cast<unsigned long long*>(&counters->free_rows);
  if (*reinterpret_cast<volatile long long*>(&counters->free_rows) > 0) {
    const long long before = static_cast<long long>(atomicAdd(count, ~0ULL));  // minus one
    if (before > 0) return free_rows[before - 1];
    atomicAdd(count, 1ULL);
  }
  return static_cast<int32_t>(atomicAdd(&counters->next_row, 1ULL));
}

__global__ void set_used_slots(TableCounters* counters) { counters->used_slots = counters->size; }

// Finds `key` or inserts it with its initial row; the whole group gets the
// row (-1 only when no slot is free, which prepare_inserts rules out).
//
// Publish protocol: an inserter claims a slot (CAS to kLockedSlot), writes
// the key, the counters and the whole initial row, then releases (fence)
// and publishes the row id in the state. A reader loads states relaxed,
// fences (acquire) and only then loads keys, so a published state is never
// paired with a stale key; the keys' line is prefetched first so that
// ordered read hits L2 rather than costing a second DRAM round trip.
template <typename Key>
__device__ int32_t group_find_or_claim(const TableView<Key>& table, TableCounters* counters,
                                       const int32_t* free_rows, const ProbeGroup<Key>& g,
                                       Key key) {
  constexpr int kK = ProbeGroup<Key>::kKeysPerLane;
  for (;;) {
    uint64_t bucket = bucket_hash(key) & table.bucket_mask;
    int64_t free_slot = -1;
    int32_t free_state = 0;
    for (uint64_t probe = 0; probe <= table.bucket_mask;) {
      const uint64_t slot = bucket * kBucketSlots + g.rank * kK;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(table.keys + slot));
      LaneSlots<Key> s;
      load_lane_states_relaxed(table.states + slot, s);
      fence_acq_rel();
      load_lane_keys(table.keys + slot, true, s);
      int32_t row = -1, lane_free_state = 0;
      int lane_free = -1;
      bool locked = false, empty = false;
#pragma unroll
      for (int j = kK - 1; j >= 0; --j) {
        if (s.states[j] >= 0 && s.keys[j] == key) row = s.states[j];
        locked |= s.states[j] == kLockedSlot;
        empty |= s.states[j] == kEmptySlot;
        if (s.states[j] == kEmptySlot || s.states[j] == kErasedSlot) {
          lane_free = j;
          lane_free_state = s.states[j];
        }
      }
      const unsigned hits = g.ballot(row >= 0);
      if (hits != 0) return g.shfl(row, __ffs(hits) - 1);
      // A slot being filled may be our key: read the bucket again.
      if (g.ballot(locked) != 0) {
        __nanosleep(64);
        continue;
      }
      if (free_slot < 0) {
        const unsigned frees = g.ballot(lane_free >= 0);
        if (frees != 0) {
          const int src = __ffs(frees) - 1;
          free_slot =
              static_cast<int64_t>(bucket * kBucketSlots) + src * kK + g.shfl(lane_free, src);
          free_state = g.shfl(lane_free_state, src);
        }
      }
      if (g.ballot(empty) != 0) break;
      bucket = (bucket + 1) & table.bucket_mask;
      ++probe;
    }
    if (free_slot < 0) return -1;
    int won = 0;
    if (g.rank == 0) {
      won = atomicCAS(table.states + free_slot, free_state, kLockedSlot) == free_state;
    }
    if (!g.shfl(won, 0)) continue;  // someone else took it: probe again
    int32_t row = 0;
    if (g.rank == 0) {
      table.keys[free_slot] = key;
      row = allocate_row(counters, free_rows);
      table.frequencies[row] = 0;
      table.versions[row] = 0;
      if (free_state == kEmptySlot) atomicAdd(&counters->used_slots, 1ULL);
      atomicAdd(&counters->size, 1ULL);
    }
    row = g.shfl(row, 0);
    // The initial row, written before the publish so that duplicates of the
    // key in this launch copy initialized values.
    float* values = table.rows + static_cast<int64_t>(row) * table.row_width;
    for (int64_t c = g.rank; c < table.dim; c += ProbeGroup<Key>::kLanes) {
      values[c] = initial_value_at(table.initializer, key, c, table.dim);
    }
    for (int slot = 0; slot < table.num_slots; ++slot) {
      float* slot_row = values + (1 + slot) * table.dim;
      for (int64_t c = g.rank; c < table.dim; c += ProbeGroup<Key>::kLanes) {
        slot_row[c] = table.slot_initial[slot];
      }
    }
    fence_acq_rel();  // release this lane's writes...
    __syncwarp(g.mask);
    if (g.rank == 0) {
      fence_acq_rel();  // ...and, after the barrier, the group's
      atomicExch(table.states + free_slot, row);
    }
    return row;
  }
}

// The group copies a row's value columns to out (dim floats); zeros when
// row < 0. kCoherent: read through L2 (rows written during the launch).
template <typename Key, bool kCoherent>
__device__ __forceinline__ void group_copy_value(const TableView<Key>& table,
                                                 const ProbeGroup<Key>& g, int32_t row,
                                                 float* out) {
  constexpr int kLanes = ProbeGroup<Key>::kLanes;
  const int64_t dim = table.dim;
  const float* source = table.rows + static_cast<int64_t>(row) * table.row_width;
  if ((dim & 3) == 0) {
    for (int64_t c = g.rank * 4; c < dim; c += kLanes * 4) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row >= 0) {
        const float4* p = reinterpret_cast<const float4*>(source + c);
        v = kCoherent ? __ldcg(p) : __ldg(p);
      }
      *reinterpret_cast<float4*>(out + c) = v;
    }
  } else {
    for (int64_t c = g.rank; c < dim; c += kLanes) {
      out[c] = row < 0 ? 0.0f : (kCoherent ? __ldcg(source + c) : __ldg(source + c));
    }
  }
}

// One table's keys in an insert_kernel launch (FindOrInsertJob, with the
// table's view, counters and free rows).
template <typename Key>
struct InsertTable {
  TableView<Key> table;
  TableCounters* counters;
  const int32_t* free_rows;
  const Key* keys;  // (n,)
  int64_t n;
  const int64_t* count;        // device, or null: only the first min(n, *count) keys
  const int64_t* frequencies;  // (n,) or null
  int64_t* row_ids;            // (n,) out or null
  float* values;               // (n, dim) out or null
  bool count_frequency;
};

// One group of ProbeGroup<Key>::kLanes lanes per key: finds or inserts it,
// counts its frequency and copies its value out. blockIdx.y picks the table
// (cc/table_launch_gpu.h).
template <typename Key>
__global__ void __launch_bounds__(256) insert_kernel(LaunchTables<InsertTable<Key>> inserts) {
  constexpr int kLanes = ProbeGroup<Key>::kLanes;
  const InsertTable<Key>& insert = inserts.at[blockIdx.y];
  const TableView<Key>& table = insert.table;
  const ProbeGroup<Key> g;
  const int64_t stride = (int64_t(gridDim.x) * blockDim.x) / kLanes;
  const int64_t n = insert.n;
  const int64_t limit = insert.count != nullptr && *insert.count < n ? *insert.count : n;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes; i < limit;
       i += stride) {
    const Key key = insert.keys[i];
    const int32_t row = group_find_or_claim(table, insert.counters, insert.free_rows, g, key);
    if (g.rank == 0) {
      if (insert.row_ids != nullptr) insert.row_ids[i] = row;
      if (insert.count_frequency && row >= 0) {
        const long long add = insert.frequencies != nullptr ? insert.frequencies[i] : 1;
        atomicAdd(reinterpret_cast<unsigned long long*>(table.frequencies + row),
                  static_cast<unsigned long long>(add));
      }
    }
    if (insert.values != nullptr) {
      group_copy_value<Key, true>(table, g, row, insert.values + i * table.dim);
    }
  }
}

// Where a table's counters go after an insert: pinned host memory.
struct CounterCopy {
  const TableCounters* from;  // device
  TableCounters* to;          // pinned host, as the device addresses it
};

// Thread t copies table t's counters.
__global__ void copy_counters_kernel(LaunchTables<CounterCopy> copies, int count) {
  if (static_cast<int>(threadIdx.x) < count) {
    *copies.at[threadIdx.x].to = *copies.at[threadIdx.x].from;
  }
}

// One group per key: probe, then copy the value (or zeros / the initial
// value when absent) in the same kernel.
//   keys: (n,)  values: (n, dim) out  found: (n,) out or null
template <typename Key>
__global__ void __launch_bounds__(256)
    find_kernel(TableView<Key> table, const Key* keys, int64_t n, float* values, bool* found,
                bool initial_for_missing) {
  constexpr int kLanes = ProbeGroup<Key>::kLanes;
  const ProbeGroup<Key> g;
  const int64_t stride = (int64_t(gridDim.x) * blockDim.x) / kLanes;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes; i < n; i += stride) {
    const Key key = keys[i];
    const int32_t row = group_find_row(table, g, key);
    if (found != nullptr && g.rank == 0) found[i] = row >= 0;
    float* out = values + i * table.dim;
    if (row >= 0 || !initial_for_missing) {
      group_copy_value<Key, false>(table, g, row, out);
    } else {
      for (int64_t c = g.rank; c < table.dim; c += kLanes) {
        out[c] = initial_value_at(table.initializer, key, c, table.dim);
      }
    }
  }
}

// Counts the keys (the first *count when count is set) that are not present
// into counters->absent; a key repeated in the batch counts each time, which
// keeps the count an upper bound of the keys an insert adds.
template <typename Key>
__global__ void __launch_bounds__(256)
    count_absent_kernel(TableView<Key> table, TableCounters* counters, const Key* keys, int64_t n,
                        const int64_t* count) {
  constexpr int kLanes = ProbeGroup<Key>::kLanes;
  const ProbeGroup<Key> g;
  const int64_t stride = (int64_t(gridDim.x) * blockDim.x) / kLanes;
  const int64_t limit = count != nullptr && *count < n ? *count : n;
  unsigned long long absent = 0;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kLanes; i < limit;
       i += stride) {
    if (group_find_row(table, g, keys[i]) < 0 && g.rank == 0) ++absent;
  }
  if (absent > 0) atomicAdd(&counters->absent, absent);
}

//   rows: (n, row_width) source rows  frequencies, versions: (n,) or null
template <typename Key>
__global__ void assign_rows_kernel(TableView<Key> table, int64_t n, const int64_t* row_ids,
                                   const float* rows, const int64_t* frequencies,
                                   const int64_t* versions) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; i < n;
       i += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t row_id = row_ids[i];
    if (row_id < 0) continue;  // no free slot (prepare_inserts prevents it)
    float* destination = table.rows + row_id * table.row_width;
    const float* source = rows + i * table.row_width;
    for (int64_t c = lane; c < table.row_width; c += 32) destination[c] = source[c];
    if (lane == 0) {
      if (frequencies != nullptr) table.frequencies[row_id] = frequencies[i];
      if (versions != nullptr) table.versions[row_id] = versions[i];
    }
  }
}

//   row_ids: (n,)  rows: (n,) out, full-row pointers
template <typename Key>
__global__ void row_pointers_kernel(TableView<Key> table, int64_t n, const int64_t* row_ids,
                                    int64_t global_step, float** rows) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row_id = row_ids[i];
    rows[i] = row_id < 0 ? nullptr : table.rows + row_id * table.row_width;
    if (row_id >= 0) table.versions[row_id] = global_step;
  }
}

// Turns an occupied slot into a tombstone and frees its row.
__device__ __forceinline__ bool release_slot(int32_t* state, int32_t row, TableCounters* counters,
                                             int32_t* free_rows) {
  if (atomicCAS(state, row, kErasedSlot) != row) return false;
  const unsigned long long top =
      atomicAdd(reinterpret_cast<unsigned long long*>(&counters->free_rows), 1ULL);
  free_rows[top] = row;
  atomicAdd(&counters->size, static_cast<unsigned long long>(-1LL));
  return true;
}

//   keys: (n,)  erased: (1,) device counter
template <typename Key>
__global__ void erase_kernel(TableView<Key> table, TableCounters* counters, int32_t* free_rows,
                             const Key* keys, int64_t n, unsigned long long* erased) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const Key key = keys[i];
    uint64_t bucket = bucket_hash(key) & table.bucket_mask;
    for (uint64_t probe = 0; probe <= table.bucket_mask; ++probe) {
      const uint64_t first = bucket * kBucketSlots;
      int32_t states[kBucketSlots];
      load_bucket_states<true>(table.states + first, states);
      Key bucket_keys[kBucketSlots];
      load_bucket_keys<Key, true>(table.keys + first, bucket_keys);
      bool done = false;
#pragma unroll
      for (int s = 0; s < kBucketSlots; ++s) {
        if (!done && states[s] >= 0 && bucket_keys[s] == key) {
          // A duplicate of this key in the batch may win the swap instead.
          if (release_slot(table.states + first + s, states[s], counters, free_rows)) {
            atomicAdd(erased, 1ULL);
          }
          done = true;
        }
        done |= states[s] == kEmptySlot;
      }
      if (done) break;
      bucket = (bucket + 1) & table.bucket_mask;
    }
  }
}

// Reinserts every occupied slot of the old index into the new one.
template <typename Key>
__global__ void rehash_kernel(const Key* old_keys, const int32_t* old_states, int64_t old_slots,
                              Key* new_keys, int32_t* new_states, uint64_t new_mask) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < old_slots;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t row = old_states[i];
    if (row < 0) continue;
    const Key key = old_keys[i];
    uint64_t bucket = bucket_hash(key) & new_mask;
    for (;;) {
      const uint64_t first = bucket * kBucketSlots;
      bool placed = false;
      for (int s = 0; s < kBucketSlots && !placed; ++s) {
        // Keys are distinct here, so the first empty slot will do.
        if (atomicCAS(new_states + first + s, kEmptySlot, row) == kEmptySlot) {
          new_keys[first + s] = key;
          placed = true;
        }
      }
      if (placed) break;
      bucket = (bucket + 1) & new_mask;
    }
  }
}

//   out_keys, out_row_ids: (capacity,)  cursor: (1,) device
template <typename Key>
__global__ void compact_slots_kernel(TableView<Key> table, int64_t slots, Key* out_keys,
                                     int64_t* out_row_ids, int64_t capacity,
                                     unsigned long long* cursor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < slots;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t row = table.states[i];
    if (row < 0) continue;
    const unsigned long long position = atomicAdd(cursor, 1ULL);
    if (position < static_cast<unsigned long long>(capacity)) {
      out_keys[position] = table.keys[i];
      out_row_ids[position] = row;
    }
  }
}

//   row_ids: (n,)  rows: (n, row_width) out  frequencies, versions: (n,) out or null
template <typename Key>
__global__ void export_rows_kernel(TableView<Key> table, int64_t n, const int64_t* row_ids,
                                   float* rows, int64_t* frequencies, int64_t* versions) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; i < n;
       i += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t row_id = row_ids[i];
    const float* source = table.rows + row_id * table.row_width;
    if (rows != nullptr) {
      float* destination = rows + i * table.row_width;
      for (int64_t c = lane; c < table.row_width; c += 32) destination[c] = source[c];
    }
    if (lane == 0) {
      if (frequencies != nullptr) frequencies[i] = table.frequencies[row_id];
      if (versions != nullptr) versions[i] = table.versions[row_id];
    }
  }
}

template <typename Key>
__global__ void evict_kernel(TableView<Key> table, TableCounters* counters, int32_t* free_rows,
                             int64_t slots, int64_t oldest_version, unsigned long long* evicted) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < slots;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t row = table.states[i];
    if (row < 0 || table.versions[row] >= oldest_version) continue;
    if (release_slot(table.states + i, row, counters, free_rows)) {
      atomicAdd(evicted, 1ULL);
    }
  }
}

// Sets column block [first_column, first_column + dim) of rows to value.
__global__ void fill_slot_kernel(float* rows, int64_t num_rows, int64_t row_width,
                                 int64_t first_column, int64_t dim, float value) {
  const int64_t total = num_rows * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    rows[(e / dim) * row_width + first_column + e % dim] = value;
  }
}

int64_t next_power_of_two(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace

template <typename Key>
HashTable<Key>::HashTable(int64_t dim, const InitializerSpec& initializer,
                          const HashTableOptions& options, DeviceAllocator* allocator)
    : dim_(dim), initializer_(initializer), options_(options), allocator_(allocator) {}

template <typename Key>
void* HashTable<Key>::allocate(size_t bytes) {
  if (bytes == 0) bytes = 16;
  if (allocator_ != nullptr) return allocator_->allocate(bytes);
  void* pointer = nullptr;
  if (cudaMalloc(&pointer, bytes) != cudaSuccess) return nullptr;
  return pointer;
}

template <typename Key>
void HashTable<Key>::deallocate(void* pointer) {
  if (pointer == nullptr) return;
  if (allocator_ != nullptr) {
    allocator_->deallocate(pointer);
  } else {
    cudaFree(pointer);
  }
}

// Old buffers are freed while the copy out of them is queued: safe when the
// allocator orders reuse on this stream. cudaFree synchronises by itself,
// but not with kernels on a non-blocking stream, and on a side stream the
// allocator's reuse is ordered on the home stream only: then wait first.
template <typename Key>
Status HashTable<Key>::wait_before_free(const GpuContext& context) {
  if (allocator_ != nullptr && context.home_stream == nullptr) return Status::Ok();
  return synchronize(stream_of(context));
}

template <typename Key>
Status HashTable<Key>::Create(const GpuContext& context, int64_t dim,
                              const InitializerSpec& initializer, const HashTableOptions& options,
                              HashTable** table) {
  *table = nullptr;
  if (dim < 1 || dim > 1024) {
    return Status::InvalidArgument("dim must be in [1, 1024], got " + std::to_string(dim));
  }
  if (!(options.max_load_factor > 0.0f && options.max_load_factor <= 0.95f)) {
    return Status::InvalidArgument("max_load_factor must be in (0, 0.95]");
  }
  if (initializer.kind == InitializerSpec::Kind::kDefaultValueMatrix &&
      (initializer.default_values == nullptr || initializer.default_value_dim <= 0)) {
    return Status::InvalidArgument(
        "kDefaultValueMatrix needs default_values and default_value_dim > 0");
  }
  HashTable* created = new HashTable(dim, initializer, options, context.allocator);
  cudaStream_t stream = stream_of(context);
  auto fail = [&](Status status) {
    delete created;
    return status;
  };
  if (initializer.kind == InitializerSpec::Kind::kDefaultValueMatrix) {
    const size_t bytes = initializer.default_value_dim * dim * sizeof(float);
    created->default_values_ = static_cast<float*>(created->allocate(bytes));
    if (created->default_values_ == nullptr) {
      return fail(Status::Internal("out of device memory (default values)"));
    }
    Status copied =
        cuda_status(cudaMemcpyAsync(created->default_values_, initializer.default_values, bytes,
                                    cudaMemcpyDeviceToDevice, stream),
                    "copy default values");
    if (!copied.ok()) return fail(copied);
    created->initializer_.default_values = created->default_values_;
  }
  created->counters_ = static_cast<TableCounters*>(created->allocate(sizeof(TableCounters)));
  if (created->counters_ == nullptr) return fail(Status::Internal("out of device memory"));
  Status zeroed = cuda_status(cudaMemsetAsync(created->counters_, 0, sizeof(TableCounters), stream),
                              "zero counters");
  if (!zeroed.ok()) return fail(zeroed);
  const int64_t capacity = std::max<int64_t>(options.initial_capacity, 1024);
  const int64_t buckets = next_power_of_two(
      static_cast<int64_t>(std::ceil(capacity / (options.max_load_factor * kBucketSlots))));
  Status status = created->rehash(context, buckets);
  if (status.ok()) status = created->grow_arena(context, capacity, dim);
  if (!status.ok()) return fail(status);
  *table = created;
  return Status::Ok();
}

template <typename Key>
HashTable<Key>::~HashTable() {
  for (CounterSnapshot& snapshot : snapshots_) {
    if (snapshot.event != nullptr) {
      cudaEvent_t event = static_cast<cudaEvent_t>(snapshot.event);
      cudaEventSynchronize(event);  // the copy into snapshot.host has landed
      cudaEventDestroy(event);
    }
    if (snapshot.host != nullptr) cudaFreeHost(snapshot.host);
  }
  if (exact_counters_ != nullptr) cudaFreeHost(exact_counters_);
  deallocate(keys_);
  deallocate(states_);
  deallocate(arena_);
  deallocate(frequencies_);
  deallocate(versions_);
  deallocate(free_rows_);
  deallocate(counters_);
  deallocate(default_values_);
}

template <typename Key>
TableView<Key> HashTable<Key>::view() const {
  TableView<Key> v;
  v.keys = keys_;
  v.states = states_;
  v.bucket_mask = static_cast<uint64_t>(num_buckets_ - 1);
  v.rows = arena_;
  v.row_width = row_width();
  v.dim = dim_;
  v.frequencies = frequencies_;
  v.versions = versions_;
  v.initializer = initializer_;
  v.num_slots = num_slots();
  for (int s = 0; s < num_slots(); ++s) v.slot_initial[s] = slot_initial_[s];
  return v;
}

template <typename Key>
size_t HashTable<Key>::memory_bytes() const {
  const size_t slots = num_buckets_ * kBucketSlots;
  return slots * (sizeof(Key) + sizeof(int32_t)) +
         row_capacity_ * (row_width() * sizeof(float) + 2 * sizeof(int64_t) + sizeof(int32_t)) +
         sizeof(TableCounters) +
         (default_values_ ? initializer_.default_value_dim * dim_ * sizeof(float) : 0);
}

template <typename Key>
Status HashTable<Key>::read_counters(const GpuContext& context, TableCounters* counters) const {
  cudaStream_t stream = stream_of(context);
  SOK_EV_CUDA_RETURN(
      cudaMemcpyAsync(counters, counters_, sizeof(TableCounters), cudaMemcpyDeviceToHost, stream));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::size(const GpuContext& context, int64_t* size) {
  TableCounters counters;
  SOK_EV_RETURN_IF_ERROR(read_counters(context, &counters));
  *size = static_cast<int64_t>(counters.size);
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::rehash(const GpuContext& context, int64_t num_buckets) {
  cudaStream_t stream = stream_of(context);
  const int64_t slots = num_buckets * kBucketSlots;
  Key* new_keys = static_cast<Key*>(allocate(slots * sizeof(Key)));
  int32_t* new_states = static_cast<int32_t*>(allocate(slots * sizeof(int32_t)));
  if (new_keys == nullptr || new_states == nullptr) {
    deallocate(new_keys);
    deallocate(new_states);
    return Status::Internal("out of device memory growing the index to " + std::to_string(slots) +
                            " slots");
  }
  if (Status ordered = order_after_home(context); !ordered.ok()) {
    deallocate(new_keys);
    deallocate(new_states);
    return ordered;
  }
  // 0xff bytes: every state kEmptySlot.
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(new_states, 0xff, slots * sizeof(int32_t), stream));
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(new_keys, 0, slots * sizeof(Key), stream));
  if (keys_ != nullptr) {
    const int64_t old_slots = num_buckets_ * kBucketSlots;
    rehash_kernel<Key><<<grid_for(old_slots, kThreads), kThreads, 0, stream>>>(
        keys_, states_, old_slots, new_keys, new_states, static_cast<uint64_t>(num_buckets - 1));
    SOK_EV_LAUNCH_CHECK("rehash");
    set_used_slots<<<1, 1, 0, stream>>>(counters_);
    SOK_EV_LAUNCH_CHECK("set_used_slots");
    SOK_EV_RETURN_IF_ERROR(wait_before_free(context));
  }
  deallocate(keys_);
  deallocate(states_);
  keys_ = new_keys;
  states_ = new_states;
  num_buckets_ = num_buckets;
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::grow_arena(const GpuContext& context, int64_t row_capacity,
                                  int64_t new_row_width) {
  cudaStream_t stream = stream_of(context);
  const int64_t old_width = arena_ != nullptr ? row_width() : 0;
  float* arena = static_cast<float*>(allocate(row_capacity * new_row_width * sizeof(float)));
  int64_t* frequencies = static_cast<int64_t*>(allocate(row_capacity * sizeof(int64_t)));
  int64_t* versions = static_cast<int64_t*>(allocate(row_capacity * sizeof(int64_t)));
  int32_t* free_rows = static_cast<int32_t*>(allocate(row_capacity * sizeof(int32_t)));
  if (!arena || !frequencies || !versions || !free_rows) {
    deallocate(arena);
    deallocate(frequencies);
    deallocate(versions);
    deallocate(free_rows);
    return Status::Internal("out of device memory growing the arena to " +
                            std::to_string(row_capacity) + " rows");
  }
  if (Status ordered = order_after_home(context); !ordered.ok()) {
    deallocate(arena);
    deallocate(frequencies);
    deallocate(versions);
    deallocate(free_rows);
    return ordered;
  }
  if (arena_ != nullptr) {
    const int64_t rows = std::min(row_capacity_, row_capacity);
    SOK_EV_CUDA_RETURN(cudaMemcpy2DAsync(arena, new_row_width * sizeof(float), arena_,
                                         old_width * sizeof(float), old_width * sizeof(float), rows,
                                         cudaMemcpyDeviceToDevice, stream));
    SOK_EV_CUDA_RETURN(cudaMemcpyAsync(frequencies, frequencies_, rows * sizeof(int64_t),
                                       cudaMemcpyDeviceToDevice, stream));
    SOK_EV_CUDA_RETURN(cudaMemcpyAsync(versions, versions_, rows * sizeof(int64_t),
                                       cudaMemcpyDeviceToDevice, stream));
    SOK_EV_CUDA_RETURN(cudaMemcpyAsync(free_rows, free_rows_, rows * sizeof(int32_t),
                                       cudaMemcpyDeviceToDevice, stream));
    SOK_EV_RETURN_IF_ERROR(wait_before_free(context));
  }
  deallocate(arena_);
  deallocate(frequencies_);
  deallocate(versions_);
  deallocate(free_rows_);
  arena_ = arena;
  frequencies_ = frequencies;
  versions_ = versions;
  free_rows_ = free_rows;
  row_capacity_ = row_capacity;
  return Status::Ok();
}

// Whether a landed snapshot is there to read; a copy still in flight is not
// an error (its cudaErrorNotReady is cleared so later launch checks pass).
inline bool landed(void* event) {
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (state == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    return false;
  }
  return state == cudaSuccess;
}

template <typename Key>
typename HashTable<Key>::CounterSnapshot* HashTable<Key>::free_snapshot() {
  CounterSnapshot& snapshot = snapshots_[next_snapshot_];
  if (snapshot.host == nullptr) {
    cudaEvent_t event;
    void* device = nullptr;
    // Mapped, so that a kernel writes the copies of many tables at once.
    if (cudaHostAlloc(&snapshot.host, sizeof(TableCounters), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&device, snapshot.host, 0) != cudaSuccess ||
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      if (snapshot.host != nullptr) cudaFreeHost(snapshot.host);
      snapshot.host = nullptr;
      return nullptr;
    }
    snapshot.device = static_cast<TableCounters*>(device);
    snapshot.event = event;
  }
  if (snapshot.taken && !landed(snapshot.event)) return nullptr;  // its copy is still under way
  return &snapshot;
}

template <typename Key>
void HashTable<Key>::snapshot_queued(const GpuContext& context, CounterSnapshot* snapshot) {
  if (cudaEventRecord(static_cast<cudaEvent_t>(snapshot->event), stream_of(context)) !=
      cudaSuccess) {
    cudaGetLastError();
    snapshot->taken = false;
    return;
  }
  snapshot->incoming_total = incoming_total_;
  snapshot->taken = true;
  next_snapshot_ = (next_snapshot_ + 1) % kSnapshots;
}

template <typename Key>
void HashTable<Key>::tighten_bounds() {
  for (const CounterSnapshot& snapshot : snapshots_) {
    if (!snapshot.taken || !landed(snapshot.event)) continue;
    // What the GPU had after that insert, plus every key sent since.
    const int64_t since = incoming_total_ - snapshot.incoming_total;
    used_slots_bound_ =
        std::min(used_slots_bound_, static_cast<int64_t>(snapshot.host->used_slots) + since);
    next_row_bound_ =
        std::min(next_row_bound_, static_cast<int64_t>(snapshot.host->next_row) + since);
  }
}

template <typename Key>
bool HashTable<Key>::bounds_fit(int64_t incoming) {
  auto fit = [&] {
    return used_slots_bound_ + incoming <= slot_limit() &&
           next_row_bound_ + incoming <= row_capacity_;
  };
  if (fit()) return true;
  tighten_bounds();
  return fit();
}

template <typename Key>
double HashTable<Key>::slot_limit() const {
  return options_.max_load_factor * static_cast<double>(num_buckets_ * kBucketSlots);
}

template <typename Key>
Status HashTable<Key>::queue_exact_read(const GpuContext& context, const Key* keys,
                                        int64_t incoming, const int64_t* count,
                                        bool* count_absent) {
  // The bounds assume every key is new. Headroom for that, up to one growth
  // step (the arena's factor; the index doubles), buys sync-free calls
  // later; beyond it (a call's keys are a large share of the table, mostly
  // present after the first step) the table would grow by the whole call.
  // Then count the absent keys, read with the counters, and grow only by
  // those.
  *count_absent =
      next_row_bound_ + incoming > row_capacity_ * static_cast<double>(options_.arena_growth) ||
      used_slots_bound_ + incoming > 2 * slot_limit();
  cudaStream_t stream = stream_of(context);
  if (*count_absent) {
    SOK_EV_CUDA_RETURN(cudaMemsetAsync(&counters_->absent, 0, sizeof(counters_->absent), stream));
    count_absent_kernel<Key>
        <<<grid_for(incoming * ProbeGroup<Key>::kLanes, kThreads), kThreads, 0, stream>>>(
            view(), counters_, keys, incoming, count);
    SOK_EV_LAUNCH_CHECK("count_absent");
  }
  if (exact_counters_ == nullptr &&
      cudaHostAlloc(reinterpret_cast<void**>(&exact_counters_), sizeof(TableCounters),
                    cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    exact_counters_ = nullptr;
    return Status::Internal(
        "find_or_insert: no pinned host memory to read the table's counters into");
  }
  SOK_EV_CUDA_RETURN(cudaMemcpyAsync(exact_counters_, counters_, sizeof(TableCounters),
                                     cudaMemcpyDeviceToHost, stream));
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::size_from_exact_read(const GpuContext& context, int64_t* incoming,
                                            bool count_absent) {
  const TableCounters counters = *exact_counters_;
  // Exact until the insert: the caller's lock keeps other calls out, and
  // the insert follows on this stream.
  if (count_absent) *incoming = std::min(*incoming, static_cast<int64_t>(counters.absent));
  used_slots_bound_ = static_cast<int64_t>(counters.used_slots);
  // Erased rows are handed out before fresh ones, so only the rest take
  // fresh arena rows (a tiered table refills the rows its write-back freed).
  const int64_t reused =
      std::min(*incoming, std::max<int64_t>(0, static_cast<int64_t>(counters.free_rows)));
  // The caller adds *incoming to the bound: it ends at next_row + fresh.
  next_row_bound_ = static_cast<int64_t>(counters.next_row) - reused;
  if (used_slots_bound_ + *incoming > slot_limit()) {
    // Sized from live keys: erased slots are dropped by the rehash.
    const int64_t needed = static_cast<int64_t>(counters.size) + *incoming;
    int64_t buckets = next_power_of_two(
        static_cast<int64_t>(std::ceil(needed / (options_.max_load_factor * kBucketSlots))));
    buckets = std::max(buckets, num_buckets_);
    SOK_EV_RETURN_IF_ERROR(rehash(context, buckets));
    used_slots_bound_ = static_cast<int64_t>(counters.size);
  }
  if (next_row_bound_ + *incoming > row_capacity_) {
    const int64_t needed = next_row_bound_ + *incoming;
    int64_t rows =
        std::max<int64_t>(needed, static_cast<int64_t>(row_capacity_ * options_.arena_growth));
    if (options_.arena_bytes_limit > 0) {
      const int64_t limit = options_.arena_bytes_limit / (row_width() * int64_t{4});
      rows = std::max(needed, std::min(rows, limit));
    }
    if (rows > (int64_t{1} << 31) - 4) {
      return Status::InvalidArgument("table is full: 2^31 rows");
    }
    SOK_EV_RETURN_IF_ERROR(grow_arena(context, rows, row_width()));
  }
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::prepare_inserts(const GpuContext& context, const FindOrInsertJob<Key>* jobs,
                                       const std::vector<size_t>& members) {
  // Per member: its counters read, and its absent keys counted with them.
  std::vector<bool> read(members.size(), false), counted(members.size(), false);
  for (size_t m = 0; m < members.size(); ++m) {
    const FindOrInsertJob<Key>& job = jobs[members[m]];
    if (job.table->bounds_fit(job.n)) continue;
    bool count_absent = false;
    SOK_EV_RETURN_IF_ERROR(
        job.table->queue_exact_read(context, job.keys, job.n, job.count, &count_absent));
    read[m] = true;
    counted[m] = count_absent;
  }
  // One wait for every table's counters.
  if (std::find(read.begin(), read.end(), true) != read.end()) {
    SOK_EV_RETURN_IF_ERROR(synchronize(stream_of(context)));
  }
  for (size_t m = 0; m < members.size(); ++m) {
    HashTable& table = *jobs[members[m]].table;
    int64_t incoming = jobs[members[m]].n;
    if (read[m]) SOK_EV_RETURN_IF_ERROR(table.size_from_exact_read(context, &incoming, counted[m]));
    table.used_slots_bound_ += incoming;
    table.next_row_bound_ += incoming;
    table.incoming_total_ += incoming;
  }
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::reserve(const GpuContext& context, int64_t keys) {
  TableCounters counters;
  SOK_EV_RETURN_IF_ERROR(read_counters(context, &counters));
  const int64_t needed = static_cast<int64_t>(counters.size) + keys;
  const int64_t buckets = next_power_of_two(
      static_cast<int64_t>(std::ceil(needed / (options_.max_load_factor * kBucketSlots))));
  if (buckets > num_buckets_) {
    SOK_EV_RETURN_IF_ERROR(rehash(context, buckets));
    counters.used_slots = counters.size;
  }
  const int64_t rows = static_cast<int64_t>(counters.next_row) + keys;
  if (rows > row_capacity_) SOK_EV_RETURN_IF_ERROR(grow_arena(context, rows, row_width()));
  used_slots_bound_ = static_cast<int64_t>(counters.used_slots);
  next_row_bound_ = static_cast<int64_t>(counters.next_row);
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::find_or_insert_tables(const GpuContext& context,
                                             const FindOrInsertJob<Key>* jobs, size_t n) {
  cudaStream_t stream = stream_of(context);
  // Round r holds the (r + 1)-th job of each table.
  std::vector<int> round(n, 0);
  int rounds = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < i; ++j) round[i] += jobs[j].table == jobs[i].table;
    rounds = std::max(rounds, round[i] + 1);
  }
  for (int r = 0; r < rounds; ++r) {
    std::vector<size_t> members;
    for (size_t i = 0; i < n; ++i) {
      if (round[i] == r && jobs[i].n > 0) members.push_back(i);
    }
    SOK_EV_RETURN_IF_ERROR(prepare_inserts(context, jobs, members));
    // The views after every sizing of the round (growth moves a table's storage).
    std::vector<InsertTable<Key>> inserts;
    for (size_t i : members) {
      const FindOrInsertJob<Key>& job = jobs[i];
      HashTable& table = *job.table;
      inserts.push_back({table.view(), table.counters_, table.free_rows_, job.keys, job.n,
                         job.count, job.frequencies, job.row_ids, job.values, job.count_frequency});
    }
    SOK_EV_RETURN_IF_ERROR(launch_by_table(
        inserts.data(), inserts.size(),
        [](const InsertTable<Key>& insert) { return insert.n * ProbeGroup<Key>::kLanes; },
        [&](const LaunchTables<InsertTable<Key>>& batch, int /*first*/, int count,
            int64_t longest) {
          insert_kernel<Key>
              <<<dim3(grid_for(longest, kThreads), count), kThreads, 0, stream>>>(batch);
        },
        "insert"));
    std::vector<CounterCopy> copies;
    std::vector<std::pair<HashTable*, CounterSnapshot*>> snapshots;
    for (size_t i : members) {
      HashTable& table = *jobs[i].table;
      if (CounterSnapshot* snapshot = table.free_snapshot()) {
        copies.push_back({table.counters_, snapshot->device});
        snapshots.push_back({&table, snapshot});
      }
    }
    const Status copied = launch_by_table(
        copies.data(), copies.size(), [](const CounterCopy&) { return 1; },
        [&](const LaunchTables<CounterCopy>& batch, int /*first*/, int count, int64_t) {
          copy_counters_kernel<<<1, LaunchTables<CounterCopy>::kCapacity, 0, stream>>>(batch,
                                                                                       count);
        },
        "copy_counters");
    if (!copied.ok()) continue;  // without snapshots the bounds stay correct, only looser
    for (const auto& [table, snapshot] : snapshots) table->snapshot_queued(context, snapshot);
  }
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::find_or_insert(const GpuContext& context, const Key* keys, int64_t n,
                                      float* values, const int64_t* frequencies, int64_t* row_ids) {
  const FindOrInsertJob<Key> job{this, keys, n, nullptr, frequencies, true, row_ids, values};
  return find_or_insert_tables(context, &job, 1);
}

template <typename Key>
Status HashTable<Key>::find(const GpuContext& context, const Key* keys, int64_t n, float* values,
                            bool* found, bool initial_for_missing) const {
  if (n <= 0) return Status::Ok();
  find_kernel<Key>
      <<<grid_for(n * ProbeGroup<Key>::kLanes, kThreads), kThreads, 0, stream_of(context)>>>(
          view(), keys, n, values, found, initial_for_missing);
  SOK_EV_LAUNCH_CHECK("find");
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::insert_or_assign(const GpuContext& context, const Key* keys, int64_t n,
                                        const float* rows, const int64_t* frequencies,
                                        const int64_t* versions) {
  if (n <= 0) return Status::Ok();
  cudaStream_t stream = stream_of(context);
  ScratchBuffer row_ids(context, n * sizeof(int64_t));
  if (!row_ids.ok()) return Status::Internal("out of device memory");
  const FindOrInsertJob<Key> job{this, keys, n, nullptr, nullptr, false, row_ids.as<int64_t>()};
  SOK_EV_RETURN_IF_ERROR(find_or_insert_tables(context, &job, 1));
  assign_rows_kernel<Key><<<grid_for(n * 32, kThreads), kThreads, 0, stream>>>(
      view(), n, row_ids.as<int64_t>(), rows, frequencies, versions);
  SOK_EV_LAUNCH_CHECK("assign_rows");
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::find_or_insert_rows(const GpuContext& context, const Key* keys, int64_t n,
                                           const int64_t* count, int64_t* row_ids) {
  const FindOrInsertJob<Key> job{this, keys, n, count, nullptr, false, row_ids};
  return find_or_insert_tables(context, &job, 1);
}

template <typename Key>
Status HashTable<Key>::rows_for_ids(const GpuContext& context, const int64_t* row_ids, int64_t n,
                                    int64_t global_step, float** rows) {
  if (n <= 0) return Status::Ok();
  row_pointers_kernel<Key><<<grid_for(n, kThreads), kThreads, 0, stream_of(context)>>>(
      view(), n, row_ids, global_step, rows);
  SOK_EV_LAUNCH_CHECK("row_pointers");
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::erase(const GpuContext& context, const Key* keys, int64_t n,
                             int64_t* num_erased) {
  if (num_erased != nullptr) *num_erased = 0;
  if (n <= 0) return Status::Ok();
  cudaStream_t stream = stream_of(context);
  ScratchBuffer erased(context, sizeof(unsigned long long));
  if (!erased.ok()) return Status::Internal("out of device memory");
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(erased.get(), 0, sizeof(unsigned long long), stream));
  erase_kernel<Key><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      view(), counters_, free_rows_, keys, n, erased.as<unsigned long long>());
  SOK_EV_LAUNCH_CHECK("erase");
  if (num_erased != nullptr) {
    unsigned long long host = 0;
    SOK_EV_CUDA_RETURN(
        cudaMemcpyAsync(&host, erased.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
    SOK_EV_RETURN_IF_ERROR(synchronize(stream));
    *num_erased = static_cast<int64_t>(host);
  }
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::export_all(const GpuContext& context, Key* keys, float* rows,
                                  int64_t* frequencies, int64_t* versions, int64_t capacity,
                                  int64_t* count) const {
  cudaStream_t stream = stream_of(context);
  const int64_t slots = num_buckets_ * kBucketSlots;
  ScratchBuffer cursor(context, sizeof(unsigned long long));
  ScratchBuffer row_ids(context, std::max<int64_t>(capacity, 1) * sizeof(int64_t));
  if (!cursor.ok() || !row_ids.ok()) return Status::Internal("out of device memory");
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(cursor.get(), 0, sizeof(unsigned long long), stream));
  compact_slots_kernel<Key><<<grid_for(slots, kThreads), kThreads, 0, stream>>>(
      view(), slots, keys, row_ids.as<int64_t>(), capacity, cursor.as<unsigned long long>());
  SOK_EV_LAUNCH_CHECK("compact_slots");
  unsigned long long written = 0;
  SOK_EV_CUDA_RETURN(
      cudaMemcpyAsync(&written, cursor.get(), sizeof(written), cudaMemcpyDeviceToHost, stream));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  if (written > static_cast<unsigned long long>(capacity)) {
    return Status::InvalidArgument("export_all: table holds " + std::to_string(written) +
                                   " keys, capacity " + std::to_string(capacity));
  }
  const int64_t n = static_cast<int64_t>(written);
  *count = n;
  if (n > 0) {
    export_rows_kernel<Key><<<grid_for(n * 32, kThreads), kThreads, 0, stream>>>(
        view(), n, row_ids.as<int64_t>(), rows, frequencies, versions);
    SOK_EV_LAUNCH_CHECK("export_rows");
  }
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::evict_stale(const GpuContext& context, int64_t global_step,
                                   int64_t steps_to_live, int64_t* num_evicted) {
  cudaStream_t stream = stream_of(context);
  const int64_t slots = num_buckets_ * kBucketSlots;
  ScratchBuffer evicted(context, sizeof(unsigned long long));
  if (!evicted.ok()) return Status::Internal("out of device memory");
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(evicted.get(), 0, sizeof(unsigned long long), stream));
  evict_kernel<Key><<<grid_for(slots, kThreads), kThreads, 0, stream>>>(
      view(), counters_, free_rows_, slots, global_step - steps_to_live,
      evicted.as<unsigned long long>());
  SOK_EV_LAUNCH_CHECK("evict");
  unsigned long long host = 0;
  SOK_EV_CUDA_RETURN(
      cudaMemcpyAsync(&host, evicted.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  if (num_evicted != nullptr) *num_evicted = static_cast<int64_t>(host);
  return Status::Ok();
}

template <typename Key>
Status HashTable<Key>::add_slot(const GpuContext& context, const std::string& name,
                                float initial_value, int* index) {
  for (size_t s = 0; s < slot_names_.size(); ++s) {
    if (slot_names_[s] == name) {
      *index = static_cast<int>(s);
      return Status::Ok();
    }
  }
  if (num_slots() >= kMaxTableSlots) {
    return Status::InvalidArgument("add_slot: at most " + std::to_string(kMaxTableSlots) +
                                   " slots");
  }
  const int64_t new_width = row_width() + dim_;
  SOK_EV_RETURN_IF_ERROR(grow_arena(context, row_capacity_, new_width));
  slot_names_.push_back(name);
  slot_initial_.push_back(initial_value);
  const int64_t first_column = (static_cast<int64_t>(slot_names_.size())) * dim_;
  fill_slot_kernel<<<grid_for(row_capacity_ * dim_, kThreads), kThreads, 0, stream_of(context)>>>(
      arena_, row_capacity_, new_width, first_column, dim_, initial_value);
  SOK_EV_LAUNCH_CHECK("fill_slot");
  *index = num_slots() - 1;
  return Status::Ok();
}

template class HashTable<int32_t>;
template class HashTable<int64_t>;

}  // namespace gpu
}  // namespace sok_ev
