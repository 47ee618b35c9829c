// A GPU Embedding Variable's store: a gpu::HashTable in device memory (HBM)
// and, with DeepRec's HBM_DRAM storage (cc/storage_spec.h), a HostTier
// (cc/host_tier.h) in pinned host memory for the rows beyond the HBM budget.
//
// Without a budget it is the GPU hash table alone: every method forwards
// to it, nothing else runs.
//
// With a budget, every row lives in exactly one tier: a key present in the
// host tier is absent from HBM and the other way round. Rows keep their
// values, slots, frequency and version whichever tier they are in, so the
// tiers are invisible: every call sees and writes exactly what the same
// table held all in HBM would. Before any call that reads or writes rows of
// given keys in HBM (a lookup, an update, a restore batch), make_resident
// brings those keys' rows in from host memory and makes room for the keys
// that are new, writing back to host memory the rows that the cache
// strategy ranks lowest (LFU: lowest frequency; LRU: lowest version, the
// step of the last update) among the rows those keys do not use, ties
// broken by the key. Rows of the keys asked for are never evicted in that
// call, so when a batch has more keys than the budget holds, HBM holds them
// all until the next call, which evicts those it does not use (even when
// every key it asks for hits). An eviction frees an eighth of the
// budget (at most 65,536 rows) more than it must, so that the whole-table
// scan that picks the victims is not paid on every call.
//
// Rows move between the tiers on the GPU: a kernel writes the rows written
// back from HBM straight into their host records, and one reads the records
// of the rows brought in, both over the host link; the host only finds,
// inserts and erases keys in the host tier's map (on the context's host
// threads, GpuContext::host; the TF kernels pass TensorFlow's CPU worker
// threads), and the keys and record addresses cross in small pinned buffers
// per table. An op on several tables moves the rows of all of them stage by
// stage (make_resident_together).
//
// Errors. Host memory that the system refuses for written-back rows fails
// the call with ResourceExhausted naming the table; the rows already
// written for it are removed from the host tier again and nothing in HBM
// has changed.
//
// Concurrency: as gpu::HashTable, calls must not overlap (the op layer
// holds the variable's table lock). Each tiered call synchronises its
// stream once to learn how many of its keys HBM lacks; only when some are
// absent, or HBM is over its budget, do keys cross to the host. The HBM
// arena grows no further than the budget (HashTableOptions::
// arena_bytes_limit) unless one call's keys need more.
#ifndef SOK_EV_CC_TIERED_TABLE_GPU_H_
#define SOK_EV_CC_TIERED_TABLE_GPU_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/hash_table_gpu.h"
#include "cc/host_tier.h"
#include "cc/initializer.h"
#include "cc/storage_spec.h"

namespace sok_ev {
namespace gpu {

// Keys that one call needs resident, from one table (a table an op lists
// several times gives several spans, made resident together).
template <typename Key>
struct KeySpan {
  const Key* keys;                 // (n,) device
  int64_t n;                       // the host's bound
  const int64_t* count = nullptr;  // device, or null: only the first *count keys
};

template <typename Key>
class TieredTable {
 public:
  // As HashTable::Create; `storage` gives the HBM budget (none: HBM only),
  // `name` names the table in errors.
  static Status Create(const GpuContext& context, int64_t dim, const InitializerSpec& initializer,
                       const HashTableOptions& options, const StorageSpec& storage,
                       const std::string& name, TieredTable** table);
  ~TieredTable();
  TieredTable(const TieredTable&) = delete;
  TieredTable& operator=(const TieredTable&) = delete;

  // The HBM tier, for the kernels that read rows by row id.
  HashTable<Key>& hbm() { return *hbm_; }
  const HashTable<Key>& hbm() const { return *hbm_; }
  bool tiered() const { return host_ != nullptr; }
  const StorageSpec& storage() const { return storage_; }

  int64_t dim() const { return hbm_->dim(); }
  int num_slots() const { return hbm_->num_slots(); }
  int64_t row_width() const { return hbm_->row_width(); }
  std::vector<std::string> slot_names() const { return hbm_->slot_names(); }
  std::vector<float> slot_initial_values() const { return hbm_->slot_initial_values(); }
  // Rows the HBM budget holds at the current row width (at least 1).
  int64_t budget_rows() const;

  // Keys in both tiers; synchronises context.stream.
  Status size(const GpuContext& context, int64_t* size);
  // In both tiers, at the same index.
  Status add_slot(const GpuContext& context, const std::string& name, float initial_value,
                  int* index);

  // Brings the rows of the spans' keys (duplicates allowed) that are in the
  // host tier into HBM, and makes room in the budget for those that are in
  // neither tier, so that the HBM table's own calls on these keys then do
  // what they would on an all-HBM table. No-op without a budget. Const:
  // which tier holds a row is invisible to every call.
  Status make_resident(const GpuContext& context, const std::vector<KeySpan<Key>>& spans) const;

