// The host-memory tier of a GPU Embedding Variable with HBM_DRAM storage
// (cc/tiered_table_gpu.h): the rows beyond the HBM budget, in memory the GPU
// reads and writes in place.
//
// A key's row lives in a record, [frequency | version | row | padding]:
// two int64, then row_width floats (value, then slots), padded to 16 bytes so
// that every record and its row start 16-byte aligned. Records sit in chunks
// from a HostMemory (the GPU side gives pinned host memory, so its kernels
// gather rows from records and scatter rows to them over the host link, and
// no row is ever copied on the host). The host keeps only the map from key to
// record.
//
// Memory. Keys are spread over kNumShards shards by the top bits of
// bucket_hash. A shard has an open-addressing map (linear probing, erase by
// backward shift, so no tombstones build up under the tier's steady inserts
// and erases; 16 bytes a slot, at most 5/8 full), a free list of records, and
// its chunks: the first holds 64 KiB of records, each next one twice the last,
// up to 8 MiB. An erased key's record goes to its shard's free list and is
// reused; chunks are returned only when the tier goes away.
//
// A record stays where it is until its key is erased or the tier is widened,
// so a record pointer from find or insert is valid until then.
//
// Concurrency: none inside. The tiered table calls it under its table lock;
// the shard-level steps of one batch (or of several tiers' batches) may run
// side by side, each shard from one thread.
#ifndef SOK_EV_CC_HOST_TIER_H_
#define SOK_EV_CC_HOST_TIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/common.h"

namespace sok_ev {

// Where a host tier's chunks come from. allocate returns null when the
// system refuses the memory.
struct HostMemory {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* pointer)> deallocate;
};

// The record layout, shared with the GPU kernels that read and write
// records (cc/tiered_table_gpu.cu).
struct HostRecord {
  static constexpr size_t kHeaderBytes = 2 * sizeof(int64_t);
  // Bytes of one record of row_width floats.
  SOK_EV_HOST_DEVICE static size_t bytes(int64_t row_width) {
    return (kHeaderBytes + row_width * sizeof(float) + 15) / 16 * 16;
  }
  SOK_EV_HOST_DEVICE static int64_t* frequency(char* record) {
    return reinterpret_cast<int64_t*>(record);
  }
  SOK_EV_HOST_DEVICE static int64_t* version(char* record) {
    return reinterpret_cast<int64_t*>(record) + 1;
  }
  SOK_EV_HOST_DEVICE static float* row(char* record) {
    return reinterpret_cast<float*>(record + kHeaderBytes);
  }
  SOK_EV_HOST_DEVICE static const int64_t* frequency(const char* record) {
    return reinterpret_cast<const int64_t*>(record);
  }
  SOK_EV_HOST_DEVICE static const int64_t* version(const char* record) {
    return reinterpret_cast<const int64_t*>(record) + 1;
  }
  SOK_EV_HOST_DEVICE static const float* row(const char* record) {
    return reinterpret_cast<const float*>(record + kHeaderBytes);
  }
};

template <typename Key>
class HostTier {
 public:
  static constexpr int kShardBits = 4;
  static constexpr int kNumShards = 1 << kShardBits;

  // row_width > 0; `name` names the table in errors.
  HostTier(int64_t row_width, HostMemory memory, std::string name);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  int64_t row_width() const { return row_width_; }
  size_t record_bytes() const { return HostRecord::bytes(row_width_); }
  // Keys stored.
  int64_t size() const;

  // A batch of keys grouped by shard: shard s's keys are
  // keys[positions[offsets[s] .. offsets[s + 1])].
  struct Batch {
    const Key* keys = nullptr;
    std::vector<int64_t> positions;  // (n,)
    std::vector<uint64_t> hashes;    // (n,) each key's bucket_hash
    int64_t offsets[kNumShards + 1] = {};
  };
  static Batch split(const Key* keys, int64_t n);

  // The shard-level steps, for shard `shard`'s keys of `batch` (each writes
  // only its keys' entries of `records`), so that the shards of one or
  // several tiers' batches run side by side.
  //   find:   records[i] = keys[i]'s record, or null.
  //   insert: records[i] = keys[i]'s record, a new one (contents unset) for a
  //           key not stored. ResourceExhausted naming the table when the
  //           system refuses memory; the keys inserted before it stay.
  //   erase:  removes the keys (their records are reused); returns how many
  //           were stored.
  void find(const Batch& batch, int shard, char** records) const;
  Status insert(const Batch& batch, int shard, char** records);
  int64_t erase(const Batch& batch, int shard);

  // Runs step(t, shard) for every tier t < tiers and every shard, side by
  // side on the context's threads (one pool call for several tiers'
  // batches); `keys` is their batches' keys in all, to size the work.
  static void for_each_shard(const CpuContext& context, size_t tiers, int64_t keys,
                             const std::function<void(size_t tier, int shard)>& step);

  // The same for a whole batch, the shards spread over the context's threads.
  // insert's first failure is returned.
  void find(const CpuContext& context, const Key* keys, int64_t n, char** records) const;
  Status insert(const CpuContext& context, const Key* keys, int64_t n, char** records);
  int64_t erase(const CpuContext& context, const Key* keys, int64_t n);

  // Makes every record `row_width` floats wide (>= the current width), the
  // new floats of each stored row set to `fill` (a slot added to the table).
  // The records move. ResourceExhausted, with the tier unchanged, when the
  // system refuses memory.
  Status widen(int64_t row_width, float fill);

  // Every stored key once, in batches of at most max_batch, in no particular
  // order; the batch's buffers are valid during emit only. The first failing
  // emit's Status is returned.
  using ExportBatch = RowBatch<Key>;
  Status export_batches(int64_t max_batch,
                        const std::function<Status(const ExportBatch& batch)>& emit) const;

  // Erases keys whose version is older than global_step - steps_to_live
  // (DeepRec's steps_to_live, as cpu::HashTable::evict_stale); returns how
  // many.
  int64_t evict_stale(int64_t global_step, int64_t steps_to_live);

 private:
  class Shard;
  // Runs step(i) for shard `shard`'s keys i of `batch` in turn, prefetching
  // the probes ahead, until a step returns false.
  template <typename Step>
  void for_each_key(const Batch& batch, int shard, const Step& step) const;
  Status out_of_memory(size_t bytes) const;

  int64_t row_width_;
  HostMemory memory_;
  std::string name_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_HOST_TIER_H_
