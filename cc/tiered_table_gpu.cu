// The tiers of a GPU Embedding Variable; see cc/tiered_table_gpu.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cc/hash_table_probe_gpu.h"
#include "cc/status_gpu.h"
#include "cc/tiered_table_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Host batches of the host tier's rows copied to the GPU by export_all.
constexpr int64_t kExportBatch = 1 << 16;

// What a residency check's kernels count on the device, copied to the
// host in one piece.
struct ResidencyCounts {
  unsigned long long absent;     // keys written to the absent list
  unsigned long long looked_up;  // keys checked
  unsigned long long hbm_size;   // rows in HBM, read after the check
};

// One span's part of a residency check: its keys, the table whose HBM
// index it probes, and where the table's absent keys and counts go (a
// table's spans share them).
template <typename Key>
struct CheckJob {
  const Key* table_keys;  // the table's TableView::keys
  const int32_t* states;  // the table's TableView::states
  uint64_t bucket_mask;
  const Key* keys;       // (n,) device
  int64_t n;             // the host's bound
  const int64_t* count;  // device or null: only the first min(*count, n) keys
  Key* absent;           // the table's absent list, counts->absent entries written
  ResidencyCounts* counts;
  const TableCounters* table_counters;  // the table's, for hbm_size
};
// Jobs a launch takes as its argument (2.3 KB of the 4 KB a launch may pass).
constexpr int kJobsPerLaunch = 32;
template <typename Key>
struct CheckJobs {
  CheckJob<Key> job[kJobsPerLaunch];
};

// Appends to each job's absent list the keys HBM lacks, a warp's misses with
// one atomic; blockIdx.y picks the job.
template <typename Key>
__global__ void absent_keys_kernel(CheckJobs<Key> jobs) {
  const CheckJob<Key>& job = jobs.job[blockIdx.y];
  TableView<Key> table;
  table.keys = const_cast<Key*>(job.table_keys);
  table.states = const_cast<int32_t*>(job.states);
  table.bucket_mask = job.bucket_mask;
  int64_t end = job.n;
  if (job.count != nullptr) end = *job.count < 0 ? 0 : (*job.count < job.n ? *job.count : job.n);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    atomicAdd(&job.counts->looked_up, static_cast<unsigned long long>(end));
    // No kernel inserts or erases during the check: every span reads the same.
    job.counts->hbm_size = job.table_counters->size;
  }
  const int lane = threadIdx.x & 31;
  // Whole warps step together, so the ballot sees every lane.
  for (int64_t base = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) - lane; base < end;
       base += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = base + lane;
    const bool miss = i < end && find_row(table, job.keys[i]) < 0;
    const unsigned misses = __ballot_sync(0xffffffffu, miss);
    if (misses == 0) continue;
    unsigned long long first = 0;
    if (lane == 0) {
      first = atomicAdd(&job.counts->absent, static_cast<unsigned long long>(__popc(misses)));
    }
    first = __shfl_sync(0xffffffffu, first, 0);
    if (miss) job.absent[first + __popc(misses & ((1u << lane) - 1))] = job.keys[i];
  }
}

// Marks the HBM rows of a span's keys: the rows a call uses, which its
// write-back must not choose. The first min(*count, n) keys (all n when
// count is null); keys HBM lacks mark nothing.
//   keys: (n,)  marks: (row_capacity,) uint8, 1 = kept
template <typename Key>
__global__ void mark_rows_kernel(TableView<Key> table, const Key* keys, int64_t n,
                                 const int64_t* count, uint8_t* marks) {
  int64_t end = n;
  if (count != nullptr) end = *count < 0 ? 0 : (*count < n ? *count : n);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < end;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t row = find_row(table, keys[i]);
    if (row >= 0) marks[row] = 1;
  }
}

// The rows a write-back may choose: every stored key whose row is not
// marked (marks null: none is), with its row id and cache score (frequency
// for LFU, version for LRU), in no particular order. *cursor ends at the
// number of such rows; at most `capacity` are written.
template <typename Key>
__global__ void list_candidates_kernel(TableView<Key> table, int64_t slots, bool by_frequency,
                                       const uint8_t* marks, int64_t capacity, Key* keys,
                                       int64_t* scores, int32_t* row_ids,
                                       unsigned long long* cursor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < slots;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t row = table.states[i];
    if (row < 0 || (marks != nullptr && marks[row])) continue;
    const unsigned long long position = atomicAdd(cursor, 1ULL);
    if (position >= static_cast<unsigned long long>(capacity)) continue;
    keys[position] = table.keys[i];
    scores[position] = by_frequency ? table.frequencies[row] : table.versions[row];
    row_ids[position] = row;
  }
}

// Candidate entries that no row fills sort after every row's: the largest
// score and key, and no row (row id -1). So the candidates can be sorted
// before their number reaches the host.
template <typename Key>
__global__ void fill_sentinels_kernel(int64_t n, Key largest_key, Key* keys, int64_t* scores,
                                      int32_t* row_ids) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = largest_key;
    scores[i] = INT64_MAX;
    row_ids[i] = -1;
  }
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

// out[i] = values[order[i]]
template <typename T>
__global__ void gather_by_kernel(const T* values, const int32_t* order, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = values[order[i]];
  }
}

