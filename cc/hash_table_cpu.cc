// CPU twin of the Embedding Variable store. See cc/hash_table_cpu.h.
#include "cc/hash_table_cpu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <shared_mutex>

#include "cc/hash.h"

namespace sok_ev {
namespace cpu {
namespace {

// Blocks this large are mapped pages: their growth moves no bytes and their
// memory goes back to the system when freed (malloc would keep it).
constexpr size_t kMapBytes = size_t{64} << 10;
// Keys ahead whose index lines a lookup loop prefetches (their misses then
// overlap instead of coming one after another).
constexpr int64_t kPrefetchDistance = 8;
// An index entry: the row id + 1 in the low 32 bits (0 = empty slot), the
// high 32 bits of the key's hash above, which also give its home slot.
constexpr uint64_t kEmptyEntry = 0;
constexpr int64_t kMaxRowsPerShard = (int64_t{1} << 32) - 2;

// Copies a row of `dim` floats. A row is small (64 bytes at dim 16) and a
// lookup copies one per key: fixed-size pieces are copied inline, where
// memcpy(dim * 4) was a library call per key (3% of the one-hot CPU step).
inline void copy_row(float* dst, const float* src, int64_t dim) {
  int64_t c = 0;
  for (; c + 16 <= dim; c += 16) __builtin_memcpy(dst + c, src + c, 16 * sizeof(float));
  for (; c + 4 <= dim; c += 4) __builtin_memcpy(dst + c, src + c, 4 * sizeof(float));
  for (; c < dim; ++c) dst[c] = src[c];
}

size_t page_rounded(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

uint32_t tag_of(uint64_t hash) { return static_cast<uint32_t>(hash >> 32); }
int64_t id_of(uint64_t entry) { return static_cast<int64_t>(entry & 0xffffffffULL) - 1; }
uint64_t make_entry(uint32_t tag, int64_t id) {
  return (static_cast<uint64_t>(tag) << 32) | static_cast<uint64_t>(id + 1);
}

// Frequencies are bumped under a shared lock by concurrent lookups.
void atomic_add(int64_t* target, int64_t delta) {
  __atomic_fetch_add(target, delta, __ATOMIC_RELAXED);
}

// Holds the locks of the shards in `mask` (bit s: shards[s]), shared or
// exclusive, taken in ascending shard order.
template <typename Shard, bool kExclusive>
class ShardLocks {
 public:
  ShardLocks(Shard* shards, uint64_t mask) : shards_(shards), mask_(mask) {
    for_each_mutex([](auto& mutex) { kExclusive ? mutex.lock() : mutex.lock_shared(); });
  }
  ~ShardLocks() { unlock(); }
  ShardLocks(const ShardLocks&) = delete;
  ShardLocks& operator=(const ShardLocks&) = delete;

  void unlock() {
    for_each_mutex([](auto& mutex) { kExclusive ? mutex.unlock() : mutex.unlock_shared(); });
    mask_ = 0;
  }

 private:
  template <typename F>
  void for_each_mutex(const F& f) {
    for (uint64_t m = mask_; m != 0; m &= m - 1) f(shards_[__builtin_ctzll(m)].mutex);
  }

  Shard* shards_;
  uint64_t mask_;
};

// Below this many keys a batch is one group of shards: splitting it would
// cost more than it spreads.
constexpr int64_t kMinKeysToSplit = 2048;

}  // namespace

GrowableBlock::~GrowableBlock() { resize(0); }

bool GrowableBlock::resize(size_t bytes) {
  if (bytes == size_) return true;
  const bool map = bytes >= kMapBytes;
  char* moved = nullptr;
  if (bytes == 0) {
    moved = nullptr;
  } else if (!map && !mapped_) {
    moved = static_cast<char*>(std::realloc(data_, bytes));
    if (moved == nullptr) return false;
    data_ = moved;
    size_ = bytes;
    return true;
  } else if (map && mapped_) {
    void* p = mremap(data_, page_rounded(size_), page_rounded(bytes), MREMAP_MAYMOVE);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<char*>(p);
    size_ = bytes;
    return true;
  } else if (map) {  // from malloc to mapped pages
    void* p = mmap(nullptr, page_rounded(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    moved = static_cast<char*>(p);
  } else {  // from mapped pages back to malloc
    moved = static_cast<char*>(std::malloc(bytes));
    if (moved == nullptr) return false;
  }
  if (moved != nullptr && data_ != nullptr) std::memcpy(moved, data_, std::min(size_, bytes));
  if (mapped_) {
    munmap(data_, page_rounded(size_));
  } else {
    std::free(data_);
  }
  data_ = moved;
  size_ = bytes;
  mapped_ = map && bytes != 0;
  return true;
}

// One lock's worth of the table: the records of its keys and the index that
// finds them.
template <typename Key>
struct HashTable<Key>::Shard {
  struct Header {
    int64_t key;  // key_bits(key)
    int64_t frequency;
    int64_t version;
  };

  mutable std::shared_mutex mutex;
  int64_t width = 0;         // floats per row
  int64_t record_bytes = 0;  // sizeof(Header) + width floats
  GrowableBlock records;     // (row_capacity, record_bytes)
  int64_t row_capacity = 0;
  int64_t rows_used = 0;            // row ids handed out, free ones included
  std::vector<uint32_t> free_rows;  // row ids released by erase
  GrowableBlock index;              // (capacity,) entries
  int64_t capacity = 0;             // 0 or a power of two
  int64_t count = 0;                // keys stored
  uint64_t erasures = 0;            // keys erased so far: a row id changes owner only then

  void set_width(int64_t new_width) {
    width = new_width;
    record_bytes = static_cast<int64_t>(sizeof(Header)) + new_width * 4;
  }

  uint64_t* entries() const { return reinterpret_cast<uint64_t*>(index.data()); }
  Header* header(int64_t id) const {
    return reinterpret_cast<Header*>(records.data() + id * record_bytes);
  }
  float* row(int64_t id) const {
    return reinterpret_cast<float*>(records.data() + id * record_bytes + sizeof(Header));
  }

  // Index slot of `key` (*found = true) or the empty slot where it would go,
  // probing from slot `start` (tag_of(hash) & (capacity - 1) for a whole probe).
  int64_t probe_from(Key key, uint64_t hash, int64_t start, bool* found) const {
    const uint64_t* e = entries();
    const int64_t mask = capacity - 1;
    const uint32_t tag = tag_of(hash);
    const int64_t bits = static_cast<int64_t>(key_bits(key));
    int64_t i = start;
    while (e[i] != kEmptyEntry) {
      if (static_cast<uint32_t>(e[i] >> 32) == tag && header(id_of(e[i]))->key == bits) {
        *found = true;
        return i;
      }
      i = (i + 1) & mask;
    }
    *found = false;
    return i;
  }
  int64_t probe(Key key, uint64_t hash, bool* found) const {
    return probe_from(key, hash, tag_of(hash) & (capacity - 1), found);
  }

  // The first slot of `hash`'s probe that is empty or holds its tag, read
  // from the index alone: the record there (almost always the key's) can be
  // asked for before probe_from compares the key in it.
  int64_t first_tag_match(uint64_t hash) const {
    const uint64_t* e = entries();
    const int64_t mask = capacity - 1;
    const uint32_t tag = tag_of(hash);
    int64_t i = tag & mask;
    while (e[i] != kEmptyEntry && static_cast<uint32_t>(e[i] >> 32) != tag) i = (i + 1) & mask;
    return i;
  }

  // Asks for row `id`'s record: its header and first `floats` floats.
  void prefetch_row(int64_t id, int64_t floats) const {
    const char* r = records.data() + id * record_bytes;
    const int64_t bytes = static_cast<int64_t>(sizeof(Header)) + floats * 4;
    for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(r + c);
    __builtin_prefetch(r + bytes - 1);
  }

  // Row id of `key`, or -1.
  int64_t find_row(Key key) const {
    if (count == 0) return -1;
    bool found;
    const int64_t i = probe(key, bucket_hash(key), &found);
    return found ? id_of(entries()[i]) : -1;
  }

  // Moves every entry into an index of new_capacity slots; false (index
  // unchanged) when out of memory.
  bool rehash(int64_t new_capacity) {
    GrowableBlock fresh;
    if (!fresh.resize(new_capacity * sizeof(uint64_t))) return false;
    uint64_t* to = reinterpret_cast<uint64_t*>(fresh.data());
    std::memset(to, 0, new_capacity * sizeof(uint64_t));
    const uint64_t* from = entries();
    const int64_t mask = new_capacity - 1;
    for (int64_t i = 0; i < capacity; ++i) {
      if (from[i] == kEmptyEntry) continue;
      int64_t j = static_cast<uint32_t>(from[i] >> 32) & mask;
      while (to[j] != kEmptyEntry) j = (j + 1) & mask;
      to[j] = from[i];
    }
    index.swap(fresh);
    capacity = new_capacity;
    return true;
  }

  // Inserts a key known to be absent; *id gets its row, whose floats the
  // caller fills. Allocates first, so on failure nothing has changed.
  // Records may move. Returns the bytes that could not be allocated, or 0.
  size_t insert_absent(Key key, int64_t* id) {
    if (4 * (count + 1) > 3 * capacity) {
      const int64_t grown = std::max<int64_t>(4, 2 * capacity);
      if (!rehash(grown)) return grown * sizeof(uint64_t);
    }
    if (free_rows.empty() && rows_used == row_capacity) {
      const int64_t grown = std::min(kMaxRowsPerShard, std::max<int64_t>(1, 2 * row_capacity));
      if (grown == row_capacity || !records.resize(grown * record_bytes)) {
        return grown * record_bytes;
      }
      row_capacity = grown;
    }
    if (!free_rows.empty()) {
      *id = free_rows.back();
      free_rows.pop_back();
    } else {
      *id = rows_used++;
    }
    const uint64_t hash = bucket_hash(key);
    bool found;
    const int64_t slot = probe(key, hash, &found);
    entries()[slot] = make_entry(tag_of(hash), *id);
    Header* h = header(*id);
    h->key = static_cast<int64_t>(key_bits(key));
    h->frequency = 0;
    h->version = 0;
    ++count;
    return 0;
  }

  // Removes `key` with backward-shift deletion, which keeps every probe
  // sequence unbroken without tombstones.
  bool erase(Key key) {
    if (count == 0) return false;
    bool found;
    int64_t hole = probe(key, bucket_hash(key), &found);
    if (!found) return false;
    uint64_t* e = entries();
    free_rows.push_back(static_cast<uint32_t>(id_of(e[hole])));
    ++erasures;
    e[hole] = kEmptyEntry;
    --count;
    const int64_t mask = capacity - 1;
    for (int64_t j = (hole + 1) & mask; e[j] != kEmptyEntry; j = (j + 1) & mask) {
      const int64_t home = static_cast<uint32_t>(e[j] >> 32) & mask;
      // Entry j may stay only if its home lies cyclically in (hole, j].
      const bool stays = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
      if (stays) continue;
      e[hole] = e[j];
      e[j] = kEmptyEntry;
      hole = j;
    }
    return true;
  }

  // Re-lays the records out with `new_width` floats, filling the added tail
  // of every row with `fill`. The block must already hold row_capacity
  // records of the new width; the last record moves first, so no record is
  // overwritten before it has moved.
  void relayout(int64_t new_width, float fill) {
    const int64_t old_bytes = record_bytes;
    const int64_t old_width = width;
    set_width(new_width);
    for (int64_t id = rows_used - 1; id >= 0; --id) {
      char* to = records.data() + id * record_bytes;
      std::memmove(to, records.data() + id * old_bytes, old_bytes);
      float* row = reinterpret_cast<float*>(to + sizeof(Header));
      std::fill(row + old_width, row + new_width, fill);
    }
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
  for (int s = 0; s < kNumShards; ++s) shards_[s].set_width(dim);
}

template <typename Key>
HashTable<Key>::~HashTable() = default;

template <typename Key>
Status HashTable<Key>::out_of_memory(const char* what, size_t bytes) const {
  return Status::ResourceExhausted(
      "Embedding Variable '" + name_ + "' (embedding_dim " + std::to_string(dim_) + ", " +
      std::to_string(row_width()) + " floats per row with its slots, " + std::to_string(size()) +
      " keys): out of memory allocating " + std::to_string(bytes) + " bytes for " + what);
}

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
Status HashTable<Key>::add_slot(const std::string& name, float initial_value, int* index) {
  std::lock_guard<std::mutex> layout_lock(layout_mutex_);
  for (size_t i = 0; i < slot_names_.size(); ++i) {
    if (slot_names_[i] == name) {
      *index = static_cast<int>(i);
      return Status::Ok();
    }
  }
  // Every shard, in index order so that two add_slot calls cannot deadlock.
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (int s = 0; s < kNumShards; ++s) locks.emplace_back(shards_[s].mutex);
  const int64_t new_width = (2 + static_cast<int64_t>(slot_names_.size())) * dim_;
  const int64_t new_record = static_cast<int64_t>(sizeof(typename Shard::Header)) + 4 * new_width;
  // Every block grows before any record moves, so a refusal changes nothing.
  for (int s = 0; s < kNumShards; ++s) {
    Shard& shard = shards_[s];
    if (!shard.records.resize(shard.row_capacity * new_record)) {
      for (int t = 0; t < s; ++t) {
        shards_[t].records.resize(shards_[t].row_capacity * shards_[t].record_bytes);
      }
      locks.clear();
      return out_of_memory("a new optimizer slot", shard.row_capacity * new_record);
    }
  }
  for (int s = 0; s < kNumShards; ++s) shards_[s].relayout(new_width, initial_value);
  slot_names_.push_back(name);
  slot_initial_values_.push_back(initial_value);
  *index = static_cast<int>(slot_names_.size()) - 1;
  return Status::Ok();
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
typename HashTable<Key>::Shard& HashTable<Key>::shard_of(uint64_t hash) const {
  return shards_[hash & (kNumShards - 1)];
}

template <typename Key>
typename HashTable<Key>::Batch HashTable<Key>::split(const CpuContext& context, const Key* keys,
                                                     int64_t n) const {
  Batch batch;
  batch.hashes.reset(new uint64_t[std::max<int64_t>(1, n)]);
  uint64_t* hashes = batch.hashes.get();
  int group_bits = 0;  // groups of kNumShards >> group_bits consecutive shards
  if (context.parallelism > 1 && n >= kMinKeysToSplit) {
    while (group_bits < kShardBits && (1 << group_bits) < 2 * context.parallelism) ++group_bits;
  }
  const int groups = 1 << group_bits;
  const int shift = kShardBits - group_bits;
  batch.shards.assign(groups, 0);
  batch.offsets.assign(groups + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    hashes[i] = bucket_hash(keys[i]);
    const int s = static_cast<int>(hashes[i] & (kNumShards - 1));
    batch.shards[s >> shift] |= uint64_t{1} << s;
    ++batch.offsets[(s >> shift) + 1];
  }
  for (int g = 0; g < groups; ++g) batch.offsets[g + 1] += batch.offsets[g];
  if (groups > 1) {
    std::vector<int64_t> cursor(batch.offsets.begin(), batch.offsets.end() - 1);
    batch.positions.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      batch.positions[cursor[(hashes[i] & (kNumShards - 1)) >> shift]++] = i;
    }
  }
  return batch;
}

template <typename Key>
template <typename Work>
Status HashTable<Key>::for_each_group(const CpuContext& context, const Batch& batch,
                                      int64_t cost_per_key, const Work& work) const {
  if (batch.groups() == 1) {
    return batch.group_size(0) == 0 ? Status::Ok() : work(0, nullptr, batch.group_size(0));
  }
  std::mutex error_mutex;
  Status first_error;
  const int64_t cost = std::max<int64_t>(1, batch.offsets.back() / batch.groups()) * cost_per_key;
  context.parallel_for(batch.groups(), cost, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int group = static_cast<int>(g);
      if (batch.group_size(group) == 0) continue;
      Status status = work(group, batch.group_positions(group), batch.group_size(group));
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (first_error.ok()) first_error = std::move(status);
      }
    }
  });
  return first_error;
}

template <typename Key>
template <typename Visit>
void HashTable<Key>::find_rows(const Key* keys, const uint64_t* hashes, const int64_t* positions,
                               int64_t count, int64_t floats, int64_t* ids,
                               const Visit& visit) const {
  // In chunks, three passes: ask for every key's index line, then read the
  // index and ask for the record there, then compare the keys. Each pass's
  // misses overlap, instead of one probe's index and record misses following
  // each other.
  constexpr int64_t kChunk = 128;  // a chunk's lines stay in L1/L2 between passes
  int64_t slots[kChunk];
  for (int64_t first = 0; first < count; first += kChunk) {
    const int64_t n = std::min(count - first, kChunk);
    auto at = [&](int64_t k) { return positions ? positions[first + k] : first + k; };
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t hash = hashes[at(k)];
      const Shard& shard = shard_of(hash);
      if (shard.count != 0)
        __builtin_prefetch(shard.entries() + (tag_of(hash) & (shard.capacity - 1)));
    }
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t hash = hashes[at(k)];
      const Shard& shard = shard_of(hash);
      if (shard.count == 0) {
        slots[k] = -1;
        continue;
      }
      slots[k] = shard.first_tag_match(hash);
      const uint64_t entry = shard.entries()[slots[k]];
      if (entry != kEmptyEntry) shard.prefetch_row(id_of(entry), floats);
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = at(k);
      if (slots[k] < 0) {
        ids[i] = -1;
        continue;
      }
      const Shard& shard = shard_of(hashes[i]);
      bool found = false;
      const int64_t slot = shard.probe_from(keys[i], hashes[i], slots[k], &found);
      ids[i] = found ? id_of(shard.entries()[slot]) : -1;
    }
    visit(first, n);
  }
}

template <typename Key>
Status HashTable<Key>::find_or_insert(const CpuContext& context, const Key* keys, int64_t n,
                                      float* values, const int64_t* frequencies,
                                      bool remember_rows) {
  // No erase count can match this: a shard whose rows may have changed owner
  // while it was unlocked is not remembered.
  constexpr uint64_t kNotRemembered = ~uint64_t{0};
  const Batch batch = split(context, keys, n);
  const uint64_t* hashes = batch.hashes.get();
  std::unique_ptr<int64_t[]> ids(new int64_t[std::max<int64_t>(1, n)]);
  std::vector<uint64_t> erasures(kNumShards, kNotRemembered);  // seen under the shared locks
  auto frequency = [&](int64_t i) { return frequencies ? frequencies[i] : int64_t{1}; };
  const Status status = for_each_group(
      context, batch, dim_ + 64, [&](int g, const int64_t* positions, int64_t count) -> Status {
        std::vector<int64_t> missing;
        uint64_t missing_shards = 0;
        {
          ShardLocks<Shard, false> lock(shards_.get(), batch.shards[g]);
          for (uint64_t m = batch.shards[g]; m != 0; m &= m - 1) {
            erasures[__builtin_ctzll(m)] = shards_[__builtin_ctzll(m)].erasures;
          }
          // Each chunk's keys found (their records asked for), then copied
          // while those records are still in cache.
          find_rows(keys, hashes, positions, count, dim_, ids.get(),
                    [&](int64_t first, int64_t chunk) {
                      for (int64_t k = first; k < first + chunk; ++k) {
                        const int64_t i = positions ? positions[k] : k;
                        const int64_t id = ids[i];
                        if (id < 0) {
                          missing.push_back(i);
                          missing_shards |= uint64_t{1} << (hashes[i] & (kNumShards - 1));
                          continue;
                        }
                        const Shard& shard = shard_of(hashes[i]);
                        copy_row(values + i * dim_, shard.row(id), dim_);
                        atomic_add(&shard.header(id)->frequency, frequency(i));
                      }
                    });
        }
        if (missing.empty()) return Status::Ok();
        ShardLocks<Shard, true> lock(shards_.get(), missing_shards);
        for (int64_t i : missing) {
          Shard& shard = shard_of(hashes[i]);
          // Another thread, or an earlier duplicate in this batch, may have
          // inserted the key since the shared lock was released.
          int64_t id = shard.find_row(keys[i]);
          if (id < 0) {
            if (size_t bytes = shard.insert_absent(keys[i], &id)) {
              lock.unlock();
              return out_of_memory("new keys", bytes);
            }
            fill_initial_row(keys[i], shard.row(id));
          }
          copy_row(values + i * dim_, shard.row(id), dim_);
          shard.header(id)->frequency += frequency(i);
          ids[i] = id;
        }
        // The rows found under the shared lock still hold their keys unless
        // a key was erased in between.
        for (uint64_t m = missing_shards; m != 0; m &= m - 1) {
          const int s = __builtin_ctzll(m);
          if (shards_[s].erasures != erasures[s]) erasures[s] = kNotRemembered;
        }
        return Status::Ok();
      });
  if (remember_rows && status.ok()) {
    RememberedRows found;
    found.keys.assign(keys, keys + n);
    found.ids.assign(ids.get(), ids.get() + n);
    found.erasures = std::move(erasures);
    std::lock_guard<std::mutex> lock(remembered_mutex_);
    remembered_ = std::move(found);
  }
  return status;
}

template <typename Key>
void HashTable<Key>::find(const CpuContext& context, const Key* keys, int64_t n, float* values,
                          bool* found, bool initial_for_missing) const {
  const Batch batch = split(context, keys, n);
  const uint64_t* hashes = batch.hashes.get();
  std::unique_ptr<int64_t[]> ids(new int64_t[std::max<int64_t>(1, n)]);
  for_each_group(context, batch, dim_ + 64,
                 [&](int g, const int64_t* positions, int64_t count) -> Status {
                   ShardLocks<Shard, false> lock(shards_.get(), batch.shards[g]);
                   find_rows(keys, hashes, positions, count, dim_, ids.get(),
                             [&](int64_t first, int64_t chunk) {
                               for (int64_t k = first; k < first + chunk; ++k) {
                                 const int64_t i = positions ? positions[k] : k;
                                 const int64_t id = ids[i];
                                 if (found) found[i] = id >= 0;
                                 if (id >= 0) {
                                   copy_row(values + i * dim_, shard_of(hashes[i]).row(id), dim_);
                                 } else if (initial_for_missing) {
                                   initial_row(initializer_, keys[i], dim_, values + i * dim_);
                                 } else {
                                   std::fill(values + i * dim_, values + (i + 1) * dim_, 0.0f);
                                 }
                               }
                             });
                   return Status::Ok();
                 });
}

template <typename Key>
Status HashTable<Key>::insert_or_assign(const CpuContext& context, const Key* keys, int64_t n,
                                        const float* rows, const int64_t* frequencies,
                                        const int64_t* versions) {
  const Batch batch = split(context, keys, n);
  const uint64_t* hashes = batch.hashes.get();
  return for_each_group(context, batch, row_width() + 64,
                        [&](int g, const int64_t* positions, int64_t count) -> Status {
                          ShardLocks<Shard, true> lock(shards_.get(), batch.shards[g]);
                          for (int64_t k = 0; k < count; ++k) {
                            const int64_t i = positions ? positions[k] : k;
                            Shard& shard = shard_of(hashes[i]);
                            int64_t id = shard.find_row(keys[i]);
                            if (id < 0) {
                              if (size_t bytes = shard.insert_absent(keys[i], &id)) {
                                lock.unlock();
                                return out_of_memory("restored keys", bytes);
                              }
                            }
                            std::memcpy(shard.row(id), rows + i * shard.width,
                                        shard.width * sizeof(float));
                            if (frequencies) shard.header(id)->frequency = frequencies[i];
                            if (versions) shard.header(id)->version = versions[i];
                          }
                          return Status::Ok();
                        });
}

template <typename Key>
int64_t HashTable<Key>::erase(const CpuContext& context, const Key* keys, int64_t n) {
  const Batch batch = split(context, keys, n);
  std::atomic<int64_t> erased{0};
  for_each_group(context, batch, 64, [&](int g, const int64_t* positions, int64_t count) -> Status {
    ShardLocks<Shard, true> lock(shards_.get(), batch.shards[g]);
    int64_t local = 0;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t i = positions ? positions[k] : k;
      local += shard_of(batch.hashes[i]).erase(keys[i]);
    }
    erased += local;
    return Status::Ok();
  });
  return erased.load();
}

