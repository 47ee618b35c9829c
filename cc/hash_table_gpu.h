// The GPU Embedding Variable store: the twin of cpu::HashTable
// (cc/hash_table_cpu.h) with device pointers and work ordered on
// context.stream.
//
// Layout. An open-addressing index of buckets of kBucketSlots slots, probed
// bucket after bucket (linear probing by bucket). Each slot has a key and a
// separate 32-bit state word, so every key value is valid:
//   state >= 0  occupied, the key's row id in the arena
//   kEmptySlot  never used: a probe for a missing key stops at its bucket
//   kErasedSlot erased (tombstone): probes go on past it, inserts reuse it
//   kLockedSlot being filled by an inserting thread of the same launch
// Rows live in a separate arena, row_width() floats each ([value | slot0 |
// slot1 ...], dim floats each), plus per-row frequency and version. Growing
// the index rehashes keys and row ids only; rows never move except when the
// arena itself is enlarged or add_slot() widens rows.
//
// Concurrency. Within one launch any thread may insert any key, duplicates
// included: a slot is claimed by compare-and-swap on its state, and a thread
// that meets a locked slot waits for it to be published before comparing
// keys, so a key is inserted at most once. Different methods must not run
// concurrently with each other (they are ordered on one stream).
//
// Sizing without synchronising. The host keeps upper bounds on the slots and
// rows in use. After each insert the counters are copied to pinned host
// memory behind an event; when a call could exceed the capacity, the newest
// copy that has landed (no wait) tightens the bounds to what it saw plus the
// keys sent since. Only when that does not suffice does the host read the
// exact counts back (one stream sync) and grow.
#ifndef SOK_EV_CC_HASH_TABLE_GPU_H_
#define SOK_EV_CC_HASH_TABLE_GPU_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/initializer.h"

namespace sok_ev {
namespace gpu {

constexpr int kBucketSlots = 16;
constexpr int32_t kEmptySlot = -1;
constexpr int32_t kErasedSlot = -2;
constexpr int32_t kLockedSlot = -3;
// Slots beyond the value; rows carry their initial values in kernel args.
constexpr int kMaxTableSlots = 8;

// Plain-old-data view of a table for kernels (fused lookups read it).
template <typename Key>
struct TableView {
  Key* keys = nullptr;        // (num_buckets * kBucketSlots,)
  int32_t* states = nullptr;  // (num_buckets * kBucketSlots,)
  uint64_t bucket_mask = 0;   // num_buckets - 1, num_buckets a power of 2
  float* rows = nullptr;      // (row_capacity, row_width)
  int64_t row_width = 0;      // (1 + num_slots) * dim
  int64_t dim = 0;
  int64_t* frequencies = nullptr;  // (row_capacity,)
  int64_t* versions = nullptr;     // (row_capacity,)
  InitializerSpec initializer;     // default_values in device memory
  int num_slots = 0;
  float slot_initial[kMaxTableSlots] = {};
};

// Device-side counters, read back only when the host bounds say so.
struct TableCounters {
  unsigned long long size;        // occupied slots (keys stored)
  unsigned long long used_slots;  // occupied + erased slots
  unsigned long long next_row;    // rows handed out from the arena's end
  long long free_rows;            // entries in the free-row stack
  unsigned long long absent;      // scratch of prepare_inserts: keys of one call not present
};

struct HashTableOptions {
  int64_t initial_capacity = 1 << 16;  // keys, before the first growth
  float max_load_factor = 0.75f;       // (occupied + erased) / slots
  float arena_growth = 1.25f;          // factor the row arena grows by
  // Bytes of rows (values and slots) the arena's growth stops at, unless a
  // call needs more (0: no limit). A tiered table's HBM budget, so that
  // the factor's step does not overshoot it.
  int64_t arena_bytes_limit = 0;
};

template <typename Key>
class HashTable;

// One table's keys in HashTable::find_or_insert_tables.
template <typename Key>
struct FindOrInsertJob {
  HashTable<Key>* table;
  const Key* keys;  // (n,) device
  int64_t n;        // the host's bound on the keys, which sizes the launch
  // Device, or null: when set, only the first *count (<= n) keys are
  // resolved, so a count computed on the GPU needs no sync.
  const int64_t* count = nullptr;
  // (n,) added to each key's frequency, or null: 1 each.
  const int64_t* frequencies = nullptr;
  // False: frequencies stay as they are (the optimizer's apply: the lookup
  // counted the keys already).
  bool count_frequency = true;
  int64_t* row_ids = nullptr;  // (n,) out or null: each key's arena row
  float* values = nullptr;     // (n, dim) out or null: each key's value
};

template <typename Key>
class HashTable {
 public:
  // dim in [1, 1024]. For kDefaultValueMatrix the (default_value_dim, dim)
  // matrix in device memory is copied. The context's allocator (or
  // cudaMallocAsync when null) provides every buffer, for the table's life.
  static Status Create(const GpuContext& context, int64_t dim, const InitializerSpec& initializer,
                       const HashTableOptions& options, HashTable** table);
  ~HashTable();
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  int64_t dim() const { return dim_; }
  int num_slots() const { return static_cast<int>(slot_names_.size()); }
  int64_t row_width() const { return (1 + num_slots()) * dim_; }
  // Number of keys stored; synchronises context.stream.
  Status size(const GpuContext& context, int64_t* size);
  // Device bytes the table holds (index, arena, per-row counters, free list).
  size_t memory_bytes() const;
  int64_t bucket_count() const { return num_buckets_; }
  int64_t row_capacity() const { return row_capacity_; }

