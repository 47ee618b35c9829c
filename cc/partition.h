// Placement of keys on workers, and grouping of keys by owner for the
// all-to-all exchange of model parallelism.
#ifndef SOK_EV_CC_PARTITION_H_
#define SOK_EV_CC_PARTITION_H_

#include <cstdint>

#include "cc/common.h"
#include "cc/hash.h"

namespace sok_ev {

// The worker that stores `key` of a table sharded over `num_workers`
// (target_gpu = -1). Checkpoints depend on this function: changing it moves
// keys between shards, so it is part of the on-disk contract.
//
//   owner_of(key, W) = mix64(int64(key) XOR 0x5bd1e9955bd1e995) mod W
//
// where mix64 is the splitmix64 finalizer (cc/hash.h) and int32 keys are
// sign-extended to int64 first. A well-mixed hash rather than key % W,
// because real id spaces are skewed (ids allocated in strides, by time...).
constexpr uint64_t kOwnerSalt = 0x5bd1e9955bd1e995ULL;

template <typename Key>
SOK_EV_HOST_DEVICE int32_t owner_of(Key key, int32_t num_workers) {
  return static_cast<int32_t>(mix64(key_bits(key) ^ kOwnerSalt) %
                              static_cast<uint64_t>(num_workers));
}

namespace cpu {

// Groups `keys` by owner, stable within each owner.
//   keys:            (n,) host
//   num_workers:     W >= 1
//   keys_by_owner:   (n,) out: keys of owner 0, then of owner 1, ...
//   positions:       (n,) out: keys_by_owner[j] == keys[positions[j]]
//   counts:          (W,) out: how many keys each owner receives
template <typename Key>
void partition_by_owner(const CpuContext& context, const Key* keys, int64_t n, int32_t num_workers,
                        Key* keys_by_owner, int64_t* positions, int64_t* counts);

}  // namespace cpu

namespace gpu {

// The same contract as cpu::partition_by_owner, with device pointers
// (counts too) and work ordered on context.stream.
template <typename Key>
void partition_by_owner(const GpuContext& context, const Key* keys, int64_t n, int32_t num_workers,
                        Key* keys_by_owner, int64_t* positions, int64_t* counts);

// partition_by_owner for the keys of num_tables tables in one sort (one
// launch sequence instead of one per table). Table t's keys are
// keys[key_offsets[t] .. key_offsets[t + 1]); with target_workers[t] >= 0
// they all go to that worker, else each to owner_of. Table t's results stay
// at its own entries, positions global (subtract key_offsets[t]):
//   keys_by_owner, positions: (n,) out
//   counts: (num_tables * num_workers,) out, table t's at t * num_workers
//   key_offsets: (num_tables + 1,) device   target_workers: (num_tables,) device
template <typename Key>
void partition_by_owner_grouped(const GpuContext& context, const Key* keys, int64_t n,
                                const int64_t* key_offsets, const int64_t* target_workers,
                                int num_tables, int32_t num_workers, Key* keys_by_owner,
                                int64_t* positions, int64_t* counts);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_PARTITION_H_
