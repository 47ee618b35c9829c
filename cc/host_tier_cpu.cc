// The host-memory tier of a GPU Embedding Variable; see cc/host_tier.h.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>

#include "cc/hash.h"
#include "cc/host_tier.h"

namespace sok_ev {
namespace {

constexpr size_t kFirstChunkBytes = size_t{64} << 10;
constexpr size_t kLargestChunkBytes = size_t{8} << 20;
// A map step's cost in cycles for the thread pool (a cache miss or two).
constexpr int64_t kCyclesPerKey = 400;
// How many keys ahead a batch's probes are prefetched.
constexpr int64_t kPrefetchAhead = 8;

}  // namespace

template <typename Key>
class HostTier<Key>::Shard {
 public:
  Shard() = default;
  ~Shard() {
    for (void* chunk : chunks_) memory_->deallocate(chunk);
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  void init(const HostMemory* memory, size_t record_bytes) {
    memory_ = memory;
    record_bytes_ = record_bytes;
  }
  int64_t size() const { return size_; }

  char* find(Key key, uint64_t hash) const {
    if (size_ == 0) return nullptr;
    for (uint64_t slot = hash & mask_;; slot = (slot + 1) & mask_) {
      if (entries_[slot].record == nullptr) return nullptr;
      if (entries_[slot].key == key) return entries_[slot].record;
    }
  }

  // Asks the CPU for the cache line of a key's first probe ahead of use.
  void prefetch(uint64_t hash) const {
    if (entries_ != nullptr) __builtin_prefetch(&entries_[hash & mask_]);
  }

  // The key's record, a new one when it is absent; null, with *refused set
  // to the bytes asked for, when the system refuses memory (nothing changed).
  char* insert(Key key, uint64_t hash, size_t* refused) {
    if (char* record = find(key, hash)) return record;
    if (static_cast<uint64_t>(size_ + 1) * 8 > (mask_ + 1) * 5 && !grow_map(refused)) {
      return nullptr;
    }
    char* record = take_record(refused);
    if (record == nullptr) return nullptr;
    uint64_t slot = hash & mask_;
    while (entries_[slot].record != nullptr) slot = (slot + 1) & mask_;
    entries_[slot] = Entry{key, record};
    ++size_;
    return record;
  }

  bool erase(Key key, uint64_t hash) {
    if (size_ == 0) return false;
    uint64_t slot = hash & mask_;
    for (;; slot = (slot + 1) & mask_) {
      if (entries_[slot].record == nullptr) return false;
      if (entries_[slot].key == key) break;
    }
    free_.push_back(entries_[slot].record);  // never reallocates: see take_record
    --size_;
    // Backward shift: each later key of the run moves into the hole when
    // the hole lies between its home slot and where it sits.
    uint64_t hole = slot;
    for (uint64_t next = (hole + 1) & mask_; entries_[next].record != nullptr;
         next = (next + 1) & mask_) {
      const uint64_t home = bucket_hash(entries_[next].key) & mask_;
      if (((next - home) & mask_) >= ((next - hole) & mask_)) {
        entries_[hole] = entries_[next];
        hole = next;
      }
    }
    entries_[hole].record = nullptr;
    return true;
  }

  // visit(key, record) for every stored key.
  template <typename Visit>
  void for_each(const Visit& visit) const {
    if (size_ == 0) return;
    for (uint64_t slot = 0; slot <= mask_; ++slot) {
      if (entries_[slot].record != nullptr) visit(entries_[slot].key, entries_[slot].record);
    }
  }

 private:
  // A key and its record side by side, so that a probe reads one cache line.
  struct Entry {
    Key key;
    char* record;  // null: an empty slot
  };

  bool grow_map(size_t* refused) {
    const uint64_t capacity = entries_ == nullptr ? 16 : 2 * (mask_ + 1);
    std::unique_ptr<Entry[]> entries(new (std::nothrow) Entry[capacity]());
    if (entries == nullptr) {
      *refused = capacity * sizeof(Entry);
      return false;
    }
    const uint64_t mask = capacity - 1;
    for_each([&](Key key, char* record) {
      uint64_t slot = bucket_hash(key) & mask;
      while (entries[slot].record != nullptr) slot = (slot + 1) & mask;
      entries[slot] = Entry{key, record};
    });
    entries_ = std::move(entries);
    mask_ = mask;
    return true;
  }

  char* take_record(size_t* refused) {
    if (!free_.empty()) {
      char* record = free_.back();
      free_.pop_back();
      return record;
    }
    if (bump_ == bump_end_) {
      const size_t bytes = std::max(next_chunk_bytes_, record_bytes_);
      // The free list holds room for every record, so erase never allocates.
      const size_t records = owned_ + bytes / record_bytes_;
      try {
        chunks_.reserve(chunks_.size() + 1);
        free_.reserve(records);
      } catch (const std::bad_alloc&) {
        *refused = records * sizeof(char*);
        return nullptr;
      }
      void* chunk = memory_->allocate(bytes);
      if (chunk == nullptr) {
        *refused = bytes;
        return nullptr;
      }
      chunks_.push_back(chunk);
      bump_ = static_cast<char*>(chunk);
      bump_end_ = bump_ + bytes / record_bytes_ * record_bytes_;
      owned_ = records;
      next_chunk_bytes_ = std::min(2 * bytes, std::max(kLargestChunkBytes, record_bytes_));
    }
    char* record = bump_;
    bump_ += record_bytes_;
    return record;
  }

  const HostMemory* memory_ = nullptr;
  size_t record_bytes_ = 0;
  std::unique_ptr<Entry[]> entries_;  // the map
  uint64_t mask_ = 0;
  int64_t size_ = 0;
  // Records: erased ones, then the rest of the newest chunk.
  std::vector<char*> free_;
  char* bump_ = nullptr;
  char* bump_end_ = nullptr;
  int64_t owned_ = 0;  // records in all chunks
  std::vector<void*> chunks_;
  size_t next_chunk_bytes_ = kFirstChunkBytes;
};

namespace {

template <typename Key>
int shard_of(uint64_t hash) {
  return static_cast<int>(hash >> (64 - HostTier<Key>::kShardBits));
}

}  // namespace

template <typename Key>
HostTier<Key>::HostTier(int64_t row_width, HostMemory memory, std::string name)
    : row_width_(row_width),
      memory_(std::move(memory)),
      name_(std::move(name)),
      shards_(new Shard[kNumShards]) {
  for (int s = 0; s < kNumShards; ++s) shards_[s].init(&memory_, record_bytes());
}

template <typename Key>
HostTier<Key>::~HostTier() = default;

template <typename Key>
int64_t HostTier<Key>::size() const {
  int64_t total = 0;
  for (int s = 0; s < kNumShards; ++s) total += shards_[s].size();
  return total;
}

template <typename Key>
Status HostTier<Key>::out_of_memory(size_t bytes) const {
  return Status::ResourceExhausted("Embedding Variable '" + name_ +
                                   "': host memory tier of HBM_DRAM storage: out of host memory "
                                   "allocating " +
                                   std::to_string(bytes) + " bytes");
}

template <typename Key>
typename HostTier<Key>::Batch HostTier<Key>::split(const Key* keys, int64_t n) {
  Batch batch;
  batch.keys = keys;
  batch.hashes.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    batch.hashes[i] = bucket_hash(keys[i]);
    ++batch.offsets[shard_of<Key>(batch.hashes[i]) + 1];
  }
  for (int s = 0; s < kNumShards; ++s) batch.offsets[s + 1] += batch.offsets[s];
  int64_t cursor[kNumShards];
  std::copy(batch.offsets, batch.offsets + kNumShards, cursor);
  batch.positions.resize(n);
  for (int64_t i = 0; i < n; ++i) batch.positions[cursor[shard_of<Key>(batch.hashes[i])]++] = i;
  return batch;
}

template <typename Key>
template <typename Step>
void HostTier<Key>::for_each_key(const Batch& batch, int shard, const Step& step) const {
  const Shard& owner = shards_[shard];
  const int64_t end = batch.offsets[shard + 1];
  for (int64_t p = batch.offsets[shard]; p < end; ++p) {
    // The probes miss the cache: the line of a key a few ahead is asked for
    // while this one is probed.
    if (p + kPrefetchAhead < end) owner.prefetch(batch.hashes[batch.positions[p + kPrefetchAhead]]);
    if (!step(batch.positions[p])) return;
  }
}

template <typename Key>
void HostTier<Key>::find(const Batch& batch, int shard, char** records) const {
  for_each_key(batch, shard, [&](int64_t i) {
    records[i] = shards_[shard].find(batch.keys[i], batch.hashes[i]);
    return true;
  });
}

template <typename Key>
Status HostTier<Key>::insert(const Batch& batch, int shard, char** records) {
  size_t refused = 0;
  for_each_key(batch, shard, [&](int64_t i) {
    records[i] = shards_[shard].insert(batch.keys[i], batch.hashes[i], &refused);
    return records[i] != nullptr;
  });
  return refused == 0 ? Status::Ok() : out_of_memory(refused);
}

template <typename Key>
int64_t HostTier<Key>::erase(const Batch& batch, int shard) {
  int64_t erased = 0;
  for_each_key(batch, shard, [&](int64_t i) {
    erased += shards_[shard].erase(batch.keys[i], batch.hashes[i]);
    return true;
  });
  return erased;
}

template <typename Key>
void HostTier<Key>::for_each_shard(const CpuContext& context, size_t tiers, int64_t keys,
                                   const std::function<void(size_t tier, int shard)>& step) {
  const int64_t units = static_cast<int64_t>(tiers) * kNumShards;
  if (units == 0) return;
  context.parallel_for(
      units, std::max<int64_t>(1, keys / units) * kCyclesPerKey, [&](int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u) {
          step(static_cast<size_t>(u / kNumShards), static_cast<int>(u % kNumShards));
        }
      });
}