  // As cpu::HashTable::add_slot: every present and future key gets the slot
  // at `initial_value`. At most kMaxTableSlots slots.
  Status add_slot(const GpuContext& context, const std::string& name, float initial_value,
                  int* index);
  std::vector<std::string> slot_names() const { return slot_names_; }
  std::vector<float> slot_initial_values() const { return slot_initial_; }

  // Makes room for `keys` more keys without growing later.
  Status reserve(const GpuContext& context, int64_t keys);

  // Inserts missing keys with their initial rows; copies values out.
  //   keys:        (n,) device
  //   values:      (n, dim) out or null (then only the insert happens)
  //   frequencies: (n,) or null: added to each key's frequency (1 when null)
  //   row_ids:     (n,) out or null: each key's arena row
  Status find_or_insert(const GpuContext& context, const Key* keys, int64_t n, float* values,
                        const int64_t* frequencies, int64_t* row_ids);

  // Copies the values of present keys; missing keys get zeros (or their
  // initial value when initial_for_missing) and found[i] = false.
  //   values: (n, dim) out    found: (n,) out or null
  Status find(const GpuContext& context, const Key* keys, int64_t n, float* values, bool* found,
              bool initial_for_missing) const;

  // Sets whole rows, inserting missing keys (checkpoint restore). When a key
  // repeats within one call, which of its rows is kept is unspecified.
  //   rows: (n, row_width())   frequencies, versions: (n,) or null (then
  //   new keys start at 0 and present keys keep theirs)
  Status insert_or_assign(const GpuContext& context, const Key* keys, int64_t n, const float* rows,
                          const int64_t* frequencies, const int64_t* versions);

  // Removes keys; *num_erased (host, may be null: then no sync) gets how many
  // were present.
  Status erase(const GpuContext& context, const Key* keys, int64_t n, int64_t* num_erased);

  // The row ids of `keys`, inserting missing keys with their initial rows;
  // frequencies stay as they are (the optimizer's apply: the lookup counted
  // the keys already). Valid until the next call that inserts.
  //   keys: (n,)  row_ids: (n,) out, device
  //   count: device, or null: when set, only the first *count (<= n) keys
  //     are resolved, so a count computed on the GPU needs no sync (n is
  //     the host's bound for sizing)
  Status find_or_insert_rows(const GpuContext& context, const Key* keys, int64_t n,
                             const int64_t* count, int64_t* row_ids);

  // find_or_insert / find_or_insert_rows for many tables at once: each
  // table's sizing on the host, then one insert launch for all and one copy
  // of their counters. A table listed k times is inserted into by k
  // launches, in list order, so each one's sizing sees the inserts before it.
  // The row ids stay valid until the next call that inserts.
  //   jobs: (n,) host
  static Status find_or_insert_tables(const GpuContext& context, const FindOrInsertJob<Key>* jobs,
                                      size_t n);

  // For row ids already resolved by find_or_insert (no second probe): sets
  // each row's version and returns its full-row pointer.
  // row_ids: (n,) device, from this table since its last insert.
  Status rows_for_ids(const GpuContext& context, const int64_t* row_ids, int64_t n,
                      int64_t global_step, float** rows);

  // Copies every key, row, frequency and version out, in no particular
  // order. Outputs hold `capacity` entries; *count (host) gets the number
  // written; fails if the table holds more than capacity keys.
  Status export_all(const GpuContext& context, Key* keys, float* rows, int64_t* frequencies,
                    int64_t* versions, int64_t capacity, int64_t* count) const;