template <typename Key>
Status HashTable<Key>::update_rows(const CpuContext& context, const Key* keys, int64_t n,
                                   int64_t global_step, const RowUpdate& update) {
  // The rows of the lookup of these very keys, taken once.
  RememberedRows remembered;
  {
    std::lock_guard<std::mutex> lock(remembered_mutex_);
    if (n > 0 && static_cast<int64_t>(remembered_.keys.size()) == n &&
        std::equal(keys, keys + n, remembered_.keys.begin())) {
      remembered = std::move(remembered_);
      remembered_ = RememberedRows();
    }
  }
  const Batch batch = split(context, keys, n);
  const uint64_t* hashes = batch.hashes.get();
  std::unique_ptr<int64_t[]> ids(new int64_t[std::max<int64_t>(1, n)]);
  return for_each_group(context, batch, row_width() + 64,
                        [&](int g, const int64_t* positions, int64_t count) -> Status {
                          const uint64_t shards = batch.shards[g];
                          ShardLocks<Shard, true> lock(shards_.get(), shards);
                          auto at = [&](int64_t k) { return positions ? positions[k] : k; };
                          // Every key was found or inserted by the lookup when no shard of the
                          // group has had an erase since.
                          bool known = !remembered.keys.empty();
                          for (uint64_t m = shards; known && m != 0; m &= m - 1) {
                            const int s = __builtin_ctzll(m);
                            known = remembered.erasures[s] == shards_[s].erasures;
                          }
                          const int64_t width = shards_[0].width;
                          if (known) {
                            for (int64_t k = 0; k < count; ++k) ids[at(k)] = remembered.ids[at(k)];
                          } else {
                            find_rows(keys, hashes, positions, count, width, ids.get(),
                                      [](int64_t, int64_t) {});
                            // Inserts first: they may move the records, so row pointers come after.
                            for (int64_t k = 0; k < count; ++k) {
                              const int64_t i = at(k);
                              if (ids[i] >= 0) continue;
                              Shard& shard = shard_of(hashes[i]);
                              ids[i] = shard.find_row(keys[i]);  // a repeated key was just inserted
                              if (ids[i] >= 0) continue;
                              if (size_t bytes = shard.insert_absent(keys[i], &ids[i])) {
                                lock.unlock();
                                return out_of_memory("new keys", bytes);
                              }
                              fill_initial_row(keys[i], shard.row(ids[i]));
                            }
                          }
                          std::unique_ptr<float*[]> rows(new float*[count]);
                          for (int64_t k = 0; k < std::min(count, kPrefetchDistance); ++k) {
                            shard_of(hashes[at(k)]).prefetch_row(ids[at(k)], width);
                          }
                          for (int64_t k = 0; k < count; ++k) {
                            if (k + kPrefetchDistance < count) {
                              const int64_t ahead = at(k + kPrefetchDistance);
                              shard_of(hashes[ahead]).prefetch_row(ids[ahead], width);
                            }
                            const int64_t i = at(k);
                            const Shard& shard = shard_of(hashes[i]);
                            shard.header(ids[i])->version = global_step;
                            rows[k] = shard.row(ids[i]);
                          }
                          update(positions, rows.get(), count);
                          return Status::Ok();
                        });
}

