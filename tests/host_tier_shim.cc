// A C interface to cc/host_tier.h for tests/test_host_tier.py (ctypes), with
// records in malloc'd memory instead of pinned memory, a cap on how many
// chunks the tier may allocate (to refuse memory on demand), and a context
// that runs every shard on its own thread. Test support only.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cc/host_tier.h"

namespace {

using sok_ev::CpuContext;
using sok_ev::HostMemory;
using sok_ev::HostRecord;
using sok_ev::HostTier;
using sok_ev::Status;

std::string last_error;

CpuContext thread_per_unit() {
  CpuContext context;
  context.parallelism = 16;
  context.parallel_for = [](int64_t total, int64_t, const CpuContext::Work& work) {
    std::vector<std::thread> threads;
    for (int64_t unit = 0; unit < total; ++unit) {
      threads.emplace_back([&work, unit] { work(unit, unit + 1); });
    }
    for (std::thread& thread : threads) thread.join();
  };
  return context;
}

struct Tier {
  std::mutex mutex;          // shards allocate from several threads at once
  int64_t chunks_left = -1;  // allocations still allowed; -1: any
  int64_t live_chunks = 0;
  std::unique_ptr<HostTier<int32_t>> int32;
  std::unique_ptr<HostTier<int64_t>> int64;
  CpuContext context = thread_per_unit();
};

HostMemory counted_memory(Tier* tier) {
  HostMemory memory;
  memory.allocate = [tier](size_t bytes) -> void* {
    std::lock_guard<std::mutex> lock(tier->mutex);
    if (tier->chunks_left == 0) return nullptr;
    if (tier->chunks_left > 0) --tier->chunks_left;
    ++tier->live_chunks;
    return std::aligned_alloc(16, (bytes + 15) / 16 * 16);
  };
  memory.deallocate = [tier](void* pointer) {
    std::lock_guard<std::mutex> lock(tier->mutex);
    --tier->live_chunks;
    std::free(pointer);
  };
  return memory;
}

int code_of(const Status& status) {
  if (!status.ok()) last_error = status.message;
  return static_cast<int>(status.code);
}

template <typename Key>
int insert(HostTier<Key>& tier, const CpuContext& context, const Key* keys, int64_t n,
           const float* rows, const int64_t* frequencies, const int64_t* versions) {
  std::vector<char*> records(n);
  const Status status = tier.insert(context, keys, n, records.data());
  if (!status.ok()) return code_of(status);
  const int64_t width = tier.row_width();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(HostRecord::row(records[i]), rows + i * width, width * sizeof(float));
    *HostRecord::frequency(records[i]) = frequencies[i];
    *HostRecord::version(records[i]) = versions[i];
  }
  return 0;
}

template <typename Key>
void find(const HostTier<Key>& tier, const CpuContext& context, const Key* keys, int64_t n,
          float* rows, int64_t* frequencies, int64_t* versions, uint8_t* found,
          int64_t* misaligned) {
  std::vector<char*> records(n);
  tier.find(context, keys, n, records.data());
  const int64_t width = tier.row_width();
  for (int64_t i = 0; i < n; ++i) {
    found[i] = records[i] != nullptr;
    if (records[i] == nullptr) continue;
    *misaligned += reinterpret_cast<uintptr_t>(records[i]) % 16 != 0;
    std::memcpy(rows + i * width, HostRecord::row(records[i]), width * sizeof(float));
    frequencies[i] = *HostRecord::frequency(records[i]);
    versions[i] = *HostRecord::version(records[i]);
  }
}

template <typename Key>
int64_t export_all(const HostTier<Key>& tier, int64_t max_batch, Key* keys, float* rows,
                   int64_t* frequencies, int64_t* versions, int64_t* largest_batch) {
  int64_t count = 0;
  const int64_t width = tier.row_width();
  tier.export_batches(max_batch, [&](const typename HostTier<Key>::ExportBatch& batch) {
    std::memcpy(keys + count, batch.keys, batch.count * sizeof(Key));
    std::memcpy(rows + count * width, batch.rows, batch.count * width * sizeof(float));
    std::memcpy(frequencies + count, batch.frequencies, batch.count * sizeof(int64_t));
    std::memcpy(versions + count, batch.versions, batch.count * sizeof(int64_t));
    count += batch.count;
    if (batch.count > *largest_batch) *largest_batch = batch.count;
    return Status::Ok();
  });
  return count;
}

}  // namespace

