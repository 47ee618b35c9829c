// What the grouped UniqueKeys and PartitionByOwner stages read and write per
// table, device-neutral: the outputs sized by the batch are allocated up
// front; those sized by the number of unique keys once the core knows it.
#ifndef SOK_EV_CC_KERNELS_UNIQUE_BUFFERS_H_
#define SOK_EV_CC_KERNELS_UNIQUE_BUFFERS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace sok_ev {

// One table's entries (a SparseTensor's values and row ids) and the outputs
// indexed by entry or by sample.
template <typename Key>
struct TableBatch {
  const Key* keys = nullptr;  // (nnz,)
  // Entry j's sample is sample_ids[j * sample_id_stride]: a SparseTensor's
  // (nnz, rank) indices read in place. Null: entry j is sample j (batch ==
  // nnz), as for the keys an owner received, and samples past nnz are
  // empty (an empty SparseTensor's indices are null too).
  const int64_t* sample_ids = nullptr;  // (nnz * sample_id_stride,)
  int64_t sample_id_stride = 1;
  // Non-null (then sample_ids is null): a RaggedTensor's row splits read in
  // place, sample b's entries being [row_splits[b], row_splits[b + 1])
  // minus first_entry, this table's first entry in the packed batch.
  const int64_t* row_splits = nullptr;  // (batch + 1,)
  int64_t first_entry = 0;
  // Null: each entry is one occurrence of its key. Otherwise entry j stands
  // for occurrences[j] of them, and a unique key's count is their sum.
  const int64_t* occurrences = nullptr;  // (nnz,)
  // Non-null (an owner's received keys): the entries are num_runs runs one
  // after another, run r holding run_lengths[r] of them, each normally
  // ascending without repeats (one worker's unique keys, as the GPU's
  // UniqueKeys sorts them). The GPU merges such runs instead of sorting
  // them; the CPU, whose UniqueKeys hashes, reads none of this.
  const int64_t* run_lengths = nullptr;  // (num_runs,) host
  int num_runs = 0;
  int64_t nnz = 0;
  int64_t batch = 0;
  int64_t* unique_index = nullptr;  // (nnz,) out: each entry's unique key
  // (nnz,) out: entries grouped by unique key; null where the core's
  // backward does not read them (Core<Device>::kBackwardReadsOrder).
  int64_t* order = nullptr;
  int64_t* row_offsets = nullptr;  // (batch + 1,) out: each sample's entries
};

// One table's outputs indexed by unique key.
template <typename Key>
struct UniqueBuffers {
  Key* unique_keys = nullptr;   // (num_unique,)
  int64_t* counts = nullptr;    // (num_unique,)
  int64_t* segments = nullptr;  // (num_unique + 1,)
};

// One table's unique keys for PartitionByOwner, and where its keys go.
template <typename Key>
struct OwnerBatch {
  const Key* keys = nullptr;  // (n,)
  int64_t n = 0;
  int32_t target_worker = -1;    // -1: each key to owner_of(key); else all there
  Key* keys_by_owner = nullptr;  // (n,) out, grouped by owner, stable
  int64_t* positions = nullptr;  // (n,) out: keys_by_owner[j] == keys[positions[j]]
  int64_t* counts = nullptr;     // (num_workers,) out: keys for each worker
};

// Called once per table with its number of unique keys; fills *buffers.
template <typename Key>
using UniqueAllocator =
    std::function<absl::Status(int table, int64_t num_unique, UniqueBuffers<Key>* buffers)>;

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_UNIQUE_BUFFERS_H_
