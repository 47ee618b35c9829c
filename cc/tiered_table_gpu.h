// A GPU Embedding Variable's store: a gpu::HashTable in device memory (HBM)
// and, with DeepRec's HBM_DRAM storage (cc/storage_spec.h), a
// cpu::HashTable in host memory for the rows beyond the HBM budget.
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
// budget more than it must, so that the whole-table scan that picks the
// victims is not paid on every call.
//
// Rows moving between the tiers go through a pinned staging buffer per
// table (grown as needed), and the host tier's lookups, inserts and erases
// run on the context's host threads (GpuContext::host; the TF kernels pass
// TensorFlow's CPU worker threads).
//
// Errors. Host memory that the system refuses for written-back rows fails
// the call with ResourceExhausted naming the table; the rows already
// written for it are removed from the host tier again and nothing in HBM
// has changed.
//
// Concurrency: as gpu::HashTable, calls must not overlap (the op layer
// holds the variable's table lock). Each tiered call synchronises its
// stream once to learn how many of its keys HBM lacks; only when some are
// absent, or HBM is over its budget, do keys cross to the host.
#ifndef SOK_EV_CC_TIERED_TABLE_GPU_H_
#define SOK_EV_CC_TIERED_TABLE_GPU_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/common.h"
#include "cc/hash_table_cpu.h"
#include "cc/hash_table_gpu.h"
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
  //
  // It is queue_residency_check, a synchronisation of the stream, then
  // finish_residency. A multi-table op calls the halves itself, so that it
  // waits once for all of its tables.
  Status make_resident(const GpuContext& context, const std::vector<KeySpan<Key>>& spans) const;
  // Queues on the stream HBM's check of the spans' keys: the keys it lacks
  // are gathered on the GPU, and only their count (with HBM's row count)
  // is copied to the host. Nothing is read on the host yet; the spans'
  // memory must stay valid until finish_residency.
  Status queue_residency_check(const GpuContext& context,
                               const std::vector<KeySpan<Key>>& spans) const;
  // The rest of make_resident, once the stream has been synchronised after
  // queue_residency_check. When every key is in HBM and HBM is within its
  // budget (the common case) nothing more crosses the host link; else the
  // absent keys come to the host (the rows written back are chosen on the
  // GPU, so the call's other keys never do).
  Status finish_residency(const GpuContext& context) const;

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
  // cpu::HashTable::export_batches without its begin.
  using HostBatch = typename cpu::HashTable<Key>::ExportBatch;
  Status export_host_batches(int64_t max_batch,
                             const std::function<Status(const HostBatch& batch)>& emit) const;
  // Rows in the host tier (0 without a budget).
  int64_t host_size() const;

  // The counters, with hbm_rows and host_rows read now (syncs the stream).
  Status counters(const GpuContext& context, TierCounters* counters);

 private:
  TieredTable(HashTable<Key>* hbm, const StorageSpec& storage, const std::string& name);
  // One call's residency check from queue to finish: its spans, the device
  // buffers its kernels write, and the pinned host memory its counts land
  // in (allocated once per table). Defined in the .cu.
  struct ResidencyCheck;
  // The rows one write-back moves, chosen on the GPU. Defined in the .cu.
  struct Victims;
  // The `count` HBM rows that the cache strategy ranks lowest (by score,
  // then key) among those whose keys are not in the `keep` spans (fewer
  // when fewer are not kept). Rows are ranked and sorted on the GPU: only
  // their number crosses to the host here. Synchronises the stream.
  Status choose_victims(const GpuContext& context, int64_t count,
                        const std::vector<KeySpan<Key>>& keep, Victims* victims) const;
  // Writes choose_victims' rows back to host memory and erases them from HBM.
  Status evict(const GpuContext& context, int64_t count,
               const std::vector<KeySpan<Key>>& keep) const;
  // Moves the rows of `keys`, read from the host tier into the residency
  // check's staging (in key order), into HBM, and removes them from the
  // host tier.
  Status bring_in(const GpuContext& context, const std::vector<Key>& keys) const;
  // check_, made on first use.
  Status make_check() const;

  std::unique_ptr<HashTable<Key>> hbm_;
  std::unique_ptr<cpu::HashTable<Key>> host_;  // null without a budget
  StorageSpec storage_;
  std::string name_;
  // Where rows are changes nothing a caller sees, so const calls move
  // them; the counters count those calls.
  mutable TierCounters counters_;
  // Reused by every call (calls on a table never overlap); null until the
  // first check.
  mutable std::unique_ptr<ResidencyCheck> check_;
};

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_TIERED_TABLE_GPU_H_
