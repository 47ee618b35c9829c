// gpu::unique_keys and gpu::partition_by_owner: both sort-based (CUB radix
// sort is stable), so positions within an owner keep batch order. An
// owner's received keys, already sorted runs, are merged instead.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cc/lower_bound_gpu.h"
#include "cc/partition.h"
#include "cc/status_gpu.h"
#include "cc/unique.h"
#include "cc/unique_partition_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;

__global__ void iota_kernel(int64_t* values, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    values[i] = i;
  }
}

// Thread u sums unique key u's occurrences (cc/unique.h).
__global__ void sum_occurrences_kernel(const int64_t* occurrences, const int64_t* order,
                                       const int64_t* segments, const int64_t* num_unique,
                                       int64_t* counts) {
  const int64_t count = *num_unique;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < count;
       u += int64_t(gridDim.x) * blockDim.x) {
    int64_t sum = 0;
    for (int64_t j = segments[u]; j < segments[u + 1]; ++j) sum += occurrences[order[j]];
    counts[u] = sum;
  }
}

// 1 where a run of equal keys starts; with tables, a new table starts a run
// too (equal keys of different tables are different).
//   sorted: (n,)  tables: (n,) or null  heads: (n,) out
template <typename Key>
__global__ void run_heads_kernel(const Key* sorted, const int32_t* tables, int64_t n,
                                 int64_t* heads) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    heads[i] =
        (i == 0 || sorted[i] != sorted[i - 1] || (tables != nullptr && tables[i] != tables[i - 1]))
            ? 1
            : 0;
  }
}

// The table holding each entry: the last t with key_offsets[t] <= position
// (empty tables share their offset with the next one).
//   positions: (n,)  key_offsets: (num_tables + 1,)  tables: (n,) out
__global__ void table_of_kernel(const int64_t* positions, int64_t n, const int64_t* key_offsets,
                                int num_tables, int32_t* tables) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    tables[i] = static_cast<int32_t>(
        lower_bound(key_offsets, int64_t(num_tables) + 1, positions[i] + 1) - 1);
  }
}

//   keys: (any,)  order: (n,)  sorted: (n,) out, keys[order[i]]
template <typename Key>
__global__ void gather_kernel(const Key* keys, const int64_t* order, int64_t n, Key* sorted) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    sorted[i] = keys[order[i]];
  }
}

// Table t's first unique index: the runs that start before its first entry
// (a table boundary always starts a run, so no run straddles two tables).
//   run_ids: (n,) inclusive scan of heads, n > 0
//   key_offsets, unique_offsets: (num_tables + 1,)
__global__ void unique_offsets_kernel(const int64_t* run_ids, const int64_t* key_offsets,
                                      int num_tables, int64_t* unique_offsets) {
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t <= num_tables;
       t += gridDim.x * blockDim.x) {
    const int64_t first = key_offsets[t];
    unique_offsets[t] = first == 0 ? 0 : run_ids[first - 1];
  }
}

//   run_ids: (n,) inclusive scan of heads, so run id = run_ids[i] - 1
template <typename Key>
__global__ void scatter_unique_kernel(const Key* sorted, const int64_t* positions,
                                      const int64_t* run_ids, int64_t n, Key* unique_keys,
                                      int64_t* inverse, int64_t* counts, int64_t* segments,
                                      int64_t* num_unique) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = run_ids[i] - 1;
    inverse[positions[i]] = id;
    const bool head = i == 0 || run_ids[i] != run_ids[i - 1];
    if (head) unique_keys[id] = sorted[i];
    if (head && segments != nullptr) segments[id] = i;
    if (i == n - 1 && segments != nullptr) segments[id + 1] = n;
    if (counts != nullptr) {
      const bool tail = i == n - 1 || run_ids[i + 1] != run_ids[i];
      // The run's length, found by its tail: walk back to the head is
      // avoided by a binary search over the non-decreasing run ids.
      if (tail) counts[id] = i - lower_bound(run_ids, i, run_ids[i]) + 1;
    }
    if (i == n - 1) *num_unique = run_ids[i];
  }
}

