// The tiers of a GPU Embedding Variable; see cc/tiered_table_gpu.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cub/device/device_radix_sort.cuh>
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

// Appends to `absent` the keys HBM lacks, a warp's misses with one atomic.
// The first min(*count, n) keys are checked (all n when count is null).
//   keys: (n,)  absent: (n,) out, counts->absent entries written
template <typename Key>
__global__ void absent_keys_kernel(TableView<Key> table, const Key* keys, int64_t n,
                                   const int64_t* count, Key* absent, ResidencyCounts* counts) {
  int64_t end = n;
  if (count != nullptr) end = *count < 0 ? 0 : (*count < n ? *count : n);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    atomicAdd(&counts->looked_up, static_cast<unsigned long long>(end));
  }
  const int lane = threadIdx.x & 31;
  // Whole warps step together, so the ballot sees every lane.
  for (int64_t base = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) - lane; base < end;
       base += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = base + lane;
    const bool miss = i < end && find_row(table, keys[i]) < 0;
    const unsigned misses = __ballot_sync(0xffffffffu, miss);
    if (misses == 0) continue;
    unsigned long long first = 0;
    if (lane == 0)
      first = atomicAdd(&counts->absent, static_cast<unsigned long long>(__popc(misses)));
    first = __shfl_sync(0xffffffffu, first, 0);
    if (miss) absent[first + __popc(misses & ((1u << lane) - 1))] = keys[i];
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

// Whole rows, frequencies and versions of row ids, a warp a row.
//   row_ids: (n,)  rows: (n, row_width) out  frequencies, versions: (n,) out
template <typename Key>
__global__ void gather_rows_kernel(TableView<Key> table, const int32_t* row_ids, int64_t n,
                                   float* rows, int64_t* frequencies, int64_t* versions) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; i < n;
       i += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t row = row_ids[i];
    const float* from = table.rows + row * table.row_width;
    float* to = rows + i * table.row_width;
    for (int64_t c = lane; c < table.row_width; c += 32) to[c] = from[c];
    if (lane == 0) {
      frequencies[i] = table.frequencies[row];
      versions[i] = table.versions[row];
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

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_ = Clock::now();
};

}  // namespace

template <typename Key>
struct TieredTable<Key>::ResidencyCheck {
  ~ResidencyCheck() {
    if (host_counts != nullptr) cudaFreeHost(host_counts);
    if (staging != nullptr) cudaFreeHost(staging);
  }
  // Pinned room for `rows` rows moving between the tiers (their values and
  // slots, then frequencies, then versions): the copies run at the host
  // link's rate, not a pageable copy's, and the host tier reads and writes
  // them in place. Grows, never shrinks.
  Status reserve(int64_t rows, int64_t width) {
    if (rows <= staging_rows && width == staging_width) return Status::Ok();
    if (staging != nullptr) cudaFreeHost(staging);
    staging = nullptr;
    staging_rows = 0;
    const int64_t grown = rows + rows / 4;  // room for the next calls' growth
    SOK_EV_CUDA_RETURN(
        cudaMallocHost(&staging, grown * (width * sizeof(float) + 2 * sizeof(int64_t))));
    staging_rows = grown;
    staging_width = width;
    return Status::Ok();
  }
  float* rows() const { return static_cast<float*>(staging); }
  int64_t* frequencies() const {
    return reinterpret_cast<int64_t*>(rows() + staging_rows * staging_width);
  }
  int64_t* versions() const { return frequencies() + staging_rows; }

  void* staging = nullptr;
  int64_t staging_rows = 0, staging_width = 0;
  ResidencyCounts* host_counts = nullptr;  // pinned: the copy does not block the host
  bool queued = false;
  std::vector<KeySpan<Key>> spans;
  std::unique_ptr<ScratchBuffer> absent;  // (sum of the spans' n,) Key, device
  std::unique_ptr<ScratchBuffer> counts;  // ResidencyCounts, device
};

