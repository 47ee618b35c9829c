// CPU twin of the Embedding Variable store. See cc/hash_table_cpu.h.
#include "cc/hash_table_cpu.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <shared_mutex>

#include "cc/hash.h"

namespace sok_ev {
namespace cpu {
namespace {

constexpr int64_t kEmptyRow = -1;
// Rows per chunk: large enough that chunk allocation is rare, small enough
// that a tiny table stays tiny.
constexpr int64_t kRowsPerChunk = 1024;
constexpr int kShardBits = 6;
// Keys ahead whose index lines a lookup loop prefetches (their misses then
// overlap instead of coming one after another).
constexpr int64_t kPrefetchDistance = 8;

// Frequencies are bumped under a shared lock by concurrent lookups.
void atomic_add(int64_t* target, int64_t delta) {
  __atomic_fetch_add(target, delta, __ATOMIC_RELAXED);
}

}  // namespace

// One lock's worth of the table: an open-addressing index (linear probing,
// power-of-two capacity, load factor at most 1/2) from key to a local row id,
// and the rows themselves in fixed-size chunks.
template <typename Key>
struct HashTable<Key>::Shard {
  mutable std::shared_mutex mutex;
  int64_t width = 0;               // floats per row
  std::vector<Key> slot_keys;      // (capacity,)
  std::vector<int64_t> slot_rows;  // (capacity,) kEmptyRow when free
  int64_t count = 0;               // keys stored
  std::vector<std::unique_ptr<float[]>> chunks;
  std::vector<int64_t> free_rows;    // row ids released by erase
  std::vector<int64_t> frequencies;  // (row ids handed out,)
  std::vector<int64_t> versions;     // (row ids handed out,)

  float* row(int64_t id) const {
    return chunks[id / kRowsPerChunk].get() + (id % kRowsPerChunk) * width;
  }

  int64_t home(Key key) const {
    const int64_t mask = static_cast<int64_t>(slot_keys.size()) - 1;
    // The low bits chose the shard; the rest choose the bucket.
    return static_cast<int64_t>(bucket_hash(key) >> kShardBits) & mask;
  }

  // Index slot holding `key`, or the free slot where it would go.
  int64_t probe(Key key) const {
    const int64_t mask = static_cast<int64_t>(slot_keys.size()) - 1;
    int64_t i = home(key);
    while (slot_rows[i] != kEmptyRow && slot_keys[i] != key) i = (i + 1) & mask;
    return i;
  }

  // Asks for the cache lines `key`'s probe starts on, ahead of probing it.
  void prefetch(Key key) const {
    if (slot_keys.empty()) return;
    const int64_t i = home(key);
    __builtin_prefetch(slot_keys.data() + i);
    __builtin_prefetch(slot_rows.data() + i);
  }

  // Asks for the first `floats` floats of row `id`, and its frequency.
  void prefetch_row(int64_t id, int64_t floats) const {
    const float* r = row(id);
    for (int64_t c = 0; c < floats; c += 16) __builtin_prefetch(r + c);
    __builtin_prefetch(frequencies.data() + id);
  }

  int64_t find_row(Key key) const {
    if (slot_keys.empty()) return kEmptyRow;
    return slot_rows[probe(key)];
  }

  void rehash(int64_t new_capacity) {
    std::vector<Key> old_keys = std::move(slot_keys);
    std::vector<int64_t> old_rows = std::move(slot_rows);
    slot_keys.assign(new_capacity, Key());
    slot_rows.assign(new_capacity, kEmptyRow);
    for (size_t i = 0; i < old_rows.size(); ++i) {
      if (old_rows[i] == kEmptyRow) continue;
      const int64_t j = probe(old_keys[i]);
      slot_keys[j] = old_keys[i];
      slot_rows[j] = old_rows[i];
    }
  }

  // Inserts a key known to be absent and returns its row id; the caller
  // fills the row.
  int64_t insert_absent(Key key) {
    if (2 * (count + 1) > static_cast<int64_t>(slot_keys.size())) {
      rehash(std::max<int64_t>(16, 2 * static_cast<int64_t>(slot_keys.size())));
    }
    int64_t id;
    if (!free_rows.empty()) {
      id = free_rows.back();
      free_rows.pop_back();
    } else {
      id = static_cast<int64_t>(frequencies.size());
      if (id / kRowsPerChunk >= static_cast<int64_t>(chunks.size())) {
        chunks.emplace_back(new float[kRowsPerChunk * width]);
      }
      frequencies.push_back(0);
      versions.push_back(0);
    }
    frequencies[id] = 0;
    versions[id] = 0;
    const int64_t i = probe(key);
    slot_keys[i] = key;
    slot_rows[i] = id;
    ++count;
    return id;
  }