  // One table's keys in make_resident_together: a table an op lists several
  // times appears once, with all of its spans, so that no span's rows are
  // written back to make room for another's.
  struct Residency {
    const TieredTable* table;
    std::vector<KeySpan<Key>> spans;
  };
  // make_resident for several tables at once (a multi-table op), in stages
  // that each run for every table before the one wait they need, so the op
  // waits for the GPU about four times however many tables it has:
  //   1. HBM's check of every span in one kernel; the counts of absent keys
  //      come to the host (one wait). When every key is in HBM and HBM is
  //      within its budget -- the common case -- the call ends here.
  //   2. Each table's absent keys sorted on the GPU (one segmented sort) and
  //      copied to the host (one wait).
  //   3. The rows to write back chosen on the GPU for every table and
  //      their keys copied to the host, while the host tier finds the
  //      records of the rows to bring in (one wait).
  //   4. The keys written back inserted in the host tier; for every table
  //      the GPU writes their rows into their records and HBM erases them,
  //      then reads the records brought in and HBM inserts them (one wait);
  //      the keys brought in erased from the host tier.
  // Tables without a budget are skipped. A table whose move fails (host
  // memory refused for the rows written back, device memory for the rows
  // brought in) keeps every row in exactly one tier, as it was; the others'
  // moves complete, and the first error is returned.
  static Status make_resident_together(const GpuContext& context,
                                       const std::vector<Residency>& tables);

  // HashTable::insert_or_assign over both tiers (a restore or import batch):
  // the keys' rows are written to HBM, which is then brought back within the
  // budget (these keys may be written back too: no batch is in flight).
  Status insert_or_assign(const GpuContext& context, const Key* keys, int64_t n, const float* rows,
                          const int64_t* frequencies, const int64_t* versions);
  // From both tiers. keys: (n,) device; *num_erased: host, may be null.
  Status erase(const GpuContext& context, const Key* keys, int64_t n, int64_t* num_erased);
  // HashTable::evict_stale on both tiers.
  Status evict_stale(const GpuContext& context, int64_t global_step, int64_t steps_to_live,
                     int64_t* num_evicted);
  // HashTable::export_all over both tiers: HBM's keys first, then the host
  // tier's. Outputs are device memory.
  Status export_all(const GpuContext& context, Key* keys, float* rows, int64_t* frequencies,
                    int64_t* versions, int64_t capacity, int64_t* count);
  // The host tier's rows in host batches (none without a budget), as
  // HostTier::export_batches.
  using HostBatch = typename HostTier<Key>::ExportBatch;
  Status export_host_batches(int64_t max_batch,
                             const std::function<Status(const HostBatch& batch)>& emit) const;
  // Rows in the host tier (0 without a budget).
  int64_t host_size() const;

  // The counters, with hbm_rows and host_rows read now (syncs the stream).
  Status counters(const GpuContext& context, TierCounters* counters);

 private:
  TieredTable(HashTable<Key>* hbm, const StorageSpec& storage, const std::string& name);
  // Pinned host memory for the keys and record addresses of the rows a table
  // moves between its tiers, kept between calls. Defined in the .cu.
  struct Staging;
  // One table's part of one call that moves rows: what it asked for, what
  // HBM lacks, the rows chosen to write back. Defined in the .cu.
  struct Move;
  // Stages 3 and 4 of make_resident_together for the moves whose tables
  // must write rows back (evict_count > 0) or bring rows in (absent keys).
  static Status write_back_and_bring_in(const GpuContext& context, std::vector<Move>& moves);
  // A stage's host time (us), shared by the tables that took part: their
  // write-back's shares to that counter field, their bringing in's to
  // bring_in_us (so the tables' sums are the stage's time).
  static void share_stage_time(const std::vector<Move>& moves, int64_t stage_us,
                               int64_t TierCounters::*write_back_field);
  // Queues the choice of the move's rows to write back: the evict_count HBM
  // rows that the cache strategy ranks lowest (by score, then key) among
  // those whose keys are not in its spans. Rows are ranked and sorted on the
  // GPU; their keys are copied to the table's pinned staging and their HBM
  // row ids kept in the move. Nothing is read on the host until the stream
  // is synchronised.
  Status queue_write_back(const GpuContext& context, Move& move) const;
  // Finds the moves' absent keys in their host tiers (every table's shards
  // side by side) and keeps in each move's absent list the keys found, their
  // keys and records in its staging (found_keys, found_records).
  static Status find_host_records(const GpuContext& context, std::vector<Move>& moves);
  // staging_, made on first use.
  Status make_staging() const;

  std::unique_ptr<HashTable<Key>> hbm_;
  std::unique_ptr<HostTier<Key>> host_;  // null without a budget
  StorageSpec storage_;
  std::string name_;
  // Where rows are changes nothing a caller sees, so const calls move
  // them; the counters count those calls.
  mutable TierCounters counters_;
  // Reused by every call (calls on a table never overlap); null until the
  // first move.
  mutable std::unique_ptr<Staging> staging_;
};

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_TIERED_TABLE_GPU_H_