// Copies `width` floats a warp, in float4 when both ends allow it (a host
// record's row and an HBM row are 16-byte aligned when width is a multiple
// of 4), so that reads over the host link go in whole 512-byte requests.
__device__ __forceinline__ void copy_row(const float* from, float* to, int64_t width, int lane) {
  if ((width & 3) == 0) {
    const float4* from4 = reinterpret_cast<const float4*>(from);
    float4* to4 = reinterpret_cast<float4*>(to);
    for (int64_t c = lane; c < width / 4; c += 32) to4[c] = from4[c];
  } else {
    for (int64_t c = lane; c < width; c += 32) to[c] = from[c];
  }
}

// HBM rows, frequencies and versions written to host-tier records (pinned
// host memory, written over the host link), a warp a row.
//   row_ids: (n,) HBM rows  records: (n,) host records (cc/host_tier.h)
template <typename Key>
__global__ void scatter_to_records_kernel(TableView<Key> table, const int32_t* row_ids,
                                          char* const* records, int64_t n) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; i < n;
       i += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t row = row_ids[i];
    char* record = records[i];
    copy_row(table.rows + row * table.row_width, HostRecord::row(record), table.row_width, lane);
    if (lane == 0) {
      *HostRecord::frequency(record) = table.frequencies[row];
      *HostRecord::version(record) = table.versions[row];
    }
  }
}

// Host-tier records (read over the host link) into device rows, a warp a row.
//   records: (n,)  rows: (n, width) out  frequencies, versions: (n,) out
__global__ void gather_from_records_kernel(const char* const* records, int64_t n, int64_t width,
                                           float* rows, int64_t* frequencies, int64_t* versions) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; i < n;
       i += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const char* record = records[i];
    copy_row(HostRecord::row(record), rows + i * width, width, lane);
    if (lane == 0) {
      frequencies[i] = *HostRecord::frequency(record);
      versions[i] = *HostRecord::version(record);
    }
  }
}

template <typename T>
Status to_device(const GpuContext& context, const T* host, int64_t n, T* device) {
  if (n == 0) return Status::Ok();
  SOK_EV_CUDA_RETURN(
      cudaMemcpyAsync(device, host, n * sizeof(T), cudaMemcpyHostToDevice, stream_of(context)));
  return Status::Ok();
}

template <typename T>
Status to_host(const GpuContext& context, const T* device, int64_t n, T* host) {
  if (n == 0) return Status::Ok();
  SOK_EV_CUDA_RETURN(
      cudaMemcpyAsync(host, device, n * sizeof(T), cudaMemcpyDeviceToHost, stream_of(context)));
  return Status::Ok();
}

// The threads for the host tier's work: the framework's, else this one.
const CpuContext& host_threads(const GpuContext& context) {
  static const CpuContext serial = CpuContext::Serial();
  return context.host != nullptr ? *context.host : serial;
}

Status out_of_device_memory(const std::string& name, const char* what, size_t bytes) {
  return Status::ResourceExhausted("Embedding Variable '" + name +
                                   "': out of GPU memory allocating " + std::to_string(bytes) +
                                   " bytes for " + what);
}