  // Removes `key` with backward-shift deletion, which keeps every probe
  // sequence unbroken without tombstones.
  bool erase(Key key) {
    if (slot_keys.empty()) return false;
    const int64_t mask = static_cast<int64_t>(slot_keys.size()) - 1;
    int64_t hole = probe(key);
    if (slot_rows[hole] == kEmptyRow) return false;
    free_rows.push_back(slot_rows[hole]);
    slot_rows[hole] = kEmptyRow;
    --count;
    for (int64_t j = (hole + 1) & mask; slot_rows[j] != kEmptyRow; j = (j + 1) & mask) {
      const int64_t h = home(slot_keys[j]);
      // Entry j may stay only if its home lies cyclically in (hole, j].
      const bool stays = (hole <= j) ? (hole < h && h <= j) : (hole < h || h <= j);
      if (stays) continue;
      slot_keys[hole] = slot_keys[j];
      slot_rows[hole] = slot_rows[j];
      slot_rows[j] = kEmptyRow;
      hole = j;
    }
    return true;
  }

  // Re-lays every row out with `new_width` floats, filling the added tail
  // with `fill`.
  void widen(int64_t new_width, float fill) {
    for (auto& chunk : chunks) {
      std::unique_ptr<float[]> wider(new float[kRowsPerChunk * new_width]);
      for (int64_t r = 0; r < kRowsPerChunk; ++r) {
        std::memcpy(wider.get() + r * new_width, chunk.get() + r * width, width * sizeof(float));
        std::fill(wider.get() + r * new_width + width, wider.get() + (r + 1) * new_width, fill);
      }
      chunk = std::move(wider);
    }
    width = new_width;
  }
};

template <typename Key>
HashTable<Key>::HashTable(int64_t dim, const InitializerSpec& initializer)
    : dim_(dim), initializer_(initializer), shards_(new Shard[kNumShards]) {
  if (initializer.kind == InitializerSpec::Kind::kDefaultValueMatrix) {
    default_values_.assign(initializer.default_values,
                           initializer.default_values + initializer.default_value_dim * dim);
    initializer_.default_values = default_values_.data();
  }
  for (int s = 0; s < kNumShards; ++s) shards_[s].width = dim;
}

template <typename Key>
HashTable<Key>::~HashTable() = default;

template <typename Key>
int HashTable<Key>::num_slots() const {
  std::lock_guard<std::mutex> lock(layout_mutex_);
  return static_cast<int>(slot_names_.size());
}

template <typename Key>
int64_t HashTable<Key>::row_width() const {
  return (1 + num_slots()) * dim_;
}

template <typename Key>
int64_t HashTable<Key>::size() const {
  int64_t total = 0;
  for (int s = 0; s < kNumShards; ++s) {
    std::shared_lock<std::shared_mutex> lock(shards_[s].mutex);
    total += shards_[s].count;
  }
  return total;
}

template <typename Key>
int HashTable<Key>::add_slot(const std::string& name, float initial_value) {
  std::lock_guard<std::mutex> layout_lock(layout_mutex_);
  for (size_t i = 0; i < slot_names_.size(); ++i) {
    if (slot_names_[i] == name) return static_cast<int>(i);
  }
  // Every shard, in index order so that two add_slot calls cannot deadlock.
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (int s = 0; s < kNumShards; ++s) locks.emplace_back(shards_[s].mutex);
  const int64_t new_width = (2 + static_cast<int64_t>(slot_names_.size())) * dim_;
  for (int s = 0; s < kNumShards; ++s) shards_[s].widen(new_width, initial_value);
  slot_names_.push_back(name);
  slot_initial_values_.push_back(initial_value);
  return static_cast<int>(slot_names_.size()) - 1;
}

template <typename Key>
std::vector<std::string> HashTable<Key>::slot_names() const {
  std::lock_guard<std::mutex> lock(layout_mutex_);
  return slot_names_;
}

template <typename Key>
std::vector<float> HashTable<Key>::slot_initial_values() const {
  std::lock_guard<std::mutex> lock(layout_mutex_);
  return slot_initial_values_;
}

template <typename Key>
void HashTable<Key>::fill_initial_row(Key key, float* row) const {
  initial_row(initializer_, key, dim_, row);
  // slot_initial_values_ only changes under every shard lock, one of which
  // the caller holds, so reading it here is safe.
  for (size_t s = 0; s < slot_initial_values_.size(); ++s) {
    std::fill(row + (1 + s) * dim_, row + (2 + s) * dim_, slot_initial_values_[s]);
  }
}

template <typename Key>
void HashTable<Key>::group_by_shard(const Key* keys, int64_t n, std::vector<int64_t>* order,
                                    std::vector<int64_t>* offsets) const {
  std::vector<uint8_t> shard(n);
  offsets->assign(kNumShards + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    shard[i] = static_cast<uint8_t>(bucket_hash(keys[i]) & (kNumShards - 1));
    ++(*offsets)[shard[i] + 1];
  }
  for (int s = 0; s < kNumShards; ++s) (*offsets)[s + 1] += (*offsets)[s];
  std::vector<int64_t> cursor(offsets->begin(), offsets->end() - 1);
  order->resize(n);
  for (int64_t i = 0; i < n; ++i) (*order)[cursor[shard[i]]++] = i;
}

template <typename Key>
void HashTable<Key>::for_each_shard(
    const CpuContext& context, const Key* keys, int64_t n,
    const std::function<void(Shard&, const int64_t*, int64_t)>& work) const {
  if (n == 0) return;
  std::vector<int64_t> order, offsets;
  group_by_shard(keys, n, &order, &offsets);
  // Cost per shard: its share of keys times a row's worth of floats.
  const int64_t cost = std::max<int64_t>(1, n / kNumShards) * (dim_ + 64);
  context.parallel_for(kNumShards, cost, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const int64_t count = offsets[s + 1] - offsets[s];
      if (count > 0) work(shards_[s], order.data() + offsets[s], count);
    }
  });
}