// Entry i's bucket: its table times num_workers plus its owner (the
// table's target worker when it has one). Sorted by bucket, the keys group
// by table, then by owner.
//   key_offsets: (num_tables + 1,) or null (one table)
//   target_workers: (num_tables,) or null (every table sharded)
template <typename Key>
__global__ void buckets_kernel(const Key* keys, int64_t n, const int64_t* key_offsets,
                               const int64_t* target_workers, int num_tables, int32_t num_workers,
                               int32_t* buckets) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t =
        key_offsets == nullptr ? 0 : lower_bound(key_offsets, int64_t(num_tables) + 1, i + 1) - 1;
    const int64_t target = target_workers == nullptr ? -1 : target_workers[t];
    const int32_t owner = target >= 0 ? int32_t(target) : owner_of(keys[i], num_workers);
    buckets[i] = int32_t(t) * num_workers + owner;
  }
}

//   positions: (n,)  keys_by_owner: (n,) out, keys[positions[j]]
template <typename Key>
__global__ void gather_keys_kernel(const Key* keys, const int64_t* positions, int64_t n,
                                   Key* keys_by_owner) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    keys_by_owner[i] = keys[positions[i]];
  }
}

// counts[b] = number of sorted buckets equal to b, by binary search for the
// first index of each bucket (buckets are sorted).
__global__ void bucket_counts_kernel(const int32_t* sorted_buckets, int64_t n, int32_t num_buckets,
                                     int64_t* counts) {
  for (int32_t b = blockIdx.x * blockDim.x + threadIdx.x; b < num_buckets;
       b += gridDim.x * blockDim.x) {
    counts[b] = lower_bound(sorted_buckets, n, b + 1) - lower_bound(sorted_buckets, n, b);
  }
}

int bits_for(int64_t values) {
  int bits = 1;
  while ((int64_t{1} << bits) < values) ++bits;
  return bits;
}

// Entry i of table t goes where a stable merge of the table's runs puts
// it: its place in its own run, plus each other run's keys below it (and,
// for an earlier run, those equal to it: equal keys keep run order). Runs
// ascending without repeats make the places a permutation of the table's
// entries. An entry not above the one before it in its run sets *unsorted;
// the places may then collide, but every one stays inside its table.
//   run_offsets: (num_tables * num_runs + 1,)
//   sorted, positions: (n,) out, the key and the entry at each place
//   tables: (n,) out, or null for one table
template <typename Key>
__global__ void merge_runs_kernel(const Key* keys, int64_t n, const int64_t* run_offsets,
                                  int num_tables, int num_runs, Key* sorted, int64_t* positions,
                                  int32_t* tables, int64_t* unsorted) {
  const int64_t num_segments = int64_t(num_tables) * num_runs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // The last run that starts at or before i (empty runs share an offset).
    const int64_t q = lower_bound(run_offsets, num_segments + 1, i + 1) - 1;
    const int64_t t = q / num_runs, r = q % num_runs;
    const int64_t* table_runs = run_offsets + t * num_runs;
    const Key key = keys[i];
    if (i > run_offsets[q] && !(keys[i - 1] < key)) *unsorted = 1;
    int64_t place = table_runs[0] + (i - run_offsets[q]);
    for (int64_t other = 0; other < num_runs; ++other) {
      if (other == r) continue;
      const Key* run = keys + table_runs[other];
      const int64_t length = table_runs[other + 1] - table_runs[other];
      place += other < r ? upper_bound(run, length, key) : lower_bound(run, length, key);
    }
    sorted[place] = key;
    positions[place] = i;
    if (tables != nullptr) tables[place] = int32_t(t);
  }
}