template <typename Key>
void HostTier<Key>::find(const CpuContext& context, const Key* keys, int64_t n,
                         char** records) const {
  const Batch batch = split(keys, n);
  for_each_shard(context, 1, n, [&](size_t, int shard) { find(batch, shard, records); });
}

template <typename Key>
Status HostTier<Key>::insert(const CpuContext& context, const Key* keys, int64_t n,
                             char** records) {
  const Batch batch = split(keys, n);
  std::mutex mutex;
  Status first_error;
  for_each_shard(context, 1, n, [&](size_t, int shard) {
    Status status = insert(batch, shard, records);
    std::lock_guard<std::mutex> lock(mutex);
    if (first_error.ok()) first_error = std::move(status);
  });
  return first_error;
}

template <typename Key>
int64_t HostTier<Key>::erase(const CpuContext& context, const Key* keys, int64_t n) {
  const Batch batch = split(keys, n);
  int64_t erased[kNumShards] = {};
  for_each_shard(context, 1, n, [&](size_t, int shard) { erased[shard] = erase(batch, shard); });
  int64_t total = 0;
  for (int64_t count : erased) total += count;
  return total;
}

template <typename Key>
Status HostTier<Key>::widen(int64_t row_width, float fill) {
  if (row_width == row_width_) return Status::Ok();
  std::unique_ptr<Shard[]> widened(new Shard[kNumShards]);
  const size_t bytes = HostRecord::bytes(row_width);
  for (int s = 0; s < kNumShards; ++s) {
    widened[s].init(&memory_, bytes);
    size_t refused = 0;
    shards_[s].for_each([&](Key key, const char* record) {
      if (refused != 0) return;
      char* to = widened[s].insert(key, bucket_hash(key), &refused);
      if (to == nullptr) return;
      std::memcpy(to, record, HostRecord::kHeaderBytes + row_width_ * sizeof(float));
      std::fill(HostRecord::row(to) + row_width_, HostRecord::row(to) + row_width, fill);
    });
    if (refused != 0) return out_of_memory(refused);
  }
  shards_ = std::move(widened);
  row_width_ = row_width;
  return Status::Ok();
}