template <typename Key>
void HashTable<Key>::find_or_insert(const CpuContext& context, const Key* keys, int64_t n,
                                    float* values, const int64_t* frequencies) {
  for_each_shard(context, keys, n, [&](Shard& shard, const int64_t* positions, int64_t count) {
    std::vector<int64_t> missing;
    {
      std::shared_lock<std::shared_mutex> lock(shard.mutex);
      // Probe every key first (asking for its row as it is found), then copy:
      // the rows' misses overlap instead of following each probe.
      std::vector<int64_t> ids(count);
      for (int64_t k = 0; k < count; ++k) {
        if (k + kPrefetchDistance < count) shard.prefetch(keys[positions[k + kPrefetchDistance]]);
        ids[k] = shard.find_row(keys[positions[k]]);
        if (ids[k] != kEmptyRow) shard.prefetch_row(ids[k], dim_);
      }
      for (int64_t k = 0; k < count; ++k) {
        const int64_t i = positions[k];
        if (ids[k] == kEmptyRow) {
          missing.push_back(i);
          continue;
        }
        std::memcpy(values + i * dim_, shard.row(ids[k]), dim_ * sizeof(float));
        atomic_add(&shard.frequencies[ids[k]], frequencies ? frequencies[i] : 1);
      }
    }
    if (missing.empty()) return;
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    for (int64_t i : missing) {
      // Another thread, or an earlier duplicate in this batch, may have
      // inserted the key since the shared lock was released.
      int64_t id = shard.find_row(keys[i]);
      if (id == kEmptyRow) {
        id = shard.insert_absent(keys[i]);
        fill_initial_row(keys[i], shard.row(id));
      }
      std::memcpy(values + i * dim_, shard.row(id), dim_ * sizeof(float));
      shard.frequencies[id] += frequencies ? frequencies[i] : 1;
    }
  });
}

template <typename Key>
void HashTable<Key>::find(const CpuContext& context, const Key* keys, int64_t n, float* values,
                          bool* found, bool initial_for_missing) const {
  for_each_shard(context, keys, n, [&](Shard& shard, const int64_t* positions, int64_t count) {
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    for (int64_t k = 0; k < count; ++k) {
      if (k + kPrefetchDistance < count) shard.prefetch(keys[positions[k + kPrefetchDistance]]);
      const int64_t i = positions[k];
      const int64_t id = shard.find_row(keys[i]);
      if (found) found[i] = id != kEmptyRow;
      if (id != kEmptyRow) {
        std::memcpy(values + i * dim_, shard.row(id), dim_ * sizeof(float));
      } else if (initial_for_missing) {
        initial_row(initializer_, keys[i], dim_, values + i * dim_);
      } else {
        std::fill(values + i * dim_, values + (i + 1) * dim_, 0.0f);
      }
    }
  });
}