// Host wall time added to a TierCounters field (microseconds): lap() adds
// what passed since the last lap, or since it was made.
class Stopwatch {
 public:
  void lap(int64_t* total_us) {
    const Clock::time_point now = Clock::now();
    *total_us += std::chrono::duration_cast<std::chrono::microseconds>(now - last_).count();
    last_ = now;
  }
  void restart() { last_ = Clock::now(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_ = Clock::now();
};

// Rows an eviction writes back beyond those it must, so that the next calls
// find room without a scan of the table: an eighth of the budget, at most
// this many (a large budget's eighth would hold gigabytes of pinned staging).
constexpr int64_t kMaxEvictionSlack = 1 << 16;

// A pinned host array, so that copies to and from the GPU run at the host
// link's rate and need no bounce buffer. Grows, never shrinks.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  // Room for n elements (the contents are not kept); ResourceExhausted
  // naming the table when the system refuses pinned memory.
  Status reserve(int64_t n, const std::string& name) {
    if (n <= capacity_) return Status::Ok();
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
    const int64_t grown = n + n / 4;  // room for the next calls' growth
    if (cudaMallocHost(&data_, grown * sizeof(T)) != cudaSuccess) {
      cudaGetLastError();
      data_ = nullptr;
      return Status::ResourceExhausted(
          "Embedding Variable '" + name + "': out of pinned host memory allocating " +
          std::to_string(grown * sizeof(T)) + " bytes for keys moving between tiers");
    }
    capacity_ = grown;
    return Status::Ok();
  }
  T* data() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  int64_t capacity_ = 0;
};

// The host tier's records: pinned and mapped, so that the GPU's kernels read
// and write them in place (with unified addressing a pinned host pointer is
// valid on the device); portable, so any device's kernels may.
HostMemory pinned_records() {
  HostMemory memory;
  memory.allocate = [](size_t bytes) -> void* {
    void* pointer = nullptr;
    if (cudaHostAlloc(&pointer, bytes, cudaHostAllocPortable | cudaHostAllocMapped) !=
        cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return pointer;
  };
  memory.deallocate = [](void* pointer) { cudaFreeHost(pointer); };
  return memory;
}

// Bytes that cross the host link for one row moved: its record's row,
// frequency and version, its key, its record's address.
template <typename Key>
int64_t moved_row_bytes(int64_t row_width) {
  return static_cast<int64_t>(row_width * sizeof(float) + HostRecord::kHeaderBytes + sizeof(Key) +
                              sizeof(char*));
}

// Each table's keys (keys[t] = its keys and their count; none: no batch)
// split by host-tier shard, the tables side by side on the host threads.
template <typename Key>
std::vector<typename HostTier<Key>::Batch> split_each(
    const CpuContext& host, const std::vector<std::pair<const Key*, int64_t>>& keys) {
  std::vector<typename HostTier<Key>::Batch> batches(keys.size());
  int64_t total = 0;
  for (const auto& table_keys : keys) total += table_keys.second;
  if (total == 0) return batches;
  host.parallel_for(static_cast<int64_t>(keys.size()),
                    std::max<int64_t>(1, total / static_cast<int64_t>(keys.size())) * 40,
                    [&](int64_t begin, int64_t end) {
                      for (int64_t t = begin; t < end; ++t) {
                        if (keys[t].second > 0) {
                          batches[t] = HostTier<Key>::split(keys[t].first, keys[t].second);
                        }
                      }
                    });
  return batches;
}

}  // namespace

template <typename Key>
struct TieredTable<Key>::Staging {
  ~Staging() {
    if (listed != nullptr) cudaFreeHost(listed);
  }
  PinnedArray<Key> victim_keys;          // the keys written back, from the GPU
  PinnedArray<char*> victim_records;     // their new host records, to the GPU
  PinnedArray<Key> found_keys;           // the keys brought in, to the GPU
  PinnedArray<char*> found_records;      // their host records, to the GPU
  unsigned long long* listed = nullptr;  // pinned: the write-back's candidates
};

template <typename Key>
struct TieredTable<Key>::Move {
  const TieredTable* table = nullptr;
  std::vector<KeySpan<Key>> spans;  // the call's keys: their rows stay in HBM
  int64_t bound = 0;                // sum of the spans' n
  Key* absent_list = nullptr;       // (bound,) device: stage 1's absent keys
  ResidencyCounts counts{};
  // The keys HBM lacks, sorted, each once; after find_host_records, those
  // the host tier holds (their keys and records in staging's found_*).
  std::vector<Key> absent;
  int64_t evict_count = 0;  // rows to write back, asked
  int64_t chosen = 0;       // rows whose choice is queued (<= evict_count)
  // (chosen,) device, until stage 4: the rows written back's keys and HBM
  // row ids.
  std::unique_ptr<ScratchBuffer> victim_keys, victim_rows;
};

template <typename Key>
TieredTable<Key>::TieredTable(HashTable<Key>* hbm, const StorageSpec& storage,
                              const std::string& name)
    : hbm_(hbm), storage_(storage), name_(name) {
  if (storage.tiered()) host_.reset(new HostTier<Key>(hbm->row_width(), pinned_records(), name));
}

template <typename Key>
TieredTable<Key>::~TieredTable() = default;

template <typename Key>
Status TieredTable<Key>::Create(const GpuContext& context, int64_t dim,
                                const InitializerSpec& initializer, const HashTableOptions& options,
                                const StorageSpec& storage, const std::string& name,
                                TieredTable** table) {
  *table = nullptr;
  StorageSpec checked;
  SOK_EV_RETURN_IF_ERROR(MakeStorageSpec(
      storage.hbm_bytes, static_cast<int64_t>(storage.cache_strategy), dim, name, &checked));
  HashTableOptions hbm_options = options;
  if (checked.tiered()) hbm_options.arena_bytes_limit = checked.hbm_bytes;
  HashTable<Key>* hbm = nullptr;
  SOK_EV_RETURN_IF_ERROR(HashTable<Key>::Create(context, dim, initializer, hbm_options, &hbm));
  *table = new TieredTable(hbm, checked, name);
  return Status::Ok();
}

template <typename Key>
int64_t TieredTable<Key>::budget_rows() const {
  if (!tiered()) return 0;
  return std::max<int64_t>(1, storage_.hbm_bytes / (row_width() * int64_t{4}));
}

template <typename Key>
int64_t TieredTable<Key>::host_size() const {
  return host_ ? host_->size() : 0;
}

template <typename Key>
Status TieredTable<Key>::size(const GpuContext& context, int64_t* size) {
  SOK_EV_RETURN_IF_ERROR(hbm_->size(context, size));
  *size += host_size();
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::add_slot(const GpuContext& context, const std::string& name,
                                  float initial_value, int* index) {
  SOK_EV_RETURN_IF_ERROR(hbm_->add_slot(context, name, initial_value, index));
  // A slot already there leaves the width, and the host tier, as they are.
  return tiered() ? host_->widen(hbm_->row_width(), initial_value) : Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::make_staging() const {
  if (staging_ != nullptr) return Status::Ok();
  std::unique_ptr<Staging> staging(new Staging);
  SOK_EV_CUDA_RETURN(cudaMallocHost(&staging->listed, sizeof(unsigned long long)));
  staging_ = std::move(staging);
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::make_resident(const GpuContext& context,
                                       const std::vector<KeySpan<Key>>& spans) const {
  if (!tiered()) return Status::Ok();
  return make_resident_together(context, {Residency{this, spans}});
}

template <typename Key>
Status TieredTable<Key>::make_resident_together(const GpuContext& context,
                                                const std::vector<Residency>& tables) {
  cudaStream_t stream = stream_of(context);
  std::vector<Move> moves;
  int64_t total = 0;
  for (const Residency& residency : tables) {
    if (!residency.table->tiered()) continue;
    Move move;
    move.table = residency.table;
    move.spans = residency.spans;
    for (const KeySpan<Key>& span : move.spans) move.bound += std::max<int64_t>(span.n, 0);
    if (move.bound == 0) continue;
    total += move.bound;
    moves.push_back(std::move(move));
  }
  if (moves.empty()) return Status::Ok();
  const std::string& first_name = moves[0].table->name_;

  // 1. Every span checked against HBM in one kernel; the counts to the host.
  ScratchBuffer absent(context, total * sizeof(Key));
  ScratchBuffer counts(context, moves.size() * sizeof(ResidencyCounts));
  if (!absent.ok() || !counts.ok()) {
    return out_of_device_memory(first_name, "the keys of a tier lookup", total * sizeof(Key));
  }
  SOK_EV_CUDA_RETURN(
      cudaMemsetAsync(counts.get(), 0, moves.size() * sizeof(ResidencyCounts), stream));
  CheckJobs<Key> jobs;
  int num_jobs = 0;
  int64_t longest = 0;
  auto launch = [&]() -> Status {
    if (num_jobs == 0) return Status::Ok();
    const dim3 grid(grid_for(longest, kThreads), num_jobs);
    absent_keys_kernel<Key><<<grid, kThreads, 0, stream>>>(jobs);
    SOK_EV_LAUNCH_CHECK("absent_keys");
    num_jobs = 0;
    longest = 0;
    return Status::Ok();
  };
  int64_t offset = 0;
  for (size_t t = 0; t < moves.size(); ++t) {
    Move& move = moves[t];
    move.absent_list = absent.as<Key>() + offset;
    offset += move.bound;
    const TableView<Key> view = move.table->hbm_->view();
    for (const KeySpan<Key>& span : move.spans) {
      if (span.n <= 0) continue;
      jobs.job[num_jobs++] = CheckJob<Key>{view.keys,
                                           view.states,
                                           view.bucket_mask,
                                           span.keys,
                                           span.n,
                                           span.count,
                                           move.absent_list,
                                           counts.as<ResidencyCounts>() + t,
                                           move.table->hbm_->device_counters()};
      longest = std::max(longest, span.n);
      if (num_jobs == kJobsPerLaunch) SOK_EV_RETURN_IF_ERROR(launch());
    }
  }
  SOK_EV_RETURN_IF_ERROR(launch());
  std::vector<ResidencyCounts> host_counts(moves.size());
  SOK_EV_RETURN_IF_ERROR(to_host(context, counts.as<ResidencyCounts>(),
                                 static_cast<int64_t>(moves.size()), host_counts.data()));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));

  // 2. The absent keys of every table that has some, sorted on the GPU (one
  // segmented sort) and brought to the host.
  std::vector<int64_t> begins, ends;
  for (size_t t = 0; t < moves.size(); ++t) {
    Move& move = moves[t];
    move.counts = host_counts[t];
    ++move.table->counters_.calls;
    move.table->counters_.pcie_bytes += sizeof(ResidencyCounts);
    const int64_t start = move.absent_list - absent.as<Key>();
    begins.push_back(start);
    ends.push_back(start + static_cast<int64_t>(move.counts.absent));
  }
  const bool any_absent =
      std::any_of(moves.begin(), moves.end(), [](const Move& m) { return m.counts.absent > 0; });
  if (any_absent) {
    ScratchBuffer sorted(context, total * sizeof(Key));
    ScratchBuffer offsets(context, 2 * moves.size() * sizeof(int64_t));
    const int segments = static_cast<int>(moves.size());
    size_t sort_bytes = 0;
    SOK_EV_CUDA_RETURN(cub::DeviceSegmentedRadixSort::SortKeys(
        nullptr, sort_bytes, absent.as<Key>(), sorted.as<Key>(), total, segments,
        offsets.as<int64_t>(), offsets.as<int64_t>() + segments, 0, int(sizeof(Key) * 8), stream));
    ScratchBuffer temp(context, sort_bytes);
    if (!sorted.ok() || !offsets.ok() || !temp.ok()) {
      return out_of_device_memory(first_name, "sorting the keys HBM lacks",
                                  total * sizeof(Key) + sort_bytes);
    }
    std::vector<int64_t> host_offsets(begins);
    host_offsets.insert(host_offsets.end(), ends.begin(), ends.end());
    SOK_EV_RETURN_IF_ERROR(
        to_device(context, host_offsets.data(), 2 * segments, offsets.as<int64_t>()));
    SOK_EV_CUDA_RETURN(cub::DeviceSegmentedRadixSort::SortKeys(
        temp.get(), sort_bytes, absent.as<Key>(), sorted.as<Key>(), total, segments,
        offsets.as<int64_t>(), offsets.as<int64_t>() + segments, 0, int(sizeof(Key) * 8), stream));
    for (size_t t = 0; t < moves.size(); ++t) {
      moves[t].absent.resize(moves[t].counts.absent);
      SOK_EV_RETURN_IF_ERROR(to_host(context, sorted.as<Key>() + begins[t],
                                     static_cast<int64_t>(moves[t].counts.absent),
                                     moves[t].absent.data()));
    }
    // The offsets' host copy and the sort's buffers must outlive the copies.
    SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  }

  // What each table must write back: room for its absent keys (each once: a
  // key in two spans is listed twice), also when every key hits but an
  // earlier batch larger than the budget left HBM over it (a pre-fill, a
  // restore's whole batch), so that HBM does not stay over it for as long
  // as those keys stay resident. Plus some slack (kMaxEvictionSlack).
  std::vector<Move> moving;
  for (Move& move : moves) {
    const TieredTable& table = *move.table;
    TierCounters& counters = table.counters_;
    counters.pcie_bytes += static_cast<int64_t>(move.absent.size() * sizeof(Key));
    counters.hits += static_cast<int64_t>(move.counts.looked_up - move.counts.absent);
    move.absent.erase(std::unique(move.absent.begin(), move.absent.end()), move.absent.end());
    counters.misses += static_cast<int64_t>(move.absent.size());
    const int64_t hbm_size = static_cast<int64_t>(move.counts.hbm_size);
    const int64_t budget = table.budget_rows();
    const int64_t needed = hbm_size + static_cast<int64_t>(move.absent.size());
    if (needed > budget) {
      move.evict_count = needed - budget + std::min(budget / 8, kMaxEvictionSlack);
    }
    if (move.evict_count > 0 || !move.absent.empty()) moving.push_back(std::move(move));
  }
  return write_back_and_bring_in(context, moving);
}

template <typename Key>
Status TieredTable<Key>::write_back_and_bring_in(const GpuContext& context,
                                                 std::vector<Move>& moves) {
  if (moves.empty()) return Status::Ok();
  cudaStream_t stream = stream_of(context);
  const CpuContext& host = host_threads(context);
  // 3. Every table's write-back chosen on the GPU, its keys copied to the
  // host; meanwhile the host tier finds the records of the rows to bring in.
  // The rows written back are never absent keys' (those are not in HBM), so
  // the two do not meet.
  Stopwatch stopwatch;
  for (Move& move : moves) {
    if (move.evict_count > 0) {
      SOK_EV_RETURN_IF_ERROR(move.table->queue_write_back(context, move));
    }
  }
  // The host tier's map work and the waits for the GPU, shared out among
  // the tables at the end (TierCounters::host_tier_us, wait_us).
  int64_t host_tier_us = 0, wait_us = 0;
  Stopwatch part;
  SOK_EV_RETURN_IF_ERROR(find_host_records(context, moves));
  part.lap(&host_tier_us);
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  part.lap(&wait_us);
  int64_t stage_us = 0;
  stopwatch.lap(&stage_us);
  share_stage_time(moves, stage_us, &TierCounters::choose_us);

  // 4. The rows written back get host records (all tables' shards side by
  // side), which the GPU fills from HBM before HBM erases the rows; the GPU
  // reads the records of the rows brought in into HBM, and once it has, the
  // host tier erases them.
  std::vector<int64_t> written(moves.size(), 0);
  std::vector<std::pair<const Key*, int64_t>> victim_keys(moves.size(), {nullptr, 0});
  int64_t total = 0;
  part.restart();
  for (size_t t = 0; t < moves.size(); ++t) {
    if (moves[t].chosen == 0) continue;
    const Staging& staging = *moves[t].table->staging_;
    written[t] = std::min<int64_t>(moves[t].chosen, static_cast<int64_t>(*staging.listed));
    victim_keys[t] = {staging.victim_keys.data(), written[t]};
    total += written[t];
  }
  const std::vector<typename HostTier<Key>::Batch> victims = split_each(host, victim_keys);
  std::vector<Status> inserted(moves.size());
  std::mutex inserted_mutex;
  HostTier<Key>::for_each_shard(host, moves.size(), total, [&](size_t t, int shard) {
    if (written[t] == 0) return;
    const TieredTable& table = *moves[t].table;
    Status status = table.host_->insert(victims[t], shard, table.staging_->victim_records.data());
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(inserted_mutex);
    if (inserted[t].ok()) inserted[t] = std::move(status);
  });
  part.lap(&host_tier_us);
  Status first_error;
  for (size_t t = 0; t < moves.size(); ++t) {
    if (written[t] == 0) continue;
    Move& move = moves[t];
    const TieredTable& table = *move.table;
    const Staging& staging = *table.staging_;
    const int64_t count = written[t];
    // On failure the rows stay in HBM only: none of these keys was in the
    // host tier before, so the records they got are erased again; the
    // table's absent keys are not brought in (HBM has no room for them).
    auto undo = [&](const Status& failed) {
      table.host_->erase(host, staging.victim_keys.data(), count);
      if (first_error.ok()) first_error = failed;
      move.absent.clear();
    };
    if (!inserted[t].ok()) {
      undo(inserted[t]);
      continue;
    }
    scatter_to_records_kernel<Key><<<grid_for(count * 32, kThreads), kThreads, 0, stream>>>(
        table.hbm_->view(), move.victim_rows->template as<int32_t>(), staging.victim_records.data(),
        count);
    const cudaError_t launched = cudaGetLastError();
    const Status erased =
        launched != cudaSuccess
            ? cuda_status(launched, "scatter_to_records")
            : table.hbm_->erase(context, move.victim_keys->template as<Key>(), count, nullptr);
    if (!erased.ok()) {
      undo(erased);
      continue;
    }
    table.counters_.rows_to_host += count;
    table.counters_.pcie_bytes += count * moved_row_bytes<Key>(table.row_width()) +
                                  static_cast<int64_t>(sizeof(unsigned long long));
  }
  // A table whose rows cannot come in keeps them in the host tier; the
  // others' arrive, and leave the host tier once HBM holds them.
  std::vector<std::unique_ptr<ScratchBuffer>> arriving(moves.size());
  std::vector<std::pair<const Key*, int64_t>> arrived_keys(moves.size(), {nullptr, 0});
  total = 0;
  for (size_t t = 0; t < moves.size(); ++t) {
    Move& move = moves[t];
    const int64_t n = static_cast<int64_t>(move.absent.size());
    if (n == 0) continue;
    const TieredTable& table = *move.table;
    const Staging& staging = *table.staging_;
    const int64_t width = table.row_width();
    const size_t bytes = n * (width * sizeof(float) + 2 * sizeof(int64_t) + sizeof(Key));
    std::unique_ptr<ScratchBuffer> buffer(new ScratchBuffer(context, bytes));
    Status arrived =
        buffer->ok() ? Status::Ok()
                     : out_of_device_memory(table.name_, "rows brought in from host memory", bytes);
    if (arrived.ok()) {
      float* rows = buffer->as<float>();
      int64_t* frequencies = reinterpret_cast<int64_t*>(rows + n * width);
      int64_t* versions = frequencies + n;
      Key* keys = reinterpret_cast<Key*>(versions + n);
      SOK_EV_RETURN_IF_ERROR(to_device(context, staging.found_keys.data(), n, keys));
      gather_from_records_kernel<<<grid_for(n * 32, kThreads), kThreads, 0, stream>>>(
          staging.found_records.data(), n, width, rows, frequencies, versions);
      const cudaError_t launched = cudaGetLastError();
      arrived = launched != cudaSuccess
                    ? cuda_status(launched, "gather_from_records")
                    : table.hbm_->insert_or_assign(context, keys, n, rows, frequencies, versions);
    }
    if (!arrived.ok()) {
      if (first_error.ok()) first_error = arrived;
      continue;
    }
    arriving[t] = std::move(buffer);
    arrived_keys[t] = {move.absent.data(), n};
    total += n;
  }
  part.restart();
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  part.lap(&wait_us);
  const std::vector<typename HostTier<Key>::Batch> arrived = split_each(host, arrived_keys);
  HostTier<Key>::for_each_shard(host, moves.size(), total, [&](size_t t, int shard) {
    if (arriving[t] != nullptr) moves[t].table->host_->erase(arrived[t], shard);
  });
  part.lap(&host_tier_us);
  for (size_t t = 0; t < moves.size(); ++t) {
    if (arriving[t] == nullptr) continue;
    const TieredTable& table = *moves[t].table;
    const int64_t n = static_cast<int64_t>(moves[t].absent.size());
    table.counters_.rows_to_hbm += n;
    table.counters_.pcie_bytes += n * moved_row_bytes<Key>(table.row_width());
  }
  stage_us = 0;
  stopwatch.lap(&stage_us);
  share_stage_time(moves, stage_us, &TierCounters::write_back_us);
  for (const Move& move : moves) {
    move.table->counters_.host_tier_us += host_tier_us / static_cast<int64_t>(moves.size());
    move.table->counters_.wait_us += wait_us / static_cast<int64_t>(moves.size());
  }
  return first_error;
}

template <typename Key>
void TieredTable<Key>::share_stage_time(const std::vector<Move>& moves, int64_t stage_us,
                                        int64_t TierCounters::*write_back_field) {
  int64_t parts = 0;
  for (const Move& move : moves) parts += (move.evict_count > 0) + !move.absent.empty();
  if (parts == 0) return;
  for (const Move& move : moves) {
    if (move.evict_count > 0) move.table->counters_.*write_back_field += stage_us / parts;
    if (!move.absent.empty()) move.table->counters_.bring_in_us += stage_us / parts;
  }
}

template <typename Key>
Status TieredTable<Key>::queue_write_back(const GpuContext& context, Move& move) const {
  cudaStream_t stream = stream_of(context);
  move.chosen = 0;
  const int64_t stored = static_cast<int64_t>(move.counts.hbm_size);
  const int64_t count = std::min(move.evict_count, stored);
  if (count <= 0) return Status::Ok();
  SOK_EV_RETURN_IF_ERROR(make_staging());
  SOK_EV_RETURN_IF_ERROR(staging_->victim_keys.reserve(count, name_));
  SOK_EV_RETURN_IF_ERROR(staging_->victim_records.reserve(count, name_));
  const TableView<Key> view = hbm_->view();
  const int64_t slots = static_cast<int64_t>(view.bucket_mask + 1) * kBucketSlots;
  // The call's rows are marked on the GPU, so its keys never cross to the host.
  const bool marking = !move.spans.empty();
  ScratchBuffer marks(context, marking ? hbm_->row_capacity() : 0);
  ScratchBuffer keys(context, stored * sizeof(Key));
  ScratchBuffer scores(context, stored * sizeof(int64_t));
  ScratchBuffer row_ids(context, stored * sizeof(int32_t));
  ScratchBuffer cursor(context, sizeof(unsigned long long));
  if (!marks.ok() || !keys.ok() || !scores.ok() || !row_ids.ok() || !cursor.ok()) {
    return out_of_device_memory(name_, "choosing rows to write back",
                                hbm_->row_capacity() + stored * (sizeof(Key) + 12));
  }
  if (marking) {
    SOK_EV_CUDA_RETURN(cudaMemsetAsync(marks.get(), 0, hbm_->row_capacity(), stream));
    for (const KeySpan<Key>& span : move.spans) {
      if (span.n <= 0) continue;
      mark_rows_kernel<Key><<<grid_for(span.n, kThreads), kThreads, 0, stream>>>(
          view, span.keys, span.n, span.count, marks.as<uint8_t>());
      SOK_EV_LAUNCH_CHECK("mark_rows");
    }
  }
  // Entries the listing leaves unfilled sort last, so the sorts need not
  // wait for the number listed: the host reads it after stage 3's wait.
  fill_sentinels_kernel<Key><<<grid_for(stored, kThreads), kThreads, 0, stream>>>(
      stored, std::numeric_limits<Key>::max(), keys.as<Key>(), scores.as<int64_t>(),
      row_ids.as<int32_t>());
  SOK_EV_LAUNCH_CHECK("fill_sentinels");
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(cursor.get(), 0, sizeof(unsigned long long), stream));
  list_candidates_kernel<Key><<<grid_for(slots, kThreads), kThreads, 0, stream>>>(
      view, slots, storage_.cache_strategy == CacheStrategy::kLfu,
      marking ? marks.as<uint8_t>() : nullptr, stored, keys.as<Key>(), scores.as<int64_t>(),
      row_ids.as<int32_t>(), cursor.as<unsigned long long>());
  SOK_EV_LAUNCH_CHECK("list_candidates");
  SOK_EV_RETURN_IF_ERROR(to_host(context, cursor.as<unsigned long long>(), 1, staging_->listed));

  // The lowest (score, key) first: sorted by key, then stably by score.
  const int n = static_cast<int>(stored);
  ScratchBuffer order_in(context, n * sizeof(int32_t));
  ScratchBuffer by_key(context, n * sizeof(int32_t));
  ScratchBuffer order(context, n * sizeof(int32_t));
  ScratchBuffer sorted_keys(context, n * sizeof(Key));
  ScratchBuffer scores_by_key(context, n * sizeof(int64_t));
  ScratchBuffer sorted_scores(context, n * sizeof(int64_t));
  size_t key_sort_bytes = 0, score_sort_bytes = 0;
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, key_sort_bytes, keys.as<Key>(), sorted_keys.as<Key>(), order_in.as<int32_t>(),
      by_key.as<int32_t>(), n, 0, int(sizeof(Key) * 8), stream));
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, score_sort_bytes, scores_by_key.as<int64_t>(), sorted_scores.as<int64_t>(),
      by_key.as<int32_t>(), order.as<int32_t>(), n, 0, 64, stream));
  ScratchBuffer temp(context, std::max(key_sort_bytes, score_sort_bytes));
  move.victim_keys.reset(new ScratchBuffer(context, count * sizeof(Key)));
  move.victim_rows.reset(new ScratchBuffer(context, count * sizeof(int32_t)));
  if (!order_in.ok() || !by_key.ok() || !order.ok() || !sorted_keys.ok() || !scores_by_key.ok() ||
      !sorted_scores.ok() || !temp.ok() || !move.victim_keys->ok() || !move.victim_rows->ok()) {
    return out_of_device_memory(
        name_, "choosing rows to write back to host memory",
        n * (3 * sizeof(int32_t) + sizeof(Key) + 16) + count * (sizeof(Key) + sizeof(int32_t)));
  }
  iota_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(order_in.as<int32_t>(), n);
  SOK_EV_LAUNCH_CHECK("iota");
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      temp.get(), key_sort_bytes, keys.as<Key>(), sorted_keys.as<Key>(), order_in.as<int32_t>(),
      by_key.as<int32_t>(), n, 0, int(sizeof(Key) * 8), stream));
  gather_by_kernel<int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      scores.as<int64_t>(), by_key.as<int32_t>(), n, scores_by_key.as<int64_t>());
  SOK_EV_LAUNCH_CHECK("gather_scores");
  SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      temp.get(), score_sort_bytes, scores_by_key.as<int64_t>(), sorted_scores.as<int64_t>(),
      by_key.as<int32_t>(), order.as<int32_t>(), n, 0, 64, stream));
  Key* victim_keys = move.victim_keys->template as<Key>();
  gather_by_kernel<Key><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
      keys.as<Key>(), order.as<int32_t>(), count, victim_keys);
  SOK_EV_LAUNCH_CHECK("gather_victim_keys");
  gather_by_kernel<int32_t><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
      row_ids.as<int32_t>(), order.as<int32_t>(), count, move.victim_rows->template as<int32_t>());
  SOK_EV_LAUNCH_CHECK("gather_victim_rows");
  // Only the keys cross now: the rows go straight from HBM to their host
  // records in stage 4, once the host tier has given the records.
  SOK_EV_RETURN_IF_ERROR(to_host(context, victim_keys, count, staging_->victim_keys.data()));
  move.chosen = count;
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::find_host_records(const GpuContext& context, std::vector<Move>& moves) {
  std::vector<std::pair<const Key*, int64_t>> keys(moves.size(), {nullptr, 0});
  std::vector<std::vector<char*>> records(moves.size());
  int64_t total = 0;
  for (size_t t = 0; t < moves.size(); ++t) {
    Move& move = moves[t];
    if (move.absent.empty()) continue;
    const TieredTable& table = *move.table;
    if (table.host_->size() == 0) {
      move.absent.clear();  // every absent key is new
      continue;
    }
    const int64_t n = static_cast<int64_t>(move.absent.size());
    SOK_EV_RETURN_IF_ERROR(table.make_staging());
    SOK_EV_RETURN_IF_ERROR(table.staging_->found_keys.reserve(n, table.name_));
    SOK_EV_RETURN_IF_ERROR(table.staging_->found_records.reserve(n, table.name_));
    keys[t] = {move.absent.data(), n};
    records[t].resize(n);
    total += n;
  }
  const CpuContext& host = host_threads(context);
  const std::vector<typename HostTier<Key>::Batch> batches = split_each(host, keys);
  HostTier<Key>::for_each_shard(host, moves.size(), total, [&](size_t t, int shard) {
    if (!records[t].empty()) moves[t].table->host_->find(batches[t], shard, records[t].data());
  });
  // The keys found, in order, with their records: the absent keys that are
  // not found are new.
  for (size_t t = 0; t < moves.size(); ++t) {
    if (records[t].empty()) continue;
    std::vector<Key>& absent = moves[t].absent;
    const Staging& staging = *moves[t].table->staging_;
    size_t found = 0;
    for (size_t i = 0; i < absent.size(); ++i) {
      if (records[t][i] == nullptr) continue;
      staging.found_keys.data()[found] = absent[i];
      staging.found_records.data()[found] = records[t][i];
      absent[found++] = absent[i];
    }
    absent.resize(found);
  }
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::insert_or_assign(const GpuContext& context, const Key* keys, int64_t n,
                                          const float* rows, const int64_t* frequencies,
                                          const int64_t* versions) {
  // Keys in the host tier move to HBM first (keeping each key in one
  // tier), then are overwritten there.
  SOK_EV_RETURN_IF_ERROR(make_resident(context, {KeySpan<Key>{keys, n}}));
  SOK_EV_RETURN_IF_ERROR(hbm_->insert_or_assign(context, keys, n, rows, frequencies, versions));
  if (!tiered()) return Status::Ok();
  // No batch is in flight (a restore, an import): back within the budget
  // now, so a table restored batch by batch never holds more in HBM.
  int64_t stored = 0;
  SOK_EV_RETURN_IF_ERROR(hbm_->size(context, &stored));
  if (stored <= budget_rows()) return Status::Ok();
  std::vector<Move> moves(1);
  moves[0].table = this;
  moves[0].counts.hbm_size = static_cast<unsigned long long>(stored);
  moves[0].evict_count = stored - budget_rows();
  return write_back_and_bring_in(context, moves);
}

template <typename Key>
Status TieredTable<Key>::erase(const GpuContext& context, const Key* keys, int64_t n,
                               int64_t* num_erased) {
  if (!tiered()) return hbm_->erase(context, keys, n, num_erased);
  int64_t in_hbm = 0;
  SOK_EV_RETURN_IF_ERROR(hbm_->erase(context, keys, n, &in_hbm));
  std::vector<Key> host_keys(std::max<int64_t>(n, 0));
  SOK_EV_RETURN_IF_ERROR(to_host(context, keys, n, host_keys.data()));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream_of(context)));
  const int64_t in_host = n > 0 ? host_->erase(host_threads(context), host_keys.data(), n) : 0;
  if (num_erased != nullptr) *num_erased = in_hbm + in_host;
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::evict_stale(const GpuContext& context, int64_t global_step,
                                     int64_t steps_to_live, int64_t* num_evicted) {
  SOK_EV_RETURN_IF_ERROR(hbm_->evict_stale(context, global_step, steps_to_live, num_evicted));
  if (tiered()) *num_evicted += host_->evict_stale(global_step, steps_to_live);
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::export_all(const GpuContext& context, Key* keys, float* rows,
                                    int64_t* frequencies, int64_t* versions, int64_t capacity,
                                    int64_t* count) {
  const int64_t in_host = host_size();
  if (in_host > capacity) {
    return Status::InvalidArgument("export_all: host tier holds " + std::to_string(in_host) +
                                   " keys, capacity " + std::to_string(capacity));
  }
  int64_t written = 0;
  SOK_EV_RETURN_IF_ERROR(
      hbm_->export_all(context, keys, rows, frequencies, versions, capacity - in_host, &written));
  if (!tiered()) {
    *count = written;
    return Status::Ok();
  }
  const int64_t width = row_width();
  SOK_EV_RETURN_IF_ERROR(export_host_batches(kExportBatch, [&](const HostBatch& batch) -> Status {
    SOK_EV_RETURN_IF_ERROR(to_device(context, batch.keys, batch.count, keys + written));
    SOK_EV_RETURN_IF_ERROR(
        to_device(context, batch.rows, batch.count * width, rows + written * width));
    SOK_EV_RETURN_IF_ERROR(
        to_device(context, batch.frequencies, batch.count, frequencies + written));
    SOK_EV_RETURN_IF_ERROR(to_device(context, batch.versions, batch.count, versions + written));
    written += batch.count;
    // The batch's host buffers are valid only during this call.
    return synchronize(stream_of(context));
  }));
  *count = written;
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::export_host_batches(
    int64_t max_batch, const std::function<Status(const HostBatch& batch)>& emit) const {
  if (!tiered()) return Status::Ok();
  return host_->export_batches(max_batch, emit);
}

template <typename Key>
Status TieredTable<Key>::counters(const GpuContext& context, TierCounters* counters) {
  *counters = counters_;
  SOK_EV_RETURN_IF_ERROR(hbm_->size(context, &counters->hbm_rows));
  counters->host_rows = host_size();
  return Status::Ok();
}

template class TieredTable<int32_t>;
template class TieredTable<int64_t>;

}  // namespace gpu
}  // namespace sok_ev
