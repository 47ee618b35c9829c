// See claiming_parallel_for.h.
#include "sok_ev/cc/kernels/claiming_parallel_for.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace sok_ev {
namespace {

// Eigen's cost model, which ThreadPool::ParallelFor uses: a thread is worth
// starting for about this many cycles of work.
constexpr double kCyclesPerThread = 100000;
// Blocks per thread: enough for the threads to even out, few enough that a
// block's fixed cost (a std::function call, an atomic) stays small.
constexpr int64_t kBlocksPerThread = 4;

// Shared by the caller and the helpers; a helper that starts after the
// caller returned holds it alive, and touches nothing else.
struct Blocks {
  std::atomic<int64_t> next{0};
  int64_t count = 0;
  int64_t total = 0;
  const CpuContext::Work* work = nullptr;  // valid while blocks are unclaimed
  std::mutex mutex;
  std::condition_variable all_done;
  int64_t done = 0;  // guarded by mutex

  // Runs blocks until none is left unclaimed.
  void Claim() {
    int64_t ran = 0;
    for (int64_t b = next.fetch_add(1); b < count; b = next.fetch_add(1), ++ran) {
      (*work)(total * b / count, total * (b + 1) / count);
    }
    if (ran == 0) return;
    std::lock_guard<std::mutex> lock(mutex);
    done += ran;
    if (done == count) all_done.notify_all();
  }
};

}  // namespace

void ClaimingParallelFor(tensorflow::thread::ThreadPool* pool, int threads, int64_t total,
                         int64_t cost_per_unit, const CpuContext::Work& work) {
  if (total <= 0) return;
  const double cycles = static_cast<double>(total) * static_cast<double>(cost_per_unit);
  const int64_t useful = static_cast<int64_t>((cycles - kCyclesPerThread) / kCyclesPerThread + 0.9);
  const int64_t used = std::min<int64_t>({threads, total, std::max<int64_t>(useful, 1)});
  if (used <= 1) {
    work(0, total);
    return;
  }
  auto blocks = std::make_shared<Blocks>();
  blocks->count = std::min(total, kBlocksPerThread * used);
  blocks->total = total;
  blocks->work = &work;
  for (int64_t h = 1; h < used; ++h) pool->Schedule([blocks] { blocks->Claim(); });
  blocks->Claim();
  std::unique_lock<std::mutex> lock(blocks->mutex);
  blocks->all_done.wait(lock, [&] { return blocks->done == blocks->count; });
}

CpuContext PoolContext(tensorflow::thread::ThreadPool* pool) {
  CpuContext context;
  context.parallelism = pool->NumThreads();
  context.parallel_for = [pool, threads = context.parallelism](int64_t total, int64_t cost_per_unit,
                                                               const CpuContext::Work& work) {
    ClaimingParallelFor(pool, threads, total, cost_per_unit, work);
  };
  return context;
}

}  // namespace sok_ev
