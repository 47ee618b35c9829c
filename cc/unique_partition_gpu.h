// GPU-only additions to cc/unique.h: unique_keys that also hands out the
// sort it is built on, so the backward pass needs no second sort, and its
// grouped form, which deduplicates the keys of many tables in one sort.
#ifndef SOK_EV_CC_UNIQUE_PARTITION_GPU_H_
#define SOK_EV_CC_UNIQUE_PARTITION_GPU_H_

#include <cstdint>

#include "cc/common.h"

namespace sok_ev {
namespace gpu {

// gpu::unique_keys (unique keys in ascending order), plus the entries of
// each unique key: unique u occurs at keys[order[j]] for j in
// [segments[u], segments[u + 1]), order ascending within a segment (the
// sort is stable).
//   keys: (n,)  unique_keys, inverse, order: (n,) out
//   segments: (n + 1,) out, the first *num_unique + 1 written
//   num_unique: (1,) out, device
template <typename Key>
void unique_keys_segmented(const GpuContext& context, const Key* keys, int64_t n, Key* unique_keys,
                           int64_t* inverse, int64_t* order, int64_t* segments,
                           int64_t* num_unique);

// unique_keys_segmented over the keys of num_tables tables at once, each
// table deduplicated on its own (equal keys of different tables stay
// apart). Table t's keys are keys[key_offsets[t] .. key_offsets[t + 1]);
// the outputs keep the tables one after another, indices global:
//   unique_keys, counts: table t's unique keys (ascending) and their
//       occurrences at [unique_offsets[t], unique_offsets[t + 1])
//   inverse: (n,) the global unique index of each entry
//   order: (n,) entries grouped by (table, key), ascending within a group;
//       table t's entries stay at [key_offsets[t], key_offsets[t + 1])
//   segments: unique g's entries are order[segments[g] .. segments[g + 1]);
//       the first unique_offsets[num_tables] + 1 are written
//   unique_offsets: (num_tables + 1,) out, device
// One radix sort over the keys and a one-pass sort by table, instead of one
// sort per table: a batch of 26 small tables costs about one big sort.
//   key_offsets: (num_tables + 1,) device; n = key_offsets[num_tables] (host)
//   unique_keys, counts, inverse, order: (n,) out   segments: (n + 1,) out
template <typename Key>
void unique_keys_grouped(const GpuContext& context, const Key* keys, int64_t n,
                         const int64_t* key_offsets, int num_tables, Key* unique_keys,
                         int64_t* counts, int64_t* inverse, int64_t* order, int64_t* segments,
                         int64_t* unique_offsets);

// unique_keys_grouped for keys that come as runs, each ascending without
// repeats: what an owner receives, every worker's unique keys (sorted by
// unique_keys_grouped) one worker after another. Table t's keys are
// num_runs runs, run r being keys[run_offsets[t * num_runs + r] ..
// run_offsets[t * num_runs + r + 1]). The runs are merged (each entry placed
// by a binary search in every other run of its table) instead of sorted:
// the outputs are unique_keys_grouped's, bit for bit (equal keys in run
// order). A run that is not ascending without repeats sets *unsorted to 1,
// and the outputs are then meaningless, though every index written stays
// inside the keys: the caller runs unique_keys_grouped instead.
//   key_offsets: (num_tables + 1,) device, key_offsets[t] =
//       run_offsets[t * num_runs]
//   run_offsets: (num_tables * num_runs + 1,) device
//   unique_keys, counts, inverse, order: (n,) out   segments: (n + 1,) out
//   unique_offsets: (num_tables + 1,) out   unsorted: (1,) out; all device
template <typename Key>
void unique_keys_of_runs_grouped(const GpuContext& context, const Key* keys, int64_t n,
                                 const int64_t* key_offsets, const int64_t* run_offsets,
                                 int num_tables, int num_runs, Key* unique_keys, int64_t* counts,
                                 int64_t* inverse, int64_t* order, int64_t* segments,
                                 int64_t* unique_offsets, int64_t* unsorted);

// values[i] = i for i < n: the grouping of keys already known to be
// distinct (each its own segment, one entry per sample).
//   values: (n,) out, device
void fill_iota(const GpuContext& context, int64_t* values, int64_t n);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_UNIQUE_PARTITION_GPU_H_