  // Erases keys whose version < global_step - steps_to_live.
  Status evict_stale(const GpuContext& context, int64_t global_step, int64_t steps_to_live,
                     int64_t* num_evicted);

  // For fused kernels. Valid until the next call that inserts or grows.
  TableView<Key> view() const;
  // The device counters (TableCounters), for kernels and copies that read
  // them in stream order.
  const TableCounters* device_counters() const { return counters_; }

 private:
  HashTable(int64_t dim, const InitializerSpec& initializer, const HashTableOptions& options,
            DeviceAllocator* allocator);
  void* allocate(size_t bytes);
  void deallocate(void* pointer);
  Status wait_before_free(const GpuContext& context);
  Status read_counters(const GpuContext& context, TableCounters* counters) const;
  // Ensures room in the index and the arena for the keys of each job of one
  // round of find_or_insert_tables (members: indices into jobs, each table
  // once). While a table's host bounds show room for all its keys, nothing
  // is read; otherwise its counters are read, together with how many of its
  // keys are absent when the bounds are far off, so the table grows only by
  // keys that are really new. One sync serves every table read. The caller
  // holds the tables' locks until their insert kernels are queued (the
  // counts stay exact).
  static Status prepare_inserts(const GpuContext& context, const FindOrInsertJob<Key>* jobs,
                                const std::vector<size_t>& members);
  // The stages of prepare_inserts for one table: whether the host bounds
  // fit `incoming` more keys (tightened from landed snapshots first); if
  // not, the exact counters' copy to exact_counters_ queued (after counting
  // the absent keys of keys, (incoming,) device, when *count_absent); after
  // the sync, the table grown as the counters say, and *incoming lowered to
  // the absent keys when they were counted.
  bool bounds_fit(int64_t incoming);
  Status queue_exact_read(const GpuContext& context, const Key* keys, int64_t incoming,
                          const int64_t* count, bool* count_absent);
  Status size_from_exact_read(const GpuContext& context, int64_t* incoming, bool count_absent);
  // The index's occupied + erased slots allowed by max_load_factor.
  double slot_limit() const;
  Status rehash(const GpuContext& context, int64_t num_buckets);
  Status grow_arena(const GpuContext& context, int64_t row_capacity, int64_t new_row_width);
  struct CounterSnapshot;
  // Where the next copy of the counters after an insert goes, or null while
  // the last copy there is still under way (or pinned memory could not be
  // had: the bounds then stay correct, only looser).
  CounterSnapshot* free_snapshot();
  // After the copy into `snapshot` was queued: records its event.
  void snapshot_queued(const GpuContext& context, CounterSnapshot* snapshot);
  // Tightens the host bounds from the snapshots that have landed.
  void tighten_bounds();

  const int64_t dim_;
  InitializerSpec initializer_;
  HashTableOptions options_;
  DeviceAllocator* allocator_;
  void* allocation_stream_ = nullptr;  // for cudaMallocAsync when no allocator
  float* default_values_ = nullptr;    // device copy backing initializer_

  Key* keys_ = nullptr;
  int32_t* states_ = nullptr;
  int64_t num_buckets_ = 0;
  float* arena_ = nullptr;
  int64_t* frequencies_ = nullptr;
  int64_t* versions_ = nullptr;
  int32_t* free_rows_ = nullptr;  // (row_capacity_,) stack of erased rows
  int64_t row_capacity_ = 0;
  TableCounters* counters_ = nullptr;  // device

  // Host upper bounds of counters_.used_slots and .next_row.
  int64_t used_slots_bound_ = 0;
  int64_t next_row_bound_ = 0;
  // Keys sent to inserts so far (each may have been new).
  int64_t incoming_total_ = 0;
  TableCounters* exact_counters_ = nullptr;  // pinned host: prepare_inserts' reads
  struct CounterSnapshot {
    void* event = nullptr;            // cudaEvent_t, recorded after the copy
    TableCounters* host = nullptr;    // pinned
    TableCounters* device = nullptr;  // the same memory as kernels write it
    int64_t incoming_total = 0;       // incoming_total_ when it was taken
    bool taken = false;
  };
  static constexpr int kSnapshots = 4;
  CounterSnapshot snapshots_[kSnapshots];
  int next_snapshot_ = 0;

  std::vector<std::string> slot_names_;
  std::vector<float> slot_initial_;
};

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_HASH_TABLE_GPU_H_