// The outputs of unique_keys_impl from the entries sorted by (table, key):
// runs of equal keys become unique keys, positions[i] being the entry at
// sorted place i.
//   sorted, positions: (n,), n > 0  tables: (n,) or null (one table)
template <typename Key>
Status write_unique(const GpuContext& context, const Key* sorted, const int32_t* tables,
                    const int64_t* positions, int64_t n, const int64_t* key_offsets, int num_tables,
                    Key* unique_keys, int64_t* inverse, int64_t* counts, int64_t* segments,
                    int64_t* num_unique, int64_t* unique_offsets) {
  cudaStream_t stream = stream_of(context);
  ScratchBuffer heads(context, n * sizeof(int64_t));
  ScratchBuffer run_ids(context, n * sizeof(int64_t));
  size_t scan_bytes = 0;
  SOK_EV_CUDA_RETURN(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, heads.as<int64_t>(),
                                                   run_ids.as<int64_t>(), n, stream));
  ScratchBuffer temp(context, scan_bytes);
  if (!heads.ok() || !run_ids.ok() || !temp.ok()) {
    return Status::Internal("unique_keys: out of device memory");
  }
  run_heads_kernel<Key>
      <<<grid_for(n, kThreads), kThreads, 0, stream>>>(sorted, tables, n, heads.as<int64_t>());
  SOK_EV_LAUNCH_CHECK("run_heads");
  SOK_EV_CUDA_RETURN(cub::DeviceScan::InclusiveSum(temp.get(), scan_bytes, heads.as<int64_t>(),
                                                   run_ids.as<int64_t>(), n, stream));
  scatter_unique_kernel<Key><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      sorted, positions, run_ids.as<int64_t>(), n, unique_keys, inverse, counts, segments,
      num_unique);
  SOK_EV_LAUNCH_CHECK("scatter_unique");
  if (unique_offsets != nullptr) {
    unique_offsets_kernel<<<grid_for(num_tables + 1, kThreads), kThreads, 0, stream>>>(
        run_ids.as<int64_t>(), key_offsets, num_tables, unique_offsets);
    SOK_EV_LAUNCH_CHECK("unique_offsets");
  }
  return Status::Ok();
}

// What every unique_keys form writes when there are no keys.
Status write_no_unique(const GpuContext& context, int num_tables, int64_t* segments,
                       int64_t* num_unique, int64_t* unique_offsets) {
  cudaStream_t stream = stream_of(context);
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(num_unique, 0, sizeof(int64_t), stream));
  if (unique_offsets != nullptr) {
    SOK_EV_CUDA_RETURN(
        cudaMemsetAsync(unique_offsets, 0, (num_tables + 1) * sizeof(int64_t), stream));
  }
  if (segments != nullptr) {
    SOK_EV_CUDA_RETURN(cudaMemsetAsync(segments, 0, sizeof(int64_t), stream));
  }
  return Status::Ok();
}

// unique_keys, unique_keys_segmented and unique_keys_grouped in one: with
// key_offsets (device, num_tables + 1) the entries are sorted by key, then
// stably by table, so runs never cross tables.
template <typename Key>
Status unique_keys_impl(const GpuContext& context, const Key* keys, int64_t n,
                        const int64_t* key_offsets, int num_tables, Key* unique_keys,
                        int64_t* inverse, int64_t* counts, int64_t* order, int64_t* segments,
                        int64_t* num_unique, int64_t* unique_offsets) {
  cudaStream_t stream = stream_of(context);
  if (n <= 0) return write_no_unique(context, num_tables, segments, num_unique, unique_offsets);
  const bool grouped = key_offsets != nullptr && num_tables > 1;
  ScratchBuffer sorted(context, n * sizeof(Key));
  ScratchBuffer positions_in(context, n * sizeof(int64_t));
  // The sort's positions are the caller's `order` when it wants them.
  ScratchBuffer positions_scratch(context, order ? 0 : n * sizeof(int64_t));
  int64_t* positions = order ? order : positions_scratch.as<int64_t>();
  // Grouped: the key sort's positions go here, then a sort by table.
  ScratchBuffer by_key(context, grouped ? n * sizeof(int64_t) : 0);
  ScratchBuffer tables_in(context, grouped ? n * sizeof(int32_t) : 0);
  ScratchBuffer tables(context, grouped ? n * sizeof(int32_t) : 0);
  if (!sorted.ok() || !positions_in.ok() || !positions_scratch.ok() || !by_key.ok() ||
      !tables_in.ok() || !tables.ok()) {
    return Status::Internal("unique_keys: out of device memory");
  }
  iota_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(positions_in.as<int64_t>(), n);
  SOK_EV_LAUNCH_CHECK("iota");
  int64_t* key_positions = grouped ? by_key.as<int64_t>() : positions;
  const int table_bits = grouped ? bits_for(num_tables) : 1;
  size_t sort_bytes = 0, table_sort_bytes = 0;
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted.as<Key>(),
                                                     positions_in.as<int64_t>(), key_positions, n,
                                                     0, int(sizeof(Key) * 8), stream));
  if (grouped) {
    SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        nullptr, table_sort_bytes, tables_in.as<int32_t>(), tables.as<int32_t>(), key_positions,
        positions, n, 0, table_bits, stream));
  }
  ScratchBuffer temp(context, std::max(sort_bytes, table_sort_bytes));
  if (!temp.ok()) return Status::Internal("unique_keys: out of device memory");
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, keys, sorted.as<Key>(),
                                                     positions_in.as<int64_t>(), key_positions, n,
                                                     0, int(sizeof(Key) * 8), stream));
  if (grouped) {
    table_of_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        key_positions, n, key_offsets, num_tables, tables_in.as<int32_t>());
    SOK_EV_LAUNCH_CHECK("table_of");
    SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        temp.get(), table_sort_bytes, tables_in.as<int32_t>(), tables.as<int32_t>(), key_positions,
        positions, n, 0, table_bits, stream));
    gather_kernel<Key>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(keys, positions, n, sorted.as<Key>());
    SOK_EV_LAUNCH_CHECK("gather");
  }
  return write_unique(context, sorted.as<Key>(), grouped ? tables.as<int32_t>() : nullptr,
                      positions, n, key_offsets, num_tables, unique_keys, inverse, counts, segments,
                      num_unique, unique_offsets);
}