template <typename Key>
struct TieredTable<Key>::Victims {
  int64_t count = 0;
  std::unique_ptr<ScratchBuffer> keys;     // (count,) Key, device
  std::unique_ptr<ScratchBuffer> row_ids;  // (count,) int32 HBM arena rows, device
  Key* key_data() const { return static_cast<Key*>(keys->get()); }
  int32_t* row_id_data() const { return static_cast<int32_t*>(row_ids->get()); }
};

template <typename Key>
TieredTable<Key>::TieredTable(HashTable<Key>* hbm, const StorageSpec& storage,
                              const std::string& name)
    : hbm_(hbm), storage_(storage), name_(name) {
  if (storage.tiered()) {
    // The host tier only stores rows it is given: it never draws initial
    // values, so it needs no initializer of its own.
    host_.reset(new cpu::HashTable<Key>(hbm->dim(), InitializerSpec()));
    host_->set_name(name);
  }
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
  HashTable<Key>* hbm = nullptr;
  SOK_EV_RETURN_IF_ERROR(HashTable<Key>::Create(context, dim, initializer, options, &hbm));
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
  if (!tiered()) return Status::Ok();
  int host_index = -1;
  SOK_EV_RETURN_IF_ERROR(host_->add_slot(name, initial_value, &host_index));
  if (host_index != *index) {
    return Status::Internal("Embedding Variable '" + name_ + "': slot '" + name + "' has index " +
                            std::to_string(*index) + " in HBM but " + std::to_string(host_index) +
                            " in host memory");
  }
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::make_resident(const GpuContext& context,
                                       const std::vector<KeySpan<Key>>& spans) const {
  if (!tiered()) return Status::Ok();
  SOK_EV_RETURN_IF_ERROR(queue_residency_check(context, spans));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream_of(context)));
  return finish_residency(context);
}

