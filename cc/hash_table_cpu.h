// The CPU Embedding Variable store: a concurrent hash table from int32 or
// int64 keys to rows of floats, growing with no preset capacity.
//
// Every key value is valid: emptiness is kept in the index, not by a reserved
// key. A row is [value | slot 0 | slot 1 | ...], `dim` floats each. Each key
// also carries its frequency (lookups counted) and version (global step of
// its last update).
//
// Memory. Keys are spread over kNumShards shards by bucket_hash. A shard
// keeps its keys' records -- [key | frequency | version | row] -- in one
// growable block, and an open-addressing index of 8 bytes per slot (row id
// and a 32-bit hash tag, load factor at most 3/4) that points into it. So a
// key costs its record plus 11 to 21 bytes of index. Blocks of 64 KiB and
// more are mapped pages, grown with mremap (no copy, no transient second
// copy) and returned to the system when freed; smaller ones come from
// malloc, so a table of a few keys costs about what it holds. Adding a slot
// re-lays the records out in place, from the last to the first.
//
// Records move when their block grows: a row pointer is valid only while
// the caller holds the shard's lock, and only until the next insert.
//
// Concurrency: each shard has its own reader-writer lock. Lookups of present
// keys share it; inserts, updates and erases take it exclusively, so a
// concurrent update is never lost. A batch's lookups and updates lock every
// shard its keys fall in at once, in ascending shard order (as any call
// holding several shard locks does, so no two wait on each other in a
// cycle), and probe all those keys in one pipeline; with a thread pool the
// shards are split into groups that run side by side, each group taking its
// own locks. No lock is held across a thread-pool call.
#ifndef SOK_EV_CC_HASH_TABLE_CPU_H_
#define SOK_EV_CC_HASH_TABLE_CPU_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/common.h"
#include "cc/initializer.h"

namespace sok_ev {
namespace cpu {

// A resizable block of bytes (see the header comment for where it lives).
class GrowableBlock {
 public:
  GrowableBlock() = default;
  ~GrowableBlock();
  GrowableBlock(const GrowableBlock&) = delete;
  GrowableBlock& operator=(const GrowableBlock&) = delete;