// unique_keys_of_runs_grouped: the runs merged in place of the sort.
template <typename Key>
Status unique_keys_of_runs_impl(const GpuContext& context, const Key* keys, int64_t n,
                                const int64_t* key_offsets, const int64_t* run_offsets,
                                int num_tables, int num_runs, Key* unique_keys, int64_t* counts,
                                int64_t* inverse, int64_t* order, int64_t* segments,
                                int64_t* unique_offsets, int64_t* unsorted) {
  cudaStream_t stream = stream_of(context);
  if (num_tables < 1 || num_runs < 1) {
    return Status::InvalidArgument(
        "unique_keys_of_runs_grouped: num_tables and num_runs must be >= 1");
  }
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(unsorted, 0, sizeof(int64_t), stream));
  if (n <= 0) {
    return write_no_unique(context, num_tables, segments, unique_offsets + num_tables,
                           unique_offsets);
  }
  ScratchBuffer sorted(context, n * sizeof(Key));
  ScratchBuffer tables(context, num_tables > 1 ? n * sizeof(int32_t) : 0);
  if (!sorted.ok() || !tables.ok()) return Status::Internal("unique_keys: out of device memory");
  // Runs out of order may leave places unwritten: zeros keep every later
  // index inside the keys.
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(order, 0, n * sizeof(int64_t), stream));
  int32_t* table_of_place = num_tables > 1 ? tables.as<int32_t>() : nullptr;
  merge_runs_kernel<Key><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      keys, n, run_offsets, num_tables, num_runs, sorted.as<Key>(), order, table_of_place,
      unsorted);
  SOK_EV_LAUNCH_CHECK("merge_runs");
  return write_unique(context, sorted.as<Key>(), table_of_place, order, n, key_offsets, num_tables,
                      unique_keys, inverse, counts, segments, unique_offsets + num_tables,
                      unique_offsets);
}