// Every call takes the tier and dispatches on its key type.
#define DISPATCH(tier, call) ((tier)->int64 ? call(*(tier)->int64) : call(*(tier)->int32))

extern "C" {

const char* host_tier_last_error() { return last_error.c_str(); }

void* host_tier_new(int key_bytes, int64_t row_width, int64_t chunks_allowed) {
  Tier* tier = new Tier;
  tier->chunks_left = chunks_allowed;
  if (key_bytes == 8) {
    tier->int64.reset(new HostTier<int64_t>(row_width, counted_memory(tier), "host_tier_test"));
  } else {
    tier->int32.reset(new HostTier<int32_t>(row_width, counted_memory(tier), "host_tier_test"));
  }
  return tier;
}

// Frees the tier; returns the chunks still allocated after (0 unless leaked).
int64_t host_tier_delete(void* handle) {
  Tier* tier = static_cast<Tier*>(handle);
  tier->int32.reset();
  tier->int64.reset();
  const int64_t live = tier->live_chunks;
  delete tier;
  return live;
}

void host_tier_allow_chunks(void* handle, int64_t chunks_allowed) {
  static_cast<Tier*>(handle)->chunks_left = chunks_allowed;
}

int64_t host_tier_live_chunks(void* handle) { return static_cast<Tier*>(handle)->live_chunks; }

int64_t host_tier_size(void* handle) {
  Tier* tier = static_cast<Tier*>(handle);
  return DISPATCH(tier, [](const auto& t) { return t.size(); });
}

int64_t host_tier_row_width(void* handle) {
  Tier* tier = static_cast<Tier*>(handle);
  return DISPATCH(tier, [](const auto& t) { return t.row_width(); });
}

// 0, or the failing Status's code (its message in host_tier_last_error).
int host_tier_insert(void* handle, const void* keys, int64_t n, const float* rows,
                     const int64_t* frequencies, const int64_t* versions) {
  Tier* tier = static_cast<Tier*>(handle);
  if (tier->int64) {
    return insert(*tier->int64, tier->context, static_cast<const int64_t*>(keys), n, rows,
                  frequencies, versions);
  }
  return insert(*tier->int32, tier->context, static_cast<const int32_t*>(keys), n, rows,
                frequencies, versions);
}

// Returns the records found that were not 16-byte aligned.
int64_t host_tier_find(void* handle, const void* keys, int64_t n, float* rows, int64_t* frequencies,
                       int64_t* versions, uint8_t* found) {
  Tier* tier = static_cast<Tier*>(handle);
  int64_t misaligned = 0;
  if (tier->int64) {
    find(*tier->int64, tier->context, static_cast<const int64_t*>(keys), n, rows, frequencies,
         versions, found, &misaligned);
  } else {
    find(*tier->int32, tier->context, static_cast<const int32_t*>(keys), n, rows, frequencies,
         versions, found, &misaligned);
  }
  return misaligned;
}

int64_t host_tier_erase(void* handle, const void* keys, int64_t n) {
  Tier* tier = static_cast<Tier*>(handle);
  if (tier->int64) return tier->int64->erase(tier->context, static_cast<const int64_t*>(keys), n);
  return tier->int32->erase(tier->context, static_cast<const int32_t*>(keys), n);
}

int host_tier_widen(void* handle, int64_t row_width, float fill) {
  Tier* tier = static_cast<Tier*>(handle);
  return code_of(DISPATCH(tier, [&](auto& t) { return t.widen(row_width, fill); }));
}

// Every key's row into the outputs (sized for size() keys); returns the
// count and the largest batch emitted.
int64_t host_tier_export(void* handle, int64_t max_batch, void* keys, float* rows,
                         int64_t* frequencies, int64_t* versions, int64_t* largest_batch) {
  Tier* tier = static_cast<Tier*>(handle);
  *largest_batch = 0;
  if (tier->int64) {
    return export_all(*tier->int64, max_batch, static_cast<int64_t*>(keys), rows, frequencies,
                      versions, largest_batch);
  }
  return export_all(*tier->int32, max_batch, static_cast<int32_t*>(keys), rows, frequencies,
                    versions, largest_batch);
}

int64_t host_tier_evict_stale(void* handle, int64_t global_step, int64_t steps_to_live) {
  Tier* tier = static_cast<Tier*>(handle);
  return DISPATCH(tier, [&](auto& t) { return t.evict_stale(global_step, steps_to_live); });
}

}  // extern "C"