template <typename Key>
Status HashTable<Key>::export_batches(
    int64_t max_batch, const std::function<Status(int64_t total, int64_t row_width)>& begin,
    const std::function<Status(const ExportBatch& batch)>& emit) const {
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  for (int s = 0; s < kNumShards; ++s) locks.emplace_back(shards_[s].mutex);
  int64_t total = 0;
  for (int s = 0; s < kNumShards; ++s) total += shards_[s].count;
  const int64_t width = shards_[0].width;
  Status status = begin(total, width);
  if (!status.ok() || total == 0) return status;
  const int64_t capacity = std::max<int64_t>(1, std::min(max_batch, total));
  std::vector<Key> keys(capacity);
  std::vector<float> rows(capacity * width);
  std::vector<int64_t> frequencies(capacity), versions(capacity);
  int64_t filled = 0;
  auto flush = [&]() -> Status {
    if (filled == 0) return Status::Ok();
    ExportBatch batch{keys.data(), rows.data(), frequencies.data(), versions.data(), filled};
    filled = 0;
    return emit(batch);
  };
  for (int s = 0; s < kNumShards; ++s) {
    const Shard& shard = shards_[s];
    // Records in row order (sequential memory), skipping released rows.
    std::vector<uint32_t> released = shard.free_rows;
    std::sort(released.begin(), released.end());
    size_t next_released = 0;
    for (int64_t id = 0; id < shard.rows_used; ++id) {
      if (next_released < released.size() && released[next_released] == id) {
        ++next_released;
        continue;
      }
      const auto* h = shard.header(id);
      keys[filled] = static_cast<Key>(h->key);
      frequencies[filled] = h->frequency;
      versions[filled] = h->version;
      std::memcpy(rows.data() + filled * width, shard.row(id), width * sizeof(float));
      if (++filled == capacity) {
        status = flush();
        if (!status.ok()) return status;
      }
    }
  }
  return flush();
}

template <typename Key>
int64_t HashTable<Key>::evict_stale(int64_t global_step, int64_t steps_to_live) {
  int64_t evicted = 0;
  for (int s = 0; s < kNumShards; ++s) {
    Shard& shard = shards_[s];
    std::unique_lock<std::shared_mutex> lock(shard.mutex);
    std::vector<Key> stale;
    const uint64_t* e = shard.entries();
    for (int64_t i = 0; i < shard.capacity; ++i) {
      if (e[i] == kEmptyEntry) continue;
      const auto* h = shard.header(id_of(e[i]));
      if (h->version < global_step - steps_to_live) stale.push_back(static_cast<Key>(h->key));
    }
    for (Key key : stale) evicted += shard.erase(key);
  }
  return evicted;
}

template class HashTable<int32_t>;
template class HashTable<int64_t>;

}  // namespace cpu
}  // namespace sok_ev