template <typename Key>
Status TieredTable<Key>::queue_residency_check(const GpuContext& context,
                                               const std::vector<KeySpan<Key>>& spans) const {
  if (!tiered()) return Status::Ok();
  SOK_EV_RETURN_IF_ERROR(make_check());
  ResidencyCheck& check = *check_;
  check.queued = false;
  check.absent.reset();
  check.counts.reset();
  int64_t bound = 0;
  for (const KeySpan<Key>& span : spans) bound += std::max<int64_t>(span.n, 0);
  if (bound == 0) return Status::Ok();
  cudaStream_t stream = stream_of(context);
  check.absent.reset(new ScratchBuffer(context, bound * sizeof(Key)));
  check.counts.reset(new ScratchBuffer(context, sizeof(ResidencyCounts)));
  if (!check.absent->ok() || !check.counts->ok()) {
    return out_of_device_memory(name_, "the keys of a tier lookup", bound * sizeof(Key));
  }
  ResidencyCounts* counts = static_cast<ResidencyCounts*>(check.counts->get());
  Key* absent = static_cast<Key*>(check.absent->get());
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(counts, 0, sizeof(ResidencyCounts), stream));
  for (const KeySpan<Key>& span : spans) {
    if (span.n <= 0) continue;
    absent_keys_kernel<Key><<<grid_for(span.n, kThreads), kThreads, 0, stream>>>(
        hbm_->view(), span.keys, span.n, span.count, absent, counts);
    SOK_EV_LAUNCH_CHECK("absent_keys");
  }
  SOK_EV_CUDA_RETURN(cudaMemcpyAsync(&counts->hbm_size, &hbm_->device_counters()->size,
                                     sizeof(unsigned long long), cudaMemcpyDeviceToDevice, stream));
  SOK_EV_CUDA_RETURN(cudaMemcpyAsync(check.host_counts, counts, sizeof(ResidencyCounts),
                                     cudaMemcpyDeviceToHost, stream));
  check.spans = spans;
  check.queued = true;
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::make_check() const {
  if (check_ != nullptr) return Status::Ok();
  std::unique_ptr<ResidencyCheck> check(new ResidencyCheck);
  SOK_EV_CUDA_RETURN(cudaMallocHost(&check->host_counts, sizeof(ResidencyCounts)));
  check_ = std::move(check);
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::finish_residency(const GpuContext& context) const {
  if (!tiered() || check_ == nullptr || !check_->queued) return Status::Ok();
  ResidencyCheck& check = *check_;
  check.queued = false;
  const ResidencyCounts counts = *check.host_counts;
  ++counters_.calls;
  counters_.pcie_bytes += sizeof(ResidencyCounts);
  // The absent keys on the host, each once (a key in two spans is listed
  // twice), sorted on the GPU first.
  std::vector<Key> absent(counts.absent);
  if (!absent.empty()) {
    const int n = static_cast<int>(absent.size());
    ScratchBuffer sorted(context, n * sizeof(Key));
    size_t sort_bytes = 0;
    SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortKeys(
        nullptr, sort_bytes, static_cast<const Key*>(check.absent->get()), sorted.as<Key>(), n, 0,
        int(sizeof(Key) * 8), stream_of(context)));
    ScratchBuffer temp(context, sort_bytes);
    if (!sorted.ok() || !temp.ok()) {
      return out_of_device_memory(name_, "sorting the keys HBM lacks",
                                  n * sizeof(Key) + sort_bytes);
    }
    SOK_EV_CUDA_RETURN(cub::DeviceRadixSort::SortKeys(
        temp.get(), sort_bytes, static_cast<const Key*>(check.absent->get()), sorted.as<Key>(), n,
        0, int(sizeof(Key) * 8), stream_of(context)));
    SOK_EV_RETURN_IF_ERROR(to_host(context, sorted.as<Key>(), n, absent.data()));
    SOK_EV_RETURN_IF_ERROR(synchronize(stream_of(context)));
  }
  counters_.pcie_bytes += static_cast<int64_t>(absent.size() * sizeof(Key));
  check.absent.reset();
  check.counts.reset();
  counters_.hits += static_cast<int64_t>(counts.looked_up - counts.absent);
  absent.erase(std::unique(absent.begin(), absent.end()), absent.end());
  counters_.misses += static_cast<int64_t>(absent.size());
  const int64_t hbm_size = static_cast<int64_t>(counts.hbm_size);
  const int64_t budget = budget_rows();
  if (absent.empty() && hbm_size <= budget) return Status::Ok();

  // Room first, also when every key hits but an earlier batch larger than
  // the budget left HBM over it (a pre-fill, a restore's whole batch): else
  // HBM would stay over the budget for as long as the keys asked for stay
  // resident. The rows written back are never absent keys' (those are not
  // in HBM), so the host tier is read for the absent keys after. An eighth
  // of the budget beyond what must go, so that the next calls find room
  // without a scan; never the rows of this call's keys.
  const int64_t needed = hbm_size + static_cast<int64_t>(absent.size());
  if (needed > budget) {
    SOK_EV_RETURN_IF_ERROR(evict(context, needed - budget + budget / 8, check.spans));
  }
  // Those in the host tier move in; the rest are new.
  if (absent.empty() || host_->size() == 0) return Status::Ok();
  Stopwatch stopwatch;
  const int64_t width = row_width();
  const int64_t m = static_cast<int64_t>(absent.size());
  SOK_EV_RETURN_IF_ERROR(check.reserve(m, width));
  std::unique_ptr<bool[]> found(new bool[m]);
  host_->find_records(host_threads(context), absent.data(), m, check.rows(), check.frequencies(),
                      check.versions(), found.get());
  // The found rows packed to the front in place: each row not found takes
  // the last found one (few keys are new, so few rows move).
  int64_t end = m;
  for (int64_t i = 0; i < end;) {
    if (found[i]) {
      ++i;
      continue;
    }
    if (i == --end) break;
    std::copy(check.rows() + end * width, check.rows() + (end + 1) * width,
              check.rows() + i * width);
    check.frequencies()[i] = check.frequencies()[end];
    check.versions()[i] = check.versions()[end];
    absent[i] = absent[end];
    found[i] = found[end];
  }
  absent.resize(end);
  const Status brought = bring_in(context, absent);
  stopwatch.lap(&counters_.bring_in_us);
  return brought;
}