// partition_by_owner_grouped; one table when key_offsets is null. One
// stable radix sort by bucket (buckets_kernel) for every table.
template <typename Key>
Status partition_impl(const GpuContext& context, const Key* keys, int64_t n,
                      const int64_t* key_offsets, const int64_t* target_workers, int num_tables,
                      int32_t num_workers, Key* keys_by_owner, int64_t* positions,
                      int64_t* counts) {
  cudaStream_t stream = stream_of(context);
  if (num_workers < 1 || num_tables < 1) {
    return Status::InvalidArgument("partition_by_owner: num_workers and num_tables must be >= 1");
  }
  const int32_t num_buckets = num_tables * num_workers;
  if (n <= 0) {
    SOK_EV_CUDA_RETURN(cudaMemsetAsync(counts, 0, num_buckets * sizeof(int64_t), stream));
    return Status::Ok();
  }
  ScratchBuffer buckets(context, n * sizeof(int32_t));
  ScratchBuffer sorted_buckets(context, n * sizeof(int32_t));
  ScratchBuffer positions_in(context, n * sizeof(int64_t));
  if (!buckets.ok() || !sorted_buckets.ok() || !positions_in.ok()) {
    return Status::Internal("partition_by_owner: out of device memory");
  }
  buckets_kernel<Key><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      keys, n, key_offsets, target_workers, num_tables, num_workers, buckets.as<int32_t>());
  SOK_EV_LAUNCH_CHECK("buckets");
  iota_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(positions_in.as<int64_t>(), n);
  SOK_EV_LAUNCH_CHECK("iota");
  const int end_bit = bits_for(num_buckets);
  size_t sort_bytes = 0;
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, buckets.as<int32_t>(), sorted_buckets.as<int32_t>(),
      positions_in.as<int64_t>(), positions, n, 0, end_bit, stream));
  ScratchBuffer temp(context, sort_bytes);
  if (!temp.ok()) return Status::Internal("partition_by_owner: out of device memory");
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      temp.get(), sort_bytes, buckets.as<int32_t>(), sorted_buckets.as<int32_t>(),
      positions_in.as<int64_t>(), positions, n, 0, end_bit, stream));
  gather_keys_kernel<Key>
      <<<grid_for(n, kThreads), kThreads, 0, stream>>>(keys, positions, n, keys_by_owner);
  SOK_EV_LAUNCH_CHECK("gather_keys");
  bucket_counts_kernel<<<grid_for(num_buckets, kThreads), kThreads, 0, stream>>>(
      sorted_buckets.as<int32_t>(), n, num_buckets, counts);
  SOK_EV_LAUNCH_CHECK("bucket_counts");
  return Status::Ok();
}

}  // namespace

template <typename Key>
void unique_keys(const GpuContext& context, const Key* keys, int64_t n, Key* unique_keys,
                 int64_t* inverse, int64_t* counts, int64_t* num_unique) {
  record_error(unique_keys_impl(context, keys, n, nullptr, 1, unique_keys, inverse, counts, nullptr,
                                nullptr, num_unique, nullptr));
}

template <typename Key>
void unique_keys_segmented(const GpuContext& context, const Key* keys, int64_t n, Key* unique_keys,
                           int64_t* inverse, int64_t* order, int64_t* segments,
                           int64_t* num_unique) {
  record_error(unique_keys_impl(context, keys, n, nullptr, 1, unique_keys, inverse, nullptr, order,
                                segments, num_unique, nullptr));
}

template <typename Key>
void unique_keys_grouped(const GpuContext& context, const Key* keys, int64_t n,
                         const int64_t* key_offsets, int num_tables, Key* unique_keys,
                         int64_t* counts, int64_t* inverse, int64_t* order, int64_t* segments,
                         int64_t* unique_offsets) {
  if (num_tables < 1) {
    record_error(Status::InvalidArgument("unique_keys_grouped: num_tables must be >= 1"));
    return;
  }
  // The total count lands in unique_offsets[num_tables] as well.
  record_error(unique_keys_impl(context, keys, n, key_offsets, num_tables, unique_keys, inverse,
                                counts, order, segments, unique_offsets + num_tables,
                                unique_offsets));
}

template <typename Key>
void unique_keys_of_runs_grouped(const GpuContext& context, const Key* keys, int64_t n,
                                 const int64_t* key_offsets, const int64_t* run_offsets,
                                 int num_tables, int num_runs, Key* unique_keys, int64_t* counts,
                                 int64_t* inverse, int64_t* order, int64_t* segments,
                                 int64_t* unique_offsets, int64_t* unsorted) {
  record_error(unique_keys_of_runs_impl(context, keys, n, key_offsets, run_offsets, num_tables,
                                        num_runs, unique_keys, counts, inverse, order, segments,
                                        unique_offsets, unsorted));
}

