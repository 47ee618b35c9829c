// Where an Embedding Variable's rows live: all in the table's device memory
// (the default), or, for a GPU table with DeepRec's HBM_DRAM storage, the
// rows within an HBM budget on the GPU and the rest in host memory
// (cc/tiered_table_gpu.h). Shared by the op layer and the core; no CUDA.
#ifndef SOK_EV_CC_STORAGE_SPEC_H_
#define SOK_EV_CC_STORAGE_SPEC_H_

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace sok_ev {

// Which rows stay in HBM when the budget is full. DeepRec's CacheStrategy
// numbers (config_pb2: LRU = 0, LFU = 1).
enum class CacheStrategy : int32_t {
  kLru = 0,  // the rows updated most recently (highest version) stay
  kLfu = 1,  // the rows looked up most often (highest frequency) stay
};

struct StorageSpec {
  // Bytes of HBM for the table's rows, values and optimizer slots together
  // ((1 + num_slots) * dim * 4 bytes a row); 0: every row in device memory.
  int64_t hbm_bytes = 0;
  CacheStrategy cache_strategy = CacheStrategy::kLfu;

  bool tiered() const { return hbm_bytes > 0; }
};

// The spec from op attributes; `name` is the variable's, for the message.
inline Status MakeStorageSpec(int64_t hbm_bytes, int64_t cache_strategy, int64_t dim,
                              const std::string& name, StorageSpec* spec) {
  if (hbm_bytes < 0 || (hbm_bytes > 0 && hbm_bytes < dim * 4)) {
    return Status::InvalidArgument(
        "Embedding Variable '" + name + "': the HBM budget (storage_size[0]) must be at least " +
        "one row of embedding_dim " + std::to_string(dim) + " (" + std::to_string(dim * 4) +
        " bytes), got " + std::to_string(hbm_bytes));
  }
  if (cache_strategy != 0 && cache_strategy != 1) {
    return Status::InvalidArgument("Embedding Variable '" + name +
                                   "': cache_strategy must be 0 (LRU) or 1 (LFU), got " +
                                   std::to_string(cache_strategy));
  }
  spec->hbm_bytes = hbm_bytes;
  spec->cache_strategy = static_cast<CacheStrategy>(cache_strategy);
  return Status::Ok();
}

// What a tiered table counts, from its creation (cumulative). Keys are
// counted once per call that needs them resident (a lookup, an update).
struct TierCounters {
  int64_t hits = 0;          // keys found in HBM
  int64_t misses = 0;        // keys not in HBM: brought from host memory, or new
  int64_t rows_to_hbm = 0;   // rows moved host -> HBM
  int64_t rows_to_host = 0;  // rows written back HBM -> host
  int64_t pcie_bytes = 0;    // bytes copied between host and GPU for the tiers
  int64_t calls = 0;         // calls that made keys resident
  int64_t hbm_rows = 0;      // rows in HBM now
  int64_t host_rows = 0;     // rows in host memory now
  // Host wall time of the moves, in microseconds (cumulative), so a slow
  // step can be split: choosing the rows to write back and copying them to
  // the host, writing them to the host tier and out of HBM, bringing rows in
  // (the host tier's lookup, the copy, HBM's insert). An op on several
  // tables runs each stage for all of them at once
  // (TieredTable::make_resident_together); a stage's time is then shared
  // out among them, so the sum over tables is the op's time.
  int64_t choose_us = 0;
  int64_t write_back_us = 0;
  int64_t bring_in_us = 0;
  // Parts of those three (a call's shared out equally among its tables):
  // the host tier's own work (splitting, finding, inserting and erasing
  // keys in its map), and the waits for the GPU's part of the moves.
  int64_t host_tier_us = 0;
  int64_t wait_us = 0;
  static constexpr int kFields = 13;

  // The fields in the order above (out: kFields values), as the op and the
  // harness return them.
  void to_fields(int64_t* out) const {
    const int64_t fields[kFields] = {
        hits,      misses,    rows_to_hbm,   rows_to_host, pcie_bytes,   calls,  hbm_rows,
        host_rows, choose_us, write_back_us, bring_in_us,  host_tier_us, wait_us};
    for (int i = 0; i < kFields; ++i) out[i] = fields[i];
  }
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_STORAGE_SPEC_H_
