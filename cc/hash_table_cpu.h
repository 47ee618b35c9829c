// The CPU Embedding Variable store: a concurrent hash table from int32 or
// int64 keys to rows of floats, growing with no preset capacity.
//
// Every key value is valid: emptiness is kept in the row-id array, not by a
// reserved key. A row is [value | slot 0 | slot 1 | ...], `dim` floats each,
// stored in chunks that never move, so row pointers stay valid while the
// table grows. Each key also carries its frequency (lookups counted) and
// version (global step of its last update).
//
// Concurrency: keys are spread over kNumShards shards by bucket_hash; each
// shard has its own reader-writer lock, open-addressing index and row
// chunks. Lookups of present keys share the lock; inserts, updates and
// erases take it exclusively, so a concurrent update is never lost.
#ifndef SOK_EV_CC_HASH_TABLE_CPU_H_
#define SOK_EV_CC_HASH_TABLE_CPU_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/initializer.h"

namespace sok_ev {
namespace cpu {

template <typename Key>
class HashTable {
 public:
  static constexpr int kNumShards = 64;

  // dim > 0. For kDefaultValueMatrix the matrix is copied, so the caller's
  // buffer may go away.
  HashTable(int64_t dim, const InitializerSpec& initializer);
  ~HashTable();
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  int64_t dim() const { return dim_; }
  int num_slots() const;
  // Floats per row: (1 + num_slots()) * dim.
  int64_t row_width() const;
  // Number of keys stored.
  int64_t size() const;

  // Adds a per-key slot of `dim` floats named `name`, equal to
  // `initial_value` for every present and future key, and returns its index
  // among the table's slots. A name already added returns its index.
  int add_slot(const std::string& name, float initial_value);
  // Names and initial values of the slots, by index.
  std::vector<std::string> slot_names() const;
  std::vector<float> slot_initial_values() const;

  // Copies the values of `keys` into `values`, inserting missing keys with
  // their initial values.
  //   keys:        (n,)
  //   values:      (n, dim) out
  //   frequencies: (n,) added to each key's frequency; null adds 1 per key
  void find_or_insert(const CpuContext& context, const Key* keys, int64_t n, float* values,
                      const int64_t* frequencies);

  // Copies the values of present keys; missing keys get zeros (or their
  // initial value when `initial_for_missing`) and found[i] = false.
  //   values: (n, dim) out    found: (n,) out or null
  void find(const CpuContext& context, const Key* keys, int64_t n, float* values, bool* found,
            bool initial_for_missing) const;

  // Sets whole rows, inserting missing keys. Used by checkpoint restore.
  //   rows:        (n, row_width()) value then slots
  //   frequencies: (n,) or null     versions: (n,) or null
  void insert_or_assign(const CpuContext& context, const Key* keys, int64_t n, const float* rows,
                        const int64_t* frequencies, const int64_t* versions);

  // Removes `keys`; returns how many were present.
  int64_t erase(const CpuContext& context, const Key* keys, int64_t n);

  // Applies `update` to the full rows of `keys` (distinct) under their
  // shards' exclusive locks, inserting missing keys first. update is called
  // once per shard with the positions (into keys) and row pointers of that
  // shard's keys. Each key's version becomes `global_step`.
  using RowUpdate =
      std::function<void(const int64_t* positions, float* const* rows, int64_t count)>;
  void update_rows(const CpuContext& context, const Key* keys, int64_t n, int64_t global_step,
                   const RowUpdate& update);

  // A consistent copy of the whole table, keys in no particular order.
  struct Snapshot {
    std::vector<Key> keys;             // (size,)
    std::vector<float> rows;           // (size, row_width)
    std::vector<int64_t> frequencies;  // (size,)
    std::vector<int64_t> versions;     // (size,)
  };
  Snapshot export_all() const;

  // Erases keys whose version is older than global_step - steps_to_live
  // (DeepRec's steps_to_live); returns how many.
  int64_t evict_stale(int64_t global_step, int64_t steps_to_live);

 private:
  struct Shard;
  // Positions of `keys` grouped by shard: positions of shard s are
  // order[offsets[s] .. offsets[s + 1]).
  void group_by_shard(const Key* keys, int64_t n, std::vector<int64_t>* order,
                      std::vector<int64_t>* offsets) const;
  // Runs work(shard, positions, count) for every shard that has keys.
  void for_each_shard(const CpuContext& context, const Key* keys, int64_t n,
                      const std::function<void(Shard&, const int64_t*, int64_t)>& work) const;
  // Fills a new row: initial value, then every slot's initial value.
  void fill_initial_row(Key key, float* row) const;

  const int64_t dim_;
  InitializerSpec initializer_;
  std::vector<float> default_values_;  // backs initializer_.default_values
  std::unique_ptr<Shard[]> shards_;
  // Slot layout; changed only by add_slot while it holds every shard lock.
  mutable std::mutex layout_mutex_;
  std::vector<std::string> slot_names_;
  std::vector<float> slot_initial_values_;
};

}  // namespace cpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_HASH_TABLE_CPU_H_