template <typename Key>
Status TieredTable<Key>::choose_victims(const GpuContext& context, int64_t count,
                                        const std::vector<KeySpan<Key>>& keep,
                                        Victims* victims) const {
  cudaStream_t stream = stream_of(context);
  victims->count = 0;
  int64_t stored = 0;
  SOK_EV_RETURN_IF_ERROR(hbm_->size(context, &stored));
  if (stored == 0 || count <= 0) return Status::Ok();
  const TableView<Key> view = hbm_->view();
  const int64_t slots = static_cast<int64_t>(view.bucket_mask + 1) * kBucketSlots;
  // The call's rows are marked on the GPU, so its keys never cross to the host.
  const bool marking = !keep.empty();
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
    for (const KeySpan<Key>& span : keep) {
      if (span.n <= 0) continue;
      mark_rows_kernel<Key><<<grid_for(span.n, kThreads), kThreads, 0, stream>>>(
          view, span.keys, span.n, span.count, marks.as<uint8_t>());
      SOK_EV_LAUNCH_CHECK("mark_rows");
    }
  }
  SOK_EV_CUDA_RETURN(cudaMemsetAsync(cursor.get(), 0, sizeof(unsigned long long), stream));
  list_candidates_kernel<Key><<<grid_for(slots, kThreads), kThreads, 0, stream>>>(
      view, slots, storage_.cache_strategy == CacheStrategy::kLfu,
      marking ? marks.as<uint8_t>() : nullptr, stored, keys.as<Key>(), scores.as<int64_t>(),
      row_ids.as<int32_t>(), cursor.as<unsigned long long>());
  SOK_EV_LAUNCH_CHECK("list_candidates");
  unsigned long long listed = 0;
  SOK_EV_RETURN_IF_ERROR(to_host(context, cursor.as<unsigned long long>(), 1, &listed));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  counters_.pcie_bytes += sizeof(listed);
  const int64_t candidates = std::min<int64_t>(static_cast<int64_t>(listed), stored);
  count = std::min(count, candidates);
  if (count == 0) return Status::Ok();

  // The lowest (score, key) first: sorted by key, then stably by score.
  const int n = static_cast<int>(candidates);
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
  victims->keys.reset(new ScratchBuffer(context, count * sizeof(Key)));
  victims->row_ids.reset(new ScratchBuffer(context, count * sizeof(int32_t)));
  if (!order_in.ok() || !by_key.ok() || !order.ok() || !sorted_keys.ok() || !scores_by_key.ok() ||
      !sorted_scores.ok() || !temp.ok() || !victims->keys->ok() || !victims->row_ids->ok()) {
    return out_of_device_memory(name_, "sorting rows to write back",
                                n * (3 * sizeof(int32_t) + sizeof(Key) + 16));
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
  gather_by_kernel<Key><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
      keys.as<Key>(), order.as<int32_t>(), count, victims->key_data());
  SOK_EV_LAUNCH_CHECK("gather_victim_keys");
  gather_by_kernel<int32_t><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
      row_ids.as<int32_t>(), order.as<int32_t>(), count, victims->row_id_data());
  SOK_EV_LAUNCH_CHECK("gather_victim_rows");
  victims->count = count;
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::evict(const GpuContext& context, int64_t count,
                               const std::vector<KeySpan<Key>>& keep) const {
  cudaStream_t stream = stream_of(context);
  Stopwatch stopwatch;
  Victims victims;
  SOK_EV_RETURN_IF_ERROR(choose_victims(context, count, keep, &victims));
  stopwatch.lap(&counters_.choose_us);
  count = victims.count;
  if (count == 0) return Status::Ok();

  // Their rows to the host tier, through the pinned staging, then out of HBM.
  const int64_t width = row_width();
  SOK_EV_RETURN_IF_ERROR(make_check());
  ResidencyCheck& check = *check_;
  SOK_EV_RETURN_IF_ERROR(check.reserve(count, width));
  ScratchBuffer rows(context, count * width * sizeof(float));
  ScratchBuffer frequencies(context, count * sizeof(int64_t));
  ScratchBuffer versions(context, count * sizeof(int64_t));
  if (!rows.ok() || !frequencies.ok() || !versions.ok()) {
    return out_of_device_memory(name_, "rows written back to host memory",
                                count * (width * sizeof(float) + 2 * sizeof(int64_t)));
  }
  gather_rows_kernel<Key><<<grid_for(count * 32, kThreads), kThreads, 0, stream>>>(
      hbm_->view(), victims.row_id_data(), count, rows.as<float>(), frequencies.as<int64_t>(),
      versions.as<int64_t>());
  SOK_EV_LAUNCH_CHECK("gather_rows");
  std::vector<Key> victim_keys(count);
  SOK_EV_RETURN_IF_ERROR(to_host(context, victims.key_data(), count, victim_keys.data()));
  SOK_EV_RETURN_IF_ERROR(to_host(context, rows.as<float>(), count * width, check.rows()));
  SOK_EV_RETURN_IF_ERROR(to_host(context, frequencies.as<int64_t>(), count, check.frequencies()));
  SOK_EV_RETURN_IF_ERROR(to_host(context, versions.as<int64_t>(), count, check.versions()));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  const CpuContext& host = host_threads(context);
  Status written = host_->insert_or_assign(host, victim_keys.data(), count, check.rows(),
                                           check.frequencies(), check.versions());
  if (!written.ok()) {
    // None of these keys was in the host tier before: remove what was
    // written, so both tiers are as they were.
    host_->erase(host, victim_keys.data(), count);
    if (written.code == Status::Code::kResourceExhausted) {
      written.message = "host memory tier of HBM_DRAM storage: " + written.message;
    }
    return written;
  }
  SOK_EV_RETURN_IF_ERROR(hbm_->erase(context, victims.key_data(), count, nullptr));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream));
  stopwatch.lap(&counters_.write_back_us);
  counters_.rows_to_host += count;
  counters_.pcie_bytes +=
      count * static_cast<int64_t>(width * sizeof(float) + 2 * sizeof(int64_t) + sizeof(Key));
  return Status::Ok();
}