template <typename Key>
void partition_by_owner(const GpuContext& context, const Key* keys, int64_t n, int32_t num_workers,
                        Key* keys_by_owner, int64_t* positions, int64_t* counts) {
  record_error(partition_impl(context, keys, n, /*key_offsets=*/nullptr,
                              /*target_workers=*/nullptr, 1, num_workers, keys_by_owner, positions,
                              counts));
}

template <typename Key>
void partition_by_owner_grouped(const GpuContext& context, const Key* keys, int64_t n,
                                const int64_t* key_offsets, const int64_t* target_workers,
                                int num_tables, int32_t num_workers, Key* keys_by_owner,
                                int64_t* positions, int64_t* counts) {
  record_error(partition_impl(context, keys, n, key_offsets, target_workers, num_tables,
                              num_workers, keys_by_owner, positions, counts));
}

void fill_iota(const GpuContext& context, int64_t* values, int64_t n) {
  if (n <= 0) return;
  iota_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(context)>>>(values, n);
  record_error(cuda_status(cudaGetLastError(), "fill_iota"));
}

void sum_occurrences_by_key(const GpuContext& context, const int64_t* occurrences,
                            const int64_t* order, const int64_t* segments,
                            const int64_t* num_unique, int64_t max_unique, int64_t* counts) {
  if (max_unique <= 0) return;
  sum_occurrences_kernel<<<grid_for(max_unique, kThreads), kThreads, 0, stream_of(context)>>>(
      occurrences, order, segments, num_unique, counts);
  record_error(cuda_status(cudaGetLastError(), "sum_occurrences_by_key"));
}

template void unique_keys<int32_t>(const GpuContext&, const int32_t*, int64_t, int32_t*, int64_t*,
                                   int64_t*, int64_t*);
template void unique_keys<int64_t>(const GpuContext&, const int64_t*, int64_t, int64_t*, int64_t*,
                                   int64_t*, int64_t*);
template void unique_keys_segmented<int32_t>(const GpuContext&, const int32_t*, int64_t, int32_t*,
                                             int64_t*, int64_t*, int64_t*, int64_t*);
template void unique_keys_segmented<int64_t>(const GpuContext&, const int64_t*, int64_t, int64_t*,
                                             int64_t*, int64_t*, int64_t*, int64_t*);
template void unique_keys_grouped<int32_t>(const GpuContext&, const int32_t*, int64_t,
                                           const int64_t*, int, int32_t*, int64_t*, int64_t*,
                                           int64_t*, int64_t*, int64_t*);
template void unique_keys_grouped<int64_t>(const GpuContext&, const int64_t*, int64_t,
                                           const int64_t*, int, int64_t*, int64_t*, int64_t*,
                                           int64_t*, int64_t*, int64_t*);
template void unique_keys_of_runs_grouped<int32_t>(const GpuContext&, const int32_t*, int64_t,
                                                   const int64_t*, const int64_t*, int, int,
                                                   int32_t*, int64_t*, int64_t*, int64_t*, int64_t*,
                                                   int64_t*, int64_t*);
template void unique_keys_of_runs_grouped<int64_t>(const GpuContext&, const int64_t*, int64_t,
                                                   const int64_t*, const int64_t*, int, int,
                                                   int64_t*, int64_t*, int64_t*, int64_t*, int64_t*,
                                                   int64_t*, int64_t*);
template void partition_by_owner<int32_t>(const GpuContext&, const int32_t*, int64_t, int32_t,
                                          int32_t*, int64_t*, int64_t*);
template void partition_by_owner<int64_t>(const GpuContext&, const int64_t*, int64_t, int32_t,
                                          int64_t*, int64_t*, int64_t*);

template void partition_by_owner_grouped<int32_t>(const GpuContext&, const int32_t*, int64_t,
                                                  const int64_t*, const int64_t*, int, int32_t,
                                                  int32_t*, int64_t*, int64_t*);
template void partition_by_owner_grouped<int64_t>(const GpuContext&, const int64_t*, int64_t,
                                                  const int64_t*, const int64_t*, int, int32_t,
                                                  int64_t*, int64_t*, int64_t*);

}  // namespace gpu
}  // namespace sok_ev