template <typename Key>
void HashTable<Key>::insert_or_assign(const CpuContext& context, const Key* keys, int64_t n,
                                      const float* rows, const int64_t* frequencies,
                                      const int64_t* versions) {
  for_each_shard(context, keys, n, [&](Shard& shard, const int64_t* positions, int64_t count) {
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t i = positions[k];
      int64_t id = shard.find_row(keys[i]);
      if (id == kEmptyRow) id = shard.insert_absent(keys[i]);
      std::memcpy(shard.row(id), rows + i * shard.width, shard.width * sizeof(float));
      if (frequencies) shard.frequencies[id] = frequencies[i];
      if (versions) shard.versions[id] = versions[i];
    }
  });
}

template <typename Key>
int64_t HashTable<Key>::erase(const CpuContext& context, const Key* keys, int64_t n) {
  std::atomic<int64_t> erased{0};
  for_each_shard(context, keys, n, [&](Shard& shard, const int64_t* positions, int64_t count) {
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    int64_t local = 0;
    for (int64_t k = 0; k < count; ++k) local += shard.erase(keys[positions[k]]);
    erased += local;
  });
  return erased.load();
}

template <typename Key>
void HashTable<Key>::update_rows(const CpuContext& context, const Key* keys, int64_t n,
                                 int64_t global_step, const RowUpdate& update) {
  for_each_shard(context, keys, n, [&](Shard& shard, const int64_t* positions, int64_t count) {
    std::vector<float*> rows(count);
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    for (int64_t k = 0; k < count; ++k) {
      if (k + kPrefetchDistance < count) shard.prefetch(keys[positions[k + kPrefetchDistance]]);
      const Key key = keys[positions[k]];
      int64_t id = shard.find_row(key);
      if (id == kEmptyRow) {
        id = shard.insert_absent(key);
        fill_initial_row(key, shard.row(id));
      }
      shard.versions[id] = global_step;
      rows[k] = shard.row(id);
      shard.prefetch_row(id, shard.width);
    }
    update(positions, rows.data(), count);
  });
}

template <typename Key>
typename HashTable<Key>::Snapshot HashTable<Key>::export_all() const {
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  for (int s = 0; s < kNumShards; ++s) locks.emplace_back(shards_[s].mutex);
  Snapshot snapshot;
  int64_t total = 0;
  for (int s = 0; s < kNumShards; ++s) total += shards_[s].count;
  const int64_t width = shards_[0].width;
  snapshot.keys.reserve(total);
  snapshot.rows.resize(total * width);
  snapshot.frequencies.reserve(total);
  snapshot.versions.reserve(total);
  for (int s = 0; s < kNumShards; ++s) {
    const Shard& shard = shards_[s];
    for (size_t i = 0; i < shard.slot_rows.size(); ++i) {
      const int64_t id = shard.slot_rows[i];
      if (id == kEmptyRow) continue;
      std::memcpy(snapshot.rows.data() + snapshot.keys.size() * width, shard.row(id),
                  width * sizeof(float));
      snapshot.keys.push_back(shard.slot_keys[i]);
      snapshot.frequencies.push_back(shard.frequencies[id]);
      snapshot.versions.push_back(shard.versions[id]);
    }
  }
  return snapshot;
}

template <typename Key>
int64_t HashTable<Key>::evict_stale(int64_t global_step, int64_t steps_to_live) {
  int64_t evicted = 0;
  for (int s = 0; s < kNumShards; ++s) {
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    std::vector<Key> stale;
    for (size_t i = 0; i < shard.slot_rows.size(); ++i) {
      const int64_t id = shard.slot_rows[i];
      if (id != kEmptyRow && shard.versions[id] < global_step - steps_to_live) {
        stale.push_back(shard.slot_keys[i]);
      }
    }
    for (Key key : stale) evicted += shard.erase(key);
  }
  return evicted;
}

template class HashTable<int32_t>;
template class HashTable<int64_t>;

}  // namespace cpu
}  // namespace sok_ev