template <typename Key>
Status TieredTable<Key>::bring_in(const GpuContext& context, const std::vector<Key>& keys) const {
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n == 0) return Status::Ok();
  const ResidencyCheck& check = *check_;
  const int64_t width = row_width();
  ScratchBuffer device_keys(context, n * sizeof(Key));
  ScratchBuffer device_rows(context, n * width * sizeof(float));
  ScratchBuffer device_frequencies(context, n * sizeof(int64_t));
  ScratchBuffer device_versions(context, n * sizeof(int64_t));
  if (!device_keys.ok() || !device_rows.ok() || !device_frequencies.ok() || !device_versions.ok()) {
    return out_of_device_memory(name_, "rows brought in from host memory",
                                n * (width * sizeof(float) + 2 * sizeof(int64_t) + sizeof(Key)));
  }
  SOK_EV_RETURN_IF_ERROR(to_device(context, keys.data(), n, device_keys.as<Key>()));
  SOK_EV_RETURN_IF_ERROR(to_device(context, check.rows(), n * width, device_rows.as<float>()));
  SOK_EV_RETURN_IF_ERROR(
      to_device(context, check.frequencies(), n, device_frequencies.as<int64_t>()));
  SOK_EV_RETURN_IF_ERROR(to_device(context, check.versions(), n, device_versions.as<int64_t>()));
  SOK_EV_RETURN_IF_ERROR(
      hbm_->insert_or_assign(context, device_keys.as<Key>(), n, device_rows.as<float>(),
                             device_frequencies.as<int64_t>(), device_versions.as<int64_t>()));
  SOK_EV_RETURN_IF_ERROR(synchronize(stream_of(context)));
  host_->erase(host_threads(context), keys.data(), n);
  counters_.rows_to_hbm += n;
  counters_.pcie_bytes +=
      n * static_cast<int64_t>(width * sizeof(float) + 2 * sizeof(int64_t) + sizeof(Key));
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
  return evict(context, stored - budget_rows(), {});
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
  return host_->export_batches(
      max_batch, [](int64_t, int64_t) { return Status::Ok(); }, emit);
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