template <typename Key>
Status HostTier<Key>::export_batches(
    int64_t max_batch, const std::function<Status(const ExportBatch& batch)>& emit) const {
  max_batch = std::max<int64_t>(1, max_batch);
  std::vector<Key> keys;
  std::vector<float> rows;
  std::vector<int64_t> frequencies, versions;
  Status status;
  auto flush = [&]() {
    if (keys.empty() || !status.ok()) return;
    status = emit(ExportBatch{keys.data(), rows.data(), frequencies.data(), versions.data(),
                              static_cast<int64_t>(keys.size())});
    keys.clear();
    rows.clear();
    frequencies.clear();
    versions.clear();
  };
  for (int s = 0; s < kNumShards && status.ok(); ++s) {
    shards_[s].for_each([&](Key key, const char* record) {
      if (!status.ok()) return;
      keys.push_back(key);
      rows.insert(rows.end(), HostRecord::row(record), HostRecord::row(record) + row_width_);
      frequencies.push_back(*HostRecord::frequency(record));
      versions.push_back(*HostRecord::version(record));
      if (static_cast<int64_t>(keys.size()) == max_batch) flush();
    });
  }
  flush();
  return status;
}

template <typename Key>
int64_t HostTier<Key>::evict_stale(int64_t global_step, int64_t steps_to_live) {
  int64_t evicted = 0;
  for (int s = 0; s < kNumShards; ++s) {
    std::vector<Key> stale;
    shards_[s].for_each([&](Key key, const char* record) {
      if (*HostRecord::version(record) < global_step - steps_to_live) stale.push_back(key);
    });
    for (Key key : stale) evicted += shards_[s].erase(key, bucket_hash(key));
  }
  return evicted;
}

template class HostTier<int32_t>;
template class HostTier<int64_t>;

}  // namespace sok_ev