  // Makes the block hold `bytes` bytes, keeping min(old, new) leading bytes;
  // the data may move. False when the system refuses the memory (the block
  // is then unchanged).
  bool resize(size_t bytes);
  char* data() const { return data_; }
  size_t size() const { return size_; }
  void swap(GrowableBlock& other) {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(mapped_, other.mapped_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

template <typename Key>
class HashTable {
 public:
  // Few shards: a batch locks all of its keys' shards at once anyway, and
  // each shard's records lie in one block, so fewer, larger blocks keep a
  // table's rows denser in memory (the one-hot CPU step measured about 15%
  // faster with 8 shards than with 64). Up to 8 groups of a batch run side by
  // side. A shard set fits a uint64_t mask.
  static constexpr int kShardBits = 3;
  static constexpr int kNumShards = 1 << kShardBits;

  // dim > 0. For kDefaultValueMatrix the matrix is copied, so the caller's
  // buffer may go away.
  HashTable(int64_t dim, const InitializerSpec& initializer);
  ~HashTable();
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  // How errors name the table (an Embedding Variable's name).
  void set_name(std::string name) { name_ = std::move(name); }

  int64_t dim() const { return dim_; }
  int num_slots() const;
  // Floats per row: (1 + num_slots()) * dim.
  int64_t row_width() const;
  // Number of keys stored.
  int64_t size() const;

  // Adds a per-key slot of `dim` floats named `name`, equal to
  // `initial_value` for every present and future key; *index gets its index
  // among the table's slots. A name already added gives its index.
  Status add_slot(const std::string& name, float initial_value, int* index);
  // Names and initial values of the slots, by index.
  std::vector<std::string> slot_names() const;
  std::vector<float> slot_initial_values() const;

  // Copies the values of `keys` into `values`, inserting missing keys with
  // their initial values. With remember_rows, the table keeps the keys and
  // the rows it found for them (replacing those of the previous such call),
  // so that an update_rows of the same keys in the same order -- a training
  // step's update after its lookup -- skips probing them again.
  //   keys:        (n,)
  //   values:      (n, dim) out
  //   frequencies: (n,) added to each key's frequency; null adds 1 per key
  Status find_or_insert(const CpuContext& context, const Key* keys, int64_t n, float* values,
                        const int64_t* frequencies, bool remember_rows = false);

  // Copies the values of present keys; missing keys get zeros (or their
  // initial value when `initial_for_missing`) and found[i] = false.
  //   values: (n, dim) out    found: (n,) out or null
  void find(const CpuContext& context, const Key* keys, int64_t n, float* values, bool* found,
            bool initial_for_missing) const;

  // Sets whole rows, inserting missing keys. Used by checkpoint restore.
  //   rows:        (n, row_width()) value then slots
  //   frequencies: (n,) or null     versions: (n,) or null
  Status insert_or_assign(const CpuContext& context, const Key* keys, int64_t n, const float* rows,
                          const int64_t* frequencies, const int64_t* versions);

  // Removes `keys`; returns how many were present.
  int64_t erase(const CpuContext& context, const Key* keys, int64_t n);

  // Applies `update` to the full rows of `keys` (distinct) under their
  // shards' exclusive locks, inserting missing keys first. update is called
  // once per group of shards (see Batch) with the positions (into keys; null:
  // keys 0 .. count - 1 in order) and row pointers of that group's keys.
  // Each key's version becomes `global_step`. When `keys` equal those of the
  // last find_or_insert with remember_rows, its rows are used
  // (once) for every shard that has had no erase since; a key keeps its row
  // until it is erased, so they are still its rows.
  using RowUpdate =
      std::function<void(const int64_t* positions, float* const* rows, int64_t count)>;
  Status update_rows(const CpuContext& context, const Key* keys, int64_t n, int64_t global_step,
                     const RowUpdate& update);

  // A consistent export of the whole table, in batches, without copying it:
  // every shard is read-locked for the whole call. begin(total, row_width)
  // is called first, then emit() with consecutive batches of at most
  // `max_batch` keys (in no particular order) that together hold every key
  // once. The first failing callback's Status is returned.
  using ExportBatch = RowBatch<Key>;
  Status export_batches(int64_t max_batch,
                        const std::function<Status(int64_t total, int64_t row_width)>& begin,
                        const std::function<Status(const ExportBatch& batch)>& emit) const;

  // Erases keys whose version is older than global_step - steps_to_live
  // (DeepRec's steps_to_live); returns how many.
  int64_t evict_stale(int64_t global_step, int64_t steps_to_live);

 private:
  struct Shard;
  // What find_or_insert(remember_rows) found, for update_rows.
  struct RememberedRows {
    std::vector<Key> keys;           // (n,)
    std::vector<int64_t> ids;        // (n,) row of keys[i] in its shard
    std::vector<uint64_t> erasures;  // (kNumShards,) each shard's erase count then
  };
  // A batch of keys hashed once and split into groups of shards that run
  // side by side: keys[i]'s hash is hashes[i], its shard the hash's low
  // kShardBits bits. Group g holds the keys at positions[offsets[g] ..
  // offsets[g + 1]) (no positions: one group, every key in order), which lie
  // in the shards of bit mask shards[g].
  struct Batch {
    std::unique_ptr<uint64_t[]> hashes;  // (n,)
    std::vector<int64_t> positions;      // (n,) or empty
    std::vector<int64_t> offsets;        // (groups + 1,)
    std::vector<uint64_t> shards;        // (groups,)
    int groups() const { return static_cast<int>(shards.size()); }
    const int64_t* group_positions(int g) const {
      return positions.empty() ? nullptr : positions.data() + offsets[g];
    }
    int64_t group_size(int g) const { return offsets[g + 1] - offsets[g]; }
  };
  // One group unless the context has threads and the batch is large.
  Batch split(const CpuContext& context, const Key* keys, int64_t n) const;
  // Runs work(g, positions, count) for every group of `batch` (side by side
  // when the context has threads); returns the first failure. Each unit of
  // work costs about `cost_per_key` per key.
  template <typename Work>
  Status for_each_group(const CpuContext& context, const Batch& batch, int64_t cost_per_key,
                        const Work& work) const;
  // ids[p(k)] = the row of keys[p(k)] in its shard, or -1, for k < count,
  // where p(k) = positions ? positions[k] : k; each found record's first
  // `floats` floats are asked for. In chunks of keys: after chunk [first,
  // first + n)'s ids are written, visit(first, n) runs while its rows are
  // still in cache. The caller holds the keys' shard locks.
  template <typename Visit>
  void find_rows(const Key* keys, const uint64_t* hashes, const int64_t* positions, int64_t count,
                 int64_t floats, int64_t* ids, const Visit& visit) const;
  Shard& shard_of(uint64_t hash) const;
  // Fills a new row: initial value, then every slot's initial value.
  void fill_initial_row(Key key, float* row) const;
  // The error for `bytes` the system did not give (names the table).
  Status out_of_memory(const char* what, size_t bytes) const;

  const int64_t dim_;
  std::string name_;
  InitializerSpec initializer_;
  std::vector<float> default_values_;  // backs initializer_.default_values
  std::unique_ptr<Shard[]> shards_;
  std::mutex remembered_mutex_;
  RememberedRows remembered_;
  // Slot layout; changed only by add_slot while it holds every shard lock.
  mutable std::mutex layout_mutex_;
  std::vector<std::string> slot_names_;
  std::vector<float> slot_initial_values_;
};

}  // namespace cpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_HASH_TABLE_CPU_H_
