// CPU twin of unique_keys. See cc/unique.h.
#include <algorithm>
#include <vector>

#include "cc/hash.h"
#include "cc/unique.h"

namespace sok_ev {
namespace cpu {

namespace {

// unique_keys with positions of type Index in the private index: int32 keeps
// a batch's index within a core's L2 cache where it fits.
template <typename Index, typename Key>
void unique_keys_indexed(const Key* keys, int64_t n, Key* unique_keys, int64_t* inverse,
                         int64_t* counts, int64_t* num_unique) {
  // An open-addressing index over positions in unique_keys; capacity a power
  // of two at least 2n keeps probes short.
  int64_t capacity = 16;
  while (capacity < 2 * n) capacity <<= 1;
  const int64_t mask = capacity - 1;
  std::vector<Index> index(capacity, -1);
  Index found = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t slot = static_cast<int64_t>(bucket_hash(keys[i])) & mask;
    while (index[slot] >= 0 && unique_keys[index[slot]] != keys[i]) {
      slot = (slot + 1) & mask;
    }
    if (index[slot] < 0) {
      index[slot] = found;
      unique_keys[found] = keys[i];
      if (counts) counts[found] = 0;
      ++found;
    }
    inverse[i] = index[slot];
    if (counts) ++counts[index[slot]];
  }
  *num_unique = found;
}

}  // namespace

template <typename Key>
void unique_keys(const CpuContext& /*context*/, const Key* keys, int64_t n, Key* unique_keys,
                 int64_t* inverse, int64_t* counts, int64_t* num_unique) {
  // Serial on purpose: the TF layer runs tables side by side, and one pass
  // over a table's batch is cheap next to the table work that follows.
  if (n < (int64_t{1} << 31)) {
    unique_keys_indexed<int32_t>(keys, n, unique_keys, inverse, counts, num_unique);
  } else {
    unique_keys_indexed<int64_t>(keys, n, unique_keys, inverse, counts, num_unique);
  }
}

void segments_from_counts(const int64_t* counts, int64_t num_unique, int64_t* segments) {
  segments[0] = 0;
  for (int64_t u = 0; u < num_unique; ++u) segments[u + 1] = segments[u] + counts[u];
}

void group_entries_by_key(const int64_t* inverse, int64_t n, const int64_t* segments,
                          int64_t num_unique, int64_t* order) {
  std::vector<int64_t> cursor(segments, segments + num_unique);
  for (int64_t i = 0; i < n; ++i) order[cursor[inverse[i]]++] = i;
}

void sum_occurrences_by_key(const int64_t* occurrences, const int64_t* inverse, int64_t n,
                            int64_t num_unique, int64_t* counts) {
  std::fill(counts, counts + num_unique, int64_t{0});
  for (int64_t i = 0; i < n; ++i) counts[inverse[i]] += occurrences[i];
}

template void unique_keys<int32_t>(const CpuContext&, const int32_t*, int64_t, int32_t*, int64_t*,
                                   int64_t*, int64_t*);
template void unique_keys<int64_t>(const CpuContext&, const int64_t*, int64_t, int64_t*, int64_t*,
                                   int64_t*, int64_t*);

}  // namespace cpu
}  // namespace sok_ev
