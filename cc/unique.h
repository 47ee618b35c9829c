// Deduplication of a batch's keys, so every later stage (exchange, table
// lookup, optimizer) touches each key once, and the grouping of the batch's
// entries by unique key that the backward pass sums over.
#ifndef SOK_EV_CC_UNIQUE_H_
#define SOK_EV_CC_UNIQUE_H_

#include <cstdint>

#include "cc/common.h"

namespace sok_ev {
namespace cpu {

// unique_keys[inverse[i]] == keys[i] for every i. The CPU twin keeps first
// occurrence order, like tf.unique.
//   keys:         (n,)
//   unique_keys:  (n,) out, the first *num_unique entries are written
//   inverse:      (n,) out
//   counts:       (n,) out or null: occurrences of each unique key
//   num_unique:   (1,) out, host
template <typename Key>
void unique_keys(const CpuContext& context, const Key* keys, int64_t n, Key* unique_keys,
                 int64_t* inverse, int64_t* counts, int64_t* num_unique);

// Where each unique key's entries start once grouped by key:
// segments[u + 1] = segments[u] + counts[u], segments[0] = 0.
//   counts: (num_unique,) from unique_keys  segments: (num_unique + 1,) out
void segments_from_counts(const int64_t* counts, int64_t num_unique, int64_t* segments);

// The entries of each unique key, in ascending order: unique u owns
// order[segments[u] .. segments[u + 1]) (a stable counting sort by inverse).
// The CPU pipeline needs it only to spread one table's backward pass over
// threads (cpu::combine_backward), so it is built there.
//   inverse: (n,) from unique_keys  segments: (num_unique + 1,)
//   order: (n,) out
void group_entries_by_key(const int64_t* inverse, int64_t n, const int64_t* segments,
                          int64_t num_unique, int64_t* order);

// Each unique key's occurrences, summed over its entries, when an entry
// stands for several occurrences (an owner's keys: each worker sends its
// unique keys once, with their counts in its batch):
// counts[u] = sum of occurrences[j] over the entries j with inverse[j] == u.
//   occurrences, inverse: (n,)  counts: (num_unique,) out
void sum_occurrences_by_key(const int64_t* occurrences, const int64_t* inverse, int64_t n,
                            int64_t num_unique, int64_t* counts);

}  // namespace cpu

namespace gpu {

// The same contract with device pointers (num_unique too); the order of the
// unique keys is unspecified.
template <typename Key>
void unique_keys(const GpuContext& context, const Key* keys, int64_t n, Key* unique_keys,
                 int64_t* inverse, int64_t* counts, int64_t* num_unique);

// cpu::sum_occurrences_by_key with device pointers, over the entries grouped
// by key (unique u's are order[segments[u] .. segments[u + 1])); the number
// of unique keys is read on the device (no sync), at most max_unique.
//   num_unique: (1,) device
void sum_occurrences_by_key(const GpuContext& context, const int64_t* occurrences,
                            const int64_t* order, const int64_t* segments,
                            const int64_t* num_unique, int64_t max_unique, int64_t* counts);

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_UNIQUE_H_
