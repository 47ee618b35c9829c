// A ParallelFor over TF's intra-op pool in which the caller waits only for
// work that has started: the CPU kernels' CpuContext::parallel_for.
//
// tensorflow::thread::ThreadPool::ParallelFor returns once every helper it
// scheduled has run its share. On a machine with few cores, where TF's
// inter-op and intra-op threads outnumber the cores, a helper can wait
// milliseconds for one, and the caller then sits idle although it could have
// done all the work itself (2026-11-24, 8b7442f logged a grouped op's second lane
// starting 1.9 and 3.6 ms late at the 90th percentile, in a 2-core
// tf.function step). Here the caller and the helpers claim blocks one at a
// time; once every block has run, the caller returns, and a helper that
// starts later finds nothing left.
#ifndef SOK_EV_CC_KERNELS_CLAIMING_PARALLEL_FOR_H_
#define SOK_EV_CC_KERNELS_CLAIMING_PARALLEL_FOR_H_

#include <cstdint>

#include "cc/common.h"
#include "tensorflow/core/platform/threadpool.h"

namespace sok_ev {

// Calls work(begin, end) over disjoint blocks covering [0, total), on the
// calling thread and on at most `threads - 1` threads of `pool`. Like
// ThreadPool::ParallelFor, work costing under about 100k cycles in all
// (total * cost_per_unit) runs on the calling thread alone, and each further
// 100k cycles may use one more thread. Returns when every block has run.
void ClaimingParallelFor(tensorflow::thread::ThreadPool* pool, int threads, int64_t total,
                         int64_t cost_per_unit, const CpuContext::Work& work);

// The CpuContext whose parallel_for is ClaimingParallelFor over all of
// `pool`'s threads (the CPU kernels' context, and the GPU kernels' for their
// host-side work).
CpuContext PoolContext(tensorflow::thread::ThreadPool* pool);

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_CLAIMING_PARALLEL_FOR_H_
